"""The what-if on a cluster of several GPU types (pure): each type's speed, and the type each past job ran on.

The bundled profiles were measured on one GPU (a T4). On a cluster whose
nodes name several types (`gpu:a100:4` here, `gpu:t4:4` there), the what-if
runs each type at the bundled speeds scaled by the speed prior the helper
itself plans with before a job has run on a type (`shapes.type_speed`: a
roofline mix of the public figures, fp32 training): `typed_truth`. So its
elastico chooses GPU types as the helper would, from the same figures, and
the simulator's truth is that same prior: the what-if's gain is that of a
cluster whose jobs speed up between types as the specifications say. How
far real jobs stray from the prior is measured on Sia's per-type profiles
(`benchmarks/type_prior.py`, the results page); the what-if cannot know it for
your jobs, so read its gain with that error in mind.

A type the public table does not know needs `like:` in `gpu.types` (the
helper's own rule, `gpu_types.resolve`); a type's memory is the one
`gpu.types` gives it, else the table's. GPUs whose gres names no type run at
the bundled (T4) speed.

Each past job is calibrated on the type it ran on (`placed`): the type it
asked for; else the type its last run was given (`PastJob.ran_type`, where
accounting records typed GPUs: right even if its node was re-equipped
since); else the type of the node it ran on (`PastJob.ran_on`); else,
when that node is gone (or the history predates the column), the type most
GPUs of its partitions have, counted as guessed (`GUESSED`); a type its
partitions no longer have counts as gone. Plain Slurm in the simulator keeps
it on that type, so that it holds its GPUs as long as it did whatever order
the nodes are listed in, and so do both policies for a job neither reshapes
(rigid, inference); elastico may move the others. A job larger than its
type's GPUs ran across types: it is calibrated on the slowest type that holds
it alone (`ACROSS`), or, where none does, it runs as submitted, across
types, at the slowest type's pace (`SPANS`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from slurm_elastico.config import Settings
from slurm_elastico.history.past import PastJob
from slurm_elastico.history.shape import ClusterShape
from slurm_elastico.shapes.gpu_types import resolve
from slurm_elastico.shapes.type_speed import from_reference
from slurm_elastico.shapes.typed import figures_by_type
from slurm_elastico.sim.gpu_types import NodeGroup
from slurm_elastico.sim.truth import T4_MEM_MIB, GroundTruth
from slurm_elastico.sim.truth_types import TypedTruth

PROFILED_ON = "t4"
"""The GPU the bundled profiles were measured on."""
UNTYPED = "untyped"
"""The simulator's name for GPUs whose gres names no type (its typed nodes need a name)."""
GUESSED = ("its type guessed (the node it ran on is not in its partitions now): the type most of its partitions' "
           "GPUs are")
INFER_RIGID = "inference run as submitted (no per-type inference model)"
SPANS = "asked more GPUs than any one type has: run as submitted, across types, at the slowest one's pace"
ACROSS = ("asked more GPUs than the type it ran on has: calibrated on the slowest type that holds it, kept there by "
          "Slurm")


def gpu_types(shape: ClusterShape) -> list[str]:
    """The cluster's GPU types, in node order; [] for a cluster of one type (the one-type what-if)."""
    found = list(dict.fromkeys(n.gpu_type for n in shape.nodes))
    return found if len(found) > 1 else []


def speedups(types: list[str], settings: Settings) -> dict[str, float]:
    """Each type's fp32 training speed over the bundled profiles' T4 by the helper's prior; `UnknownGpuType`
    (a ConfigError) naming a type neither the table nor `gpu.types` describes."""
    figures = figures_by_type(settings.gpu.types)
    base = resolve(PROFILED_ON)
    return {t: 1.0 if not t else from_reference(1.0, base, resolve(t, figures), "train", "fp32").value
            for t in types}


def memory_mib(gpu_type: str, settings: Settings) -> int:
    """What a job may use of one GPU of `gpu_type`: `gpu.types`' figure, else the public table's (the bundled
    T4's usable 15 GiB for an untyped GPU)."""
    own = settings.gpu.type_settings(gpu_type) if gpu_type else None
    if own is not None and own.memory_mib:
        return int(own.memory_mib)
    if not gpu_type:
        return int(T4_MEM_MIB)
    return int(resolve(gpu_type, figures_by_type(settings.gpu.types)).memory_gib * 1024)


def typed_truth(types: list[str], settings: Settings) -> TypedTruth:
    """One ground truth per type: the bundled one at that type's speedup (`speedups`)."""
    return TypedTruth({sim_name(t): GroundTruth.scaled(x) for t, x in speedups(types, settings).items()},
                      source="what-if GPU types")


def sim_name(gpu_type: str) -> str:
    return gpu_type or UNTYPED


def node_groups(shape: ClusterShape, settings: Settings) -> list[NodeGroup]:
    """The simulated cluster's nodes, each with its type, GPUs of that type's memory, and partitions."""
    return [NodeGroup(sim_name(n.gpu_type), 1, n.gpus, memory_mib(n.gpu_type, settings), n.partitions)
            for n in shape.nodes]


def placed(job: PastJob, shape: ClusterShape, speeds: Mapping[str, float], notes: Counter) -> tuple[str, bool]:
    """(the type `job` is calibrated on, whether it ran across types: no one type of its partitions holds it);
    see the module docstring. What had to be assumed is counted in `notes`."""
    parts: list[Counter] = []
    for nodes in shape.nodes_for(shape.partition_of(job.partition)):  # GPUs of each type in each of its partitions
        parts.append(Counter())
        for n in nodes:
            parts[-1][n.gpu_type] += n.gpus
    ran = _ran(job, shape, parts, notes)
    need = max(job.gpus, 1)
    if job.gpu_type or any(c[ran] >= need for c in parts):
        return ran, False
    here = {t for c in parts for t in c}
    alone = [t for t in here if any(c[t] >= need for c in parts)]
    notes[ACROSS if alone else SPANS] += 1
    return min(alone or here, key=lambda t: (speeds[t], t)), not alone


def _ran(job: PastJob, shape: ClusterShape, parts: list[Counter], notes: Counter) -> str:
    """The type `job` ran on: asked, given (`ran_type`), its node's, else its partitions' most common (a guess)."""
    if job.gpu_type:
        return job.gpu_type
    gpus: Counter = sum(parts, Counter())
    if not gpus:
        for n in shape.nodes:
            gpus[n.gpu_type] += n.gpus
    if job.ran_type and job.ran_type in gpus:
        return job.ran_type
    by_name = {n.name: n.gpu_type for n in shape.nodes}
    if by_name.get(job.ran_on) in gpus:
        return by_name[job.ran_on]
    notes[GUESSED] += 1
    return max(gpus, key=lambda t: (gpus[t], t))


def describe(speeds: Mapping[str, float]) -> str:
    """'a100 x5.02, t4 x1.00' (each type's speed over the bundled profiles' T4)."""
    return ", ".join(f"{t or UNTYPED} x{x:.2f}" for t, x in speeds.items())
