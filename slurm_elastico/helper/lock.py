"""One epoch at a time: the helper's lock in its state directory."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slurm_elastico.errors import ElasticoError


class EpochBusy(ElasticoError):
    """Another epoch holds the helper's lock (cron epochs may overlap a slow one); this one is skipped."""

    exit_code = 0


@contextmanager
def epoch_lock(state_dir: str | Path) -> Iterator[None]:
    """Hold `<state_dir>/sched.lock` for one epoch: two epochs at once would repair each other's reshapes."""
    path = Path(state_dir) / "sched.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EpochBusy(f"another epoch holds {path}; this one is skipped") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)

