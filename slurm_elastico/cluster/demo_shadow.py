"""The demo's shadow pass: shadow epochs paired with acting ones, each checked for changes to Slurm.

A shadow helper alone sees the jobs as Slurm runs them, never as its own
actions would have left them, so after its first proposals it plans for a
cluster the acting helper would not have had (on the demo's heavier list it
proposed fewer reshapes of running jobs than the acting helper took). To
check what shadow mode is for -- that its journal lists what the
acting helper does -- each of the pass's epochs is a pair on the same store,
run by `demo_pair` in one process with the helper's locks held: a shadow
epoch (the shadow helper, as `elastico sched --once --shadow` opens it), then
at once an acting epoch that plans on the shadow epoch's read of Slurm and
acts. Its actions are compared with the shadow epoch's journal rows. So that
the two plan on the same jobs: no job is submitted while a pair runs
(`PairedHelper.quiet`), a pair starts once Slurm has followed through the
acting epoch before it (`Pairing.settled`), and the acting epoch does not read
Slurm again (`demo_pair.OneRead`). What Slurm still does before the acting
epoch's actions (a job ends, backfill starts one) is counted beside the misses
(`Pair.moved`). Each pair is kept in `work`/pairs.jsonl.

Around every shadow epoch the pair reads `scontrol show job --oneliner` of
every job before and after, and slurmctld's log in between (`changes`,
`SLURMCTLD_CHANGES`). Slurm goes on meanwhile (it starts and ends jobs, and
follows through an acting epoch's requeue), so a record is compared on what
only a command changes: the fields of `STATIC` always; those of `STEADY` when
the job's state and reason stayed the same; and two moves Slurm does not make
by itself here (a running job sent back to pending, a job put on hold). The
same reads around each acting epoch count the jobs it changed: the control
that shows the check can fail.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slurm_elastico.cluster.demo_checks import DemoError
from slurm_elastico.helper import inflight

STATIC = ("AdminComment", "TresPerNode", "TresPerJob", "ReqNodeList", "ExcNodeList", "Reservation", "Partition",
          "Features", "Requeue", "Restarts")
"""Fields of `scontrol show job` a helper's commands set and Slurm leaves alone (an acting epoch's requeue counts
its restart before its command returns)."""
STEADY = ("Priority", "NumNodes", "EligibleTime", "TimeLimit")
"""Fields a helper's commands set (a hold, a node count, StartTime=now) or could, that Slurm also sets when it moves
a job (a start: the partition's limit for an UNLIMITED one, seen on 22.05; a requeue followed through; a first
scheduling pass): compared when the state and reason are unchanged."""
HELD = frozenset({"JobHeldAdmin", "JobHeldUser", "job_requeued_in_held_state"})
"""A held job's reasons (`scontrol hold`, `scontrol requeuehold`: the latter's, seen on 22.05)."""
SENT_BACK = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "PREEMPTED"})
"""States a running job reaches only by a command (requeue, hold, suspend) or preemption, none of it Slurm's own
doing on the demo's cluster."""
SETTLE_S = 0.3
SETTLE_READS = 10
"""Before a shadow epoch: reads of every job `SETTLE_S` apart until two agree (Slurm starts a released job, ends a
requeued one, within a second or so of the acting epoch that asked), at most `SETTLE_READS`."""
FIELD = re.compile(r"(?:^|\s)([\w/:]+)=(\S*)")


def job_records(runner) -> dict[int, dict[str, str]]:
    """Every job as `scontrol show job --oneliner` shows it: {job id: {field: value}} ({} with no job)."""
    out = runner(["scontrol", "show", "job", "--oneliner"])
    if out.returncode != 0:
        raise DemoError(f"scontrol show job failed ({out.returncode}): {(out.stderr or out.stdout).strip()}")
    records = {}
    for line in out.stdout.splitlines():
        fields = dict(FIELD.findall(line))
        if fields.get("JobId", "").isdigit():
            records[int(fields["JobId"])] = fields
    return records


ENDED = frozenset({"COMPLETING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"})


STARTS = frozenset(kind.value for kind in inflight.STARTS)
"""The acting epoch's actions after which Slurm starts the job."""


def moved(before: dict[int, dict[str, str]], after: dict[int, dict[str, str]],
          done: dict[int, dict[str, str]] | None = None, acting: list[tuple[int, str]] = ()) -> list[int]:
    """The jobs submitted, ended (gone) or moved to another state between two `job_records` (before and after a
    shadow epoch), and those Slurm moved by itself between `after` and `done` (after the acting epoch, whose
    actions are `acting`): gone; running then ended with no restart counted (a requeue by the acting epoch counts
    one); pending then running though the acting epoch did not start it."""
    found = {j for j in before.keys() | after.keys()
             if j not in before or j not in after or before[j].get("JobState") != after[j].get("JobState")}
    started = {j for j, kind in acting if kind in STARTS}
    for j, a in (after.items() if done is not None else ()):
        d, state = done.get(j), a.get("JobState")
        if d is None or (state == "RUNNING" and d.get("JobState") in ENDED and d.get("Restarts") == a.get("Restarts")) \
                or (state == "PENDING" and d.get("JobState") == "RUNNING" and j not in started):
            found.add(j)
    return sorted(found)


