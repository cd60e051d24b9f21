"""The planner's view of each simulated job: a `Family` of shapes with *profiled* throughputs.

What `elastico profile` would record: the ground truth's solo speed of each
shape times a seeded measurement error (lognormal, `noise` = its sigma), the
shape's GPU memory, and the job's CPUs and host memory. Co-location never
enters a family; the policy learns about it only from its own interference
model. Shapes are pruned to the Pareto front as `shapes.build_family` does,
keeping the submitted (default) shape.

Training shapes: micro-batch = global batch / 2^k within the measured per-GPU
batches (fp32, no activation checkpointing: what Pollux measured), times the
MPS shares. Inference shapes: vLLM `gpu_memory_utilization` × `max_num_seqs`
× KV dtype × shares.
"""

from __future__ import annotations

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


def micro_batches(truth: GroundTruth, app: str, global_batch: int) -> list[int]:
    """Micro-batches dividing the global batch by a power of two, from the default down to the smallest measured."""
    lo, _ = truth.batch_range(app)
    m = default_micro(truth, app, global_batch)
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


def family_of(job: TraceJob, truth: GroundTruth, shares: tuple[int, ...], gpu_mem_mib: float, noise: float = 0.0,
              seed: int = 0, adaptive: bool = False) -> Family | None:
    """The job's family as profiled, or None for a rigid multi-GPU job (the planner leaves it to Slurm).

    `adaptive` adds shapes at the other measured global batches, declared with
    a learning-rate rule (`lr_scaling: sqrt`); their throughput is goodput in
    steps of the submitted batch per second (Pollux: throughput × statistical
    efficiency, here measured as iterations to the same end).
    """
    if job.gpus > 1:
        return None
    levels = sorted(set(shares) | {job.share})
    shapes: list[Shape] = []
    if job.kind == "train":
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
        fits = [s for s in shapes if s.resources.mps == job.share] or shapes
        default = max(fits, key=lambda s: s.throughput).name
    return Family(kind=job.kind, shapes=tuple(pareto(shapes, keep=default)), total_work=float(job.work),
                  name=job.app, default=default)


def fastest_speed(job: TraceJob, truth: GroundTruth, gpu_mem_mib: float, adaptive: bool = False) -> float:
    """The job's true speed alone at its fastest shape (a whole GPU, any knobs): the lower bound's rate."""
    if job.gpus > 1:
        return truth.rigid_speed(job.app, job.global_batch, job.gpus)
    if job.kind == "train":
        batches = [job.global_batch] + (other_batches(truth, job) if adaptive else [])
        return max(truth.train_speed(job.app, b, m, 100) * goodput_factor(truth, job, b)
                   for b in batches for m in micro_batches(truth, job.app, b)
                   if truth.train_mem_mib(job.app, m) <= gpu_mem_mib or m == default_micro(truth, job.app, b))
    return max(truth.infer_speed(job.context_tokens, job.generated_tokens, g, n, kv, 100, gpu_mem_mib)
               for g in GMUS for n in SEQS for kv in KV)
