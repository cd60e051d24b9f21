"""The shape elastico-run runs: the family from its spec, and the shape the job's AdminComment names, on each (re)start."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from slurm_elastico.errors import ConfigError, ElasticoError
from slurm_elastico.inputs import load_yaml
from slurm_elastico.model import MPS_SHARES_PER_GPU, Family
from slurm_elastico.model import Shape as PlannedShape
from slurm_elastico.shapes import build_family, enumerate_shapes, parse_spec
from slurm_elastico.shapes.current import running_shape
from slurm_elastico.shapes.typed import build_typed_family, enumerate_typed, same_type, with_limit

Log = Callable[[str], None]


def choose_shape(family: Family, candidates: Sequence[PlannedShape], admin_comment: str,
                 held_share: int | None = None, shares_per_gpu: int = MPS_SHARES_PER_GPU,
                 held_gpus: int | None = None, gpu_type: str = "") -> tuple[PlannedShape, str]:
    """The shape to run and where it came from: `shapes.current.running_shape`, the rule the planner follows too.

    `candidates` is every shape of the spec that fits the GPU (a superset of the
    pruned family), so a shape named by hand or by an older plan is honoured too.
    `held_share` is in Slurm's MPS counts (`shares_per_gpu` a GPU); `held_gpus` the whole GPUs on all nodes.
    `gpu_type`: the type the job's GPUs are ("" = unknown); typed candidates of other types are not run then
    (their precision or memory may not suit these GPUs), and the default runs as its shape of that type.
    """
    default: PlannedShape | None = family.default_shape
    if gpu_type and any(c.gpu_type for c in candidates):
        mine = [c for c in candidates if not c.gpu_type or same_type(c.gpu_type, gpu_type)]
        if mine:
            base = family.default_shape.name.partition("@")[0]
            default = next((c for c in mine if c.name.partition("@")[0] == base), None)  # None: the fastest that fits
            candidates = mine
    return running_shape(candidates, default, admin_comment, held_share, shares_per_gpu, held_gpus)


def family_from_spec(text: str, source: str, gpu_memory_mib: int, gpu_types: Sequence[tuple[str, int]] = (),
                     type_limit: Sequence[str] = (), figures: Mapping[str, Mapping[str, object]] | None = None,
                     ) -> tuple[Family, list[PlannedShape]]:
    """The job's family and every shape of its spec that fits the GPU (names the planner may write).

    With the cluster's `gpu_types` ((type, memory MiB), two or more) the shapes are typed, as the helper's are;
    `figures`: the settings' declared figures of types the public table lacks (`like:`), as the helper has them.
    """
    spec = with_limit(parse_spec(load_yaml(text, source), source), type_limit)
    if len(gpu_types) > 1:
        types = dict(gpu_types)
        try:
            return build_typed_family(spec, types, figures=figures), enumerate_typed(spec, types, figures=figures)
        except ConfigError as exc:  # a type without public figures here: the untyped shapes, by their base names
            print(f"elastico-run: warning: the family's typed shapes cannot be built ({exc}); running its untyped "
                  "shapes, read by their base names", file=sys.stderr, flush=True)
    return build_family(spec, gpu_memory_mib), enumerate_shapes(spec, gpu_memory_mib)


@dataclass(frozen=True)
class Found:
    """The shape to run now and what Slurm says about the job (None = unknown).

    `allocated_share`: its MPS share in Slurm's counts; `allocated_gpus`: the whole GPUs it holds on all its
    nodes, `nodes`: how many nodes; seconds to its time limit and since this run began.
    """

    shape: PlannedShape
    origin: str
    allocated_share: int | None = None
    remaining_s: float | None = None
    elapsed_s: float | None = None
    allocated_gpus: int | None = None
    nodes: int | None = None


class JobShapes:
    """Reads the job's shape from Slurm on each call; falls back to the family default when Slurm cannot be read."""

    def __init__(self, family: Family, candidates: Sequence[PlannedShape], job_id: int | None, gateway, log: Log,
                 retries: int = 3, sleep: Callable[[float], None] = time.sleep,
                 shares_per_gpu: int = MPS_SHARES_PER_GPU):
        self.family, self.candidates, self.job_id, self.gateway = family, tuple(candidates), job_id, gateway
        self.log, self.retries, self.sleep, self.shares_per_gpu = log, retries, sleep, shares_per_gpu
        self.typed = any(s.gpu_type for s in family.shapes)

    def __call__(self) -> Found:
        if self.job_id is None or self.gateway is None:
            return Found(self.family.default_shape, "default (not in a Slurm job)")
        problem = ""
        for attempt in range(self.retries):
            try:
                # On a cluster of several types, a request that names none (an MPS share, an untyped gpu:N) does
                # not say which type's shape runs: the node does.
                view, node_type = self.gateway.job_on_type(self.job_id) if self.typed else (
                    self.gateway.job(self.job_id), "")
            except ElasticoError as exc:  # Slurm down, or squeue printed something unparsable
                problem = str(exc)
                if attempt + 1 < self.retries:
                    self.sleep(1.0)
                continue
            nodes = len(view.nodes) or None
            gpus = view.whole_gpus * (nodes or 1) or None
            shape, origin = choose_shape(self.family, self.candidates, view.admin_comment, view.mps_share or None,
                                         self.shares_per_gpu, gpus, (view.gres.gpu_type if view.gres else "") or node_type)
            now = time.time()
            remaining = view.end_time - now if view.end_time is not None and view.time_limit_s is not None else None
            elapsed = now - view.start_time if view.start_time is not None else None
            return Found(shape, origin, view.mps_share or None, remaining, elapsed, gpus, nodes)
        self.log(f"warning: cannot read job {self.job_id} from Slurm ({problem}); running the family default")
        return Found(self.family.default_shape, "default (Slurm unreadable)")