def changes(before: dict[int, dict[str, str]], after: dict[int, dict[str, str]]) -> dict[int, list[str]]:
    """What a command changed between two `job_records` (see the module's docstring), per job listed in both."""
    found = {}
    for job_id in sorted(before.keys() & after.keys()):
        b, a = before[job_id], after[job_id]
        keys = list(STATIC)
        if (b.get("JobState"), b.get("Reason")) == (a.get("JobState"), a.get("Reason")):
            keys += STEADY
        what = [f"{k} {b.get(k)} -> {a.get(k)}" for k in keys if b.get(k) != a.get(k)]
        if b.get("JobState") == "RUNNING" and a.get("JobState") in SENT_BACK:
            what.append(f"JobState RUNNING -> {a['JobState']}")
        if a.get("Reason") in HELD and b.get("Reason") not in HELD:
            what.append(f"Reason {b.get('Reason')} -> {a['Reason']}")
        if what:
            found[job_id] = what
    return found


@dataclass
class Pair:
    """One paired epoch: the shadow epoch's time and what Slurm showed around it, the acting epoch's actions."""

    shadow_at: float
    shadow_changes: int
    """The Slurm changes the shadow epoch counted itself (`slurm_changes`)."""
    changed: dict[int, list[str]]
    """What `scontrol show job` showed changed across the shadow epoch (must be empty)."""
    logged: list[str]
    """slurmctld's log lines of a change written during the shadow epoch (must be empty)."""
    acting_at: float | None
    acting: list[tuple[int, str]]
    """(job id, kind) of each action the acting epoch took (done)."""
    acting_changed: int
    """Jobs whose record changed across the acting epoch (the control: the same check sees its changes)."""
    outage: bool = False
    moved: list[int] = field(default_factory=list)
    """Jobs Slurm moved between the shadow epoch's first read and the acting epoch's last (`moved`): the acting
    epoch's actions on them may have found another state than the one planned for."""
    acting_failed: bool = False
    """The acting epoch failed (its exit code was not 0); the pass goes on, as the `--interval` helper does."""

    @classmethod
    def from_dict(cls, data: dict) -> "Pair":
        """The pair from its JSON form (`dataclasses.asdict`)."""
        return cls(**{**data, "changed": {int(j): v for j, v in data["changed"].items()},
                      "acting": [(int(j), str(k)) for j, k in data["acting"]]})


