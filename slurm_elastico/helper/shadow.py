"""Shadow mode: the helper's full epochs against the live cluster, journaled, with nothing changed in Slurm.

`elastico sched --shadow` (or `helper.mode: shadow`) reads the cluster,
learns the jobs' families and progress, plans, and records what it would have
done, with the JCT gain the plan predicts, in its own table (`shadow_journal`).
The no-change guarantee is structural, in two layers:

- the executor gets a `ReadOnlyGateway`: it offers only the gateway's reads
  an epoch makes (`snapshot`, `job`, `jobs`, `batch_script`, `argv_for`); every other
  attribute (apply, release, signal, forget_place, set_*, requeue*, preempt,
  resume, ...) raises `ShadowRefused` without touching the gateway behind it;
- that gateway's runner is a `slurm.readonly.GuardedRunner` that refuses any
  command not on its read list before it runs (`slurm_changes` stays 0).

What a shadow helper must not record as if its actions had happened: it never
writes the acting journal (`journal`), so no in-flight action, no open row for
recovery, no 'done' reshape counted by `elastico report`; it runs no recovery
(an acting helper's open rows stay for the acting helper, which a shadow epoch
reads, with its recent starts, to leave those jobs alone as it would:
`epoch.run_once`); its observer keeps
the jobs' real progress readings but judges no pairing and records no refusal
or revert (`observer.ProgressObserver(shadow=True)`). The next shadow epoch
plans from the cluster as it really is. An acting helper never reads
`shadow_journal` (`journal.Journal` reads only `journal`); `elastico report
--shadow` does (`shadow_report`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slurm_elastico.errors import ShadowRefused
from slurm_elastico.model import Action, ActionKind, Family, JobState, JobView, Plan, Snapshot
from slurm_elastico.store import SCHEMA, Store

SLURMCTLD_CHANGES = re.compile(
    r"_slurm_rpc_(update_job|requeue|kill_job|job_notify|create_resv|update_resv|delete_resv)"
    r"|update_job|[Rr]equeue|[Rr]elease|signal|hold", re.I)
"""What slurmctld logs (info level) for the commands a helper acts with; it logs no read. A line of its log that
matches is a change to Slurm's state (a shadow helper must cause none)."""

SCHEMA.append(
    # What a helper in shadow mode would have done (slurm_elastico.helper.shadow): one row per action of each
    # shadow epoch, with its exact commands and the JCT gain the plan predicts for its job. Never read by an
    # acting helper; `elastico report --shadow` summarises it.
    """CREATE TABLE IF NOT EXISTS shadow_journal (
        id INTEGER PRIMARY KEY,
        epoch REAL NOT NULL,
        job_id INTEGER NOT NULL,
        kind TEXT NOT NULL,
        action TEXT NOT NULL,
        reason TEXT NOT NULL,
        argv TEXT NOT NULL DEFAULT '[]',
        gain_s REAL,
        error TEXT NOT NULL DEFAULT ''
    )""")
SCHEMA.append("CREATE INDEX IF NOT EXISTS shadow_journal_epoch ON shadow_journal (epoch)")
SCHEMA.append(
    # Every shadow epoch that planned, with or without actions: a proposal is one decision only across epochs that
    # really followed each other (`decisions`), and the report says how many epochs ran.
    """CREATE TABLE IF NOT EXISTS shadow_epoch (
        at REAL PRIMARY KEY,
        actions INTEGER NOT NULL,
        outage TEXT NOT NULL DEFAULT '',
        slowed TEXT NOT NULL DEFAULT '{}'
    )""")

READS = frozenset({"snapshot", "jobs", "job", "batch_script", "argv_for", "shares_per_gpu", "gpu_memory_mib",
                   "type_memory"})
"""What a `ReadOnlyGateway` offers of the gateway behind it: the reads an epoch makes and the gateway's settings,
nothing that acts."""


