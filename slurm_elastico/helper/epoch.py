"""The epoch driver: read the cluster, recover, observe, plan, act through the executor.

`run_once` is one epoch of `elastico sched`; the simulator runs the same
function against its simulated cluster with an in-memory journal, so an
action Slurm refuses has the same consequences in both. `main_loop` repeats
epochs for `--interval`; `render` shows one to a person.

An outage plans nothing: a snapshot Slurm did not answer raises
`SlurmUnavailable` before recovery, observation or planning (so no journal
row is abandoned and no learned progress is dropped); Slurm that stops
answering mid-epoch ends the epoch's actions (`EpochResult.outage`).
`main_loop` then waits longer each time (doubling from the interval, at most
`BACKOFF_CAP_S`), says so on stderr, and goes back to the interval once Slurm
answers.

Shadow mode (`shadow=True`, `helper.shadow`): the same epoch, with the
shadow journal for `journal`; no recovery and no in-flight guard (nothing
was issued, so nothing is open or starting), and the plan's actions are
rehearsed (`executor.rehearse`), never applied.

A pairing the plan makes as a probe of a model adapting online is named in the epoch's notes
(`helper.probes`).

A job whose batch script the epoch's reading budget left unread (`families.ScriptFamilies`,
`helper.script_read_budget_s`) has no family yet: it is left as submitted, like a plain job, counted in
`EpochResult.deferred` and in a note, and read by a later epoch.

`gateway` is anything with the `SlurmGateway` methods used here (`snapshot`,
`apply`, `argv_for`, `release`); the simulator's cluster has the same methods.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import shlex
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from slurm_elastico.config import Settings
from slurm_elastico.errors import ElasticoError, SlurmUnavailable
from slurm_elastico.helper.executor import Outcome, Rehearsal, execute, keep_others_comments, rehearse
from slurm_elastico.helper.families import Admission, FamilySource
from slurm_elastico.helper.inflight import SETTLE_S, in_flight
from slurm_elastico.helper.journal import Journal, JournalLike, action_to_json
from slurm_elastico.helper.probes import probe_notes
from slurm_elastico.helper.recovery import recover
from slurm_elastico.helper.revert import undo_actions
from slurm_elastico.helper.shadow import predicted_gains
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Action, Family, Plan, Snapshot
from slurm_elastico.planner import partitions, run_epoch


class Gateway(Protocol):
    def snapshot(self) -> Snapshot: ...
    def apply(self, action: Action) -> None: ...
    def argv_for(self, action: Action) -> list[list[str]]: ...
    def release(self, job_id: int) -> None: ...
    def forget_place(self, job_id: int) -> None: ...


Observer = Callable[[Snapshot, dict[int, Family], bool, FamilySource],
                    tuple[dict[int, float], dict[int, Family], list[str]]]
"""(snapshot, families, dry run, family source) -> (work done per job, families, notes); see `observer.ProgressObserver`.

