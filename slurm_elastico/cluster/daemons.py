"""Start and stop daemons by pid file, reading process state from /proc.

A stopped daemon can linger as a zombie until its parent reaps it, and
`kill -0` succeeds on zombies, so "running" here means: the pid file names a
process whose /proc state is not Z or X and whose command name is the
daemon's. The name check keeps a stale pid file from ever signalling an
unrelated process that reused the pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurm_elastico.errors import ClusterError

POLL_S = 0.05


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except (FileNotFoundError, PermissionError):
        return None
    return int(text) if text.isdigit() else None


def proc_state(pid: int) -> str | None:
    """The one-letter /proc state (R, S, D, Z, ...) or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name in parentheses may itself hold spaces or ')'.
    return stat[stat.rindex(")") + 2]


def proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def is_alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def running_pid(pid_file: Path, name: str) -> int | None:
    """The pid of a live `name` process recorded in `pid_file`, else None."""
    pid = read_pid(pid_file)
    # comm is truncated to 15 characters by the kernel.
    if pid is None or not is_alive(pid) or proc_name(pid) != name[:15]:
        return None
    return pid


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = POLL_S) -> bool:
    """Poll `predicate` until it is true (→ True) or `timeout` seconds pass (→ False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def stop(pid_file: Path, name: str, timeout: float = 10.0) -> int | None:
    """SIGTERM the daemon of `pid_file`, SIGKILL it after `timeout`; return its pid or None if none ran."""
    pid = running_pid(pid_file, name)
    if pid is not None:
        _signal(pid, signal.SIGTERM)
        if not wait_for(lambda: not is_alive(pid), timeout):
            _signal(pid, signal.SIGKILL)
            if not wait_for(lambda: not is_alive(pid), 5.0):
                raise ClusterError(f"{name} (pid {pid}) survived SIGKILL; see /proc/{pid}/status")
    pid_file.unlink(missing_ok=True)
    return pid


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass  # it has exited already: what the signal was for


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file, or a note that it does not exist."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode(errors="replace")
    except FileNotFoundError:
        return "(the log file does not exist)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(the log file is empty)"


def logged_fatal(path: Path, offset: int = 0) -> bool:
    """Whether the log got a line after byte `offset` that Slurm writes just before exiting at start."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            text = fh.read()
            # slurmd 24.11 ends with "error: slurmd initialization failed", not "fatal:".
            return b"fatal:" in text or b"initialization failed" in text
    except FileNotFoundError:
        return False


def failure(daemon: str, what: str, log: Path) -> ClusterError:
    """A ClusterError naming the daemon, what went wrong, the log to read and its last lines."""
    return ClusterError(f"{daemon} {what}; read {log}. Its last lines:\n{tail(log)}")


def run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
        input: str | None = None) -> subprocess.CompletedProcess:
    """Run a short command (argv list) with a timeout; ClusterError when missing or too slow."""
    argv = [str(a) for a in argv]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, **(env or {})}, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise ClusterError(f"`{argv[0]}` is not installed or not on PATH") from None
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from None


def launch(argv: Sequence[str], out: Path, env: Mapping[str, str] | None = None, timeout: float = 30.0) -> int:
    """Run a self-daemonizing command, its output to `out` (never a pipe a daemon could hold open)."""
    argv = [str(a) for a in argv]
    with open(out, "ab") as fh:
        try:
            return subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=timeout, env={**os.environ, **(env or {})}, check=False).returncode
        except FileNotFoundError:
            raise ClusterError(f"`{argv[0]}` is not installed or not on PATH") from None
        except subprocess.TimeoutExpired:
            raise ClusterError(f"`{' '.join(argv)}` did not return within {timeout:g} s; see {out}") from None


def spawn(argv: Sequence[str], out: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start a foreground daemon (e.g. mariadbd) in its own session, its output appended to `out`."""
    argv = [str(a) for a in argv]
    with open(out, "ab") as fh:
        try:
            return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env={**os.environ, **(env or {})})
        except FileNotFoundError:
            raise ClusterError(f"`{argv[0]}` is not installed or not on PATH") from None
