"""GPU counts for data-parallel jobs: weighted shortest remaining time first, whole requests before partial ones,
the shortest on more GPUs where their speedup earns it.

Why not the prices alone: mean completion time counts every second a job
waits as much as every second it runs, and the measured data-parallel
speedups are close to linear (Pollux's placements: 6 GPUs run CIFAR-10 at
5.2× one GPU), so spreading the GPUs over many jobs — what prices with a
value of T/T_max settle on — slows every job and finishes none sooner. The
GPUs do most good on the jobs closest to done: the order is a job's
GPU-seconds left at its request (its remaining *area*, as Tiresias's two
dimensions count service, but looking ahead) divided by its fairness weight
(so a job that waits long enough under the `waiting` rule goes first,
whatever its size).

Two passes over the jobs in that order, over a budget of GPU equivalents
(free GPUs plus those the elastic running jobs hold):

1. A pending job starts only at its fastest shape within its *limit*, or
   waits: a job started on a fraction of its request holds GPUs that a
   shorter job would finish on sooner. The limit is its cap (the GPU count
   it was submitted with), or more where its measured speedup earns it
   (`share_limit`, over the GPUs no running job after it holds, and never
   for a job Slurm cannot requeue): heSRPT's optimal split of GPUs among
   jobs whose speedup on n GPUs is n^p (Berg, Vesilo, Harchol-Balter,
   SIGMETRICS 2020) gives
   the shortest of m jobs the fraction 1 − (1 − 1/m)^(1/(1−p)) of the GPUs
   left, the next the same fraction of what remains, and so on; with
   speedups near linear a short job finishing on many GPUs delays the jobs
   behind it less than it gains (two equal jobs on two GPUs with speedup
   1.9: one after the other they end at 0.53 and 1.05 of the one-GPU time,
   side by side both at 1). Each shape's own speedup over the job's best
   single GPU gives its p. A running job keeps the shape it runs as while
   that fits what is left, and moves up to its limit only when the time
   saved over its remaining work pays the restart; when shorter jobs have
   taken what it holds, it shrinks to what is left, and with nothing left it
   is preempted (it resumes when its turn comes, paying one restart) — or,
   when `preempt` is off, keeps its smallest shape.
2. What is left after everyone had their turn starts waiting jobs, in the
   same order, on less than they asked for: idle GPUs help nobody.

Pure: no I/O, no clock; the same claims give the same answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_elastico.planner import reshape

NONE = -1
"""Waits (a pending job) or is preempted (a running one)."""

EPS = 1e-9


@dataclass(frozen=True)
class Claim:
    """One job's side of the allotment."""

    key: float
    """GPU-seconds left at its request (remaining work ÷ its speed per GPU there) ÷ its weight: smaller goes
    first."""
    sizes: Sequence[float]
    """GPU equivalents each shape slot holds (a gang: its GPUs; a share: its fraction of one GPU)."""
    tput: Sequence[float]
    allowed: Sequence[bool]
    cap: float
    """GPU equivalents it may take in the first pass (its submitted count)."""
    work: float = math.inf
    """Work left (only read for a running job)."""
    current: int | None = None
    """The slot a running job runs as; None for a pending job."""
    restart_s: float = 0.0
    """What leaving `current` costs (checkpoint and restart)."""
    extra: bool = True
    """May it take more than its cap (heSRPT's split)? Not a job Slurm cannot requeue: it could never give
    them back."""


def order(claims: Sequence[Claim]) -> list[int]:
    """Indices by key, ties by position."""
    return sorted(range(len(claims)), key=lambda i: (claims[i].key, i))


def _fastest(c: Claim, limit: float) -> int:
    """The fastest allowed slot holding at most `limit` (ties: the smaller), or NONE."""
    best = NONE
    for s, (size, t, ok) in enumerate(zip(c.sizes, c.tput, c.allowed)):
        if ok and size <= limit + EPS and (best == NONE or (t, -size) > (c.tput[best], -c.sizes[best])):
            best = s
    return best


def share_limit(c: Claim, budget: float, left: int) -> float:
    """The most GPU equivalents `c` may take in the first pass when it and `left - 1` jobs after it share `budget`:
    its cap, or the largest shape heSRPT's split gives it (see the module docstring), p from that shape's
    speedup over the job's fastest shape on at most one GPU."""
    base = max((t for t, z, ok in zip(c.tput, c.sizes, c.allowed) if ok and z <= 1 + EPS), default=0.0)
    limit = c.cap
    if base <= 0 or left < 1 or not c.extra:
        return limit
    for size, t, ok in zip(c.sizes, c.tput, c.allowed):
        if not ok or size <= max(1.0, limit) + EPS or t <= base:
            continue
        p = math.log(t / base) / math.log(size)  # the speedup as size ** p
        frac = 1.0 if p >= 1 - EPS or left == 1 else 1.0 - (1.0 - 1.0 / left) ** (1.0 / (1.0 - p))
        if size <= frac * budget + EPS:
            limit = size
    return limit


def _running(c: Claim, budget: float, hysteresis: float, preempt: bool, limit: float) -> int:
    """A running job's slot in the first pass (see the module docstring)."""
    cur = c.current
    assert cur is not None
    want = _fastest(c, min(budget, max(limit, c.sizes[cur])))
    if c.sizes[cur] <= budget + EPS:  # it keeps what it holds unless moving up pays the restart
        if want == NONE or c.tput[want] <= c.tput[cur]:
            return cur
        return want if reshape.saving(c.work, c.tput[cur], c.tput[want], c.restart_s, hysteresis) > 0 else cur
    if want != NONE or preempt:
        return want
    return min((s for s, ok in enumerate(c.allowed) if ok), key=lambda s: (c.sizes[s], -c.tput[s]), default=cur)


def allot(claims: Sequence[Claim], budget: float, hysteresis: float, preempt: bool = True) -> list[int]:
    """Each claim's slot, or NONE (a pending job waits, a running one is preempted); see the module docstring."""
    pick = [NONE] * len(claims)
    seq = order(claims)
    # What the running jobs after each position hold: GPUs beyond a job's cap come only from the others, so
    # that no running job shrinks or is preempted (a restart) for another's extra GPUs.
    held_after = [0.0] * len(seq)
    for k in range(len(seq) - 2, -1, -1):
        after = claims[seq[k + 1]]
        held_after[k] = held_after[k + 1] + (after.sizes[after.current] if after.current is not None else 0.0)
    for k, i in enumerate(seq):
        c = claims[i]
        limit = share_limit(c, max(0.0, budget - held_after[k]), len(seq) - k)
        if c.current is not None:
            want = _running(c, budget, hysteresis, preempt, limit)
        else:
            want = _fastest(c, limit)
            if want != NONE and c.sizes[want] > budget + EPS:
                want = NONE  # its whole request does not fit: it waits (pass 2 may start it smaller)
        if want != NONE:
            pick[i] = want
            budget -= c.sizes[want]
    for i in seq:  # idle GPUs help nobody: what is left starts waiting jobs on less than they asked
        c = claims[i]
        if pick[i] == NONE and c.current is None and budget > EPS:
            want = _fastest(c, min(budget, c.cap))
            if want != NONE:
                pick[i] = want
                budget -= c.sizes[want]
    return pick
