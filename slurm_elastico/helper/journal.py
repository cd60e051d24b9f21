"""The journal: every action is written before it is issued and settled after.

A row is 'planned' when written, then 'done', 'failed' or 'recovered'. A row
that stays 'planned' past its epoch (a crash, a failed reshape that may have
left its job held, an action Slurm did not answer) is for `recovery.recover`
to settle from Slurm's state of the job; it stays 'planned', with a note of
why, until that state settles it. A 'recovered' row's `error` says what was
found and done.

`Journal` keeps the rows in the store (the helper's); `MemoryJournal` keeps
them in memory (the simulator's): the same states and the same open rows, so
a refused action has the same consequences in both.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Protocol

from slurm_elastico.model import Action, ActionKind
from slurm_elastico.store import Store


class JournalLike(Protocol):
    def plan(self, epoch: float, action: Action) -> int: ...
    def note(self, row_id: int, error: str, at: float) -> None: ...
    def settle(self, row_id: int, status: str, at: float, error: str = "") -> None: ...
    def unsettled(self) -> list[tuple[int, Action]]: ...
    def recent(self, since: float) -> list[tuple[float, Action]]: ...


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

    def recent(self, since: float) -> list[tuple[float, Action]]:
        """(time, action) of the rows that took effect at or after `since` (see `inflight.in_flight`): 'done'
        rows at their epoch, 'recovered' ones at their settling (recovery may just have released the job)."""
        rows = self.store.query("SELECT status, epoch, updated, action FROM journal WHERE (status='done' AND "
                                "epoch >= ?) OR (status='recovered' AND updated >= ?) ORDER BY id", (since, since))
        return [(r["epoch"] if r["status"] == "done" else r["updated"], action_from_json(r["action"])) for r in rows]


class MemoryJournal:
    """The journal kept in memory: open rows, recent 'done' rows, and a count of settled rows by status (the simulator's)."""

    def __init__(self) -> None:
        self.open: dict[int, Action] = {}
        self.settled: Counter[str] = Counter()
        self._last = 0
        self._epochs: dict[int, float] = {}
        self._done: list[tuple[float, Action]] = []

    def plan(self, epoch: float, action: Action) -> int:
        self._last += 1
        self.open[self._last] = action
        self._epochs[self._last] = epoch
        return self._last

    def note(self, row_id: int, error: str, at: float) -> None:
        pass  # the row stays open; nothing else is kept

    def settle(self, row_id: int, status: str, at: float, error: str = "") -> None:
        action = self.open.pop(row_id)
        epoch = self._epochs.pop(row_id)
        self.settled[status] += 1
        if status in ("done", "recovered"):
            self._done.append((epoch if status == "done" else at, action))

    def unsettled(self) -> list[tuple[int, Action]]:
        return sorted(self.open.items())

    def recent(self, since: float) -> list[tuple[float, Action]]:
        """As `Journal.recent`, in the order settled; older ones are forgotten."""
        self._done = [(at, a) for at, a in self._done if at >= since]
        return list(self._done)


def action_to_json(action: Action) -> str:
    d = dataclasses.asdict(action)
    d["kind"] = action.kind.value
    return json.dumps(d, sort_keys=True)


def action_from_json(text: str) -> Action:
    d = json.loads(text)
    d["kind"] = ActionKind(d["kind"])
    d["nodes"] = tuple(d.get("nodes") or ())
    return Action(**d)
