"""The backfill helper (`elastico sched`): one epoch = read, repair, plan, journal, act.

The planner is pure; this module is the I/O around it. Every action is written
to the journal ('planned') before it is issued and marked 'done' or 'failed'
after, so an epoch that dies between the two (a crash, a killed cron run) is
found by the next one: a job it had requeue-held is released, and nothing
else needs undoing because the other actions are plain, repeatable updates.
A reshape that fails stays 'planned' for the same reason: it may have left
the job held. A job's actions stop at its first failure, and an AdminComment
set earlier in the epoch is put back, so elastico-run never reads a shape
whose share change did not happen.

Before planning, a `ProgressObserver` (when given) reads the running jobs'
progress reports: the work they have done goes to the planner, and the
slowdowns they show next to each other go to the store's `colocation` table
and, with a trained predictor and its reference data, refine it online
(`slurm_elastico.observe`, `interference.online`).

`gateway` is anything with the `SlurmGateway` methods used here (`snapshot`,
`apply`, `argv_for`, `release`); the simulator's cluster has the same methods.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import shlex
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError, ElasticoError
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.interference.measurements import load_rows, save_to_store
from slurm_elastico.model import Action, ActionKind, Counters, Family, Plan, Snapshot
from slurm_elastico.observe import SOURCE, Observation, Reading, merge_solo, observe, pair_observations, with_measured
from slurm_elastico.planner import run_epoch
from slurm_elastico.runtime.counters import FIELDS as COUNTER_FIELDS
from slurm_elastico.runtime.counters import counters_path, read_counters
from slurm_elastico.runtime.progress import read_job_reports
from slurm_elastico.shapes import load_directory, parse_family
from slurm_elastico.store import Store


class Gateway(Protocol):
    def snapshot(self) -> Snapshot: ...
    def apply(self, action: Action) -> None: ...
    def argv_for(self, action: Action) -> list[list[str]]: ...
    def release(self, job_id: int) -> None: ...


class FamilySource(Protocol):
    def families(self, job_ids: set[int]) -> tuple[dict[int, Family], list[str]]:
        """Families of these jobs, and one warning per family that could not be used."""
        ...


class StoreFamilies:
    """Families recorded by elastico-submit in the store."""

    def __init__(self, store: Store, gpu_memory_mib: int):
        self.store, self.gpu_memory_mib = store, gpu_memory_mib

    def families(self, job_ids: set[int]) -> tuple[dict[int, Family], list[str]]:
        if not job_ids:
            return {}, []
        marks = ",".join("?" * len(job_ids))
        rows = self.store.query(f"SELECT job_id, spec, source FROM job_family WHERE job_id IN ({marks})", sorted(job_ids))
        return _parse_all(((r["job_id"], r["spec"], r["source"] or f"job {r['job_id']}") for r in rows), self.gpu_memory_mib)


class DirectoryFamilies:
    """Families as files `<job id>.yaml` in a directory (before or besides elastico-submit)."""

    def __init__(self, directory: str | Path, gpu_memory_mib: int):
        self.dir, self.gpu_memory_mib = Path(directory), gpu_memory_mib
        if not self.dir.is_dir():
            raise ConfigError(str(self.dir), ["the families directory does not exist"])

    def families(self, job_ids: set[int]) -> tuple[dict[int, Family], list[str]]:
        found, errors = load_directory(self.dir, self.gpu_memory_mib)
        return ({j: f for j, f in found.items() if j in job_ids},
                [f"family ignored, the job is left as submitted: {e}" for e in errors])


def _parse_all(items, gpu_memory_mib: int) -> tuple[dict[int, Family], list[str]]:
    families: dict[int, Family] = {}
    warnings: list[str] = []
    for job_id, text, source in items:
        try:
            families[job_id] = parse_family(yaml.safe_load(text), source, gpu_memory_mib)
        except (ConfigError, yaml.YAMLError) as exc:
            warnings.append(f"job {job_id}: family ignored, the job is left as submitted: {exc}")
    return families, warnings


class Journal:
    """Decisions in the store, written before they are issued and settled after."""

    def __init__(self, store: Store):
        self.store = store

    def plan(self, epoch: float, action: Action) -> int:
        cur = self.store.execute(
            "INSERT INTO journal (epoch, job_id, kind, action, reason, status, updated) VALUES (?,?,?,?,?,?,?)",
            (epoch, action.job_id, action.kind.value, action_to_json(action), action.reason, "planned", epoch),
        )
        return int(cur.lastrowid)

    def note(self, row_id: int, error: str, at: float) -> None:
        """Record an error on a row that stays 'planned' (its outcome is for the next epoch to find out)."""
        self.store.execute("UPDATE journal SET error=?, updated=? WHERE id=?", (error, at, row_id))

    def settle(self, row_id: int, status: str, at: float, error: str = "") -> None:
        self.store.execute("UPDATE journal SET status=?, error=?, updated=? WHERE id=?", (status, error, at, row_id))

    def unsettled(self) -> list[tuple[int, Action]]:
        rows = self.store.query("SELECT id, action FROM journal WHERE status='planned' ORDER BY id")
        return [(r["id"], action_from_json(r["action"])) for r in rows]


def action_to_json(action: Action) -> str:
    d = dataclasses.asdict(action)
    d["kind"] = action.kind.value
    return json.dumps(d, sort_keys=True)


def action_from_json(text: str) -> Action:
    d = json.loads(text)
    d["kind"] = ActionKind(d["kind"])
    d["nodes"] = tuple(d.get("nodes") or ())
    return Action(**d)


@dataclass(frozen=True)
class Outcome:
    action: Action
    status: str  # done | failed | dry-run
    error: str = ""
    argv: tuple[tuple[str, ...], ...] = ()


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


def recover(gateway: Gateway, journal: Journal, snapshot: Snapshot, at: float) -> list[str]:
    """Settle what an interrupted epoch left 'planned'; release any job it left requeue-held."""
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


REFINE_BATCH = 5
"""Observations to gather before refining the predictor again (a long co-location gives one every 10 s or so)."""
REPLAY = 2000
"""Observed rows kept in the online learner's replay (besides its whole reference data)."""


