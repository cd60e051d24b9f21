"""When a running job's reshape pays: the time it saves over its remaining work must beat the restart.

A reshape costs a checkpoint, a requeue and a restart (`cost_s`). It is done
only when `before − (after + cost_s) > hysteresis · before`, with `before` and
`after` the remaining time at the current and at the new throughput. The
relative margin is the hysteresis: a reshape back would need the same margin
the other way, which the first reshape's gain rules out, so jobs do not flap.
"""

from __future__ import annotations

import math


def remaining_work(total: float, done: float | None, start_time: float | None, now: float, rate: float) -> float:
    """Work left: `total − done` when progress is known, else estimated from the time since the last start."""
    if done is None:
        ran = max(0.0, now - start_time) if start_time is not None else 0.0
        done = ran * rate
    return min(total, max(0.0, total - done))


def saving(work: float, rate_now: float, rate_new: float, cost_s: float, hysteresis: float) -> float:
    """Seconds a reshape saves net of its cost, or 0.0 when it does not clear the hysteresis margin."""
    if work <= 0 or rate_new <= rate_now or rate_new <= 0:
        return 0.0
    if rate_now <= 0:
        return math.inf  # stalled now: any shape that runs saves everything
    before = work / rate_now
    saved = before - (work / rate_new + cost_s)
    return saved if saved > hysteresis * before else 0.0
