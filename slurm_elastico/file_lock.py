"""An exclusive `flock` on a file that names its holder: one process at a time, and the one refused learns who.

The kernel drops a flock when its process ends, however it ends (a SIGKILLed
holder leaves nothing to clean up). The holder writes a JSON record (its pid
and whatever else identifies it) into the file once it holds it, so the one
refused can say who holds it. Used for one helper per cluster
(`helper.lock`), one running job per checkpoint directory
(`jobwrap.job.ckpt_lock`), and, waiting its turn instead of refused, one
package installation at a time (`cluster.install`).
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
def held(path: Path, holder: dict, on_unlockable: Callable[[OSError], None] | None = None,
         shared: bool = False, wait: bool = False) -> Iterator[IO[str]]:
    """flock `path` and write `holder` into it, for as long as the block runs; `Busy(record)` when another process
    holds it, or with `wait`, wait until it lets go. A file system that cannot lock (`flock` fails otherwise)
    raises `ConfigError`, or, with `on_unlockable`, is reported to it and the block runs unlocked.

    The file is its owner's alone, 0600 (set again by the owner: anyone who can open a lock file can take it, and
    hold the helper off). A `shared` lock is one several users take in turn (a checkpoint directory a team
    shares): it is made 0666. One this user may not write (another user's, left 0644 by an older version) is refused,
    naming its owner and the fix: locked read-only it would keep its last holder's record (a refusal would name
    the wrong job), and NFS's flock needs a file open for writing."""
    mode = 0o666 if shared else 0o600
    try:
        f = _open(path, mode)
    except PermissionError as exc:
        owner = _owner(path)
        raise ConfigError("lock", [f"cannot open {path} for writing: {exc.strerror or exc}" + (
            f" (it is uid {owner}'s; a shared directory's lock file must be 0666: its owner may `chmod 0666` it, "
            "or remove it when no job runs there)" if shared and owner is not None else
            "; allowed: a directory this user may write")]) from None
    except OSError as exc:
        raise ConfigError("lock", [f"cannot open {path}: {exc.strerror or exc}; allowed: a directory this user "
                                   "may write"]) from None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
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


def _open(path: Path, mode: int) -> IO[str]:
    """The lock file for reading and writing, made with `mode` if new (its owner sets the mode again)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o777 != mode:
            os.fchmod(fd, mode)  # past the umask, or a file an older version made
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "r+")


def _owner(path: Path) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def read_holder(f: IO[str]) -> dict:
    """The record the lock's holder wrote ({} while it has not written it yet, or when it is not ours)."""
    try:
        f.seek(0)
        data = json.loads(f.read(4096) or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
