"""The epoch driver: read the cluster, recover, observe, plan, act through the executor.

`run_once` is one epoch of `elastico sched`; the simulator runs the same
function against its simulated cluster with an in-memory journal, so an
action Slurm refuses has the same consequences in both. `main_loop` repeats
epochs for `--interval`; `render` shows one to a person.

`gateway` is anything with the `SlurmGateway` methods used here (`snapshot`,
`apply`, `argv_for`, `release`); the simulator's cluster has the same methods.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from slurm_elastico.config import Settings
from slurm_elastico.errors import ElasticoError
from slurm_elastico.helper.executor import Outcome, execute
from slurm_elastico.helper.families import FamilySource
from slurm_elastico.helper.journal import JournalLike, action_to_json
from slurm_elastico.helper.lock import EpochBusy
from slurm_elastico.helper.recovery import recover
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Action, Family, Plan, Snapshot
from slurm_elastico.planner import run_epoch


class Gateway(Protocol):
    def snapshot(self) -> Snapshot: ...
    def apply(self, action: Action) -> None: ...
    def argv_for(self, action: Action) -> list[list[str]]: ...
    def release(self, job_id: int) -> None: ...


Observer = Callable[[Snapshot, dict[int, Family], bool, FamilySource],
                    tuple[dict[int, float], dict[int, Family], list[str]]]
"""(snapshot, families, dry run, family source) -> (work done per job, families, notes); see `observer.ProgressObserver`."""


@dataclass(frozen=True)
class EpochResult:
    at: float
    plan: Plan
    outcomes: tuple[Outcome, ...]
    recovered: tuple[str, ...]
    warnings: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "at": self.at,
            "objective": self.plan.objective,
            "notes": list(self.plan.notes),
            "actions": [{**json.loads(action_to_json(o.action)), "status": o.status, "error": o.error,
                         "argv": [list(a) for a in o.argv]} for o in self.outcomes],
            "recovered": list(self.recovered),
            "warnings": list(self.warnings),
        }


def run_once(gateway: Gateway, settings: Settings, families: FamilySource, model: SlowdownModel | None,
             journal: JournalLike | None, now: float, *, dry_run: bool = False,
             observer: Observer | None = None) -> EpochResult:
    """One epoch. `journal` may be None only for a dry run (nothing is issued then)."""
    if journal is None and not dry_run:
        raise ValueError("a journal is required unless dry_run is set")
    snap = gateway.snapshot()
    recovered: list[str] = []
    if journal is not None and not dry_run:
        recovered = recover(gateway, journal, snap, now)
        if recovered:
            snap = gateway.snapshot()
    fams, warnings = families.families({j.job_id for j in snap.jobs})
    progress, fams, observed = observer(snap, fams, dry_run, families) if observer is not None else ({}, fams, [])
    plan = run_epoch(snap, fams, settings, model, now, progress)
    plan = dataclasses.replace(plan, notes=(*plan.notes, *observed))
    outcomes = execute(plan.actions, gateway, journal, now, dry_run=dry_run,
                       comments={j.job_id: j.admin_comment for j in snap.jobs})
    return EpochResult(now, plan, tuple(outcomes), tuple(recovered), tuple(warnings))


def render(result: EpochResult) -> str:
    """The epoch for a person: each action with its reason and, for a dry run, the exact commands."""
    lines = [f"epoch at {result.at:.0f}: {len(result.outcomes)} action(s), objective {result.plan.objective:.3f}"]
    lines += [f"  recovered: {r}" for r in result.recovered]
    lines += [f"  warning: {w}" for w in result.warnings]
    for o in result.outcomes:
        lines.append(f"  [{o.status}] job {o.action.job_id} {o.action.kind.value}: {o.action.reason}")
        if o.error:
            lines.append(f"      error: {o.error}")
        if o.status == "dry-run":
            lines += ["      $ " + " ".join(shlex.quote(a) for a in argv) for argv in o.argv]
    lines += [f"  note: {n}" for n in result.plan.notes]
    return "\n".join(lines)


def main_loop(step, interval_s: float, epochs: int | None, sleep=None) -> int:
    """Call `step()` every `interval_s` seconds (`epochs` times, or forever); return the failed-epoch count."""
    sleep = sleep or time.sleep
    failures = 0
    n = 0
    while epochs is None or n < epochs:
        started = time.monotonic()
        try:
            step()
        except EpochBusy as exc:
            print(f"note: {exc}", file=sys.stderr)
        except (ElasticoError, sqlite3.Error, OSError) as exc:  # one bad epoch (slurmctld restarting, a
            failures += 1                                       # locked store) must not end the loop
            print(f"error: epoch failed: {exc}", file=sys.stderr)
        n += 1
        if epochs is None or n < epochs:
            sleep(max(0.0, interval_s - (time.monotonic() - started)))
    return failures


