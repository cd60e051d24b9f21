"""Shadow prices of GPU types for the allotment: a type jobs want beyond what it has gets dearer.

On a cluster of several GPU types, the allotment (`planner.allot`) gives
each job, in order of its weighted GPU-seconds left, the slot with the least
priced time per unit of work, `(1 + λ_t·size) / throughput`. At zero prices
every job wants its fastest type, and the first in line take it whether it
gains 1.2× there or 5×. The prices make the choice one of comparative
advantage, as Gavel's and Sia's optimisations do over their whole allocation:
a few rounds of the allotment, each moving λ_t by what the first pass could
not give type t (`Outcome.pressure`: the size of each choice that found its
type full) less what it left idle on t (`Outcome.spare`), relative to t's
GPUs, with a diminishing step (projected subgradient, as `pricing.solve`).
The last round's allotment is the answer, so the prices returned are the
ones its choices were made at.

Pure and cheap: a round is one allotment (O(jobs × slots)); a cluster of one
type skips the rounds (its one price stays 0, the allotment as it always was).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from slurm_elastico.planner.allot import Claim, Outcome, allot_outcome

ROUNDS = 8
"""Allotments per epoch on a typed cluster; prices move by at most STEP/√k in round k."""
STEP = 0.5
"""λ's step per unit of relative excess: λ is per GPU (1 doubles the priced time of a one-GPU slot), so a type
wanted by twice what it has rises by about half a GPU's price in the first round."""
TOLERANCE = 0.05
"""Rounds stop once no type's excess is beyond this fraction of its GPUs."""


def priced_allotment(claims: Sequence[Claim], pools: Sequence[float], hysteresis: float,
                     preempt: bool = True) -> tuple[Outcome, list[float]]:
    """The allotment of `claims` over `pools` (GPU equivalents free per type, elastic holdings included) at
    shadow prices per type found by a few rounds; (the last round's outcome, its prices)."""
    lam = [0.0] * len(pools)
    out = allot_outcome(claims, list(pools), hysteresis, preempt, lam)
    if len(pools) < 2:
        return out, lam
    for k in range(1, ROUNDS):
        excess = [(p - s) / max(cap, 1.0) for p, s, cap in zip(out.pressure, out.spare, pools)]
        if all(abs(e) <= TOLERANCE for e in excess) or all(e <= 0 and x == 0 for e, x in zip(excess, lam)):
            break
        lam = [max(0.0, x + STEP * min(e, 10.0) / math.sqrt(k)) for x, e in zip(lam, excess)]
        out = allot_outcome(claims, list(pools), hysteresis, preempt, lam)
    return out, lam
