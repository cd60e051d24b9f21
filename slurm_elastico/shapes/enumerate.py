"""From a validated spec to a `Family`: the cross product, the memory fit, the Pareto front.

Numbers per shape come, in this order, from what the spec declares, from a
profile (passed in: this module never opens the store), or from the estimate.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import Family, Resources, Shape
from slurm_elastico.runtime.split import accumulation_for
from slurm_elastico.shapes import estimate
from slurm_elastico.shapes.spec import PARALLEL_KNOB, Declared, FamilySpec, shape_name
from slurm_elastico.shapes.spec_batch import other_batch_name


def enumerate_shapes(spec: FamilySpec, gpu_memory_mib: int,
                     profiles: Mapping[str, Declared] | None = None) -> list[Shape]:
    """Every shape of the cross product that fits its GPUs, with its numbers; no pruning yet.

    A 1-GPU shape holds an MPS share (`Resources.mps`, percent); an n-GPU shape
    holds n whole GPUs (`Resources.gpus` n, `mps` 0), with `gpu_mem_mib` per GPU
    and `cpus`, `host_mem_mib` the spec's per-rank figures times n. Training
    shapes on n GPUs carry the knob `ranks` n and an accumulation of
    global / (micro x n); inference shapes carry `replicas` or
    `tensor_parallel_size` n (the spec's `parallel`).

    Dropped: shapes whose GPU memory exceeds the GPU, and inference shapes
    whose KV cache has no room (throughput 0).
    """
    profiles = profiles or {}
    out: list[Shape] = []
    for knobs, share, gpus in spec.shapes_of():
        name = shape_name(spec.kind, knobs, share, gpus, spec.parallel)
        multi = gpus > 1
        if spec.kind == "train":
            tput, mem = estimate.train(spec.model, spec.global_batch, knobs["micro_batch"], knobs["precision"],
                                       knobs["checkpointing"], 100 if multi else share, gpus)
            knobs_full = {**knobs, "accumulation": accumulation_for(spec.global_batch, knobs["micro_batch"], gpus),
                          "global_batch": spec.global_batch}
            if multi:
                knobs_full["ranks"] = gpus
        else:
            tput, mem = estimate.infer(spec.model, gpu_memory_mib, knobs["gpu_memory_utilization"],
                                       knobs["max_num_seqs"], knobs["kv_cache_dtype"], 100 if multi else share,
                                       gpus, spec.parallel)
            knobs_full = {**knobs, PARALLEL_KNOB[spec.parallel]: gpus} if multi else dict(knobs)
        tput, mem = _declared(name, tput, mem, spec, profiles)
        if tput <= 0 or mem > gpu_memory_mib:
            continue
        ranks = gpus if multi else 1
        res = Resources(mps=0 if multi else share, gpu_mem_mib=int(math.ceil(mem)), cpus=spec.cpus * ranks,
                        host_mem_mib=spec.host_mem_mib * ranks, gpus=gpus if multi else 0)
        if spec.kind == "train" and spec.batch is not None:  # goodput mode: every shape runs it
            knobs_full.update(base_batch=spec.global_batch, batch_rule=spec.batch.lr_scaling)
        out.append(Shape(name=name, resources=res, throughput=float(tput), knobs=tuple(sorted(knobs_full.items()))))
    if spec.kind == "train" and spec.batch is not None:
        out.extend(_other_batches(spec, gpu_memory_mib, profiles))
    return out


def _other_batches(spec: FamilySpec, gpu_memory_mib: int, profiles: Mapping[str, Declared]) -> list[Shape]:
    """An adaptive family's shapes at the other global batches of its `batch` rule (`BatchRule.batches`).

    The same micro-batches, precisions, checkpointing, shares and GPU counts wherever they divide the batch.
    Knobs: `global_batch` (that batch), `lr_scaling` (the rule), `base_batch` (the submitted one), and the
    usual `micro_batch`, `accumulation`, `ranks`. Throughput is goodput in steps of the submitted batch per
    second: the estimate's steps/s at that batch times the gain the job is sure of before it has measured its
    noise scale, min(1, B/B0) (the gain at the worst noise scale: 1 for a larger batch, B/B0 for a smaller);
    a planner that knows the job's `grad_noise_scale` φ multiplies by gain(φ)/min(1, B/B0)
    (`runtime.goodput.step_worth`). A declared or profiled figure for the shape's name is its goodput.
    """
    assert spec.batch is not None
    base = spec.global_batch
    out: list[Shape] = []
    for batch in spec.batch.batches(base):
        for combo in itertools.product(*spec.knobs.values()):
            knobs = dict(zip(spec.knobs, combo))
            micro = knobs["micro_batch"]
            for gpus in spec.gpus:
                if batch % gpus or (batch // gpus) % micro:
                    continue
                multi = gpus > 1
                for share in (0,) if multi else spec.mps_shares:
                    name = other_batch_name(batch, shape_name("train", knobs, share, gpus))
                    tput, mem = estimate.train(spec.model, batch, micro, knobs["precision"], knobs["checkpointing"],
                                               100 if multi else share, gpus, base_batch=base)
                    tput *= min(1.0, batch / base)
                    tput, mem = _declared(name, tput, mem, spec, profiles)
                    if tput <= 0 or mem > gpu_memory_mib:
                        continue
                    full = {**knobs, "accumulation": batch // (micro * gpus), "global_batch": batch,
                            "lr_scaling": spec.batch.lr_scaling, "base_batch": base}
                    if multi:
                        full["ranks"] = gpus
                    ranks = gpus if multi else 1
                    res = Resources(mps=0 if multi else share, gpu_mem_mib=int(math.ceil(mem)), cpus=spec.cpus * ranks,
                                    host_mem_mib=spec.host_mem_mib * ranks, gpus=gpus if multi else 0)
                    out.append(Shape(name=name, resources=res, throughput=float(tput),
                                     knobs=tuple(sorted(full.items()))))
    return out


def pareto(shapes: Sequence[Shape], keep: str | None = None) -> list[Shape]:
    """The shapes no other shape beats: at least as fast with no more of any resource (one of each tie).

    `keep` names a shape kept even if dominated (the family's default). Order
    of the input is kept, so the result is deterministic.
    """
    out: list[Shape] = []
    prints = [s.resources.footprint() for s in shapes]  # each once, not once per pair
    for i, a in enumerate(shapes):
        ra = prints[i]
        dominated = False
        for j, b in enumerate(shapes):
            if i == j:
                continue
            rb = prints[j]
            no_worse = b.throughput >= a.throughput and all(x <= y for x, y in zip(rb, ra))
            if not no_worse:
                continue
            better = b.throughput > a.throughput or rb != ra
            if better or j < i:  # strictly better, or an identical twin listed earlier
                dominated = True
                break
        if not dominated or a.name == keep:
            out.append(a)
    return out


def build_family(spec: FamilySpec, gpu_memory_mib: int, profiles: Mapping[str, Declared] | None = None) -> Family:
    """The job's `Family`: enumerated, fitted to the GPU, pruned to its Pareto front.

    Raises `ConfigError` when no shape fits the GPU or the default does not.
    """
    shapes = enumerate_shapes(spec, gpu_memory_mib, profiles)
    if not shapes:
        raise ConfigError(spec.source, [f"(all shapes): none fits a GPU of {gpu_memory_mib} MiB; "
                                        "allowed: shapes whose memory estimate or declared gpu_mem_mib is below it"])
    if spec.default is not None and spec.default not in {s.name for s in shapes}:
        raise ConfigError(spec.source, [f"default: shape {spec.default!r} does not fit a GPU of {gpu_memory_mib} MiB"])
    front = front_of(spec, shapes, spec.default)
    default = spec.default if spec.default is not None else own_default(spec, front)
    return Family(kind=spec.kind, shapes=tuple(front), total_work=spec.work, throughput_floor=spec.throughput_floor,
                  name=spec.name, default=default)


def own_default(spec: FamilySpec, shapes: Sequence[Shape]) -> str | None:
    """The shape an adaptive job without a `default` runs as unplanned: the fastest at the submitted batch on the
    most GPU (what `Family.default_shape` would pick among all shapes); None for a fixed-batch family."""
    own = [s for s in shapes if s.knob("lr_scaling") is None]
    if spec.batch is None or not own:
        return None
    top = max(s.resources.gpu_size for s in own)
    return max((s for s in own if s.resources.gpu_size == top), key=lambda s: s.throughput).name


def front_of(spec: FamilySpec, shapes: Sequence[Shape], keep: str | None = None) -> list[Shape]:
    """The Pareto front, taken per global batch in an adaptive family: a shape at another batch carries a goodput
    counted at the worst noise scale until the job measures its own, so it competes only with shapes of its
    batch and stays in the family for a planner that prices it with the measured one."""
    groups: dict[object, list[Shape]] = {}
    for s in shapes:
        groups.setdefault(s.knob("global_batch") if spec.batch is not None else None, []).append(s)
    return [s for group in groups.values() for s in pareto(group, keep=keep)]


def _declared(name: str, tput: float, mem: float, spec, profiles) -> tuple[float, float]:
    """A shape's estimated throughput and memory, replaced by what a profile, then the spec's `declared`, say of
    it (the later wins)."""
    for source in (profiles.get(name), spec.declared.get(name)):
        if source is not None:
            tput = source.throughput if source.throughput is not None else tput
            mem = source.gpu_mem_mib if source.gpu_mem_mib is not None else mem
    return tput, mem
