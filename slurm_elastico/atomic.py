"""Replacing a file whole or not at all: write a temporary sibling, fsync it, rename it over, fsync the directory.

A reader then sees the old file or the whole new one, and after `write_atomic` returns the new one survives a
power cut. Used wherever the project writes a file a person or a later run relies on (checkpoints, traces).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any]) -> Any:
    """Write via `write(file)` to a temporary sibling, fsync, rename over `path`; returns what `write` returned.
    On any failure the temporary is removed and the old file is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            result = write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return result
