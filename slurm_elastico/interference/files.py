"""Model files: written so that a crash leaves the old file or the new one, never half of one; read with their
format and version checked."""

from __future__ import annotations

import os
from pathlib import Path

from slurm_elastico.interference.errors import ModelFileError


def write_atomically(path: str | Path, data: bytes) -> None:
    """Writes `data` to a temporary file beside `path`, flushes it to disk, then renames it over `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


def check_header(blob: object, path: str | Path, file_format: str, version: int, older: tuple[int, ...] = ()) -> None:
    """Raises `ModelFileError` unless `blob` is a dict of `file_format` at `version`, or at one of the `older`
    versions this code still reads as they were written (naming what to do)."""
    if not isinstance(blob, dict) or blob.get("format") != file_format:
        raise ModelFileError(f"{path}: not a slurm-elastico predictor file (format {file_format!r} expected)")
    if blob.get("version") != version and blob.get("version") not in older:
        also = "".join(f" or {v}" for v in sorted(older, reverse=True))
        raise ModelFileError(f"{path}: file version {blob.get('version')}, this slurm-elastico reads version "
                             f"{version}{also}; retrain with `elastico iac train`")