An observer may also carry `refusals` (`interference.probe.Refusals`: the planner gets `refusals.model(model, now)`)
and `reverted` (the probe's verdicts of its last call that a pairing did not pay: undone by `revert.undo_actions`)."""


BACKOFF_CAP_S = 300.0
"""Longest wait between epochs while Slurm does not answer (or the interval, when that is longer)."""


@dataclass(frozen=True)
class EpochResult:
    at: float
    plan: Plan
    outcomes: tuple[Outcome, ...]
    recovered: tuple[str, ...]
    warnings: tuple[str, ...]
    outage: str = ""
    """Why Slurm stopped answering during this epoch's actions ('' when it did not); the rest were skipped."""
    managed: tuple[int, ...] = ()
    """The queued jobs with a family (the only ones the helper acts on)."""
    held: tuple[int, ...] = ()
    """Those of them pending and held when the epoch began."""
    predicted: tuple[tuple[int, float], ...] = ()
    """(job id, solo speed / planned speed) of each job the plan places: the slowdown the planner predicts."""
    gains: tuple[tuple[int, float | None], ...] = ()
    """(job id, predicted JCT gain in seconds, None: no prediction) of each job the plan acts on
    (`shadow.predicted_gains`)."""
    mode: str = "act"
    """'act', 'shadow' (journaled, nothing issued) or 'dry-run'."""
    slurm_changes: int | None = None
    """Commands that change Slurm this epoch issued (the service counts them at its runner; None: not counted)."""
    deferred: int = 0
    """Queued jobs whose family this epoch did not read yet (the reading budget, `helper.script_read_budget_s`): left
    as submitted, read by the next epochs."""

    def to_dict(self) -> dict:
        gains = dict(self.gains)
        return {
            "at": self.at,
            "mode": self.mode,
            "objective": self.plan.objective,
            "notes": list(self.plan.notes),
            "actions": [{**json.loads(action_to_json(o.action)), "status": o.status, "error": o.error,
                         "argv": [list(a) for a in o.argv], "predicted_gain_s": _finite(gains.get(o.action.job_id))}
                        for o in self.outcomes],
            "recovered": list(self.recovered),
            "warnings": list(self.warnings),
            "outage": self.outage,
            "managed": len(self.managed),
            "held": list(self.held),
            "families_deferred": self.deferred,
            "placements": [{"job_id": p.job_id, "shape": p.shape, "node": p.node, "gpu": p.gpu, "share": p.share,
                            "throughput": p.throughput} for p in self.plan.placements],
            "slurm_changes": self.slurm_changes,
        }


def _finite(value: float | None) -> float | None:
    """A gain for JSON: None for none, or for an infinite one (a stalled job), which strict JSON cannot carry."""
    return value if value is not None and math.isfinite(value) else None


def run_once(gateway: Gateway, settings: Settings, families: FamilySource, model: SlowdownModel | None,
             journal: JournalLike | Rehearsal | None, now: float, *, dry_run: bool = False,
             observer: Observer | None = None, shadow: bool = False) -> EpochResult:
    """One epoch. `journal` may be None only for a dry run (nothing is issued then); in shadow mode it is the
    shadow journal (`shadow.ShadowJournal`), never the acting one.

    `SlurmUnavailable` from the snapshot or from recovery propagates: nothing is planned, nothing settled
    that Slurm's state did not settle. A job whose journal row is still open after recovery (it is still
    stopping) gets no new action this epoch, nor does a job an earlier epoch just started that Slurm has not
    started yet (`inflight.in_flight`). A shadow epoch reads the acting journal for both (never writes or settles
    it), so it proposes what an acting epoch would take in its place.
    """
    if journal is None and not dry_run:
        raise ValueError("a journal is required unless dry_run is set")
    if shadow and (dry_run or not hasattr(journal, "record") or hasattr(journal, "unsettled")):
        raise ValueError("shadow mode needs the shadow journal (helper.shadow.ShadowJournal) and no dry run")
    snap = gateway.snapshot()
    recovered: list[str] = []
    unsettled: set[int] = set()
    starting: set[int] = set()
    if journal is not None and not dry_run:
        # a shadow epoch reads the acting helper's rows (never settles them): what it left open or just started,
        # an acting epoch would leave alone
        acting = Journal(journal.store) if shadow else journal
        if not shadow:
            recovered = recover(gateway, journal, snap, now)
            if recovered:
                snap = gateway.snapshot()
        unsettled = {action.job_id for _, action in acting.unsettled()}
        starting = in_flight(acting.recent(now - SETTLE_S), snap.jobs, now) - unsettled
    admitted = families.admit(snap, dry_run) if isinstance(families, Admission) else []
    deferred = getattr(families, "deferred", 0) if isinstance(families, Admission) else 0
    fams, warnings = families.families({j.job_id for j in snap.jobs})
    warnings = [*admitted, *warnings]
    progress, fams, observed = observer(snap, fams, dry_run, families) if observer is not None else ({}, fams, [])
    refusals = getattr(observer, "refusals", None)
    planning = refusals.model(model, now) if refusals is not None and model is not None else model
    plan = run_epoch(snap, fams, settings, planning, now, progress)
    # acting on a job Slurm is still requeueing would race its recovery
    plan = _without(plan, unsettled, "no new action while an interrupted one is still open in the journal")
    # Slurm refuses an update to a job it is starting; it will start this one on its next pass
    plan = _without(plan, starting, "no new action, an earlier epoch started it and Slurm has not yet "
                                    f"(waiting up to {SETTLE_S:g} s)")
    # the planner leaves jobs without a family alone; this holds it whatever the policy
    plan = _without(plan, {a.job_id for a in plan.actions} - set(fams), "no action, it has no family from elastico-submit")
    # elastico keeps each job on its partitions' nodes; a peer's policy may not, and Slurm accepts such a NodeList
    jobs, nodes = {j.job_id: j for j in snap.jobs}, {n.name: n for n in snap.nodes}
    plan = _without(plan, {a.job_id for a in plan.actions if partitions.outside(jobs.get(a.job_id), a.nodes, nodes)},
                    "no action, the plan put it on a node outside the partitions it was submitted to (Slurm would "
                    "accept that and never start it)")
    plan = dataclasses.replace(plan, notes=(*plan.notes, *probe_notes(plan, snap, fams, model)))
    if deferred:  # not read yet: no family, so the planner and `_without` above leave these jobs as submitted
        plan = dataclasses.replace(plan, notes=(*plan.notes, f"families not read yet: {deferred} job(s), deferred to "
                                                "later epochs (helper.script_read_budget_s); left as submitted until then"))
    reverted = getattr(observer, "reverted", ())
    if reverted:  # probe and revert: separate each pair that did not pay (the planner will not pair it again)
        undo, why = undo_actions(reverted, snap.jobs, fams, {a.job_id for a in plan.actions} | unsettled | starting,
                                 settings.gpu.shares_per_gpu)
        plan = dataclasses.replace(plan, actions=(*plan.actions, *undo), notes=(*plan.notes, *why))
    comments = {j.job_id: j.admin_comment for j in snap.jobs}
    plan = dataclasses.replace(plan, actions=keep_others_comments(plan.actions, comments),
                               notes=(*plan.notes, *observed))
    gains = predicted_gains(plan, snap, fams, progress, now, settings.planner.reshape_cost_s,
                            settings.gpu.shares_per_gpu)
    if shadow:
        outcomes = rehearse(plan.actions, gateway, journal, now, gains)  # type: ignore[arg-type]
    else:
        outcomes = execute(plan.actions, gateway, journal, now, dry_run=dry_run, comments=comments)  # type: ignore[arg-type]
    outage = next((o.error for o in outcomes if o.status == "unanswered"), "")
    held = tuple(j.job_id for j in snap.jobs if j.job_id in fams and j.held)
    return EpochResult(now, plan, tuple(outcomes), tuple(recovered), tuple(warnings), outage,
                       tuple(sorted(fams)), held, predicted_slowdowns(plan, fams), tuple(sorted(gains.items())),
                       "shadow" if shadow else "dry-run" if dry_run else "act", deferred=deferred)


def _without(plan: Plan, jobs: set[int], why: str) -> Plan:
    """`plan` without the actions on `jobs`, with a note `job N: <why>` for each job that lost one."""
    dropped = sorted({a.job_id for a in plan.actions} & jobs)
    if not dropped:
        return plan
    return dataclasses.replace(plan, actions=tuple(a for a in plan.actions if a.job_id not in jobs),
                               notes=(*plan.notes, *(f"job {j}: {why}" for j in dropped)))


def predicted_slowdowns(plan: Plan, families: dict[int, Family]) -> tuple[tuple[int, float], ...]:
    """(job id, the placed shape's solo throughput / the throughput planned beside its co-runners) per placement."""
    out = []
    for p in plan.placements:
        fam = families.get(p.job_id)
        shape = next((s for s in fam.shapes if s.name == p.shape), None) if fam is not None else None
        if shape is not None and p.throughput > 0:
            out.append((p.job_id, shape.throughput / p.throughput))
    return tuple(out)


def render(result: EpochResult) -> str:
    """The epoch for a person: each action with its reason and, for a dry run, the exact commands."""
    what = "shadow epoch (nothing changed in Slurm)" if result.mode == "shadow" else "epoch"
    lines = [f"{what} at {local_time(result.at)}: {len(result.outcomes)} action(s), "
             f"objective {result.plan.objective:.3f}"]
    gains = dict(result.gains)
    lines += [f"  recovered: {r}" for r in result.recovered]
    lines += [f"  warning: {w}" for w in result.warnings]
    for o in result.outcomes:
        lines.append(f"  [{o.status}] job {o.action.job_id} {o.action.kind.value}: {o.action.reason}")
        if o.error:
            lines.append(f"      error: {o.error}")
        if o.status == "shadow" and gains.get(o.action.job_id) is not None:
            lines.append(f"      predicted JCT gain of job {o.action.job_id}: {gains[o.action.job_id]:.0f} s")
        if o.status in ("dry-run", "shadow"):
            lines += ["      $ " + " ".join(shlex.quote(a) for a in argv) for argv in o.argv]
    lines += [f"  note: {n}" for n in result.plan.notes]
    if result.outage:
        lines.append(f"  outage: Slurm stopped answering; the epoch's later actions were skipped: {result.outage}")
    return "\n".join(lines)


def local_time(at: float) -> str:
    """Unix seconds as this host's local time with its offset, ISO 8601 to the second (2026-12-04T05:16:39+00:00).

    For a person reading the log; the JSON forms keep Unix seconds (`EpochResult.to_dict`), which scripts compare.
    The zone is the process's (TZ, else /etc/localtime): the offset is written, so a reader elsewhere is not misled.
    """
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).astimezone().isoformat(timespec="seconds")