class ProgressObserver:
    """The I/O around `observe.observe`: report files in, readings, solo rates and observations in the store.

    With `model` a trained predictor (it has `fine_tune`) and `reference` its
    training observations, every `refine_batch` new observations refine the
    model in place (`interference.online.refine`: held out by row id, drift
    judged against the model's first recorded reference error) and, if the
    update is kept, replace `model_path` atomically; if saving fails the
    weights go back too. Every attempt is a `model_update` row.
    """

    def __init__(self, store: Store, gpu_type: str, model: SlowdownModel | None = None, model_path: str = "",
                 reference: list | None = None, refine_batch: int = REFINE_BATCH):
        self.store, self.gpu_type = store, gpu_type
        self.model, self.model_path, self.reference = model, model_path, reference or []
        self.refine_batch = refine_batch

    def __call__(self, snapshot: Snapshot, families: dict[int, Family], dry_run: bool,
                 source: FamilySource | None = None) -> tuple[dict[int, float], dict[int, Family], list[str]]:
        """(work done per job, the families with measured shapes, notes) for this epoch; records what it learned.

        `source` gives the families of jobs that left the queue with a pair still open (see `_resolve`).
        """
        mine = [j for j in snapshot.jobs if j.job_id in families]
        reports, notes = read_job_reports(mine)
        counters, counter_notes = read_job_reports(mine, read_counters, counters_path)
        notes += counter_notes
        previous = {r["job_id"]: Reading(r["done"], r["updated"], r["restarts"], r["context"], r["since"])
                    for r in self.store.query("SELECT * FROM progress_reading")}
        obs = observe(snapshot, families, reports, previous, counters)
        if not dry_run:
            self._record(snapshot, obs)
        measured = {(r["job_id"], r["shape"]): Counters(*(math.nan if r[f] is None else r[f] for f in COUNTER_FIELDS))
                    for r in self.store.query("SELECT * FROM solo_counters")}
        families = with_measured(families, measured)
        if dry_run:
            return obs.progress, families, notes
        found = self._resolve(families, measured, source, notes)
        self._forget({j.job_id for j in snapshot.jobs})
        if found:
            save_to_store(self.store, found)
            if self.reference and hasattr(self.model, "fine_tune"):
                try:
                    note = self._refine()
                except (ElasticoError, OSError, RuntimeError, ValueError) as exc:  # learning must not stop scheduling
                    note = f"predictor not refined this epoch (its weights are as before): {exc}"
                notes += [note] if note else []
        return obs.progress, families, notes

    def _resolve(self, families: dict[int, Family], measured: dict, source: FamilySource | None,
                 notes: list[str]) -> list:
        """Turn the pairs that are ready into observations (also pairs whose jobs have left) and spend their time."""
        beside = {(r["job_id"], r["shape"], r["partner"], r["partner_shape"]): (r["work"], r["seconds"])
                  for r in self.store.query("SELECT * FROM pair_rate")}
        gone = {j for key in beside for j in (key[0], key[2])} - set(families)
        known = dict(families)  # the queue's, measured shapes included; those of departed jobs from `source`
        if gone and source is not None:
            known.update(with_measured(source.families(gone)[0], measured))
        solo = merge_solo({(r["job_id"], r["shape"]): (r["work"], r["seconds"])
                           for r in self.store.query("SELECT * FROM solo_rate")})
        found, spent, pair_notes = pair_observations(beside, solo, known, self.gpu_type)
        notes += pair_notes
        with self.store.transaction() as conn:
            conn.executemany("DELETE FROM pair_rate WHERE job_id=? AND shape=? AND partner=? AND partner_shape=?", spent)
        return found

    def _forget(self, active: set[int]) -> None:
        """Drop what jobs that left the queue can no longer give: all of it, once no open pair needs their solo speed."""
        with self.store.transaction() as conn:
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS active (job_id INTEGER PRIMARY KEY)")
            conn.execute("DELETE FROM active")
            conn.executemany("INSERT INTO active VALUES (?)", [(j,) for j in active])
            conn.execute("DELETE FROM progress_reading WHERE job_id NOT IN (SELECT job_id FROM active)")
            conn.execute("DELETE FROM pair_rate WHERE job_id NOT IN (SELECT job_id FROM active) "
                         "AND partner NOT IN (SELECT job_id FROM active)")  # both gone: it cannot complete
            for table in ("solo_rate", "solo_counters"):
                conn.execute(f"DELETE FROM {table} WHERE job_id NOT IN (SELECT job_id FROM active) "
                             "AND job_id NOT IN (SELECT job_id FROM pair_rate) AND job_id NOT IN (SELECT partner FROM pair_rate)")

    def _record(self, snapshot: Snapshot, obs: Observation) -> None:
        """Keep this epoch's readings and samples."""
        with self.store.transaction() as conn:
            conn.executemany("INSERT OR REPLACE INTO progress_reading VALUES (?,?,?,?,?,?)",
                             [(j, r.done, r.updated, r.restarts, r.context, r.since) for j, r in obs.readings.items()])
            conn.executemany("INSERT INTO solo_rate VALUES (?,?,?,?) ON CONFLICT (job_id, shape) DO UPDATE SET "
                             "work = work + excluded.work, seconds = seconds + excluded.seconds", obs.solo)
            conn.executemany("INSERT OR REPLACE INTO solo_counters VALUES (?,?,?,?,?,?)",
                             [(j, shape, *(None if math.isnan(getattr(c, f)) else getattr(c, f) for f in COUNTER_FIELDS))
                              for j, shape, c in obs.solo_counters])
            conn.executemany("INSERT INTO pair_rate VALUES (?,?,?,?,?,?) ON CONFLICT (job_id, shape, partner, partner_shape) "
                             "DO UPDATE SET work = work + excluded.work, seconds = seconds + excluded.seconds",
                             [(*key, work, seconds) for key, work, seconds in obs.beside])

    def _refine(self) -> str | None:
        """Refine the model once `refine_batch` observations arrived since the last attempt; a note, or None."""
        from slurm_elastico.interference.online import refine  # imports torch: only with a trained model

        last = self.store.query("SELECT COALESCE(MAX(last_observation), 0) AS m FROM model_update WHERE model = ?",
                                (self.model_path,))[0]["m"]
        new = load_rows(self.store, self.gpu_type, SOURCE, after_id=last)
        if len(new) < self.refine_batch:
            return None
        earlier = [r for r in load_rows(self.store, self.gpu_type, SOURCE, last=REPLAY + len(new)) if r[0] <= last]
        first = self.store.query("SELECT error_before FROM model_update WHERE model = ? ORDER BY id LIMIT 1",
                                 (self.model_path,))
        baseline = first[0]["error_before"] if first else None
        save = (lambda: self.model.save(self.model_path)) if self.model_path else None  # type: ignore[union-attr]
        result = refine(self.model, self.reference, earlier, new, save, replay_size=REPLAY,  # type: ignore[arg-type]
                        baseline_error=baseline)
        self.store.execute(
            "INSERT INTO model_update (at, model, accepted, error_before, error_after, recent_before, recent_after,"
            " new_observations, last_observation) VALUES (?,?,?,?,?,?,?,?,?)",
            (time.time(), self.model_path, int(result.accepted), result.error_before, result.error_after,
             result.recent_before, result.recent_after, len(new), new[-1][0]))
        verdict = "kept" if result.accepted else "rolled back"
        return (f"predictor refined from {len(new)} new observation(s): {verdict} (reference error "
                f"{result.error_before:.1%} -> {result.error_after:.1%})")


