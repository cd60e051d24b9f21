"""The "please checkpoint now" flag: set by a signal handler, polled by the program at safe points.

`elastico-run` sends SIGUSR1 for a reshape; Slurm sends SIGTERM for a requeue,
preemption or the time limit (then SIGKILL after KillWait). Both mean the same
thing to the program: finish the current optimizer step (or batch), save, and
exit with `EXIT_CHECKPOINTED`. The handler only sets a flag, because almost
nothing is safe inside a signal handler (no I/O, no locks, no torch); the
training loop and inference runner poll `checkpoint_requested()` at their
boundaries. Traps: handlers can be installed only from the main thread, and a
step longer than KillWait is killed before it can save.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGTERM)

_requested: signal.Signals | None = None
_manual = False


def _handler(signum: int, frame: object) -> None:
    global _requested
    _requested = signal.Signals(signum)


def install_signal_handlers(signals: Iterable[signal.Signals] = DEFAULT_SIGNALS) -> None:
    """Make each of `signals` set the checkpoint-request flag instead of its default action (main thread only)."""
    for sig in signals:
        signal.signal(sig, _handler)


def checkpoint_requested() -> bool:
    """True once a reshape/termination signal arrived (or `request_checkpoint()` was called)."""
    return _requested is not None or _manual


def requested_by() -> str | None:
    """Name of the signal that asked ("SIGUSR1", "SIGTERM"), "manual", or None when nothing asked."""
    if _requested is not None:
        return _requested.name
    return "manual" if _manual else None


def request_checkpoint() -> None:
    """Ask for a checkpoint from code (tests, a watchdog thread) exactly as a signal would."""
    global _manual
    _manual = True


def clear_checkpoint_request() -> None:
    """Forget any request, e.g. after an in-process relaunch (tests)."""
    global _requested, _manual
    _requested = None
    _manual = False
