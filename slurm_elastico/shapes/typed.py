"""A family's shapes per GPU type on a cluster of several types: what fits each type, at its own speed there.

On a one-type cluster (`shapes.build_family` with one memory size) nothing
here runs and shape names are what they always were. Given the cluster's types
(type -> GPU memory MiB), `build_typed_family` enumerates the spec once per
type the job may use (its `gpu_types` limit, else every type):

* memory: the shapes that fit that type's memory (an inference shape's KV
  cache is sized from it too);
* precision: only what the type supports (`gpu_types.supports`: no bf16
  below compute capability 8.0);
* throughput, in this order: a typed figure for `<shape>@<type>` (declared in
  the spec, or a profile); else what the job measured for that shape on the
  types where it ran, scaled to this type (`type_speed.estimate`, with its
  sigma in `Shape.throughput_sigma`); else the family's untyped figure
  (declared, profiled or estimated), read as a speed on the `anchor` type and
  scaled from there (`type_speed.from_reference`), times the job's own
  scale: the geometric mean of measured / that figure over the (shape, type)
  pairs the job has measured (the family's estimate guesses the scale; the
  job's reports fix it, and the estimate keeps only the ranking of shapes).

Each shape is `<name>@<type>` with `Shape.gpu_type` set: the same knobs on two
types are two shapes. The Pareto front is taken within each type (a slower
type's shapes are not beaten by a faster type's: they hold other GPUs).

Trap: the anchor matters only for shapes nobody measured; its choice (the
site's `gpu.type`, else the first type) is the caller's. The site's type
takes the family's figures as they are (sigma 0 for the ranking of its own
shapes); the first type, standing in for a site type nobody named, carries
the sigma of a transfer from the nearest other type, as every other type
carries the sigma of a transfer from it, so which type Slurm lists first
does not tip a near tie.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import Family, NodeView, Shape
from slurm_elastico.shapes.enumerate import enumerate_shapes, front_of, own_default
from slurm_elastico.shapes.gpu_types import FIGURE_KEYS, GpuSpec, canonical, normalise, resolve, supports
from slurm_elastico.shapes.spec import Declared, FamilySpec
from slurm_elastico.shapes.spec_types import split_name, typed_name
from slurm_elastico.shapes.type_speed import estimate, from_reference, precision_class, prior_mix, spread_sigma

Measured = Mapping[str, Mapping[str, float]]
"""Shape name (untyped) -> {GPU type: measured speed there}: what a job's progress reports showed."""


def same_type(a: str, b: str) -> bool:
    """Do two type words mean the same GPU (`A100` and `a100`; `a100` and `a100-40gb`)?"""
    if normalise(a) == normalise(b):
        return True
    ca, cb = canonical(a), canonical(b)
    return ca is not None and ca == cb


def types_of_nodes(nodes: Sequence[NodeView], default_memory_mib: int) -> dict[str, int]:
    """The cluster's GPU types -> memory MiB from its nodes; {} when it has fewer than two (the one-type path).

    A node's memory is `NodeView.gpu_memory_mib` (settings per type), else `default_memory_mib`. Every listed
    node counts, whatever its state, so a type does not vanish from the families while its nodes are down.
    Nodes whose gres names no type are left out of typed families (a typed shape must name its type).
    """
    found: dict[str, int] = {}
    for n in nodes:
        if n.gpu_type and n.gpus:
            found[n.gpu_type] = max(found.get(n.gpu_type, 0), n.gpu_memory_mib or default_memory_mib)
    return found if len(found) > 1 else {}


def family_memory(nodes: Sequence[NodeView], default_memory_mib: int) -> int:
    """The GPU memory a one-type cluster's (untyped) families are sized for: when every GPU node's gres names the
    same type, that type's (`NodeView.gpu_memory_mib`, from its `gpu.types` entry); else `default_memory_mib`
    (gpu.memory_mib). elastico-submit sizes by the same rule from the settings (`settings_family_memory`)."""
    typed = {n.gpu_type for n in nodes if n.gpus}
    if len(typed) == 1 and "" not in typed:
        return max(n.gpu_memory_mib or default_memory_mib for n in nodes if n.gpus)
    return default_memory_mib


def settings_family_memory(types: Mapping[str, int], default_memory_mib: int) -> int:
    """`family_memory` as the settings say it: the one type's memory when `gpu.types` names exactly one (every GPU
    node must then name it), else gpu.memory_mib."""
    return next(iter(types.values())) if len(types) == 1 else default_memory_mib


def memory_by_type(raw: object) -> dict[str, int]:
    """type -> memory MiB from settings' `gpu.types`: each value an integer, a mapping or an object with memory_mib."""
    out: dict[str, int] = {}
    for name, v in (raw.items() if isinstance(raw, Mapping) else ()):
        mem = v if isinstance(v, int) else v.get("memory_mib") if isinstance(v, Mapping) else getattr(v, "memory_mib", None)
        if isinstance(mem, int) and not isinstance(mem, bool) and mem > 0:
            out[str(name)] = mem
    return out


