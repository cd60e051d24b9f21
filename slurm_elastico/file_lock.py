"""An exclusive `flock` on a file that names its holder: one process at a time, and the one refused learns who.

The kernel drops a flock when its process ends, however it ends (a SIGKILLed
holder leaves nothing to clean up). The holder writes a JSON record (its pid
and whatever else identifies it) into the file once it holds it, so the one
refused can say who holds it. Used for one helper per cluster
(`helper.lock`) and one running job per checkpoint directory
(`jobwrap.job.ckpt_lock`).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from slurm_elastico.errors import ConfigError, StateError


class Busy(Exception):
    """The lock is held by another process; `holder` is the record it wrote ({} if none yet)."""

    def __init__(self, holder: dict):
        self.holder = holder
        super().__init__(f"held by {holder or 'a process that has not written its record yet'}")


@contextmanager
def held(path: Path, holder: dict, on_unlockable: Callable[[OSError], None] | None = None) -> Iterator[IO[str]]:
    """flock `path` without waiting and write `holder` into it, for as long as the block runs; `Busy(record)`
    when another process holds it. A file system that cannot lock (`flock` fails otherwise) raises
    `ConfigError`, or, with `on_unlockable`, is reported to it and the block runs unlocked."""
    try:
        f = open(path, "a+")
    except OSError as exc:
        raise ConfigError("lock", [f"cannot open {path}: {exc.strerror or exc}; allowed: a directory this user "
                                   "may write"]) from None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(read_holder(f)) from None
        except OSError as exc:
            if on_unlockable is None:
                raise ConfigError("lock", [f"cannot lock {path}: {exc.strerror or exc}; allowed: a file system "
                                           "with flock"]) from None
            on_unlockable(exc)
            yield f
            return
        try:
            try:  # unbuffered: a full or read-only disk fails here, not again when the file is closed
                os.ftruncate(f.fileno(), 0)
                os.pwrite(f.fileno(), (json.dumps(holder) + "\n").encode(), 0)
            except OSError as exc:
                raise StateError(f"cannot write the lock {path}: {exc.strerror or exc}; allowed: a directory "
                                 "this user may write on a disk with free space") from None
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_holder(f: IO[str]) -> dict:
    """The record the lock's holder wrote ({} while it has not written it yet, or when it is not ours)."""
    try:
        f.seek(0)
        data = json.loads(f.read(4096) or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
