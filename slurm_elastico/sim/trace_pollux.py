"""Pollux's workloads as simulator traces: the eight bundled ones, or a file in their format.

A Pollux workload gives each job's arrival, app, GPUs and global batch; its
work is the measured iterations to the app's end at that batch
(`GroundTruth.iterations_to_end`). Nothing is drawn, so the trace is fixed
(its replicas differ by `trace.jitter_arrivals`).
"""

from __future__ import annotations

from pathlib import Path

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.datafiles import DATA, read_rows
from slurm_elastico.sim.trace import TraceJob, validate
from slurm_elastico.sim.truth import GroundTruth

POLLUX_WORKLOADS = 8
"""Bundled Pollux workloads: workload-1.csv .. workload-8.csv."""
POLLUX_COLUMNS = ("time", "application", "num_replicas", "batch_size")


def pollux(path: str | Path | int = 1, truth: GroundTruth | None = None, single_gpu: bool = False) -> list[TraceJob]:
    """A Pollux workload (`name,time,application,num_replicas,batch_size`); an int picks a bundled one (1..8).

    Work = the measured iterations to the app's end at the job's global batch
    (`pollux_iterations.csv`). `single_gpu` runs every job on one GPU (same
    steps, same global batch, hence longer), so all of them can be shaped.
    """
    truth = truth or GroundTruth()
    if isinstance(path, int) and not 1 <= path <= POLLUX_WORKLOADS:
        raise ConfigError("trace", [f"pollux:{path}: no such bundled workload; allowed: pollux:N with N in "
                                    f"1..{POLLUX_WORKLOADS}, or pollux:PATH"])
    p = DATA / "pollux_workloads" / f"workload-{path}.csv" if isinstance(path, int) else Path(path)
    rows = read_rows(p)
    missing = [c for c in POLLUX_COLUMNS if rows and c not in rows[0]]
    if missing:
        raise ConfigError(str(p), [f"missing column(s) {', '.join(missing)}; allowed: a Pollux workload with "
                                   f"columns {','.join(POLLUX_COLUMNS)}"])
    jobs, problems = [], []
    for i, r in enumerate(rows):
        try:
            app, batch = (r["application"] or "").strip(), int(r["batch_size"])
            gpus = 1 if single_gpu else max(1, int(r["num_replicas"]))
            submit = float(r["time"])
        except (ValueError, TypeError) as exc:  # TypeError: a short row's missing cell is None
            problems.append(f"row {i + 2}: {exc if isinstance(exc, ValueError) else 'fewer cells than the header'}; "
                            "allowed: integers for batch_size and num_replicas, seconds for time")
            continue
        if app not in truth.apps:
            problems.append(f"row {i + 2}: application {app!r} has no measured profile; allowed: "
                            f"{', '.join(truth.apps)}")
            continue
        jobs.append(TraceJob(i + 1, submit, "train", app, gpus, float(truth.iterations_to_end(app, batch)), batch))
    if problems:
        raise ConfigError(str(p), problems)
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    validate(jobs, truth, str(p))
    return jobs