def run_once(gateway: Gateway, settings: Settings, families: FamilySource, model: SlowdownModel | None,
             journal: Journal | None, now: float, *, dry_run: bool = False,
             observer: ProgressObserver | None = None) -> EpochResult:
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
    comments = {j.job_id: j.admin_comment for j in snap.jobs}
    failed: set[int] = set()
    commented: set[int] = set()
    outcomes: list[Outcome] = []
    for action in plan.actions:
        argv = tuple(tuple(a) for a in gateway.argv_for(action))
        if dry_run:
            outcomes.append(Outcome(action, "dry-run", argv=argv))
            continue
        if action.job_id in failed:  # a job's actions go together: after one fails, the rest would mislead
            outcomes.append(Outcome(action, "skipped", "an earlier action for this job failed", argv))
            continue
        row = journal.plan(now, action)
        try:
            gateway.apply(action)
        except ElasticoError as exc:
            failed.add(action.job_id)
            if action.kind is ActionKind.RESHAPE_RUNNING:
                # It may have left the job requeue-held: stay 'planned' so the next epoch's recover() checks.
                journal.note(row, str(exc), now)
            else:
                journal.settle(row, "failed", now, str(exc))
            outcomes.append(Outcome(action, "failed", str(exc), argv))
            if action.job_id in commented:
                _restore_comment(gateway, action.job_id, comments.get(action.job_id, ""))
        else:
            journal.settle(row, "done", now)
            outcomes.append(Outcome(action, "done", argv=argv))
            if action.kind is ActionKind.SET_ADMIN_COMMENT:
                commented.add(action.job_id)
    return EpochResult(now, plan, tuple(outcomes), tuple(recovered), tuple(warnings))