def figures_by_type(raw: object) -> dict[str, dict[str, object]]:
    """type -> declared spec figures (`gpu_types.FIGURE_KEYS`, `like`) from settings' `gpu.types`, whatever its form:
    a mapping per type, or an object with those attributes. Types without any are left to the public table."""
    keys = (*FIGURE_KEYS, "like")
    out: dict[str, dict[str, object]] = {}
    for name, v in (raw.items() if isinstance(raw, Mapping) else ()):
        got = {k: (v.get(k) if isinstance(v, Mapping) else getattr(v, k, None)) for k in keys}
        got = {k: x for k, x in got.items() if x not in (None, "", 0) or k == "bf16_tflops" and x == 0}
        if any(k != "bf16_tflops" for k in got):
            out[str(name)] = got
    return out


def with_limit(spec: FamilySpec, limit: Sequence[str]) -> FamilySpec:
    """`spec` limited to the types of a typed GPU request too (`--gres=gpu:a100:2`): the types both allow.

    Raises `ConfigError` when the request names no type the family's own `gpu_types` allows.
    """
    if not limit:
        return spec
    both = tuple(t for t in limit if not spec.gpu_types or any(same_type(t, w) for w in spec.gpu_types))
    if not both:
        raise ConfigError(spec.source, [f"gpu_types: the job asks Slurm for GPU type(s) {list(limit)} and its family "
                                        f"allows only {list(spec.gpu_types)}; allowed: a request for one of those "
                                        "types, or a family that lists the requested one"])
    return dataclasses.replace(spec, gpu_types=both)


def named(want: str, types: Iterable[str]) -> list[str]:
    """The cluster's types a type word names: those spelt as it is (case and separators aside), else those of the
    same GPU (`same_type`). So `gpu:dgx:1` (Slurm's name) stays on dgx where a dgx-ext of the same card is beside
    it, and a family that says `A100` runs on the cluster's `a100-sxm4-40gb`."""
    types = list(types)
    exact = [t for t in types if normalise(t) == normalise(want)]
    return exact or [t for t in types if same_type(t, want)]


def allowed_types(spec: FamilySpec, types: Mapping[str, int]) -> list[str]:
    """The cluster's types this family may run on, in the cluster's order (its `gpu_types`, else all)."""
    if not spec.gpu_types:
        return list(types)
    ok = {t for want in spec.gpu_types for t in named(want, types)}
    return [t for t in types if t in ok]


def enumerate_typed(spec: FamilySpec, types: Mapping[str, int], profiles: Mapping[str, Declared] | None = None,
                    measured: Measured | None = None, anchor: str | None = None,
                    figures: Mapping[str, Mapping[str, object]] | None = None) -> list[Shape]:
    """Every shape of every type the family may use that fits that type (see the module text); no pruning.

    `types` maps each GPU type of the cluster to its memory (MiB); `figures` holds declared specs of types
    the table does not know (`gpu_types.resolve`: an unknown type raises `UnknownGpuType`).
    """
    profiles, measured = profiles or {}, measured or {}
    specs = {t: resolve(t, figures) for t in types}
    site = next(iter(named(anchor, types) if anchor else ()), None)
    anchor = site or next(iter(types), None)
    untyped = {k: v for k, v in profiles.items() if not split_name(k)[1]}
    rows = []
    for t in allowed_types(spec, types):
        for shape in enumerate_shapes(spec, types[t], untyped):
            precision = str(shape.knob("precision", "fp32"))
            if spec.kind != "train" or supports(specs[t], precision):
                rows.append((t, shape, precision))
    logs = []  # the job's scale: measured / the family's own figure, over what it measured
    for t, shape, precision in rows:
        got = measured.get(shape.name, {}).get(t)
        guess = _on_type(spec, shape, t, specs, profiles, {}, anchor, precision) if got and got > 0 else None
        if guess is not None:
            logs.append(math.log(got / guess.throughput))  # type: ignore[operator]
    scale = math.exp(sum(logs) / len(logs)) if logs else 1.0
    # Where the untyped figure's speed comes from, for the anchor's own uncertainty: the types the job measured;
    # else, with no site type, any of the others (the first type listed is no better a guess than the rest, so
    # it is as uncertain as a transfer from the nearest: the order Slurm lists nodes in must not favour a type).
    where = ({t for runs in measured.values() for t in runs if t in specs} if logs
             else set() if site else set(specs) - {anchor})
    # Each shape's own figure on each type (enumerated for that type's memory): a speed measured on type m is
    # carried to type t as what it would be at t's figure (an inference engine holds more sequences in more
    # memory: that is the figure's part of the difference, the specs' ratio the rest).
    figure = {(shape.name, t): shape.throughput for t, shape, _ in rows}
    out: list[Shape] = []
    for t, shape, precision in rows:
        seen = {m: v * (shape.throughput / figure[(shape.name, m)] if figure.get((shape.name, m), 0) > 0 else 1.0)
                for m, v in measured.get(shape.name, {}).items()}
        typed = _on_type(spec, shape, t, specs, profiles, seen, anchor, precision, scale, where)
        if typed is not None and typed.resources.gpu_mem_mib <= types[t]:
            out.append(typed)
    return out


