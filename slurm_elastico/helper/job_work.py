"""What each managed job's progress reports said, kept in the store for the planner and for `elastico report`.

Each epoch the observer (`helper.observer`) hands over the running jobs' reports (`runtime.progress`):
`record` keeps the last of each in the store's `job_work` table (work done, total, the optimizer steps and
samples it cost, the gradient noise scale). `noise_scales` gives the planner each queued adaptive job's
noise scale: the running job's report, else the row (a job requeued to change its batch reports nothing
while it waits). When a job has left the queue, `close_departed` reads its report once more (the last one,
written as it finished, usually after the helper's last look) and marks the row final; a job id seen in the
queue again after that is a new job, whose old row is no noise scale of its.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from slurm_elastico.model import JobView
from slurm_elastico.runtime.progress import Progress, ReportError, check_owner, progress_path, read_progress
from slurm_elastico.store import Store

UPSERT = ("INSERT INTO job_work (job_id, user, work_dir, done, total, steps, samples, grad_noise_scale, updated, final) "
          "VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT (job_id) DO UPDATE SET user=excluded.user, "
          "work_dir=excluded.work_dir, done=excluded.done, total=excluded.total, steps=excluded.steps, "
          "samples=excluded.samples, grad_noise_scale=excluded.grad_noise_scale, updated=excluded.updated, "
          "final=excluded.final")


def _row(job_id: int, user: str, work_dir: str, p: Progress, final: int) -> tuple:
    return (job_id, user, work_dir, p.done, p.total, p.steps, p.samples, p.grad_noise_scale, p.updated, final)


def record(store: Store, jobs: Iterable[JobView], reports: Mapping[int, Progress]) -> None:
    """Keep the reports of these (running, managed) jobs; a row already final (an earlier job of that id) is
    replaced."""
    rows = [_row(j.job_id, j.user, j.work_dir, reports[j.job_id], 0) for j in jobs if j.job_id in reports]
    if rows:
        with store.transaction() as conn:
            conn.executemany(UPSERT, rows)


def noise_scales(store: Store, job_ids: Iterable[int], reports: Mapping[int, Progress]) -> dict[int, float]:
    """Job id -> the gradient noise scale it last reported, for the queued `job_ids` that reported one."""
    ids = set(job_ids)
    out = {r["job_id"]: float(r["grad_noise_scale"]) for r in store.query(
        "SELECT job_id, grad_noise_scale FROM job_work WHERE final = 0 AND grad_noise_scale IS NOT NULL")
        if r["job_id"] in ids}
    out.update({j: p.grad_noise_scale for j, p in reports.items() if j in ids and p.grad_noise_scale is not None})
    return {j: phi for j, phi in out.items() if math.isfinite(phi) and phi >= 0}


def close_departed(store: Store, active: set[int],
                   read: Callable[[Path], Progress | None] = read_progress) -> list[str]:
    """Read once more the report of each job that left the queue and mark its row final; a note per report that
    could not be read (the row then keeps the last report the helper saw)."""
    notes: list[str] = []
    rows = []
    for r in store.query("SELECT job_id, user, work_dir FROM job_work WHERE final = 0"):
        if r["job_id"] in active:
            continue
        where = progress_path(r["work_dir"], r["job_id"])
        last = None
        try:
            check_owner(where, r["user"])
            last = read(where)
        except ReportError as exc:
            notes.append(f"job {r['job_id']}: last report not read: {exc}")
        rows.append((r["job_id"], r["user"], r["work_dir"], last))
    if rows:
        with store.transaction() as conn:
            for job_id, user, work_dir, last in rows:
                if last is None:
                    conn.execute("UPDATE job_work SET final = 1 WHERE job_id = ?", (job_id,))
                else:
                    conn.execute(UPSERT, _row(job_id, user, work_dir, last, 1))
    return notes

