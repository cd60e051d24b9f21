"""The project's SQLite store (WAL): one file, one schema list that modules append to.

Why WAL: the helper writes while `elastico report` and the profiler read; WAL
lets readers proceed during a write. Each module adds its `CREATE TABLE IF NOT
EXISTS` statements to `SCHEMA` at import time, so opening a store creates any
table that is missing and never touches existing ones (no migrations here: a
changed table needs a new name).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from slurm_elastico.errors import StateError

SCHEMA: list[str] = [
    # Co-location observations (slurm_elastico.interference.measurements): one row
    # per pair of jobs sharing one GPU; `a_*`/`b_*` are each job's solo profile,
    # `*_norm` its co-located throughput / solo throughput (NULL when fits = 0).
    """CREATE TABLE IF NOT EXISTS colocation (
        id INTEGER PRIMARY KEY,
        gpu_type TEXT NOT NULL,
        fits INTEGER NOT NULL,
        source TEXT NOT NULL DEFAULT '',
        a_kind TEXT, a_throughput REAL, a_batch REAL, a_precision TEXT, a_model_family TEXT,
        a_sm_util REAL, a_membw_util REAL, a_mem_used_mib REAL, a_power_w REAL, a_mps_share INTEGER,
        a_norm REAL,
        b_kind TEXT, b_throughput REAL, b_batch REAL, b_precision TEXT, b_model_family TEXT,
        b_sm_util REAL, b_membw_util REAL, b_mem_used_mib REAL, b_power_w REAL, b_mps_share INTEGER,
        b_norm REAL
    )""",
    # The families of jobs the helper has managed, for `elastico report`'s history (kind per job):
    # written by the helper (slurm_elastico.helper.families) from the jobs' own batch scripts,
    # never read to decide what to do with a job.
    """CREATE TABLE IF NOT EXISTS job_family (
        job_id INTEGER PRIMARY KEY,
        spec TEXT NOT NULL,
        source TEXT NOT NULL DEFAULT '',
        submitted_at REAL NOT NULL
    )""",
    # What the helper found in each queued job's batch script (slurm_elastico.helper.families), once per
    # job: keyed by job id and submit time (a reused id is a new job); managed = 1 only for a script
    # elastico-submit made, with its valid family. Rows of jobs that left the queue are deleted.
    """CREATE TABLE IF NOT EXISTS job_admission (
        job_id INTEGER NOT NULL,
        submit_time INTEGER NOT NULL,
        user TEXT NOT NULL,
        managed INTEGER NOT NULL,
        spec TEXT NOT NULL DEFAULT '',
        source TEXT NOT NULL DEFAULT '',
        note TEXT NOT NULL DEFAULT '',
        seen_at REAL NOT NULL,
        PRIMARY KEY (job_id, submit_time)
    )""",
    # The helper's journal (slurm_elastico.helper.journal): a row is written before an action
    # is issued ('planned') and updated after ('done' / 'failed' / 'recovered'), so a
    # crash between the two is found and repaired by the next epoch.
    """CREATE TABLE IF NOT EXISTS journal (
        id INTEGER PRIMARY KEY,
        epoch REAL NOT NULL,
        job_id INTEGER NOT NULL,
        kind TEXT NOT NULL,
        action TEXT NOT NULL,
        reason TEXT NOT NULL,
        status TEXT NOT NULL,
        error TEXT NOT NULL DEFAULT '',
        updated REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS journal_status ON journal (status)",
    # What the helper last read of each running job's progress report, and each
    # job's solo speed per shape as total work / total seconds (slurm_elastico.helper.observe).
    """CREATE TABLE IF NOT EXISTS progress_reading (
        job_id INTEGER PRIMARY KEY,
        done REAL NOT NULL,
        updated REAL NOT NULL,
        restarts INTEGER NOT NULL,
        context TEXT NOT NULL,
        since REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS solo_rate (
        job_id INTEGER NOT NULL,
        shape TEXT NOT NULL,
        work REAL NOT NULL,
        seconds REAL NOT NULL,
        PRIMARY KEY (job_id, shape)
    )""",
    # Each managed job's last progress report as the helper read it (slurm_elastico.helper.job_work): the work
    # done and what it cost (optimizer steps, samples) and, in goodput mode, the gradient noise scale the planner
    # prices the job's other batches at. Kept after the job leaves the queue (`final` 1: its report was read
    # once more then) for `elastico report`.
    """CREATE TABLE IF NOT EXISTS job_work (
        job_id INTEGER PRIMARY KEY,
        user TEXT NOT NULL,
        work_dir TEXT NOT NULL,
        done REAL NOT NULL,
        total REAL NOT NULL,
        steps INTEGER,
        samples INTEGER,
        grad_noise_scale REAL,
        updated REAL NOT NULL,
        final INTEGER NOT NULL DEFAULT 0
    )""",
    # The same per GPU type where the job measured it: a typed shape's name is `<shape>@<type>`
    # (slurm_elastico.shapes.typed), so its solo speed is the job's speed on that type (read by
    # slurm_elastico.helper.families to scale it to the types where the job has not run).
    """CREATE VIEW IF NOT EXISTS solo_rate_by_type AS SELECT job_id,
        substr(shape, 1, instr(shape, '@') - 1) AS shape, substr(shape, instr(shape, '@') + 1) AS gpu_type,
        work, seconds FROM solo_rate WHERE instr(shape, '@') > 1""",
    # The GPU counters of a job's latest counters report taken while it ran a shape alone.
    """CREATE TABLE IF NOT EXISTS solo_counters (
        job_id INTEGER NOT NULL,
        shape TEXT NOT NULL,
        sm_util REAL, membw_util REAL, mem_used_mib REAL, power_w REAL,
        PRIMARY KEY (job_id, shape)
    )""",
    # The same beside one partner on one GPU, per direction, until the pair is an observation.
    """CREATE TABLE IF NOT EXISTS pair_rate (
        job_id INTEGER NOT NULL,
        shape TEXT NOT NULL,
        partner INTEGER NOT NULL,
        partner_shape TEXT NOT NULL,
        work REAL NOT NULL,
        seconds REAL NOT NULL,
        PRIMARY KEY (job_id, shape, partner, partner_shape)
    )""",
    # Online refinements of the predictor (slurm_elastico.interference.online): one row
    # per attempt; `last_observation` is the newest colocation id it had seen.
    """CREATE TABLE IF NOT EXISTS model_update (
        id INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        model TEXT NOT NULL,
        accepted INTEGER NOT NULL,
        error_before REAL, error_after REAL, recent_before REAL, recent_after REAL,
        new_observations INTEGER NOT NULL,
        last_observation INTEGER NOT NULL
    )""",
]


