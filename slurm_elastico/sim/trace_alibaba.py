"""Alibaba's GPU-sharing trace (cluster-trace-gpu-v2023) as a simulator trace, and a cluster sized for it.

Pods asking for part of a GPU become inference jobs at that MPS share; whole-GPU
pods become training jobs (several GPUs: rigid). The trace says nothing of
models, so those are drawn (seeded). It states no license, so it is not
bundled: `alibaba_slice` and `alibaba` read the original CSV from a path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.datafiles import read_rows
from slurm_elastico.sim.trace import INFER_APP, TraceJob, default_micro, train_batch, validate
from slurm_elastico.sim.trace_azure import azure_requests, llm_tokens
from slurm_elastico.sim.truth import GPU_MEM_MIB, GroundTruth

ALIBABA_COLUMNS = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time")


@dataclass(frozen=True)
class AlibabaSlice:
    """The jobs of a window of Alibaba's GPU-sharing trace, with what sizing a cluster for them needs."""

    jobs: list[TraceJob]
    gpu_seconds: float
    """What the slice's pods held in the trace during its arrival span: Σ GPUs (`gpu_milli` / 1000 of one for a
    shared GPU) × the part of the pod's run (scheduled to deleted, capped) within the first to last submission."""
    start_s: float
    """When the slice's first job was submitted, in the trace's seconds (its jobs' `submit_s` count from here)."""
    span_s: float
    """First to last submission of the slice."""
    skipped: dict[str, int]
    """Pods of the window left out, by reason (no GPU request, never scheduled, no run time)."""

    def load_on(self, gpus: int) -> float:
        """The slice's demand on `gpus` GPUs: the mean GPUs its pods held while they arrived, over `gpus`."""
        return self.gpu_seconds / (gpus * max(self.span_s, 1.0))

    def gpus_for(self, load: float, gpus_per_node: int) -> int:
        """The fewest whole nodes of GPUs on which `load_on` is at most `load`, and at least the largest job's GPUs.

        The demand counts a pod's run only while the slice's jobs arrive, so a
        few pods of days (the trace has pods of weeks) do not size the
        cluster for time after the slice; at `load` 1 the cluster holds on
        average what the pods held in the trace, with their GPU shares.
        """
        if not (load > 0 and math.isfinite(load)):
            raise ConfigError("alibaba", [f"load {load!r} must be a finite number > 0"])
        if gpus_per_node < 1:
            raise ConfigError("alibaba", [f"gpus_per_node {gpus_per_node} must be >= 1"])
        need = max(self.load_on(1) / load, max(j.gpus for j in self.jobs), 1)
        return math.ceil(need / gpus_per_node) * gpus_per_node


