"""One helper per cluster, for the helper process's whole life.

Two helpers on one cluster repair each other's reshapes and release each
other's holds; two clusters' helpers sharing one state directory would read
each other's journal. So a helper holds, from start to exit, two locks:

- `<run dir>/<ClusterName>.lock` in a system-wide run directory
  (`/run/slurm-elastico`), whatever its state directory: one helper per
  cluster on this host. Run the helper on one host only (the controller's).
- `<state dir>/sched.lock`: one helper per state directory.

Both are `flock` locks (`file_lock`): the kernel drops them when the process
ends, however it ends (a SIGKILLed helper leaves nothing to clean up). Each
lock file names its holder (pid, cluster, state directory), so the one
refused can say who holds it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from slurm_elastico.errors import ConfigError, ElasticoError
from slurm_elastico.file_lock import Busy, held

RUN_DIR = Path("/run/slurm-elastico")
"""The system-wide run directory (systemd: `RuntimeDirectory=slurm-elastico`); root creates it itself."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class HelperBusy(ElasticoError):
    """Another helper holds the cluster's (or the state directory's) lock; names it and its pid."""

    def __init__(self, message: str, pid: int | None):
        self.pid = pid
        super().__init__(message)


@contextmanager
def helper_lock(cluster: str, state_dir: str | Path, run_dir: str | Path = RUN_DIR) -> Iterator[None]:
    """Hold the cluster's lock and the state directory's for as long as the block runs (the helper's life).

    `HelperBusy` naming the other helper's pid when either is taken; `ConfigError` for a cluster name that
    cannot be a file name, or a directory that cannot be made.
    """
    if not isinstance(cluster, str) or not _NAME.match(cluster):
        raise ConfigError("slurm.conf", [f"ClusterName {cluster!r} cannot name a lock file (allowed: letters, "
                                         "digits, '_', '.', '-'; at most 128)"])
    holder = {"pid": os.getpid(), "cluster": cluster, "state_dir": str(Path(state_dir).absolute())}
    with ExitStack() as stack:
        cluster_lock = _directory(run_dir, "run directory", "RuntimeDirectory=slurm-elastico in the helper's "
                                  "systemd unit, or run the helper as root") / f"{cluster}.lock"
        stack.enter_context(_locked(cluster_lock, holder, lambda other: (
            f"another elastico helper already runs for cluster {cluster!r}{_who(other, 'state_dir')} "
            f"(lock {cluster_lock}); one helper per cluster: stop it first")))
        state_lock = _directory(state_dir, "state directory", "set state_dir in elastico.yaml to a directory "
                                "the helper's user may write") / "sched.lock"
        stack.enter_context(_locked(state_lock, holder, lambda other: (
            f"another elastico helper uses the state directory {Path(state_dir)}{_who(other, 'cluster')} "
            f"(lock {state_lock}); each helper needs its own state directory")))
        yield


def _who(other: dict, also: str) -> str:
    """' (pid N, cluster X)' from a lock file's record; the pid is 'unknown' when it was not written yet."""
    pid = other.get("pid")
    extra = other.get(also)
    label = "state directory" if also == "state_dir" else also
    parts = [f"pid {pid}" if isinstance(pid, int) else "pid unknown"]
    if isinstance(extra, str) and extra:
        parts.append(f"{label} {extra}")
    return f" ({', '.join(parts)})"


def _directory(path: str | Path, what: str, hint: str) -> Path:
    p = Path(path)
    try:
        p.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(what, [f"cannot create {p}: {exc.strerror or exc} ({hint})"]) from None
    if not p.is_dir():
        raise ConfigError(what, [f"{p} is not a directory ({hint})"])
    return p


@contextmanager
def _locked(path: Path, holder: dict, busy_message) -> Iterator[None]:
    """`file_lock.held(path, holder)`; `HelperBusy(busy_message(other holder))` when another process holds it."""
    try:
        with held(path, holder):
            yield
    except Busy as busy:
        other = busy.holder
        raise HelperBusy(busy_message(other), other.get("pid") if isinstance(other.get("pid"), int) else None) from None