class Store:
    """An open store; creates every table in `SCHEMA` that is missing. Use as a context manager."""

    def __init__(self, path: str | Path):
        """Opens (creating if missing) the store at `path`; `StateError` when it cannot, leaving nothing behind.

        A store that could not be set up is removed again with the directories made for it, so a full or
        read-only disk leaves the state directory as it was.
        """
        self.path = Path(path)
        for d in (self.path.parent, *self.path.parent.parents):
            if d.exists() and not d.is_dir():
                raise StateError(f"cannot open the store {self.path}: {d} is not a directory; allowed: a state_dir "
                                 "that is a directory (or a path that can be created as one)")
        made = [d for d in (self.path.parent, *self.path.parent.parents) if not d.exists()]
        existed = self.path.exists()
        conn = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: autocommit; `transaction()` groups writes explicitly.
            conn = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA foreign_keys=ON")
            for statement in SCHEMA:
                conn.execute(statement)
        except (OSError, sqlite3.Error) as exc:
            if conn is not None:
                conn.close()
            if not existed:
                for name in (self.path.name, f"{self.path.name}-wal", f"{self.path.name}-shm"):
                    with contextlib.suppress(OSError):  # what cannot be removed was never made
                        (self.path.parent / name).unlink()
                for d in made:  # innermost first
                    with contextlib.suppress(OSError):
                        d.rmdir()
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise StateError(f"cannot open the store {self.path}: {reason}; allowed: a state_dir that is a "
                             "writable directory on a disk with free space") from None
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Runs `sql` for every row in one transaction: all rows land or none."""
        with self.transaction() as conn:
            conn.executemany(sql, rows)

    def transaction(self) -> sqlite3.Connection:
        """`with store.transaction():` groups the writes inside into one transaction."""
        self.conn.execute("BEGIN")
        return self.conn

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return self.conn.execute(sql, params).fetchall()

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
