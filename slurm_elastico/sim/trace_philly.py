"""Microsoft's Philly trace as a simulator trace: arrivals, GPUs and durations, with drawn models.

`philly` replays a window of submissions; `single_gpu_durations` are the
one-GPU jobs' run times, from which `trace_synthetic` draws its durations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.datafiles import DATA, read_rows
from slurm_elastico.sim.trace import TraceJob, default_micro, train_batch, validate
from slurm_elastico.sim.truth import GroundTruth

PHILLY_COLUMNS = ("submit_s", "duration_s", "num_gpus")


def philly(path: str | Path | None = None, truth: GroundTruth | None = None, seed: int = 0, start_s: float = 0.0,
           hours: float = 24.0, max_duration_s: float | None = 7 * 86400.0) -> list[TraceJob]:
    """Philly jobs submitted in [start_s, start_s + hours): arrival, GPUs and duration from the trace.

    Philly has no model names: each job gets a profiled app and a global batch
    at random (seeded), and its work is its duration times its speed alone at
    its submitted shape, so a job alone on plain Slurm takes its measured time.
    """
    truth = truth or GroundTruth()
    rng = np.random.default_rng(seed)
    end = start_s + hours * 3600.0
    jobs = []
    where = str(path or "philly")
    rows = read_rows(Path(path) if path else DATA / "philly.csv.gz")
    missing = [c for c in PHILLY_COLUMNS if rows and c not in rows[0]]
    if missing:
        raise ConfigError(where, [f"missing column(s) {', '.join(missing)}; allowed: a Philly trace with columns "
                                  f"{','.join(PHILLY_COLUMNS)}"])
    for i, r in enumerate(rows, start=2):
        try:
            t, dur, gpus = float(r["submit_s"]), float(r["duration_s"]), max(1, int(r["num_gpus"]))
        except (ValueError, TypeError) as exc:  # TypeError: a short row's missing cell is None
            raise ConfigError(where, [f"row {i}: {exc if isinstance(exc, ValueError) else 'fewer cells than the header'}"
                                      "; allowed: seconds for submit_s and duration_s, an integer for num_gpus"]) from None
        if t < start_s:
            continue
        if t >= end:
            break
        if dur <= 0:
            continue
        if max_duration_s:
            dur = min(dur, max_duration_s)
        app = truth.apps[int(rng.integers(0, len(truth.apps)))]
        batch = train_batch(truth, app, rng)
        speed = (truth.train_speed(app, batch, default_micro(truth, app, batch), 100) if gpus == 1
                 else truth.rigid_speed(app, batch, gpus))
        jobs.append(TraceJob(len(jobs) + 1, t - start_s, "train", app, gpus, dur * speed, batch))
    validate(jobs, truth, "philly")
    return jobs

_PHILLY_CACHE: list[np.ndarray] = []


def single_gpu_durations() -> np.ndarray:
    """Run times of Philly's one-GPU jobs that ran (read once, then kept)."""
    if not _PHILLY_CACHE:
        rows = read_rows(DATA / "philly.csv.gz")
        _PHILLY_CACHE.append(np.array([float(r["duration_s"]) for r in rows
                                       if r["num_gpus"] == "1" and float(r["duration_s"]) > 0]))
    return _PHILLY_CACHE[0]
