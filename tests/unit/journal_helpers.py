"""Helpers the inference-runner tests share (CPU engines and real vLLM): read a journal, stop after N batches."""

from __future__ import annotations

import json
from pathlib import Path


def journal_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def outputs(path: Path) -> dict[str, tuple[str, list[int]]]:
    """Request id -> (text, token ids) of every record in a journal."""
    return {r["id"]: (r["text"], r["token_ids"]) for r in journal_lines(path)}


def stop_after(batches: int):
    """A should_stop that says yes once `batches` batches ran (asked before every batch)."""
    asked = [0]

    def should_stop() -> bool:
        asked[0] += 1
        return asked[0] > batches

    return should_stop