def _restore_comment(gateway: Gateway, job_id: int, text: str) -> None:
    """Put back the AdminComment a failed plan had changed, so elastico-run does not start a shape never set up."""
    try:
        gateway.apply(Action(ActionKind.SET_ADMIN_COMMENT, job_id, "restore after a failed action", text=text))
    except ElasticoError:
        pass  # the job may be gone; elastico-run checks the share of a named shape anyway


class EpochBusy(ElasticoError):
    """Another epoch holds the helper's lock (cron epochs may overlap a slow one); this one is skipped."""

    exit_code = 0


@contextmanager
def epoch_lock(state_dir: str | Path) -> Iterator[None]:
    """Hold `<state_dir>/sched.lock` for one epoch: two epochs at once would repair each other's reshapes."""
    path = Path(state_dir) / "sched.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EpochBusy(f"another epoch holds {path}; this one is skipped") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
            lines += ["      $ " + " ".join(_quote(a) for a in argv) for argv in o.argv]
    lines += [f"  note: {n}" for n in result.plan.notes]
    return "\n".join(lines)


def _quote(arg: str) -> str:
    return shlex.quote(arg)


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


__all__ = ["DirectoryFamilies", "EpochBusy", "EpochResult", "Journal", "Outcome", "ProgressObserver", "StoreFamilies",
           "epoch_lock", "main_loop", "recover", "render", "run_once"]