def _on_type(spec: FamilySpec, shape: Shape, t: str, specs: Mapping[str, GpuSpec], profiles: Mapping[str, Declared],
             seen: Mapping[str, float], anchor: str | None, precision: str, scale: float = 1.0,
             where: set[str] | frozenset[str] = frozenset()) -> Shape | None:
    """`shape` (enumerated for type t's memory) as the typed shape `<name>@t`, with its speed there."""
    name = typed_name(shape.name, t)
    figures = [f for f in (profiles.get(name), spec.declared.get(name)) if f is not None]  # later wins
    tput, sigma = shape.throughput, 0.0
    mem = shape.resources.gpu_mem_mib
    exact = [f.throughput for f in figures if f.throughput is not None]
    runs = {k: v for k, v in seen.items() if k in specs}
    if exact:
        tput = exact[-1]
    elif runs:
        est = estimate(runs, t, specs, spec.kind, precision)
        tput, sigma = est.value, (0.0 if est.measured else est.sigma)
    elif anchor is not None and anchor != t:
        est = from_reference(shape.throughput * scale, specs[anchor], specs[t], spec.kind, precision)
        tput, sigma = est.value, est.sigma
    else:  # on the anchor: the scale came from the types in `where`, as uncertain as a transfer from them
        tput = shape.throughput * scale
        if where and t not in where:
            cls, mix = precision_class(spec.kind, precision), prior_mix(spec.kind, precision)
            sigma = min(spread_sigma(specs[m], specs[t], cls, mix) for m in where)
    for f in figures:
        mem = int(f.gpu_mem_mib + 0.999999) if f.gpu_mem_mib is not None else mem
    if tput <= 0:
        return None
    res = dataclasses.replace(shape.resources, gpu_mem_mib=mem)
    return dataclasses.replace(shape, name=name, resources=res, throughput=float(tput), gpu_type=t,
                               throughput_sigma=sigma)


def build_typed_family(spec: FamilySpec, types: Mapping[str, int], profiles: Mapping[str, Declared] | None = None,
                       measured: Measured | None = None, anchor: str | None = None,
                       figures: Mapping[str, Mapping[str, object]] | None = None) -> Family:
    """The job's `Family` on a cluster of several GPU types: typed shapes, each type's Pareto front.

    Raises `ConfigError` naming the family and every type with its memory when no shape fits any type it may
    use (or its `gpu_types` names none of the cluster's), and when its `default` fits none of them.
    """
    if not types:
        raise ValueError("a typed family needs at least one GPU type")
    what = f"family {spec.name!r}" if spec.name else "the family"
    listed = ", ".join(f"{t} ({m} MiB)" for t, m in types.items())
    usable = allowed_types(spec, types)
    if not usable:
        raise ConfigError(spec.source, [f"gpu_types: {what} may run on {list(spec.gpu_types)}, and the cluster's GPU "
                                        f"types are {listed}; allowed: some of the cluster's types"])
    shapes = enumerate_typed(spec, types, profiles, measured, anchor, figures)
    if not shapes:
        raise ConfigError(spec.source, [
            f"(all shapes): no shape of {what} fits any GPU type it may use: "
            + ", ".join(f"{t} ({types[t]} MiB)" for t in usable)
            + "; allowed: shapes whose memory estimate or declared gpu_mem_mib fits one of them, at a precision "
              "the type supports (bf16 needs compute capability 8.0: not V100, T4, RTX 2080 Ti, Quadro RTX 6000)"])
    default = None
    if spec.default is not None:
        default = next((s.name for t in usable for s in shapes if s.name == typed_name(spec.default, t)), None)
        if default is None:
            raise ConfigError(spec.source, [f"default: shape {spec.default!r} fits none of the GPU types "
                                            + ", ".join(f"{t} ({types[t]} MiB)" for t in usable)])
    front: list[Shape] = []
    for t in usable:
        front += front_of(spec, [s for s in shapes if s.gpu_type == t], keep=default)
    return Family(kind=spec.kind, shapes=tuple(front), total_work=spec.work, throughput_floor=spec.throughput_floor,
                  name=spec.name, default=default if default is not None else own_default(spec, front))