class ReadOnlyGateway:
    """The gateway a shadow helper acts through: its reads pass, anything else raises `ShadowRefused`.

    An allow list (`READS`): a method added to the gateway later is refused here until someone decides it only
    reads. `refused` lists every refused call (name, job id), even one a caller caught."""

    def __init__(self, gateway):
        self._gateway = gateway
        self.refused: list[tuple[str, object]] = []

    def __getattr__(self, name: str):
        if name in READS:
            return getattr(self._gateway, name)
        if name.startswith("__"):
            raise AttributeError(name)

        def refuse(*args, **kwargs):
            what = args[0] if args else kwargs.get("job_id")
            self.refused.append((name, getattr(what, "job_id", what)))
            raise ShadowRefused(f"shadow mode refused the gateway's {name}({_what(what)}): it would change Slurm; "
                                f"allowed in shadow mode: {', '.join(sorted(READS))}")
        return refuse


def _what(what: object) -> str:
    if isinstance(what, Action):
        return f"{what.kind.value} of job {what.job_id}"
    return "" if what is None else f"job {what}"


class ShadowJournal:
    """The shadow helper's record of what it would have done, in the store's `shadow_journal` table.

    It has no `unsettled`, `recent` or `settle`: it can never stand in for the acting journal (recovery and the
    in-flight guard read those), so a shadow record is never taken for an action that happened."""

    def __init__(self, store: Store):
        self.store = store

    def record(self, epoch: float, action: Action, argv: Iterable[Iterable[str]], gain_s: float | None,
               error: str = "") -> int:
        from slurm_elastico.helper.journal import action_to_json

        cur = self.store.execute(
            "INSERT INTO shadow_journal (epoch, job_id, kind, action, reason, argv, gain_s, error) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (epoch, action.job_id, action.kind.value, action_to_json(action), action.reason,
             json.dumps([list(a) for a in argv]), None if gain_s is None or not math.isfinite(gain_s) else gain_s,
             error))
        return int(cur.lastrowid)

    def epoch(self, at: float, actions: int, outage: str = "", slowed: Mapping[int, float | None] | None = None) -> None:
        """That a shadow epoch planned at `at` and proposed `actions` actions (`outage`: Slurm stopped answering);
        `slowed`: the predicted gain (a loss) of each running job it would slow without acting on it."""
        body = {str(j): (g if g is not None and math.isfinite(g) else None) for j, g in (slowed or {}).items()}
        self.store.execute("INSERT OR REPLACE INTO shadow_epoch (at, actions, outage, slowed) VALUES (?,?,?,?)",
                           (at, actions, outage, json.dumps(body, sort_keys=True)))


def _held_gpus(job: JobView) -> int | None:
    whole = sum(1 for _, _, shares in job.gpu_alloc if shares == 0)
    return whole or None


def predicted_gains(plan: Plan, snapshot: Snapshot, families: Mapping[int, Family], progress: Mapping[int, float],
                    now: float, restart_cost_s: float, shares_per_gpu: int) -> dict[int, float | None]:
    """The JCT seconds the plan predicts each job it acts on, and each running job it slows, gains (None: no
    prediction).

    Pure. Per job, with `work` its remaining work (`planner.reshape.remaining_work`):
    - running: work / (the speed of the shape it runs as now) - work / (its planned speed beside its
      co-runners) - the restart cost when the plan requeues it;
    - pending: the wait Slurm expects (its expected start time minus now, 0 when Slurm has none) plus
      work / (its default shape's speed: how it runs if nobody shapes it) - work / (its planned speed), the
      plan starting it this epoch.
    A running job the plan does not act on but places beside a job it acts on (a new co-runner on its GPU) is
    counted too, by the same rule: a loss when the newcomer slows it. Its speed now is its shape's speed alone,
    so only when it has its GPU to itself now; when it already shares one, None (the speed it has beside its
    present co-runners is not known here). None for a job the plan does not place (a preemption: its gain goes
    to others) or without speeds.
    """
    from slurm_elastico.planner.reshape import remaining_work
    from slurm_elastico.shapes.current import running_shape

    placed = {p.job_id: p for p in plan.placements}
    jobs = {j.job_id: j for j in snapshot.jobs}
    requeued = {a.job_id for a in plan.actions if a.kind in (ActionKind.RESHAPE_RUNNING, ActionKind.PREEMPT)}
    acted = {a.job_id for a in plan.actions}
    out: dict[int, float | None] = {}
    for jid in sorted(acted | _slowed_beside(plan, snapshot, acted)):
        fam, place, job = families.get(jid), placed.get(jid), jobs.get(jid)
        if fam is None or place is None or job is None or not place.throughput > 0 or not fam.shapes:
            out[jid] = None
            continue
        if job.state is JobState.RUNNING:
            share = job.mps_share or None
            shape, _ = running_shape(fam.shapes, fam.default_shape, job.admin_comment, share, shares_per_gpu,
                                     held_gpus=_held_gpus(job))
            rate, wait, cost = shape.throughput, 0.0, restart_cost_s if jid in requeued else 0.0
        else:
            rate = fam.default_shape.throughput
            expected = job.start_time if job.state is JobState.PENDING else None
            wait, cost = (max(0.0, expected - now) if expected else 0.0), 0.0
        if not rate > 0:
            out[jid] = None
            continue
        work = remaining_work(fam.total_work, progress.get(jid), job.start_time if job.state is JobState.RUNNING
                              else None, now, rate)
        if jid not in acted and _shares_now(jid, snapshot):
            out[jid] = None
            continue
        out[jid] = wait + work / rate - work / place.throughput - cost
    return out


