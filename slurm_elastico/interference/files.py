"""Writing model files so that a crash leaves the old file or the new one, never half of one."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: str | Path, data: bytes) -> None:
    """Writes `data` to a temporary file beside `path`, flushes it to disk, then renames it over `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
