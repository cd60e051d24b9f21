"""Per-job and per-group figures from sacct runs and the helper's journal (pure).

JCT is wall time from the first submission to the end of the last run,
restarts included (DESIGN "What done means"); waiting is submission to first
start. GPU-hours count whole GPUs (`gres/gpu`) plus MPS shares as fractions of
a GPU; MPS share-hours count only the shares. Only finished jobs (no active
run) have a JCT.

A runaway job is one accounting still shows active (pending or running) that
slurmctld no longer knows, and knew before it was asked: its end was never
recorded (slurmdbd was down or lost the message; `sacctmgr show runawayjobs`
fixes such records). sacct reports a running run's time up to now, so that
run's GPU-hours would grow forever: they are left out and the job is marked.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from slurm_elastico.model import JobState
from slurm_elastico.slurm.accounting import SacctRecord, runs_by_job

FINISHED = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.NODE_FAIL,
            JobState.OUT_OF_MEMORY, JobState.PREEMPTED)


@dataclass(frozen=True)
class JobRow:
    job_id: int
    name: str
    user: str
    kind: str  # train | infer | other (jobs submitted without a family)
    state: str
    submit: int | None
    first_start: int | None
    end: int | None
    jct_s: float | None
    wait_s: float | None
    runs: int
    reshapes: int
    gpu_hours: float
    mps_share_hours: float
    runaway: bool = False
    """Accounting shows the job active, slurmctld no longer knows it (see the module docstring)."""
    progress: float | None = None
    """The work done by the job's last progress report the helper read, in its family's units (steps of the
    submitted batch for training: in goodput mode the statistical progress the steps were worth); None: none."""
    work: float | None = None
    """The job's work in the same units (its report's total)."""
    steps: int | None = None
    """Optimizer steps the job took for that progress, at whatever global batch (training; None: not reported)."""
    samples: int | None = None
    """Samples the job used for it (training; None: not reported)."""


@dataclass(frozen=True)
class GroupRow:
    group: str  # "user=<name>", "kind=<kind>" or "all"
    jobs: int
    finished: int
    mean_jct_s: float | None
    median_jct_s: float | None
    mean_wait_s: float | None
    gpu_hours: float
    mps_share_hours: float
    reshapes: int
    runaway: int = 0


RUNAWAY_MARGIN_S = 60
"""A job submitted this long before slurmctld was asked must be in its answer if it is still active
(clock differences between the hosts stay far below it)."""


def job_rows(records: Iterable[SacctRecord], kinds: Mapping[int, str], reshapes: Mapping[int, int],
             shares_per_gpu: int = 100, controller_jobs: Collection[int] | None = None,
             controller_at: float | None = None, work: Mapping[int, Mapping[str, object]] | None = None) -> list[JobRow]:
    """One row per job; `kinds` maps job id → family kind, `reshapes` job id → reshapes the journal holds,
    `work` job id → the helper's record of its last progress report (`done`, `total`, `steps`, `samples`,
    `updated`: when the job wrote it).

    `controller_jobs`: the active jobs slurmctld listed at `controller_at` (epoch seconds), asked before
    accounting; a job accounting shows active, submitted before then and not in that list is runaway.
    None: not checked."""
    rows = []
    work = work or {}
    for job_id, runs in sorted(runs_by_job(records).items()):
        first, last = runs[0], runs[-1]
        submit = first.submit_time
        starts = [r.start_time for r in runs if r.start_time]
        done = last.state in FINISHED and last.end_time is not None
        runaway = (controller_jobs is not None and controller_at is not None and last.state.active
                   and job_id not in controller_jobs and submit is not None
                   and submit < controller_at - RUNAWAY_MARGIN_S)
        gpu_s = mps_s = 0.0
        for r in runs:
            if runaway and r is last:
                continue  # its time runs on in accounting: unknown
            whole = r.tres_alloc.get("gres/gpu", 0)
            shares = r.tres_alloc.get("gres/mps", 0)
            mps_s += r.elapsed_s * shares / shares_per_gpu
            gpu_s += r.elapsed_s * (whole + shares / shares_per_gpu)
        rows.append(JobRow(
            job_id=job_id, name=last.name, user=last.user, kind=kinds.get(job_id, "other"), state=last.state.value,
            submit=submit, first_start=min(starts) if starts else None, end=last.end_time if done else None,
            jct_s=float(last.end_time - submit) if done and submit is not None else None,
            wait_s=float(min(starts) - submit) if starts and submit is not None else None,
            runs=len(runs), reshapes=reshapes.get(job_id, 0),
            gpu_hours=gpu_s / 3600.0, mps_share_hours=mps_s / 3600.0, runaway=runaway,
            **_work(work.get(job_id), submit),
        ))
    return rows


def _work(w: Mapping[str, object] | None, submit: int | None) -> dict:
    """JobRow's progress, work, steps and samples from the helper's record (all None without one, or when the
    record was written before the job was submitted: an earlier job's of the same id)."""
    updated = w.get("updated") if w is not None else None
    if w is None or (isinstance(updated, (int, float)) and submit is not None and updated < submit):
        return {}
    return {"progress": w.get("done"), "work": w.get("total"), "steps": w.get("steps"), "samples": w.get("samples")}


def _group(name: str, rows: list[JobRow]) -> GroupRow:
    jcts = [r.jct_s for r in rows if r.jct_s is not None]
    waits = [r.wait_s for r in rows if r.wait_s is not None]
    return GroupRow(
        group=name, jobs=len(rows), finished=len(jcts),
        mean_jct_s=statistics.fmean(jcts) if jcts else None,
        median_jct_s=statistics.median(jcts) if jcts else None,
        mean_wait_s=statistics.fmean(waits) if waits else None,
        gpu_hours=sum(r.gpu_hours for r in rows), mps_share_hours=sum(r.mps_share_hours for r in rows),
        reshapes=sum(r.reshapes for r in rows), runaway=sum(r.runaway for r in rows),
    )


def group_rows(rows: list[JobRow]) -> list[GroupRow]:
    """All jobs, then per kind, then per user."""
    out = [_group("all", rows)]
    for key, attr in (("kind", "kind"), ("user", "user")):
        for value in sorted({getattr(r, attr) for r in rows}):
            out.append(_group(f"{key}={value}", [r for r in rows if getattr(r, attr) == value]))
    return out
