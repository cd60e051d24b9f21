"""The planner's view of each simulated job: a `Family` of shapes with *profiled* throughputs.

What `elastico profile` would record: the ground truth's solo speed of each
shape times a seeded measurement error (lognormal, `noise` = its sigma), the
shape's GPU memory, and the job's CPUs and host memory. Co-location never
enters a family; the policy learns about it only from its own interference
model. Shapes are pruned to the Pareto front as `shapes.build_family` does,
keeping the submitted (default) shape.

Training shapes: micro-batch = global batch / 2^k within the measured per-GPU
batches (fp32, no activation checkpointing: what Pollux measured), times the
MPS shares; and data-parallel shapes of r whole GPUs (r = 2, 4, 8, … up to
`max_gpus`, and the submitted count) at the SAME global batch: each rank
takes global batch / r, in micro-batches of the same power-of-two rule,
accumulated to it (only where r divides the global batch, so every shape
does exactly the same optimizer steps; the submitted count is kept even if
it does not divide it, as the user submitted it). A job submitted with r > 1
GPUs defaults to its r-GPU shape. Inference shapes: vLLM `gpu_memory_utilization` × `max_num_seqs`
× KV dtype × shares.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from slurm_elastico.model import Family, Resources, Shape
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
    if global_batch % ranks:  # a submitted count that does not divide it: rounded up, as the user ran it
        local = global_batch / ranks
        return [math.ceil(local / math.ceil(local / hi))]
    m = default_micro(truth, app, global_batch // ranks)
    out = [m]
    while m % 2 == 0 and m // 2 >= lo:
        m //= 2
        out.append(m)
    return out


def _noise(job_id: int, name: str, seed: int, sigma: float) -> float:
    if sigma <= 0:
        return 1.0
    key = zlib.crc32(f"{seed}:{job_id}:{name}".encode())
    return float(np.exp(np.random.default_rng(key).normal(0.0, sigma)))


def other_batches(truth: GroundTruth, job: TraceJob) -> list[int]:
    """Global batches besides the job's own at which the app's iterations to the end were measured."""
    _, hi = truth.batch_range(job.app)
    return sorted(b for b in truth.iterations.get(job.app, {}) if b != job.global_batch and b <= 4 * hi)


def goodput_factor(truth: GroundTruth, job: TraceJob, batch: int) -> float:
    """Steps of the job's own batch one step at `batch` is worth: measured iterations to the end, G over B."""
    if batch == job.global_batch:
        return 1.0
    return truth.iterations_to_end(job.app, job.global_batch) / truth.iterations_to_end(job.app, batch)


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


