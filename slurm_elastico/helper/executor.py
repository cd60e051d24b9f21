"""The one action executor: the helper and the simulator carry out a plan through it.

For each action: journal it ('planned'), issue it through the gateway, settle
the row ('done' or 'failed'). A reshape or preemption that fails while Slurm
shows its job held or still stopping (or cannot say) stays 'planned' with its
error noted, and the AdminComment set for it stays: the requeue-hold happened,
and the next epoch's `recovery.recover` finishes or settles it (a preempted
job keeps the mark by which the policy resumes it). One that fails with its
job running was not carried out: settled 'failed'. A reshape carried out
whose kept place could not be given up (`PlaceNotGivenUp`) is done, its row
open for recovery to give the place up. A job's actions go together: after one
fails the rest are skipped, and an AdminComment set earlier in the plan is put
back (unless the job may be held, above), so elastico-run never reads a shape
whose share change did not happen.

When Slurm stops answering (`SlurmUnavailable`) the action's outcome is
unknown: its row stays 'planned' with the error noted, for recovery to settle
from Slurm's state once it answers again, and every later action of the plan
is skipped (each would wait out the same timeout and fail the same way).

In shadow mode (`rehearse`) nothing is issued: each action gets its exact
commands (`argv_for`, which only reads) and a row in the shadow journal
(`shadow.ShadowJournal`) with the JCT gain the plan predicts for its job;
`apply` is never called, and the gateway it is given refuses it anyway
(`shadow.ReadOnlyGateway`).

`gateway` is anything with `apply` and `argv_for` (`slurm.gateway.SlurmGateway`,
`sim.cluster.SimCluster`); `journal` anything with the journal's methods
(`journal.Journal` in the store, `journal.MemoryJournal` in the simulator).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from slurm_elastico.errors import ElasticoError, PlaceNotGivenUp, ShadowRefused, SlurmUnavailable, UnknownJobError
from slurm_elastico.helper.journal import JournalLike
from slurm_elastico.helper.recovery import HOLDS
from slurm_elastico.model import Action, ActionKind, JobState
from slurm_elastico.planner.baselines import STATE as TIRESIAS_STATE
from slurm_elastico.planner.pollux import STATE as POLLUX_STATE


class Actuator(Protocol):
    def apply(self, action: Action) -> None: ...
    def argv_for(self, action: Action) -> list[list[str]]: ...


@dataclass(frozen=True)
class Outcome:
    action: Action
    status: str  # done | failed | unanswered (Slurm did not answer: outcome unknown) | skipped | dry-run | shadow
    error: str = ""
    argv: tuple[tuple[str, ...], ...] = ()


def execute(actions: Iterable[Action], gateway: Actuator, journal: JournalLike | None, now: float, *,
            dry_run: bool = False, comments: dict[int, str] | None = None) -> list[Outcome]:
    """Carry out `actions` in order; one `Outcome` each. `journal` may be None only for a dry run.

    `comments` are the jobs' AdminComments before the plan: what a failed job's comment is put back to.
    """
    if journal is None and not dry_run:
        raise ValueError("a journal is required unless dry_run is set")
    comments = comments or {}
    failed: set[int] = set()
    commented: set[int] = set()
    outcomes: list[Outcome] = []
    outage = ""
    for action in actions:
        try:
            argv = tuple(tuple(a) for a in gateway.argv_for(action))
        except ElasticoError:  # a reshape's place reads the job (its owner, nodes): `apply` meets the same and says it
            if dry_run:
                raise
            argv = ()
        if dry_run:
            outcomes.append(Outcome(action, "dry-run", argv=argv))
            continue
        if outage:
            outcomes.append(Outcome(action, "skipped", f"Slurm stopped answering earlier in this epoch: {outage}", argv))
            continue
        if action.job_id in failed:  # after one fails, the job's later actions would mislead
            outcomes.append(Outcome(action, "skipped", "an earlier action for this job failed", argv))
            continue
        row = journal.plan(now, action)  # type: ignore[union-attr]
        try:
            gateway.apply(action)
        except SlurmUnavailable as exc:
            outage = str(exc)
            journal.note(row, f"outcome unknown, Slurm did not answer: {exc}", now)  # type: ignore[union-attr]
            outcomes.append(Outcome(action, "unanswered", f"{exc} (the journal row stays open for recovery)", argv))
        except PlaceNotGivenUp as exc:  # carried out; recovery gives the place up (`recovery.recover`)
            journal.note(row, str(exc), now)  # type: ignore[union-attr]
            outcomes.append(Outcome(action, "done", f"{exc}; the journal row stays open for recovery to give it up",
                                    argv))
        except ElasticoError as exc:
            failed.add(action.job_id)
            error = str(exc)
            if action.kind in HOLDS and _may_be_held(gateway, action.job_id):
                journal.note(row, error, now)  # type: ignore[union-attr]
                error += ("; the job may be held: the journal row stays open for recovery, and its AdminComment as "
                          "planned")
            else:
                journal.settle(row, "failed", now, error)  # type: ignore[union-attr]
                if action.job_id in commented:
                    error += _restore_comment(gateway, action.job_id, comments.get(action.job_id, ""))
            outcomes.append(Outcome(action, "failed", error, argv))
        else:
            journal.settle(row, "done", now)  # type: ignore[union-attr]
            outcomes.append(Outcome(action, "done", argv=argv))
            if action.kind is ActionKind.SET_ADMIN_COMMENT:
                commented.add(action.job_id)
    return outcomes


def _may_be_held(gateway: Actuator, job_id: int) -> bool:
    """Whether a requeue-hold that failed part way may have held the job: Slurm shows it held or still stopping, or
    cannot say (a gateway without `job`: yes)."""
    read = getattr(gateway, "job", None)
    if read is None:
        return True
    try:
        view = read(job_id)
    except UnknownJobError:
        return False  # gone: nothing is held
    except ElasticoError:
        return True
    return view.state is JobState.COMPLETING or (view.state is JobState.PENDING and view.held)


class Rehearsal(Protocol):
    def record(self, epoch: float, action: Action, argv, gain_s: float | None, error: str = "") -> int: ...

    def epoch(self, at: float, actions: int, outage: str = "", slowed: dict[int, float | None] | None = None) -> None: ...


def rehearse(actions: Iterable[Action], gateway: Actuator, journal: Rehearsal, now: float,
             gains: dict[int, float | None]) -> list[Outcome]:
    """Shadow mode: record each action as the acting helper would issue it, issue nothing; one `Outcome` each.

    Status 'shadow'; `error` says when Slurm would refuse it up front (`argv_for` checks a GPU-count change
    against the Slurm version and the job's request), as the acting helper's `apply` would find, or that the job
    left Slurm's queue meanwhile. When Slurm does not answer (`argv_for` reads it for a GPU-count change), the
    action is 'unanswered' and the rest 'skipped', as `execute` does: an outage, never journaled as refusals.
    `gains`: the JCT seconds predicted per job (`shadow.predicted_gains`). The epoch is recorded even when it
    proposes nothing (`journal.epoch`), so that `shadow.decisions` knows which epochs ran, with the gains of the
    running jobs it slows without acting on them."""
    outcomes: list[Outcome] = []
    outage = ""
    for action in actions:
        if outage:
            outcomes.append(Outcome(action, "skipped", f"Slurm did not answer an earlier action: {outage}"))
            continue
        error = ""
        try:
            argv = tuple(tuple(a) for a in gateway.argv_for(action))
        except ShadowRefused:
            raise
        except SlurmUnavailable as exc:
            outage = str(exc)
            outcomes.append(Outcome(action, "unanswered", outage))
            continue
        except UnknownJobError as exc:
            argv, error = (), f"the job left Slurm's queue before this action: {exc}"
        except ElasticoError as exc:
            argv, error = (), f"the acting helper would be refused: {exc}"
        journal.record(now, action, argv, gains.get(action.job_id), error)
        outcomes.append(Outcome(action, "shadow", error, argv))
    acted = {a.job_id for a in (o.action for o in outcomes)}
    journal.epoch(now, sum(1 for o in outcomes if o.status == "shadow"), outage,
                  {jid: g for jid, g in gains.items() if jid not in acted})
    return outcomes


OWN_PARTS = ("elastico:", POLLUX_STATE, TIRESIAS_STATE)
"""Prefixes of the AdminComment parts the policies write (`elastico:shape=`, `elastico:held=1`, a baseline's
state); every other part belongs to someone else (a site keeps data there) and is kept as it is."""


def merged_comment(current: str, ours: str) -> str:
    """The AdminComment to set: the policy's parts `ours`, then every part of `current` that is not a policy's.

    Parts are comma-separated; a part someone else wrote keeps its exact text and order."""
    mine = [p for p in ours.split(",") if p.strip()]
    kept = [p for p in (current or "").split(",") if p.strip() and not p.strip().startswith(OWN_PARTS)]
    return ",".join(mine + kept)


def keep_others_comments(actions: Iterable[Action], comments: dict[int, str]) -> tuple[Action, ...]:
    """`actions` with each AdminComment merged into the job's current one (`merged_comment`); one that would
    change nothing is dropped (a policy compares its own text with the whole comment)."""
    out = []
    for a in actions:
        if a.kind is ActionKind.SET_ADMIN_COMMENT and a.text is not None:
            text = merged_comment(comments.get(a.job_id, ""), a.text)
            if text == comments.get(a.job_id, ""):
                continue
            a = dataclasses.replace(a, text=text)
        out.append(a)
    return tuple(out)


def _restore_comment(gateway: Actuator, job_id: int, text: str) -> str:
    """Put back the AdminComment a failed plan had changed, so elastico-run does not start a shape never set up.

    Returns '' or, when that fails too (the job may be gone), what to add to the failed action's error; elastico-run
    checks the share of a named shape anyway."""
    try:
        gateway.apply(Action(ActionKind.SET_ADMIN_COMMENT, job_id, "restore after a failed action", text=text))
    except ElasticoError as exc:
        return f"; its AdminComment could not be put back either: {exc}"
    return ""