def _slowed_beside(plan: Plan, snapshot: Snapshot, acted: set[int]) -> set[int]:
    """Running jobs the plan leaves alone on a GPU where it places a job it acts on."""
    gpus_of_acted = {(p.node, p.gpu) for p in plan.placements if p.job_id in acted}
    running = {j.job_id for j in snapshot.jobs if j.state is JobState.RUNNING}
    return {p.job_id for p in plan.placements
            if p.job_id not in acted and p.job_id in running and (p.node, p.gpu) in gpus_of_acted}


def _shares_now(job_id: int, snapshot: Snapshot) -> bool:
    """Whether another job uses a GPU the job uses now (Slurm's view of the GPUs' users)."""
    return any(job_id in {u.job_id for u in g.users} and len({u.job_id for u in g.users}) > 1
               for n in snapshot.nodes for g in n.gpus)


@dataclass(frozen=True)
class Decision:
    """One distinct thing the shadow helper would have done: a job's action, first and last proposed."""

    job_id: int
    kind: str
    first: float
    last: float
    epochs: int
    gain_s: float | None
    reason: str


ENDS_SPELL = frozenset({ActionKind.START_NOW.value, ActionKind.RESHAPE_RUNNING.value, ActionKind.PREEMPT.value,
                        ActionKind.RESUME.value})
"""Actions after which the job is no longer in the state that made the helper propose them (a start runs it, a
reshape or preemption restarts or holds it, a resume releases it)."""


def _signature(action: dict) -> tuple:
    """What makes two proposals in consecutive epochs the same decision: the job, the kind and the target, not the
    reason's wording."""
    return (action["job_id"], action["kind"], action.get("share"), action.get("gpus"), tuple(action.get("nodes") or ()),
            action.get("shape"), action.get("signal"), action.get("text"), action.get("gpu_type", ""))