@dataclass
class Pairing:
    """One paired epoch, checked: what `demo_pair` runs in a process of its own.

    `epoch(mode)` runs one epoch, mode "shadow" or "act", and returns (its JSON, the exit code `elastico sched
    --once` would give: 75 when Slurm did not answer); `runner` runs `scontrol`; `slurmctld_log` is read around the
    shadow epoch when given."""

    epoch: Callable[[str], tuple[dict | None, int]]
    runner: object
    slurmctld_log: Path | None = None

    def settled(self) -> dict[int, dict[str, str]]:
        """The job records once Slurm has followed through the last acting epoch: two reads `SETTLE_S` apart with
        every job in the same state (at most `SETTLE_READS` reads; the last one when they never agree)."""
        last = job_records(self.runner)
        for _ in range(SETTLE_READS - 1):
            time.sleep(SETTLE_S)
            now = job_records(self.runner)
            if {j: r.get("JobState") for j, r in now.items()} == {j: r.get("JobState") for j, r in last.items()}:
                return now
            last = now
        return last

    def pair(self) -> Pair:
        """The shadow epoch with the job records and slurmctld's log read around it, then the acting epoch; a
        shadow epoch that fails raises `DemoError` (no acting epoch follows)."""
        before = self.settled()
        log_from = self._log_size()
        shadow, code = self.epoch("shadow")
        after = job_records(self.runner)
        logged = self._logged(log_from)
        if code not in (0, 75):  # 75: Slurm did not answer (an outage epoch, recorded as such)
            raise DemoError(f"a shadow epoch failed (exit {code}); see its log, shadow.log")
        outage = code == 75 or shadow is None
        acting, code = self.epoch("act")
        done = after if acting is None else job_records(self.runner)
        taken = [(a["job_id"], a["kind"]) for a in (acting or {}).get("actions", ()) if a["status"] == "done"]
        return Pair(shadow_at=shadow["at"] if shadow else time.time(),
                    shadow_changes=(shadow or {}).get("slurm_changes") or 0, changed=changes(before, after),
                    logged=logged, acting_at=acting["at"] if acting else None,
                    acting=taken, acting_changed=len(changes(after, done)), outage=outage,
                    moved=moved(before, after, done, taken), acting_failed=code != 0)

    def _log_size(self) -> int:
        return self.slurmctld_log.stat().st_size if self.slurmctld_log and self.slurmctld_log.exists() else 0

    def _logged(self, start: int) -> list[str]:
        from slurm_elastico.helper.shadow import SLURMCTLD_CHANGES

        if not self.slurmctld_log or not self.slurmctld_log.exists():
            return []
        with open(self.slurmctld_log, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        return [ln for ln in text.splitlines() if SLURMCTLD_CHANGES.search(ln)]


@dataclass
class PairedHelper:
    """The pass's helper: a thread that runs a paired epoch every `interval_s` seconds until `stop` is set.

    Each pair is one run of `python -m slurm_elastico.cluster.demo_pair` (`python`, by default this process's
    interpreter; `env` names the helper's config), which appends each epoch's output to `work`/shadow.log or
    `work`/sched.log and prints the `Pair` (anything it says on stderr goes to `work`/pairs.err). A pair that
    fails (a shadow epoch that fails, a `scontrol show job` that fails) ends the thread with `error` set (the driver
    raises it); an acting epoch that fails is counted (`acting_failed`) and the next pair goes on, as the
    `--interval` helper does."""

    env: dict
    interval_s: float
    work: Path
    slurmctld_log: Path | None = None
    python: str = sys.executable
    pairs: list[Pair] = field(default_factory=list)
    quiet: threading.Lock = field(default_factory=threading.Lock)
    """Held for each pair: the driver's submissions wait for it (no job arrives between the two epochs)."""
    error: BaseException | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def acting_failed(self) -> int:
        return sum(p.acting_failed for p in self.pairs)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="paired-helper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the pair under way (a pair is never cut short) and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                self.pairs.append(self.pair())
                with open(self.work / "pairs.jsonl", "a") as f:  # the evidence, a line a pair
                    f.write(json.dumps(dataclasses.asdict(self.pairs[-1])) + "\n")
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))
        except BaseException as exc:  # raised by the driver, which polls `error`
            self.error = exc

    def pair(self) -> Pair:
        """One paired epoch, with no submission meanwhile (`quiet`)."""
        argv = [self.python, "-m", "slurm_elastico.cluster.demo_pair", str(self.work), str(self.slurmctld_log or "")]
        with self.quiet:
            out = subprocess.run(argv, env=self.env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                 timeout=1200)
        if out.stderr.strip():  # the child's own errors (a traceback); its epochs' output is in their logs
            with open(self.work / "pairs.err", "a") as f:
                f.write(out.stderr)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode != 0 or not lines:
            why = out.stderr.strip().splitlines()[-1:] or ["no output"]
            raise DemoError(f"a paired epoch failed (exit {out.returncode}): {why[0]} (all of it in "
                            f"{self.work / 'pairs.err'})")
        return Pair.from_dict(json.loads(lines[-1]))


def journal_pairs(store, pairs: list[Pair]) -> list[list[tuple[int, str]]]:
    """Each pair's shadow journal rows, (job id, kind): the rows of its shadow epoch (journaled at its `at`)."""
    rows = store.query("SELECT epoch, job_id, kind FROM shadow_journal ORDER BY id")
    by_epoch: dict[float, list[tuple[int, str]]] = {}
    for r in rows:
        by_epoch.setdefault(round(r["epoch"], 3), []).append((r["job_id"], r["kind"]))
    return [by_epoch.get(round(p.shadow_at, 3), []) for p in pairs]


def matched(pairs: list[Pair], journaled: list[list[tuple[int, str]]]) -> dict:
    """How many of the acting epochs' actions the shadow epoch just before them journaled (same job and kind), how
    many journaled proposals the acting epoch did not take, and how many of both misses fell in pairs where Slurm
    moved a job before the acting epoch acted (`Pair.moved`)."""
    hit = taken = proposed = missed_moved = 0
    for p, rows in zip(pairs, journaled):
        common = Counter(p.acting) & Counter(rows)
        hit += sum(common.values())
        taken += len(p.acting)
        proposed += len(rows)
        if p.moved:
            missed_moved += len(p.acting) + len(rows) - 2 * sum(common.values())
    return {"acting": taken, "journaled": proposed, "matched": hit,
            "share_matched": hit / taken if taken else None, "not_taken": proposed - hit,
            "misses_where_slurm_moved_a_job": missed_moved}
