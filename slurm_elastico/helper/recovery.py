"""Settling the journal rows an interrupted epoch left 'planned', from Slurm's real state of each job.

A row stays open until Slurm's state settles it; a job the helper
requeue-held and did not release is never abandoned. What each open row
means, by the job's state now (`decide`, pure):

| row               | job held (pending)        | job stopping (COMPLETING)   | running / pending, not held | gone  |
|-------------------|---------------------------|-----------------------------|-----------------------------|-------|
| RESHAPE_RUNNING   | complete it: new request, start now, release | keep open: it will be held | close: nothing is held | close |
| PREEMPT           | close: held, as meant     | keep open                   | close (next plan decides)   | close |
| RESUME            | complete it: release      | close                       | close                       | close |
| any other action  | close (next plan decides) | close                       | close                       | close |

A reshape's new request is the one the gateway would have set: its share
and node pin, or its GPU count on its nodes; released with the old one, the
job would run under a comment naming the new shape and the next plan would
requeue it again.

Measured on 22.05: right after `scontrol requeuehold` a job is COMPLETING
(priority 0, reason JobHeldUser) while it checkpoints, and only then PENDING
and held; a recovery that looked once at a COMPLETING job and closed its row
left it held for good. Every step is journaled: a closed row is 'recovered'
with what was found and done; a kept row gets a note. `SlurmUnavailable`
from any call propagates with the row still open: recovery waits for Slurm.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from slurm_elastico.errors import ElasticoError, SlurmUnavailable, UnknownJobError
from slurm_elastico.helper.journal import JournalLike
from slurm_elastico.model import Action, ActionKind, JobState, JobView, Snapshot


class Settler(Protocol):
    def apply(self, action: Action) -> None: ...
    def release(self, job_id: int) -> None: ...
    def forget_place(self, job_id: int) -> None: ...


class Step(enum.Enum):
    CLOSE = "close"          # nothing held, nothing to do: settle the row
    KEEP = "keep"            # Slurm has not settled it yet: the row stays open for the next epoch
    COMPLETE = "complete"    # a held job the action meant to release: finish the action, then settle


@dataclass(frozen=True)
class Decision:
    step: Step
    why: str


HOLDS = (ActionKind.RESHAPE_RUNNING, ActionKind.PREEMPT)
"""The actions that requeue-hold their job: one interrupted or failed part way may have held it."""


def decide(action: Action, job: JobView | None) -> Decision:
    """What an open row of `action` needs, given its job as Slurm shows it now (None: no longer active)."""
    kind = action.kind.value
    if job is None:
        return Decision(Step.CLOSE, f"interrupted {kind}: the job is no longer active (ended, cancelled or purged)")
    if job.state is JobState.COMPLETING:
        if action.kind in HOLDS:
            return Decision(Step.KEEP, f"interrupted {kind}: the job is still stopping (COMPLETING); "
                                       "settled once Slurm shows it held or running")
        return Decision(Step.CLOSE, f"interrupted {kind}: the job is ending")
    held = job.state is JobState.PENDING and job.held
    if action.kind is ActionKind.RESHAPE_RUNNING:
        if held:
            return Decision(Step.COMPLETE, "interrupted reshape_running had left it held")
        return Decision(Step.CLOSE, f"interrupted reshape_running: the job is {job.state.value.lower()} and not "
                                    "held (the requeue did not happen, or its release did)")
    if action.kind is ActionKind.PREEMPT:
        if held:
            return Decision(Step.CLOSE, "interrupted preempt took effect: the job stays held until the policy "
                                        "resumes it")
        return Decision(Step.CLOSE, f"interrupted preempt: the job is {job.state.value.lower()} and not held; "
                                    "the next plan decides again")
    if action.kind is ActionKind.RESUME and held:
        return Decision(Step.COMPLETE, "interrupted resume had not released it")
    return Decision(Step.CLOSE, f"interrupted {kind}: nothing held; the next plan decides again")


def recover(gateway: Settler, journal: JournalLike, snapshot: Snapshot, at: float) -> list[str]:
    """Settle what interrupted epochs left 'planned', from `snapshot` (Slurm's answer, never an outage's).

    Returns one note per open row. A row whose job is still stopping stays open (noted); a held job an
    interrupted reshape or resume left behind is released through `_complete`. `SlurmUnavailable`
    propagates, leaving the rows not yet settled open.
    """
    notes: list[str] = []
    active = {j.job_id: j for j in snapshot.jobs}
    settled_by: dict[int, int] = {}  # job id -> the row whose completion acted on it this time
    for row_id, action in journal.unsettled():
        jid = action.job_id
        if jid in settled_by:  # the job's state above is from before that row's completion
            _close(journal, row_id, at, notes, jid, f"interrupted {action.kind.value}: settled with row {settled_by[jid]}")
            continue
        if action.kind is ActionKind.RESHAPE_RUNNING:
            # The reservation keeping the job's place (`slurm.places.Places.kept`) outlives a helper that died
            # mid-reshape; a job left running inside it is killed when it ends (measured on 22.05: TIMEOUT).
            # One Slurm refuses to delete keeps that row open (the job is not released into it), not the others.
            try:
                gateway.forget_place(jid)
            except SlurmUnavailable:
                raise
            except ElasticoError as exc:
                why = f"interrupted reshape_running: the reservation keeping its place was not given up ({exc})"
                journal.note(row_id, f"open: {why}", at)
                notes.append(f"job {jid}: {why}; tried again next epoch")
                continue
        decision = decide(action, active.get(jid))
        if decision.step is Step.KEEP:
            journal.note(row_id, f"open: {decision.why}", at)
            notes.append(f"job {jid}: {decision.why}")
        elif decision.step is Step.CLOSE:
            _close(journal, row_id, at, notes, jid, decision.why)
        else:
            done, outcome = _complete(gateway, action)
            settled_by[jid] = row_id
            if done:
                _close(journal, row_id, at, notes, jid, f"{outcome}; {decision.why}")
            else:
                journal.note(row_id, f"open: {decision.why}; {outcome}", at)
                notes.append(f"job {jid}: {decision.why}; {outcome}")
    return notes


def _close(journal: JournalLike, row_id: int, at: float, notes: list[str], job_id: int, why: str) -> None:
    journal.settle(row_id, "recovered", at, why)
    notes.append(f"job {job_id}: {why}")


def _complete(gateway: Settler, action: Action) -> tuple[bool, str]:
    """Finish an interrupted action on its held job; (settled, what happened). `SlurmUnavailable` propagates.

    A reshape: its new request as `_reshape_updates` gives it (the job's AdminComment already names the
    new shape), StartTime=now (no ~120 s BeginTime), release. An update Slurm refuses does not keep the job
    held: it is released with the request it has. A resume: the gateway's own resume (node pin,
    StartTime=now, release).
    """
    jid = action.job_id
    try:
        if action.kind is ActionKind.RESUME:
            gateway.apply(action)
            return True, "released (resume completed)"
        problem, done = "", []
        for update, what in _reshape_updates(action):
            try:
                gateway.apply(update)
            except SlurmUnavailable:
                raise
            except ElasticoError as exc:  # UnknownJobError included: the release below says so too
                problem = f" (its {what} was refused: {exc})"
                break
            done.append(what)
        gateway.apply(Action(ActionKind.START_NOW, jid, "complete an interrupted reshape"))
        gateway.release(jid)
        return True, f"released ({''.join(f'{w}, ' for w in done)}StartTime=now){problem}"
    except UnknownJobError as exc:
        return True, f"the job is gone ({exc})"
    except SlurmUnavailable:
        raise
    except ElasticoError as exc:  # refused, not unanswered: try again next epoch rather than abandon the hold
        return False, f"not released yet, tried again next epoch: {exc}"


def _reshape_updates(action: Action) -> list[tuple[Action, str]]:
    """The updates an interrupted reshape makes to its held job before the release, each with what it sets:
    the same as the gateway's requeue (`requeue_with_gpus`: GPU count and nodes in one verified update;
    `requeue_with_share`: the share, then the node pin)."""
    jid, why = action.job_id, "complete an interrupted reshape"
    if action.gpus is not None:
        where = f" on {','.join(action.nodes)}" if action.nodes else ""
        typed = f" of type {action.gpu_type}" if action.gpu_type else ""
        return [(Action(ActionKind.SET_GPUS, jid, why, gpus=action.gpus, nodes=action.nodes, gpu_type=action.gpu_type),
                 f"{action.gpus} GPU(s){typed}{where}")]
    out = []
    if action.share is not None:
        out.append((Action(ActionKind.SET_SHARE, jid, why, share=action.share), f"share {action.share}"))
    if action.nodes:
        out.append((Action(ActionKind.SET_NODES, jid, why, nodes=action.nodes), f"node {','.join(action.nodes)}"))
    return out
