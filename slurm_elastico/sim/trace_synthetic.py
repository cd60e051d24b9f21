"""A synthetic mixed training/inference trace: Philly's durations, Azure's request sizes, a chosen offered load.

`MixSpec` says how many jobs on how many GPUs at what load; `synthetic` draws
them (seeded), so a seed is a different trace.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.trace import INFER_APP, TraceJob, default_micro, train_batch, validate
from slurm_elastico.sim.trace_azure import azure_requests, llm_tokens
from slurm_elastico.sim.trace_philly import single_gpu_durations
from slurm_elastico.sim.truth import GPU_MEM_MIB, GroundTruth


@dataclass(frozen=True)
class MixSpec:
    """A synthetic mixed trace: Poisson arrivals sized so the offered load is `load` of the cluster."""

    n_jobs: int = 400
    gpus: int = 64
    load: float = 1.0
    infer_fraction: float = 0.3
    multi_gpu_fraction: float = 0.0
    max_duration_s: float = 12 * 3600.0
    min_duration_s: float = 120.0
    gpu_memory_mib: float = GPU_MEM_MIB


def synthetic(spec: MixSpec, seed: int = 0, truth: GroundTruth | None = None) -> list[TraceJob]:
    """Training and inference jobs whose whole-GPU durations follow Philly's single-GPU jobs.

    Each job's duration alone on a whole GPU at its submitted shape is drawn
    from Philly's single-GPU durations (clipped to [min, max]); training jobs
    get a profiled app and measured global batch, inference jobs the mean
    tokens of a random 5-minute window of the Azure trace. The arrival rate is
    set from the drawn durations so that Σ GPU-seconds / (GPUs × span) = load.
    """
    truth = truth or GroundTruth()
    for name in ("n_jobs", "gpus"):
        if getattr(spec, name) < 1:
            raise ConfigError("synthetic trace", [f"{name} must be >= 1"])
    if spec.load <= 0 or not 0 <= spec.infer_fraction <= 1:
        raise ConfigError("synthetic trace", ["load must be > 0 and infer_fraction in [0, 1]"])
    rng = np.random.default_rng(seed)
    durations = single_gpu_durations()
    req = azure_requests()
    jobs, gpu_seconds = [], 0.0
    for i in range(spec.n_jobs):
        dur = float(np.clip(durations[int(rng.integers(0, len(durations)))], spec.min_duration_s, spec.max_duration_s))
        if rng.random() < spec.infer_fraction:
            ctx, gen = llm_tokens(req, rng)
            speed = truth.infer_speed(ctx, gen, 0.9, 256, "auto", 100, spec.gpu_memory_mib)
            jobs.append(TraceJob(i + 1, 0.0, "infer", INFER_APP, 1, max(1.0, round(dur * speed)), 0, 100, ctx, gen))
            gpu_seconds += dur
        else:
            app = truth.apps[int(rng.integers(0, len(truth.apps)))]
            batch = train_batch(truth, app, rng)
            gpus = int(rng.choice([2, 4, 8])) if rng.random() < spec.multi_gpu_fraction else 1
            speed = (truth.train_speed(app, batch, default_micro(truth, app, batch), 100) if gpus == 1
                     else truth.rigid_speed(app, batch, gpus))
            jobs.append(TraceJob(i + 1, 0.0, "train", app, gpus, max(1.0, round(dur * speed)), batch))
            gpu_seconds += dur * gpus
    span = gpu_seconds / (spec.gpus * spec.load)
    gaps = rng.exponential(1.0, spec.n_jobs)
    times = np.cumsum(gaps)
    times = (times - times[0]) * span / max(times[-1] - times[0], 1e-9)
    out = [replace(j, submit_s=float(round(t, 3))) for j, t in zip(jobs, times)]
    validate(out, truth, "synthetic trace")
    return out
