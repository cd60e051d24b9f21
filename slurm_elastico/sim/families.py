"""The planner's view of each simulated job: a `Family` of shapes with *estimated* throughputs.

The ground truth's solo speed of each shape times seeded errors: the shape's
own (lognormal, `noise` = its sigma) and, with `errors`, those an estimate
shares over an app's jobs and a job's shapes (`Errors`, `sim.belief`, which
also refines the family from what the job measured); the shape's GPU
memory, and the job's CPUs and host memory. Co-location never
enters a family; the policy learns about it only from its own interference
model. Shapes are pruned to the Pareto front as `shapes.build_family` does,
keeping the submitted (default) shape.

Training shapes: micro-batch = global batch / 2^k within the measured per-GPU
batches (fp32, no activation checkpointing: what Pollux measured), times the
MPS shares; and data-parallel shapes of r whole GPUs (r = 2, 4, 8, … up to
`max_gpus`, and the submitted count) at the SAME global batch: each rank
takes global batch / r, in micro-batches of the same power-of-two rule,
accumulated to it (only where r divides the global batch; the submitted
count is kept even if it does not divide it, each rank computing its part as
the runtime splits it, `runtime.split.rank_part`: every shape does exactly
the same optimizer steps). A job submitted with r > 1
GPUs defaults to its r-GPU shape. Inference shapes: vLLM `gpu_memory_utilization` × `max_num_seqs`
× KV dtype × shares.

Goodput shapes (`adaptive`: the settings' `adaptive_batch`, or a policy that
adapts batch sizes) change the global batch, as Pollux does: other batches
of the app's measured range on one whole GPU or r = 2 … `max_gpus` GPUs.
Their throughput is goodput, in steps of the job's own batch per second:
steps/s at that batch × its statistical efficiency relative to the own
batch during the job's current epoch (`GroundTruth.efficiency_ratio`), which
changes as training goes on; `efficiency_segment` is that factor and where
it next changes, `at_epoch` the family as the job's gradient statistics
show it in a later epoch. The job's work stays its measured iterations at
its own batch, so a job that keeps its batch finishes where it always did.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from slurm_elastico.model import Family, Resources, Shape
from slurm_elastico.runtime.split import accumulation_for, largest_part
from slurm_elastico.shapes.enumerate import pareto
from slurm_elastico.shapes.spec import shape_name
from slurm_elastico.sim.trace import TraceJob, default_micro
from slurm_elastico.sim.truth import GroundTruth

TRAIN_CPUS, TRAIN_HOST_MIB = 4, 16384
INFER_CPUS, INFER_HOST_MIB = 2, 8192
GMUS = (0.3, 0.5, 0.9)
SEQS = (16, 64, 256)
KV = ("auto", "fp8")


def micro_batches(truth: GroundTruth, app: str, global_batch: int, ranks: int = 1) -> list[int]:
    """Micro-batches dividing each rank's part of the global batch by a power of two, from the default (the
    largest measured) down to the smallest measured."""
    lo, hi = truth.batch_range(app)
    if global_batch % ranks:  # a submitted count that does not divide it: the largest rank part (`runtime.split`)
        local = largest_part(global_batch, ranks)  # in the fewest micro-batches the largest measured batch allows
        return [math.ceil(local / math.ceil(local / hi))]
    m = default_micro(truth, app, global_batch // ranks)
    out = [m]
    while m % 2 == 0 and m // 2 >= lo:
        m //= 2
        out.append(m)
    return out


def _noise(job_id: int | str, name: str, seed: int, sigma: float) -> float:
    if sigma <= 0:
        return 1.0
    key = zlib.crc32(f"{seed}:{job_id}:{name}".encode())
    return float(np.exp(np.random.default_rng(key).normal(0.0, sigma)))


@dataclass(frozen=True)
class Errors:
    """Sigmas of the estimate's errors that are shared, not per shape (see `sim.belief`): the app's overall bias
    (`app`), the job's own (`job`), and the errors of the app's share exponent (`share`: speed × (share/100)^d)
    and data-parallel scaling (`scaling`: speed × ranks^r)."""

    app: float = 0.0
    job: float = 0.0
    share: float = 0.0
    scaling: float = 0.0

    def factor(self, job: TraceJob, seed: int, share: int, ranks: int) -> float:
        """The estimate's shared error on one shape of `job`, seeded by (seed, app) and (seed, job)."""
        if not (self.app or self.job or self.share or self.scaling):
            return 1.0
        log = math.log
        d = log(_noise(job.app, "share-exponent", seed, self.share))
        r = log(_noise(job.app, "scaling-exponent", seed, self.scaling))
        return (_noise(job.app, "app", seed, self.app) * _noise(job.job_id, "job", seed, self.job)
                * math.exp(d * log(max(share, 1) / 100) + r * log(max(ranks, 1))))