def backoff_s(interval_s: float, outages: int) -> float:
    """The wait before the next epoch after `outages` epochs in a row found Slurm not answering.

    The interval when Slurm answered; else doubling from it (2x, 4x, ...), at most `BACKOFF_CAP_S` (or the
    interval, if that is longer): an outage is not hammered, and its end is noticed within the cap.
    """
    if outages <= 0:
        return interval_s
    return min(interval_s * 2.0 ** min(outages, 32), max(interval_s, BACKOFF_CAP_S))


def outage_line(problem: BaseException | str, wait_s: float | None = None, outages: int = 1, *,
                mid_epoch: bool = False) -> str:
    """The one line that says an epoch found Slurm not answering (and when the next one tries)."""
    what = ("Slurm stopped answering during this epoch's actions; the rest were skipped" if mid_epoch
            else "Slurm is unavailable; planned nothing, changed nothing")
    line = f"{what}: {problem}"
    if wait_s is not None:
        line += f"; next try in {wait_s:.0f} s ({outages} epoch(s) in a row without an answer)"
    return line


def _stderr(level: str, line: str) -> None:
    print(f"elastico sched: {line}", file=sys.stderr, flush=True)


def main_loop(step: Callable[[], EpochResult | None], interval_s: float, epochs: int | None, sleep=None,
              log: Callable[[str, str], None] = _stderr) -> int:
    """Call `step()` every `interval_s` seconds (`epochs` times, or forever); return the failed-epoch count.

    An epoch that finds Slurm unavailable (`SlurmUnavailable`, or a result with an `outage`) counts as
    failed and the next one waits `backoff_s`; the first epoch Slurm answers again says so and the interval
    is back. Other failures of one epoch (a locked store, an OS error) are logged and do not end the loop.
    `log(level, line)` gets each line ('info', 'warning' or 'error').
    """
    sleep = sleep or time.sleep
    failures = 0
    outages = 0
    outage_started = 0.0
    n = 0
    while epochs is None or n < epochs:
        started = time.monotonic()
        problem, mid_epoch = "", False
        try:
            result = step()
            problem = result.outage if result is not None else ""
            mid_epoch = bool(problem)
        except SlurmUnavailable as exc:
            problem = str(exc)
        except (ElasticoError, sqlite3.Error, OSError) as exc:  # one bad epoch (a locked store, a full
            failures += 1                                       # disk) must not end the loop
            log("error", f"error: epoch failed: {exc}")
        if problem:
            failures += 1
            if outages == 0:
                outage_started = started
            outages += 1
        elif outages:
            log("info", f"Slurm answers again after {outages} epoch(s) without an answer "
                f"({time.monotonic() - outage_started:.0f} s); an epoch every {interval_s:g} s again")
            outages = 0
        n += 1
        wait = backoff_s(interval_s, outages)
        if problem:
            log("warning", outage_line(problem, wait if epochs is None or n < epochs else None, outages,
                                       mid_epoch=mid_epoch))
        if epochs is None or n < epochs:
            sleep(max(0.0, wait - (time.monotonic() - started)))
    return failures