def family_of(job: TraceJob, truth: GroundTruth, shares: tuple[int, ...], gpu_mem_mib: float, noise: float = 0.0,
              seed: int = 0, adaptive: bool = False, max_gpus: int = 0, gpus_per_node: int = 4) -> Family | None:
    """The job's family as profiled, or None for a multi-GPU job the planner cannot reshape (no data-parallel
    shapes: `max_gpus` 0, inference, or an app measured on one GPU only); Slurm runs it as submitted.

    `adaptive` adds shapes at the other measured global batches, declared with
    a learning-rate rule (`lr_scaling: sqrt`); their throughput is goodput in
    steps of the submitted batch per second (Pollux: throughput × statistical
    efficiency, here measured as iterations to the same end).
    """
    ranks = gang_ranks(job, truth, max_gpus) if max_gpus else []
    if job.gpus > 1 and not ranks:
        return None
    levels = sorted(set(shares) | {job.share})
    shapes: list[Shape] = []
    if job.kind == "train":
        for r in ranks:
            for m in micro_batches(truth, job.app, job.global_batch, r):
                mem = truth.train_mem_mib(job.app, m)
                if mem > gpu_mem_mib:
                    continue
                knobs = {"micro_batch": m, "precision": "fp32", "checkpointing": False}
                full = {**knobs, "accumulation": math.ceil(job.global_batch / (r * m)), "ranks": r,
                        "global_batch": job.global_batch}
                name = gang_name(m, r)
                tput = (truth.gang_speed(job.app, job.global_batch, packed(r, gpus_per_node), m)
                        * _noise(job.job_id, name, seed, noise))
                shapes.append(Shape(name, Resources(0, int(mem), TRAIN_CPUS * r, TRAIN_HOST_MIB * r, gpus=r), tput,
                                    tuple(sorted(full.items()))))
        for batch in [job.global_batch] + (other_batches(truth, job) if adaptive else []):
            factor = goodput_factor(truth, job, batch)
            for m in micro_batches(truth, job.app, batch):
                mem = truth.train_mem_mib(job.app, m)
                if mem > gpu_mem_mib:
                    continue
                knobs = {"micro_batch": m, "precision": "fp32", "checkpointing": False}
                full: dict[str, object] = {**knobs, "accumulation": batch // m, "global_batch": batch}
                prefix = ""
                if batch != job.global_batch:
                    full["lr_scaling"] = "sqrt"
                    prefix = f"gb{batch}-"
                for s in levels:
                    name = prefix + shape_name("train", knobs, s)
                    tput = truth.train_speed(job.app, batch, m, s) * factor * _noise(job.job_id, name, seed, noise)
                    shapes.append(Shape(name, Resources(s, int(mem), TRAIN_CPUS, TRAIN_HOST_MIB), tput,
                                        tuple(sorted(full.items()))))
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
                                            true * _noise(job.job_id, name, seed, noise), tuple(sorted(knobs.items()))))
        default = shape_name("infer", {"gpu_memory_utilization": GMUS[-1], "max_num_seqs": SEQS[-1],
                                       "kv_cache_dtype": "auto"}, job.share)
    if default not in {s.name for s in shapes}:
        fits = ([s for s in shapes if s.resources.gpus == job.gpus] if job.gpus > 1
                else [s for s in shapes if s.resources.mps == job.share]) or shapes
        default = max(fits, key=lambda s: s.throughput).name
    return Family(kind=job.kind, shapes=tuple(pareto(shapes, keep=default)), total_work=float(job.work),
                  name=job.app, default=default)


def gang_name(micro: int, ranks: int) -> str:
    return f"mb{micro}-fp32-gpus{ranks}"


def fastest_speed(job: TraceJob, truth: GroundTruth, gpu_mem_mib: float, adaptive: bool = False,
                  max_gpus: int = 0, gpus_per_node: int = 4) -> float:
    """The job's true speed alone at its fastest shape (any knobs, a whole GPU or any data-parallel size its
    family offers, on the fewest nodes): the lower bound's rate."""
    ranks = gang_ranks(job, truth, max_gpus) if max_gpus else []
    gang = max((truth.gang_speed(job.app, job.global_batch, packed(r, gpus_per_node), m)
                for r in ranks for m in micro_batches(truth, job.app, job.global_batch, r)
                if truth.train_mem_mib(job.app, m) <= gpu_mem_mib), default=0.0)
    if job.gpus > 1:
        return max(gang, truth.rigid_speed(job.app, job.global_batch, job.gpus, gpus_per_node=gpus_per_node))
    if job.kind == "train":
        batches = [job.global_batch] + (other_batches(truth, job) if adaptive else [])
        return max(gang, *(truth.train_speed(job.app, b, m, 100) * goodput_factor(truth, job, b)
                   for b in batches for m in micro_batches(truth, job.app, b)
                   if truth.train_mem_mib(job.app, m) <= gpu_mem_mib or m == default_micro(truth, job.app, b)))
    return max(truth.infer_speed(job.context_tokens, job.generated_tokens, g, n, kv, 100, gpu_mem_mib)
               for g in GMUS for n in SEQS for kv in KV)
