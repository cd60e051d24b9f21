"""Typed errors. The library raises these; only the CLI turns them into messages and exit codes."""

from __future__ import annotations

from collections.abc import Sequence


class ElasticoError(Exception):
    """Base of every error slurm-elastico raises on purpose."""

    exit_code = 1


class ConfigError(ElasticoError):
    """Settings or a spec file are wrong; the message lists every problem at once."""

    exit_code = 2

    SHOWN = 20
    """The message lists this many problems and counts the rest; `problems` keeps them all."""
    WIDTH = 1000
    """A problem longer than this (one quoting a huge value) is cut in the message."""

    def __init__(self, source: str, problems: Sequence[str]):
        self.source = source
        self.problems = tuple(problems)
        lines = [f"  - {_cut(p, self.WIDTH)}" for p in self.problems[:self.SHOWN]]
        if len(self.problems) > self.SHOWN:
            lines.append(f"  ... and {len(self.problems) - self.SHOWN} more")
        super().__init__(f"{_cut(source, self.WIDTH)}: {len(self.problems)} problem(s):\n" + "\n".join(lines))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else f"{text[:width]}... ({len(text)} characters)"


class InvalidActionError(ElasticoError):
    """An action was refused before any Slurm command ran (e.g. a share outside 1..100)."""

    exit_code = 2


class SlurmError(ElasticoError):
    """A Slurm command failed: carries the argv, exit code and stderr."""

    exit_code = 3

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, message: str | None = None):
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        text = message or f"`{' '.join(self.argv)}` exited with {returncode}"
        detail = stderr.strip()
        super().__init__(f"{text}: {detail}" if detail else text)


class SlurmUnavailable(SlurmError):
    """Slurm did not answer: the cluster's state is unknown, which is never an empty cluster.

    Raised for a read that exits non-zero or times out, prints no JSON, or prints Slurm's own top-level
    `errors` list (22.05's `squeue --json` exits 0 with `slurm_load_jobs` errors and no jobs while
    slurmctld is down), and for an action refused because the controller cannot be reached. The helper
    plans nothing on it, leaves its journal rows open and tries again later. Exit code 75 (EX_TEMPFAIL:
    try again later).
    """

    exit_code = 75


class SlurmTimeout(SlurmUnavailable):
    """A Slurm command did not finish within its timeout (the controller may be down or overloaded)."""

    def __init__(self, argv: Sequence[str], timeout: float, stderr: str = ""):
        self.timeout = timeout
        super().__init__(argv, None, stderr, f"`{' '.join(argv)}` did not finish within {timeout:g} s")


class PlaceNotGivenUp(SlurmError):
    """A reshape was carried out (held, updated, released) but the reservation that kept the job's place could not be
    deleted: the job runs on its new request, and recovery must give the place up (a job left in it is killed when
    it ends)."""


class SlurmNotFound(SlurmError):
    """A Slurm command is not installed (or not on PATH)."""


class UnknownJobError(SlurmError):
    """Slurm does not know the job id."""


class JobNotPendingError(SlurmError):
    """Slurm refused a change that only pending jobs accept (e.g. GRES of a running job)."""


class ParseError(ElasticoError):
    """Slurm printed something the parser does not understand (schema drift); names the field."""


class NotJsonError(ParseError):
    """A command printed no JSON object at all (empty, cut off, or an error text): a non-answer, not drift."""


class ClusterError(ElasticoError):
    """The local development cluster could not be brought up or down; names the log to read."""


class StateError(ElasticoError):
    """The helper's state (store, journal) cannot be opened or written: a read-only or full disk, a path that is a
    file. Names the path and the reason; exit code 74 (EX_IOERR)."""

    exit_code = 74


class ShadowRefused(ElasticoError):
    """A helper in shadow mode was asked to change something in Slurm (an update, a requeue, a signal, a hold or
    release, a reservation): refused before any command ran. It means a defect, never a cluster problem: shadow
    mode reads only. Exit code 70 (EX_SOFTWARE)."""

    exit_code = 70
