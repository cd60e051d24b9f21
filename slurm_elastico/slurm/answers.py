"""What a Slurm command's answer means: done, refused (and why), or no answer at all.

Slurm's clients say what went wrong only in words on stderr (or in the `errors` list of their JSON), so
these tables of phrases are the one place that reads them into typed errors, each carrying the argv, exit
code and text. A read that gets no answer (a non-zero exit, a timeout, no JSON, or Slurm's own `errors`
list in the JSON) is `SlurmUnavailable`, never an empty cluster: 22.05's `squeue --json` exits 0 with
`slurm_load_jobs` errors and no jobs while slurmctld is down.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_elastico.errors import JobNotPendingError, NotJsonError, SlurmError, SlurmUnavailable, UnknownJobError
from slurm_elastico.slurm.runner import Completed
from slurm_elastico.slurm.schema import slurm_errors

_UNKNOWN_JOB = ("invalid job id", "unknown job", "does not exist")
_NOT_PENDING = ("no longer pending", "job is not pending", "already running")
# What Slurm's clients print when the controller cannot be reached (measured on 22.05 with slurmctld
# stopped: `scontrol show config` "Unable to contact slurm controller (connect failure)", `scontrol release`
# and `update` "Unexpected message received"); the rest are the other texts of Slurm's communication errors.
_UNREACHABLE = ("unable to contact slurm controller", "connect failure", "connection refused",
                "unexpected message received", "socket timed out", "zero bytes were transmitted",
                "communication connection failure", "connection timed out")


_NOTHING_FOUND = "slurmdb_jobs_get: nothing found"
"""22.05's `sacct --json` for a query no job matches: exit 0, no jobs, this one `errors` entry (error 9003)."""


def nothing_found(result: Completed) -> bool:
    """Whether `result` is accounting's answer that no job matched: an empty answer, not an outage."""
    if result.returncode != 0:
        return False
    try:
        errors = slurm_errors(result.stdout)
    except NotJsonError:
        return False
    return bool(errors) and all(e.lower() == _NOTHING_FOUND for e in errors)


def _says(text: str, phrases: Sequence[str]) -> bool:
    low = text.lower()
    return any(s in low for s in phrases)


def classify(result: Completed) -> Completed:
    """Raise the typed error a failed Slurm command deserves; return the result when it succeeded."""
    if result.returncode == 0:
        return result
    text = (result.stderr or result.stdout).strip()
    if _says(text, _UNKNOWN_JOB):
        raise UnknownJobError(result.argv, result.returncode, text)
    if _says(text, _NOT_PENDING):
        raise JobNotPendingError(result.argv, result.returncode, text)
    if _says(text, _UNREACHABLE):
        raise SlurmUnavailable(result.argv, result.returncode, text,
                               f"`{' '.join(result.argv)}` could not reach Slurm's controller (exit {result.returncode})")
    raise SlurmError(result.argv, result.returncode, text)


def check_answer(result: Completed) -> Completed:
    """A read's result when Slurm answered; otherwise the typed error (see the module's docstring).

    `UnknownJobError` when Slurm answered that the job does not exist (by exit code or in its `errors`);
    `SlurmUnavailable` for any other non-zero exit, output that is no JSON object, or a non-empty `errors`
    list; `ParseError` (from the parsers, later) for JSON of an unknown schema.
    """
    command = " ".join(result.argv)
    if result.returncode != 0:
        text = (result.stderr or result.stdout).strip()
        if _says(text, _UNKNOWN_JOB):
            raise UnknownJobError(result.argv, result.returncode, text)
        raise SlurmUnavailable(result.argv, result.returncode, text,
                               f"`{command}` did not answer (exit {result.returncode})")
    try:
        errors = slurm_errors(result.stdout)
    except NotJsonError as exc:
        raise SlurmUnavailable(result.argv, 0, result.stderr, f"`{command}` did not answer: {exc}") from None
    if errors:
        text = "; ".join(errors)
        if _says(text, _UNKNOWN_JOB):
            raise UnknownJobError(result.argv, 0, text)
        raise SlurmUnavailable(result.argv, 0, text,
                               f"`{command}` answered with Slurm errors and no trustworthy data (is slurmctld down?)")
    return result
