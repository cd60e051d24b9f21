"""The in-flight guard: a job the helper just started is left alone until Slurm has had time to start it.

An action that ends with `StartTime=now` (`start_now`, `resume`,
`reshape_running`) is 'done' once Slurm accepted it, but Slurm starts the job
on its next scheduling pass: for a second or more the job is still PENDING.
An epoch in that gap would see a pending job and plan for it again, and Slurm
refuses an update to a job it is starting. So a job with such a 'done' journal
row from an earlier epoch within `SETTLE_S`, still pending and not held, gets
no new action; after the window a job Slurm did not start is planned again as
any pending job is. The same holds from the moment recovery settled such an
action a crash had interrupted (a 'recovered' row: recovery may just have
released the job, or the crash came right after its StartTime=now).

Pure logic: the journal's recent rows and the snapshot's jobs in, job ids out.
"""

from __future__ import annotations

from collections.abc import Iterable

from slurm_elastico.model import Action, ActionKind, JobState, JobView

STARTS = frozenset({ActionKind.START_NOW, ActionKind.RESUME, ActionKind.RESHAPE_RUNNING})
"""The actions after which Slurm starts the job by itself (they end with StartTime=now)."""
SETTLE_S = 15.0
"""Seconds after such an action during which a still-pending job is taken to be starting."""


def in_flight(recent: Iterable[tuple[float, Action]], jobs: Iterable[JobView], now: float,
              settle_s: float = SETTLE_S) -> set[int]:
    """Jobs started by an action within `settle_s` before `now` (this epoch's recovery included) that Slurm
    has not started yet.

    `recent`: (time, action) of the journal's rows that took effect (`Journal.recent`); `jobs`: the
    snapshot's. A job that runs, ended, or is held (someone stopped it since) is not in flight.
    """
    if not settle_s >= 0:
        raise ValueError(f"settle_s {settle_s!r}: must be a number of seconds >= 0")
    waiting = {j.job_id for j in jobs if j.state is JobState.PENDING and not j.held}
    return {a.job_id for at, a in recent
            if a.kind in STARTS and a.job_id in waiting and now - settle_s <= at <= now}
