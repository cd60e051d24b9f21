"""Reports from sacct and the helper's journal: JCT, waiting, GPU-hours, MPS share-hours, reshapes.

`collect` does the I/O (one squeue call, one sacct call, three store queries: the families' kinds, the
journal's reshapes, the helper's record of each job's last progress report); `metrics` computes;
`render` prints tables, CSV and JSON; `plots` draws PNGs.
"""

from __future__ import annotations

import time

from slurm_elastico.history.past import stored_families
from slurm_elastico.report.metrics import GroupRow, JobRow, group_rows, job_rows
from slurm_elastico.slurm.accounting import runs_by_job
from slurm_elastico.store import Store

UNREADABLE = "family unreadable"
"""The kind of a job whose stored family does not parse as a train or infer family."""

__all__ = ["UNREADABLE", "GroupRow", "JobRow", "collect", "group_rows", "job_rows"]


def collect(gateway, store: Store, start: str = "now-7days", end: str = "now", shares_per_gpu: int = 100) -> list[JobRow]:
    """Per-job rows for the jobs accounting knows in [start, end] (sacct time syntax).

    slurmctld's active jobs are asked first, then accounting, so a job that ends in between is never taken
    for a runaway one (`metrics.job_rows`); Slurm not answering is an error, not an empty cluster."""
    asked_at = time.time()
    active = {j.job_id for j in gateway.jobs()}
    records = gateway.sacct(start=start, end=end)
    runs = runs_by_job(records)
    # A family that no longer reads is its own kind in the report, not silently a plain ("other") job; a stored
    # family of another job that had the same id is none.
    kinds = {job_id: fam.kind or UNREADABLE for job_id, fam in stored_families(store).items()
             if job_id in runs and fam.of(runs[job_id])}
    reshapes = {r["job_id"]: r["n"] for r in store.query(
        "SELECT job_id, COUNT(*) AS n FROM journal WHERE status='done' AND kind='reshape_running' GROUP BY job_id")}
    # what the job's last progress report said (`helper.job_work`), for the jobs whose stored family is theirs
    work = {r["job_id"]: {k: r[k] for k in ("done", "total", "steps", "samples", "updated")}
            for r in store.query("SELECT * FROM job_work") if r["job_id"] in kinds}
    return job_rows(records, kinds, reshapes, shares_per_gpu, active, asked_at, work)