def alibaba_slice(path: str | Path, truth: GroundTruth | None = None, seed: int = 0, start_h: float = 0.0,
                  hours: float | None = None, infer_below_milli: int = 1000,
                  max_duration_s: float | None = 7 * 86400.0) -> AlibabaSlice:
    """Pods of Alibaba's GPU-sharing trace (`openb_pod_list_default.csv`) created in [start_h, start_h + hours)
    hours from the trace's start (`hours` None: to its end) that asked for a GPU and ran.

    A pod asking for part of a GPU (`gpu_milli` < `infer_below_milli`)
    becomes an inference job asking for that MPS share; whole-GPU pods become
    training jobs (`num_gpu` > 1: rigid). The trace says nothing of models:
    those are drawn (seeded). Duration = deletion − scheduled time (capped at
    `max_duration_s`: a pod still running at the trace's end was cut there);
    work = duration × speed alone at the requested shape. A pod never
    scheduled (phase Pending, no `scheduled_time`) never ran and is left out,
    as is one with no run time; `skipped` counts them. Submissions are from
    the slice's first pod; `job_id` is the pod's row in the file (1 = the
    first pod), so an error about a job names a row one can find. Pods
    created before the window and still running in it are not in the slice.
    """
    truth = truth or GroundTruth()
    where = str(path)
    problems = []
    if not (start_h >= 0 and math.isfinite(start_h)):
        problems.append(f"start_h {start_h!r} must be a finite number of hours >= 0")
    if hours is not None and not (hours > 0 and math.isfinite(hours)):
        problems.append(f"hours {hours!r} must be a finite number > 0 (or None: to the trace's end)")
    if max_duration_s is not None and not max_duration_s > 0:
        problems.append(f"max_duration_s {max_duration_s!r} must be > 0 (or None: no cap)")
    if not 1 <= infer_below_milli <= 1000:
        problems.append(f"infer_below_milli {infer_below_milli!r} must be in 1..1000")
    if problems:
        raise ConfigError("alibaba", problems)
    rows = read_rows(Path(path))
    missing = [c for c in ALIBABA_COLUMNS if rows and c not in rows[0]]
    if missing:
        raise ConfigError(where, [f"missing column(s) {', '.join(missing)}; expected {', '.join(ALIBABA_COLUMNS)} "
                                  "(openb_pod_list_*.csv of Alibaba's cluster-trace-gpu-v2023)"])
    lo, hi = start_h * 3600.0, math.inf if hours is None else (start_h + hours) * 3600.0
    rng = np.random.default_rng(seed)
    req = azure_requests()
    jobs, runs, skipped = [], [], {"no GPU request": 0, "never scheduled": 0, "no run time": 0}
    for row, r in enumerate(rows, start=1):
        bad = [f"{c} {r[c]!r}" for c, kind in _ALIBABA_NUMBERS.items() if not _parses(r[c], kind)]
        if bad:
            problems.append(f"pod row {row} ({r['name']}): {', '.join(bad)} is not a number (integers for "
                            "num_gpu and gpu_milli; seconds for the times, empty where the trace has none)")
            continue
        n, milli, submit = int(r["num_gpu"] or 0), int(r["gpu_milli"] or 0), float(r["creation_time"] or "nan")
        stop = float(r["deletion_time"] or "nan")
        sched = float(r["scheduled_time"]) if r["scheduled_time"] else None
        if not lo <= submit < hi:  # a pod with no creation time (NaN) is in no window
            continue
        if n < 1 or milli < 1:
            skipped["no GPU request"] += 1
            continue
        if sched is None:
            skipped["never scheduled"] += 1
            continue
        dur = stop - sched
        if not dur > 0:  # also a missing deletion time (NaN)
            skipped["no run time"] += 1
            continue
        if max_duration_s:
            dur = min(dur, max_duration_s)
        if n == 1 and milli < infer_below_milli:
            share = max(1, min(100, int(round(milli / 10))))
            ctx, gen = llm_tokens(req, rng)
            speed = truth.infer_speed(ctx, gen, 0.9, 256, "auto", share, GPU_MEM_MIB)
            if speed <= 0:
                problems.append(f"pod row {row} ({r['name']}): no vLLM engine fits share {share} of a GPU")
                continue
            jobs.append(TraceJob(row, submit, "infer", INFER_APP, 1, dur * speed, 0, share, ctx, gen))
            runs.append((sched, sched + dur, share / 100.0))
        else:
            app = truth.apps[int(rng.integers(0, len(truth.apps)))]
            batch = train_batch(truth, app, rng)
            speed = (truth.train_speed(app, batch, default_micro(truth, app, batch), 100) if n == 1
                     else truth.rigid_speed(app, batch, n))
            jobs.append(TraceJob(row, submit, "train", app, n, dur * speed, batch))
            runs.append((sched, sched + dur, float(n)))
    if problems:
        raise ConfigError(where, problems)
    if not jobs:
        window = f"[{start_h:g} h, {'end' if hours is None else f'{start_h + hours:g} h'})"
        raise ConfigError(where, [f"no pod created in {window} asked for a GPU and ran "
                                  f"({', '.join(f'{k}: {v}' for k, v in skipped.items())}); the file has "
                                  f"{len(rows)} pod(s)"])
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    t0, t1 = jobs[0].submit_s, jobs[-1].submit_s
    held = sum(g * max(0.0, min(b, t1) - max(a, t0)) for a, b, g in runs)
    jobs = [replace(j, submit_s=j.submit_s - t0) for j in jobs]
    validate(jobs, truth, where)
    return AlibabaSlice(jobs, held, t0, t1 - t0, skipped)


_ALIBABA_NUMBERS = {"num_gpu": int, "gpu_milli": int, "creation_time": float, "deletion_time": float,
                    "scheduled_time": float}


def _parses(text: str, kind: type) -> bool:
    try:
        kind(text or 0)
    except ValueError:
        return False
    return True


def alibaba(path: str | Path, truth: GroundTruth | None = None, seed: int = 0, start_h: float = 0.0,
            hours: float | None = None, infer_below_milli: int = 1000,
            max_duration_s: float | None = 7 * 86400.0) -> list[TraceJob]:
    """The jobs of `alibaba_slice` (the whole trace by default)."""
    return alibaba_slice(path, truth, seed, start_h, hours, infer_below_milli, max_duration_s).jobs