NO_ERRORS = Errors()


def batch_grid(truth: GroundTruth, app: str) -> list[int]:
    """The global batches a goodput family offers: the app's smallest measured batch times 1, 1.5, 2, 3, 4, 6, …
    up to its largest (the range Pollux searches, at about the density of its 50-point geometric grid's useful
    points)."""
    lo, hi = truth.batch_limits(app)
    out, b = set(), lo
    while b <= hi:
        out.add(b)
        if b % 2 == 0 and b * 3 // 2 <= hi:
            out.add(b * 3 // 2)
        b *= 2
    return sorted(out)


def other_batches(truth: GroundTruth, job: TraceJob) -> list[int]:
    """Global batches besides the job's own that its goodput family offers (`batch_grid`)."""
    return [b for b in batch_grid(truth, job.app) if b != job.global_batch]


@lru_cache(maxsize=4096)
def _epoch_bounds(truth: GroundTruth, app: str, global_batch: int, work: float) -> tuple[float, ...]:
    """Own-batch steps done at the end of each epoch (the last is `work`)."""
    ends = truth.epoch_ends(app, global_batch)
    return tuple(x * work for x in ends[:-1]) + (work,)


def efficiency_epoch(truth: GroundTruth, job: TraceJob, done: float) -> int:
    """The epoch (of the job's own batch) that `done` steps of its own batch fall in; the last one past its end."""
    bounds = _epoch_bounds(truth, job.app, job.global_batch, job.work)
    return min(bisect.bisect_right(bounds, done), len(bounds) - 1)


def efficiency_segment(truth: GroundTruth, job: TraceJob, batch: int, done: float) -> tuple[float, float]:
    """(steps of the job's own batch one step at `batch` is worth, own steps done when that next changes).

    The worth is Pollux's statistical efficiency relative to the own batch during the current epoch
    (`GroundTruth.efficiency_ratio`); it holds until the epoch ends. At the own batch it is 1 to the end
    (`job.work`), whatever the epoch: a job that keeps its batch is untouched by this.
    """
    if batch == job.global_batch:
        return 1.0, job.work
    e = efficiency_epoch(truth, job, done)
    until = _epoch_bounds(truth, job.app, job.global_batch, job.work)[e]
    return truth.efficiency_ratio(job.app, job.global_batch, batch, e), until


def gang_ranks(job: TraceJob, truth: GroundTruth, max_gpus: int) -> list[int]:
    """The data-parallel sizes (2 or more whole GPUs) a training job's family offers: powers of two up to
    `max_gpus` that divide its global batch and leave each rank at least the smallest measured batch, and the
    submitted count; none where the ground truth has no multi-GPU measurement of the app."""
    if job.kind != "train" or not truth.measured_on_several_gpus(job.app):
        return []
    lo, _ = truth.batch_range(job.app)
    out = {r for r in (2 ** k for k in range(1, 13)) if r <= max_gpus and job.global_batch % r == 0
           and job.global_batch // r >= lo}
    if job.gpus > 1:
        out.add(job.gpus)
    return sorted(out)


def packed(ranks: int, gpus_per_node: int) -> tuple[int, ...]:
    """The placement of `ranks` GPUs on the fewest nodes: full nodes, then the rest."""
    return (gpus_per_node,) * (ranks // gpus_per_node) + ((ranks % gpus_per_node,) if ranks % gpus_per_node else ())


@lru_cache(maxsize=8192)  # pure: each policy's run of a trace and seed asks again for the same (frozen) families
def family_of(job: TraceJob, truth: GroundTruth, shares: tuple[int, ...], gpu_mem_mib: float, noise: float = 0.0,
              seed: int = 0, adaptive: bool = False, max_gpus: int = 0, gpus_per_node: int = 4,
              whole_gpu_gangs: bool = False, errors: Errors = NO_ERRORS) -> Family | None:
    """The job's family as profiled, or None for a multi-GPU job the planner cannot reshape (no data-parallel
    shapes: `max_gpus` 0, inference, or an app measured on one GPU only); Slurm runs it as submitted.

    `adaptive` adds goodput shapes at the other global batches of `batch_grid`
    on whole GPUs (`goodput_shapes`), declared with a learning-rate rule
    (`lr_scaling: sqrt`). Their throughput is goodput in steps of the
    submitted batch per second (Pollux: throughput × statistical efficiency)
    during the job's first epoch; `at_epoch` gives it for a later one.
    Shapes are pruned to the Pareto front per global batch (the efficiency
    factor is common to one batch, so the fronts hold at every epoch).
    `whole_gpu_gangs`: a family with data-parallel shapes offers one GPU only
    whole (share 100), as elastico-submit starts it (`shapes.nodes.start_request`).
    `errors`: the estimate's shared errors on top of each shape's own `noise`
    (`Errors`; none by default: a profiled family).
    """
    ranks = gang_ranks(job, truth, max_gpus) if max_gpus else []
    if job.gpus > 1 and not ranks:
        return None
    levels = [100] if ranks and whole_gpu_gangs else sorted(set(shares) | {job.share})
    shapes: list[Shape] = []
    if job.kind == "train":
        for r in ranks:
            for m in micro_batches(truth, job.app, job.global_batch, r):
                mem = truth.train_mem_mib(job.app, m)
                if mem > gpu_mem_mib:
                    continue
                knobs = {"micro_batch": m, "precision": "fp32", "checkpointing": False}
                full = {**knobs, "accumulation": accumulation_for(job.global_batch, m, r), "ranks": r,
                        "global_batch": job.global_batch}
                name = gang_name(m, r)
                tput = (truth.gang_speed(job.app, job.global_batch, packed(r, gpus_per_node), m)
                        * _noise(job.job_id, name, seed, noise) * errors.factor(job, seed, 100, r))
                shapes.append(Shape(name, Resources(0, int(mem), TRAIN_CPUS * r, TRAIN_HOST_MIB * r, gpus=r), tput,
                                    tuple(sorted(full.items()))))
        for m in micro_batches(truth, job.app, job.global_batch):
            mem = truth.train_mem_mib(job.app, m)
            if mem > gpu_mem_mib:
                continue
            knobs = {"micro_batch": m, "precision": "fp32", "checkpointing": False}
            full: dict[str, object] = {**knobs, "accumulation": job.global_batch // m, "global_batch": job.global_batch}
            for s in levels:
                name = shape_name("train", knobs, s)
                tput = (truth.train_speed(job.app, job.global_batch, m, s) * _noise(job.job_id, name, seed, noise)
                        * errors.factor(job, seed, s, 1))
                shapes.append(Shape(name, Resources(s, int(mem), TRAIN_CPUS, TRAIN_HOST_MIB), tput,
                                    tuple(sorted(full.items()))))
        if adaptive:
            shapes += [Shape(c.name, c.resources, c.speed * truth.efficiency_ratio(job.app, job.global_batch, c.batch, 0)
                             * _noise(job.job_id, c.name, seed, noise)
                             * errors.factor(job, seed, c.resources.mps or 100, c.resources.gpus or 1), c.knobs)
                       for c in goodput_shapes(job, truth, levels[-1], gpu_mem_mib, max_gpus, gpus_per_node)]
        if job.gpus > 1:
            default = gang_name(micro_batches(truth, job.app, job.global_batch, job.gpus)[0], job.gpus)
        else:
            default = shape_name("train", {"micro_batch": default_micro(truth, job.app, job.global_batch),
                                           "precision": "fp32", "checkpointing": False}, job.share)
    else:
        for gmu in GMUS:
            for n in SEQS:
                for kv in KV:
                    knobs = {"gpu_memory_utilization": gmu, "max_num_seqs": n, "kv_cache_dtype": kv}
                    for s in levels:
                        true = truth.infer_speed(job.context_tokens, job.generated_tokens, gmu, n, kv, s, gpu_mem_mib)
                        if true <= 0:
                            continue
                        name = shape_name("infer", knobs, s)
                        shapes.append(Shape(name, Resources(s, int(gmu * gpu_mem_mib), INFER_CPUS, INFER_HOST_MIB),
                                            true * _noise(job.job_id, name, seed, noise) * errors.factor(job, seed, s, 1),
                                            tuple(sorted(knobs.items()))))
        default = shape_name("infer", {"gpu_memory_utilization": GMUS[-1], "max_num_seqs": SEQS[-1],
                                       "kv_cache_dtype": "auto"}, job.share)
    if default not in {s.name for s in shapes}:
        fits = ([s for s in shapes if s.resources.gpus == job.gpus] if job.gpus > 1
                else [s for s in shapes if s.resources.mps == job.share]) or shapes
        default = max(fits, key=lambda s: s.throughput).name
    groups: dict[object, list[Shape]] = {}
    for s in shapes:
        groups.setdefault(s.knob("global_batch"), []).append(s)
    kept = tuple(s for group in groups.values() for s in pareto(group, keep=default))
    return Family(kind=job.kind, shapes=kept, total_work=float(job.work), name=job.app, default=default)


@dataclass(frozen=True)
class GoodputShape:
    """A shape at another global batch before profiling: `speed` is its true optimizer steps/s at `batch`."""

    name: str
    resources: Resources
    speed: float
    batch: int
    knobs: tuple[tuple[str, object], ...]


def goodput_shapes(job: TraceJob, truth: GroundTruth, share: int, gpu_mem_mib: float, max_gpus: int,
                   gpus_per_node: int) -> list[GoodputShape]:
    """The job's shapes at the other global batches of `batch_grid`, on whole GPUs.

    One GPU at `share` (each micro-batch `micro_batches` allows); r = 2..`max_gpus` GPUs on the fewest nodes
    where the app was measured on several, as Pollux sizes a batch b on r GPUs: each takes ceil(b / r) samples
    in the fewest micro-steps its largest measured batch allows, so the batch run is r × micro × steps (shapes
    that land on the job's own batch are its own gang shapes, not repeated here). No rank below the smallest
    measured per-GPU batch.
    """
    lo, hi = truth.batch_range(job.app)
    out: list[GoodputShape] = []
    seen: set[tuple[int, int]] = set()
    several = max_gpus >= 2 and truth.measured_on_several_gpus(job.app)
    for b in other_batches(truth, job):
        for m in micro_batches(truth, job.app, b):
            mem = truth.train_mem_mib(job.app, m)
            if mem > gpu_mem_mib:
                continue
            knobs = {"micro_batch": m, "precision": "fp32", "checkpointing": False}
            full: dict[str, object] = {**knobs, "accumulation": b // m, "global_batch": b, "lr_scaling": "sqrt"}
            out.append(GoodputShape(f"gb{b}-" + shape_name("train", knobs, share),
                                    Resources(share, int(mem), TRAIN_CPUS, TRAIN_HOST_MIB),
                                    truth.train_speed(job.app, b, m, share), b, tuple(sorted(full.items()))))
        for r in range(2, max_gpus + 1) if several else ():
            local = b / r
            if local < lo:
                break
            steps = math.ceil(local / hi - 1e-9)
            m = math.ceil(local / steps - 1e-9)
            g = r * m * steps
            mem = truth.train_mem_mib(job.app, m)
            if g == job.global_batch or (g, r) in seen or mem > gpu_mem_mib:
                continue
            seen.add((g, r))
            full = {"micro_batch": m, "precision": "fp32", "checkpointing": False, "accumulation": steps, "ranks": r,
                    "global_batch": g, "lr_scaling": "sqrt"}
            out.append(GoodputShape(f"gb{g}-{gang_name(m, r)}",
                                    Resources(0, int(mem), TRAIN_CPUS * r, TRAIN_HOST_MIB * r, gpus=r),
                                    truth.gang_speed(job.app, g, packed(r, gpus_per_node), m), g,
                                    tuple(sorted(full.items()))))
    return out


def at_epoch(fam: Family, job: TraceJob, truth: GroundTruth, epoch: int) -> Family:
    """`fam` (as `family_of` made it: goodput of the first epoch) with every other-batch shape's goodput at the
    statistical efficiency of `epoch` of the job's own batch (what the job's gradient statistics show then)."""
    if epoch == 0:
        return fam
    shapes = []
    for s in fam.shapes:
        b = s.knob("global_batch", job.global_batch)
        if b != job.global_batch:
            ratio = truth.efficiency_ratio(job.app, job.global_batch, b, epoch)
            s = dataclasses.replace(s, throughput=s.throughput * ratio / truth.efficiency_ratio(
                job.app, job.global_batch, b, 0))  # the shape's type (and anything else it carries) kept
        shapes.append(s)
    return dataclasses.replace(fam, shapes=tuple(shapes))


def gang_name(micro: int, ranks: int) -> str:
    return f"mb{micro}-fp32-gpus{ranks}"


def fastest_speed(job: TraceJob, truth: GroundTruth, gpu_mem_mib: float, adaptive: bool = False,
                  max_gpus: int = 0, gpus_per_node: int = 4) -> float:
    """The job's true speed alone at its fastest shape (any knobs, a whole GPU or any data-parallel size its
    family offers, on the fewest nodes): the lower bound's rate. With `adaptive` goodput shapes, the fastest
    shape of each epoch: the work over the sum of each epoch's work at its fastest goodput."""
    ranks = gang_ranks(job, truth, max_gpus) if max_gpus else []
    gang = max((truth.gang_speed(job.app, job.global_batch, packed(r, gpus_per_node), m)
                for r in ranks for m in micro_batches(truth, job.app, job.global_batch, r)
                if truth.train_mem_mib(job.app, m) <= gpu_mem_mib), default=0.0)
    if job.kind != "train":
        return max(truth.infer_speed(job.context_tokens, job.generated_tokens, g, n, kv, 100, gpu_mem_mib)
                   for g in GMUS for n in SEQS for kv in KV)
    if job.gpus > 1:
        own = max(gang, truth.rigid_speed(job.app, job.global_batch, job.gpus, gpus_per_node=gpus_per_node))
    else:
        own = max(gang, *(truth.train_speed(job.app, job.global_batch, m, 100)
                          for m in micro_batches(truth, job.app, job.global_batch)
                          if truth.train_mem_mib(job.app, m) <= gpu_mem_mib
                          or m == default_micro(truth, job.app, job.global_batch)))
    if not adaptive:
        return own
    return _adaptive_speed(truth, job.app, job.global_batch, job.work, own, gpu_mem_mib, max_gpus, gpus_per_node)


@lru_cache(maxsize=1024)
def _adaptive_speed(truth: GroundTruth, app: str, global_batch: int, work: float, own: float, gpu_mem_mib: float,
                    max_gpus: int, gpus_per_node: int) -> float:
    job = TraceJob(0, 0.0, "train", app, 1, work, global_batch)
    fastest: dict[int, float] = {}
    for c in goodput_shapes(job, truth, 100, gpu_mem_mib, max_gpus, gpus_per_node):
        fastest[c.batch] = max(fastest.get(c.batch, 0.0), c.speed)
    bounds = (0.0,) + _epoch_bounds(truth, app, global_batch, work)
    seconds = 0.0
    for e in range(len(bounds) - 1):
        best = max(own, *(v * truth.efficiency_ratio(app, global_batch, b, e) for b, v in fastest.items()))
        seconds += (bounds[e + 1] - bounds[e]) / best
    return work / seconds
