"""Fairness weights `w_j`: how much a job's lost throughput counts, by the rule settings name.

Rules live in a registry, so the epoch never branches on the rule's name.
Every weight is >= 1 and finite, so no job is ever worth nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from slurm_elastico.model import Family, JobState, JobView

WAIT_UNIT_S = 3600.0
"""waiting: one more unit of weight per hour waited (starved jobs rise in the order)."""


def waiting(submit_time: float | None, remaining_s: float, now: float) -> float:
    """1 + hours waited since submission (until `now`, or until it started for a running job): the longer a
    job waits, the more it counts."""
    waited = max(0.0, now - submit_time) if submit_time is not None else 0.0
    return 1.0 + waited / WAIT_UNIT_S


def remaining(submit_time: float | None, remaining_s: float, now: float) -> float:
    """1 + 1/(1 + remaining hours at its fastest shape): short jobs first, as SRPT does for mean JCT."""
    return 1.0 + 1.0 / (1.0 + max(0.0, remaining_s) / 3600.0)


def equal(submit_time: float | None, remaining_s: float, now: float) -> float:
    return 1.0


RULES: dict[str, Callable[[float | None, float, float], float]] = {
    "waiting": waiting,
    "remaining": remaining,
    "equal": equal,
}


def weight_of(job: JobView, family: Family, fairness: str, now: float, done: float | None = None,
              fastest: float | None = None) -> float:
    """`w_j` of one job under the rule `fairness` names: remaining time = work left (all of it unless
    `done` is known from the job's progress) at its fastest shape (`fastest`, its throughput, where the caller
    has it: the epoch's `Table.fastest`, found once per family)."""
    best = max(s.throughput for s in family.shapes) if fastest is None else fastest
    work = max(0.0, family.total_work - (done or 0.0))
    left = work / best if best > 0 else float("inf")
    # A running job waits no longer: its wait ended when it last started (it must not outweigh the queue by age).
    until = min(now, job.start_time) if job.state is JobState.RUNNING and job.start_time is not None else now
    return RULES[fairness](job.submit_time, left, until)
