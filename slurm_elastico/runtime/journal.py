"""A job's requests and the journal of those answered: a fixed set, each answered exactly once across reshapes.

Requests come from JSONL (`{"id", "prompt", "max_tokens"}` per line; ids
unique, max_tokens 16 when absent). Results are appended to a JSONL journal,
one line per request id, written, flushed and fsynced once per batch; on
(re)start the journal's ids are skipped, so a resume neither loses nor repeats
a request whatever the new `max_num_seqs`. A kill can tear only the last line
(appends are sequential); `Journal` detects that, truncates it away, and the
request is redone.

With replicas (`runtime.infer`), replica 0 writes the journal itself and
replica r its shard `<stem>.replica-<r><suffix>` beside it (`replica_journal`:
one writer per file); each reads every shard (`journal_shards`, `OtherShards`)
without repairing the others' torn tails, and an id found in two shards is a
`JournalCorruptError`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_elastico.errors import ConfigError, ElasticoError

log = logging.getLogger(__name__)


class JournalCorruptError(ElasticoError):
    """The journal has a bad line before its end: not a torn append, so it is not silently dropped."""


@dataclass(frozen=True)
class Request:
    id: str
    prompt: str
    max_tokens: int


def read_requests(path: str | os.PathLike[str]) -> list[Request]:
    """Parse a requests JSONL file; every bad line is reported at once (line number and what is wrong)."""
    problems: list[str] = []
    requests: list[Request] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"line {n}: not JSON ({exc.msg})")
                continue
            if not isinstance(obj, dict):
                problems.append(f"line {n}: expected an object with id, prompt, max_tokens")
                continue
            rid, prompt, max_tokens = obj.get("id"), obj.get("prompt"), obj.get("max_tokens", 16)
            if not isinstance(rid, (str, int)) or isinstance(rid, bool) or rid == "":
                problems.append(f"line {n}: 'id' must be a non-empty string or integer, not {rid!r}")
                continue
            rid = str(rid)
            if not isinstance(prompt, str):
                problems.append(f"line {n}: 'prompt' must be a string")
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
                problems.append(f"line {n}: 'max_tokens' must be an integer >= 1, not {max_tokens!r}")
            if rid in seen:
                problems.append(f"line {n}: id {rid!r} repeats line {seen[rid]}; ids must be unique")
            seen.setdefault(rid, n)
            if isinstance(prompt, str) and isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1:
                requests.append(Request(rid, prompt, max_tokens))
    if problems:
        raise ConfigError(str(path), problems)
    return requests


class Journal:
    """An append-only JSONL file of finished requests keyed by "id"; opening it repairs a torn last line."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.done: dict[str, dict[str, Any]] = {}
        self.repaired_bytes = 0
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        self.done, good_end = _scan(data, self.path)
        if good_end < len(data):
            self.repaired_bytes = len(data) - good_end
            log.warning("%s: dropping a torn last line (%d bytes) left by a kill", self.path, self.repaired_bytes)
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
                f.flush()
                os.fsync(f.fileno())

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Durably append `records` (one batch): one write, flush, fsync. Refuses an id already journaled."""
        records = list(records)
        for r in records:
            if r["id"] in self.done:
                raise JournalCorruptError(f"{self.path}: request {r['id']!r} is already journaled; refusing to write it twice")
        text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        for r in records:
            self.done[r["id"]] = r


def _scan(data: bytes, path: Path, offset: int = 0) -> tuple[dict[str, dict[str, Any]], int]:
    """The records of journal bytes `data` (read from `path` at byte `offset`) and where the complete lines end.

    A torn last line (no newline, or cut mid-record) is left out; an
    unreadable line followed by more records, or a repeated id, is a JournalCorruptError.
    """
    records: dict[str, dict[str, Any]] = {}
    good_end = pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        line = data[pos:] if nl < 0 else data[pos:nl]
        record = _parse_record(line)
        if nl < 0 or record is None:
            if nl >= 0 and data[nl + 1 :].strip():
                raise JournalCorruptError(
                    f"{path}: byte {offset + pos}: unreadable line followed by more records; not a torn append, fix or remove it"
                )
            break  # the last line is torn: drop it
        if record["id"] in records:
            raise JournalCorruptError(f"{path}: id {record['id']!r} appears twice")
        records[record["id"]] = record
        good_end = pos = nl + 1
    return records, good_end


def replica_journal(base: str | os.PathLike[str], replica: int) -> Path:
    """The journal shard replica `replica` writes: the journal itself for replica 0, `<stem>.replica-<r><suffix>` beside it otherwise."""
    base = Path(base)
    return base if replica == 0 else base.with_name(f"{base.stem}.replica-{replica}{base.suffix}")


def journal_shards(base: str | os.PathLike[str]) -> list[Path]:
    """Every existing shard of the journal `base` (the journal itself first, then the replicas' in replica order)."""
    base = Path(base)
    pattern = re.compile(rf"^{re.escape(base.stem)}\.replica-(\d+){re.escape(base.suffix)}$")
    found = sorted((int(m.group(1)), p) for p in base.parent.glob(f"{base.stem}.replica-*") if (m := pattern.match(p.name)))
    return ([base] if base.exists() else []) + [p for _, p in found]


class OtherShards:
    """The ids the other replicas' shards hold, read incrementally and read-only (a torn tail is left for its writer)."""

    def __init__(self, base: Path, own: Path):
        self.base, self.own = base, own
        self.offsets: dict[Path, int] = {}
        self.ids: dict[str, Path] = {}

    def poll(self) -> dict[str, Path]:
        for path in journal_shards(self.base):
            if path == self.own:
                continue
            offset = self.offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            records, end = _scan(data, path, offset)
            for rid in records:
                if rid in self.ids:
                    raise JournalCorruptError(f"request {rid!r} is journaled in both {self.ids[rid]} and {path}")
                self.ids[rid] = path
            self.offsets[path] = offset + end
        return self.ids


def _parse_record(line: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        return None
    return obj
