"""The planner's view of a job on a cluster of several GPU types: a family whose shapes each name the type they run on.

`typed_family_of` builds, for each type of the cluster, the job's family as
`families.family_of` would on a one-type cluster of that type (its truth,
its memory, its GPUs per node; data-parallel sizes up to the GPUs the type
has), and keeps every shape with `gpu_type` set to that type, its name
suffixed `@<type>` (names are unique within a family) and its throughput
that type's, times the profiling error drawn for the typed name (so a
shape's error differs between types, as two profiling runs would).
Shapes that do not fit a type's memory, or ask more GPUs than it has, are
left out for it. The planner contract: a shape of type T runs only on
nodes of type T; "" runs anywhere.

The job's default shape (what it runs as when nobody plans it) is its
submitted shape on the slowest type (`TypedTruth.slowest_type`), the type a
user who cannot choose would have profiled for; its request stays untyped,
as submitted (`--gpus=N`).

One-type cluster, or the type-blind ablation (`type_blind`): the plain
`family_of` with shapes of `gpu_type` "" and the throughput of one type:
the cluster's only one, or the slowest for the app among the cluster's
types (a type-blind planner then never expects more than any GPU gives);
that type's memory bounds the shapes, and their GPU counts go up to all the
cluster's GPUs (an untyped request may run on any node).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import Family, Shape
from slurm_elastico.sim.families import _noise, family_of, fastest_speed
from slurm_elastico.sim.gpu_types import NodeGroup
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth_types import TypedTruth


def reference_group(job: TraceJob, truth: TypedTruth, groups: Sequence[NodeGroup]) -> NodeGroup:
    """The group whose type stands for the whole cluster in an untyped family: the only one, else the slowest."""
    if len(groups) == 1:
        return groups[0]
    slow = truth.slowest_type(job.app, [g.gpu_type for g in groups])
    return next(g for g in groups if g.gpu_type == slow)


def typed_family_of(job: TraceJob, truth: TypedTruth, groups: tuple[NodeGroup, ...], shares: tuple[int, ...],
                    noise: float = 0.0, seed: int = 0, adaptive: bool = False, max_gpus: int = 0,
                    whole_gpu_gangs: bool = False, type_blind: bool = False) -> Family | None:
    """The job's family on the cluster of `groups` (see the module docstring); None for a job the planner cannot
    reshape on any type (Slurm runs it as submitted). A job that asked for a type (`TraceJob.gpu_type`) gets
    shapes of that type only."""
    if len(groups) == 1 or type_blind:
        g = reference_group(job, truth, groups)  # untyped shapes may run on any node: up to all the GPUs there are
        return family_of(job, truth[g.gpu_type], shares, g.memory_mib, noise, seed, adaptive,
                         min(max_gpus, sum(x.gpus for x in groups)), g.gpus_per_node, whole_gpu_gangs)
    if job.gpu_type:
        groups = tuple(g for g in groups if g.gpu_type == job.gpu_type)
    shapes: list[Shape] = []
    defaults: dict[str, str] = {}
    for g in groups:
        fam = family_of(job, truth[g.gpu_type], shares, g.memory_mib, 0.0, seed, adaptive, min(max_gpus, g.gpus),
                        g.gpus_per_node, whole_gpu_gangs)
        if fam is None:
            continue
        defaults[g.gpu_type] = f"{fam.default}@{g.gpu_type}"
        for s in fam.shapes:
            if s.resources.gpus > g.gpus:
                continue
            name = f"{s.name}@{g.gpu_type}"
            shapes.append(dataclasses.replace(s, name=name, gpu_type=g.gpu_type,
                                              throughput=s.throughput * _noise(job.job_id, name, seed, noise)))
    if not shapes:
        return None
    names = {s.name for s in shapes}
    default = defaults.get(reference_group(job, truth, groups).gpu_type)
    if default not in names:
        own = [s for s in shapes if (s.resources.gpus or 1) == job.gpus
               and (job.gpus > 1 or s.resources.mps == job.share)]
        default = max(own or shapes, key=lambda s: s.throughput).name
    return Family(kind=job.kind, shapes=tuple(shapes), total_work=float(job.work), name=job.app, default=default)


def typed_fastest_speed(job: TraceJob, truth: TypedTruth, groups: Sequence[NodeGroup], adaptive: bool,
                        max_gpus: int) -> float:
    """The lower bound's rate on a typed cluster: the fastest of `families.fastest_speed` on each type alone (the
    one it asked for, where it asked for one)."""
    groups = [g for g in groups if not job.gpu_type or g.gpu_type == job.gpu_type] or groups
    return max(fastest_speed(job, truth[g.gpu_type], g.memory_mib, adaptive, min(max_gpus, g.gpus),
                             g.gpus_per_node) for g in groups)


def check_typed(jobs: Sequence[TraceJob], truth: TypedTruth, groups: Sequence[NodeGroup], source: str) -> None:
    """One `ConfigError` unless every job can run on the typed cluster: training only (no per-type decode model
    was measured), each app profiled on every type of the cluster (Slurm may place an untyped job on any)."""
    problems = []
    types = [g.gpu_type for g in groups]
    for app in sorted({j.app for j in jobs if j.kind == "train"}):
        missing = truth.missing(app, types)
        if missing:
            problems.append(f"app {app!r} has no measured profile on GPU type(s) {', '.join(missing)}; allowed: apps "
                            f"profiled on every type of the cluster ({', '.join(truth.reference.apps)})")
    infer = [j.job_id for j in jobs if j.kind != "train"]
    if infer:
        problems.append(f"{len(infer)} inference job(s) (first: {infer[0]}); a cluster of several GPU types runs "
                        "training jobs only (no per-type inference measurement); allowed: a training trace")
    if problems:
        raise ConfigError(source, problems)

