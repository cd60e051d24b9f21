import sqlite3

import pytest

from slurm_elastico import store as store_mod
from slurm_elastico.store import Store


def test_store_is_wal_and_creates_schema(tmp_path):
    with Store(tmp_path / "sub" / "e.db") as s:
        assert s.query("PRAGMA journal_mode")[0][0] == "wal"
        tables = {r[0] for r in s.query("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "colocation" in tables


def test_reopen_keeps_rows_and_new_schema_entries_are_created(tmp_path, monkeypatch):
    path = tmp_path / "e.db"
    with Store(path) as s:
        s.execute("INSERT INTO colocation (gpu_type, fits) VALUES ('h100', 0)")
    monkeypatch.setattr(store_mod, "SCHEMA", [*store_mod.SCHEMA, "CREATE TABLE IF NOT EXISTS extra (x INTEGER)"])
    with Store(path) as s:
        assert s.query("SELECT count(*) FROM colocation")[0][0] == 1
        assert s.query("SELECT count(*) FROM extra")[0][0] == 0


def test_executemany_is_all_or_nothing(tmp_path):
    with Store(tmp_path / "e.db") as s:
        with pytest.raises(sqlite3.IntegrityError):
            s.executemany("INSERT INTO colocation (gpu_type, fits) VALUES (?, ?)", [("a", 1), (None, 1)])
        assert s.query("SELECT count(*) FROM colocation")[0][0] == 0