def decisions(rows: Iterable[Mapping], ran: Iterable[float] = ()) -> list[Decision]:
    """The shadow journal's rows (in id order) as distinct decisions (the acting helper would have taken each once);
    a decision's gain is the one predicted when first proposed.

    - The same proposal in consecutive epochs is one decision.
    - A job's proposals in the epochs where the plan ends its state (`ENDS_SPELL`: start it, reshape, preempt or
      resume it), with the actions proposed beside it, are one decision of each kind whatever their targets and
      gaps, until a proposal to end its state in another way: the acting helper would have acted on the first
      epoch's, and the job would have left the state the later ones were planned for.

    `ran`: the times of every shadow epoch (`shadow_epoch`), those without actions included, so that a proposal
    repeated after an epoch that did not make it is a new decision; the rows' own epochs are always counted."""
    rows = list(rows)
    actions = [json.loads(r["action"]) for r in rows]
    ending: dict[tuple[float, int], str] = {}  # (epoch, job) -> the kind of its proposal that ends its state
    for r, a in zip(rows, actions):
        if a["kind"] in ENDS_SPELL:
            ending.setdefault((float(r["epoch"]), int(r["job_id"])), a["kind"])
    spell: dict[int, tuple[str, int]] = {}  # job -> (the kind that last ended its state, how many changes)
    seen: dict[tuple, list] = {}
    last_epoch_of: dict[tuple, float] = {}
    epochs = sorted({float(r["epoch"]) for r in rows} | {float(t) for t in ran})
    index = {e: i for i, e in enumerate(epochs)}
    out: list[list] = []
    for r, a in zip(rows, actions):
        epoch, job = float(r["epoch"]), int(r["job_id"])
        ends = ending.get((epoch, job))
        if ends:
            kind, n = spell.get(job, ("", 0))
            if ends != kind:
                spell[job] = kind, n = ends, n + 1
            sig: tuple = (job, a["kind"], "spell", n)
        else:
            sig = _signature(a)
        current = seen.get(sig)
        if current is not None and (ends or index[epoch] - index[last_epoch_of[sig]] <= 1):
            if epoch != current[3]:
                current[3], current[4] = epoch, current[4] + 1
        else:
            current = [job, r["kind"], epoch, epoch, 1, r["gain_s"], r["reason"]]
            seen[sig] = current
            out.append(current)
        last_epoch_of[sig] = epoch
    return [Decision(*d) for d in out]


def shadow_report(store: Store, since: float, until: float) -> dict:
    """What the shadow helper would have done between `since` and `until` (Unix seconds): a JSON-ready summary."""
    rows = store.query("SELECT epoch, job_id, kind, action, reason, gain_s FROM shadow_journal "
                       "WHERE epoch >= ? AND epoch <= ? ORDER BY id", (since, until))
    rows = list(rows)
    ran = store.query("SELECT at, outage, slowed FROM shadow_epoch WHERE at >= ? AND at <= ? ORDER BY at",
                      (since, until))
    found = decisions(rows, (float(r["at"]) for r in ran))
    kinds: dict[str, int] = {}
    for d in found:
        kinds[d.kind] = kinds.get(d.kind, 0) + 1
    # One gain per job: the one predicted with its first decision. Nothing happens in shadow mode, so each later
    # epoch predicts the job's whole change again (a new proposal is a new plan for the same job, not more gain).
    first_gain: dict[int, float | None] = {}
    for d in sorted(found, key=lambda d: d.first):
        first_gain.setdefault(d.job_id, d.gain_s)
    # Running jobs a decision would slow without acting on them: their first predicted loss, once per job.
    slowed: dict[int, float | None] = {}
    for r in ran:
        for jid, g in json.loads(r["slowed"]).items():
            if int(jid) not in first_gain:
                slowed.setdefault(int(jid), g)
    first_gain.update(slowed)
    per_job = {jid: g for jid, g in first_gain.items() if g is not None}
    unpredicted = {jid for jid, g in first_gain.items() if g is None}
    jobs = sorted({d.job_id for d in found})
    gains = sorted(per_job.values())
    epochs = sorted({float(r["epoch"]) for r in rows})
    return {
        "since": since, "until": until,
        "first_epoch": epochs[0] if epochs else None, "last_epoch": epochs[-1] if epochs else None,
        "epochs_with_actions": len(epochs), "epochs_run": len(set(epochs) | {float(r["at"]) for r in ran}),
        "epochs_without_slurm": sum(1 for r in ran if r["outage"]),
        "actions": {"total": len(found), "by_kind": dict(sorted(kinds.items())), "proposals": len(rows)},
        "jobs_touched": jobs,
        "predicted_gain_s": {
            "jobs": len(gains), "total": sum(gains), "mean": sum(gains) / len(gains) if gains else None,
            "median": _median(gains), "negative": sum(1 for g in gains if g < 0),
            "co_runners_slowed": len(slowed),
            "co_runners_total": sum(g for g in slowed.values() if g is not None),
            "jobs_without_prediction": sorted(unpredicted),
        },
        "decisions": [d.__dict__ for d in found],
    }


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


