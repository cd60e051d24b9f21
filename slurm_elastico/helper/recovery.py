"""Settling what an interrupted epoch left 'planned' in the journal."""

from __future__ import annotations

from typing import Protocol

from slurm_elastico.helper.journal import JournalLike
from slurm_elastico.model import ActionKind, Snapshot


class Releaser(Protocol):
    def release(self, job_id: int) -> None: ...


def recover(gateway: Releaser, journal: JournalLike, snapshot: Snapshot, at: float) -> list[str]:
    """Settle what an interrupted epoch left 'planned'; release any job an interrupted reshape left requeue-held.

    Only a RESHAPE_RUNNING row releases: its hold was a step on the way back to running. A PREEMPT's hold is
    the point (the policy stopped the job until it resumes it), and an interrupted RESUME is decided again by
    the next plan, which sees the job still held.
    """
    notes: list[str] = []
    active = {j.job_id: j for j in snapshot.jobs}
    for row_id, action in journal.unsettled():
        job = active.get(action.job_id)
        if action.kind is ActionKind.RESHAPE_RUNNING and job is not None and job.held:
            gateway.release(action.job_id)
            notes.append(f"job {action.job_id}: released; an interrupted reshape had left it held")
        else:
            notes.append(f"job {action.job_id}: interrupted {action.kind.value} abandoned; the next plan decides again")
        journal.settle(row_id, "recovered", at)
    return notes