_UNITS = {"": 1, "second": 1, "seconds": 1, "minute": 60, "minutes": 60, "hour": 3600, "hours": 3600,
          "day": 86400, "days": 86400, "week": 604800, "weeks": 604800}


def parse_when(text: str, now: float, what: str = "--start") -> float:
    """Unix seconds of a time written as sacct takes it: `now`, `now-7days` (seconds, minutes, hours, days, weeks),
    an ISO date or date and time (this host's zone unless it names one), or Unix seconds.
    `ValueError` naming `what` and the forms allowed."""
    import datetime

    t = text.strip()
    m = re.fullmatch(r"now(?:([+-])(\d+)([a-z]*))?", t)
    if m:
        if not m.group(1):
            return now
        unit = _UNITS.get(m.group(3))
        if unit is not None:
            return now + (1 if m.group(1) == "+" else -1) * int(m.group(2)) * unit
    elif re.fullmatch(r"\d{9,11}(\.\d+)?", t):
        return float(t)
    else:
        try:
            when = datetime.datetime.fromisoformat(t)
        except ValueError:
            when = None  # not a date either: the error below says what is allowed
        if when is not None:
            return (when if when.tzinfo else when.astimezone()).timestamp()
    raise ValueError(f"{what} {text!r}: allowed: now, now-N[seconds|minutes|hours|days|weeks], an ISO date or "
                     "date and time (2026-12-01, 2026-12-01T08:00), or Unix seconds")


def render_report(summary: dict) -> str:
    """`shadow_report`'s summary for a person (times in this host's zone, with its offset, as the epoch lines)."""
    import datetime

    def local_time(at: float) -> str:
        return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).astimezone().isoformat(timespec="seconds")

    lines = [f"shadow mode from {local_time(summary['since'])} to {local_time(summary['until'])}"]
    if summary["first_epoch"] is None:
        lines.append("  no shadow epoch proposed an action in this period (is the helper running with --shadow?)")
        return "\n".join(lines)
    acts = summary["actions"]
    lines.append(f"  epochs with actions: {summary['epochs_with_actions']} of {summary['epochs_run']} recorded "
                 f"(first {local_time(summary['first_epoch'])}, last {local_time(summary['last_epoch'])})"
                 + (f"; Slurm did not answer in {summary['epochs_without_slurm']}" if summary['epochs_without_slurm']
                    else ""))
    lines.append(f"  actions it would have taken: {acts['total']} ({acts['proposals']} proposals; one repeated in "
                 "consecutive epochs counts once)")
    lines += [f"    {kind:<18} {n}" for kind, n in acts["by_kind"].items()]
    gain = summary["predicted_gain_s"]
    lines.append(f"  jobs it would have touched: {len(summary['jobs_touched'])}: "
                 f"{', '.join(map(str, summary['jobs_touched'][:50]))}"
                 + (f" ... and {len(summary['jobs_touched']) - 50} more" if len(summary['jobs_touched']) > 50 else ""))
    if gain["jobs"]:
        lines.append(f"  predicted JCT gain: {gain['total'] / 3600:.2f} job-hours over {gain['jobs']} job(s); "
                     f"mean {gain['mean']:.0f} s, median {gain['median']:.0f} s per job; {gain['negative']} job(s) "
                     "predicted to lose")
    if gain["co_runners_slowed"]:
        lines.append(f"    of which {gain['co_runners_total'] / 3600:.2f} job-hours on {gain['co_runners_slowed']} "
                     "running job(s) it would slow by placing another beside them, without acting on them")
    if gain["jobs_without_prediction"]:
        lines.append(f"  no prediction (not placed by the plan, e.g. preempted; or slowed beside a co-runner it "
                     "already had): jobs "
                     f"{', '.join(map(str, gain['jobs_without_prediction']))}")
    return "\n".join(lines)
