"""Shadow prices by projected subgradient: each job picks its cheapest shape, prices chase the excess.

Pure numpy, vectorised across jobs × shapes; no Python loop over jobs. One
price per resource (MPS share, GPU memory, CPUs, host memory) over the pool of
free capacity, with demand and capacity in GPU equivalents (resource / what
one GPU, or one GPU's slice of a node, offers) so that one step size suits
every resource. The relaxation ignores which GPU a shape lands on: that is the
packing's job, and the prices only steer shape choice and order.

Job j's cost of shape c is `w_j·(1 − v_jc) + Γ_jc + Σ_r λ_r·d_jcr`, where
`v_jc = T_j(c) / T_j(c_max)`. A job marked optional may also choose "none"
(column index -1): cost `w_j`, no demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NONE = -1
MAX_EXCESS = 10.0
"""Relative excess is clipped so that one round on a nearly-empty pool cannot fling a price."""


@dataclass(frozen=True)
class PriceProblem:
    """Arrays of one pricing problem: J jobs, C shape slots (padded), R resources."""

    value: np.ndarray  # [J, C] T/T_max in [0, 1]
    demand: np.ndarray  # [J, C, R] in GPU equivalents; with `group`, [G, C, R]: one per group
    penalty: np.ndarray  # [J, C] Γ, interference charge
    allowed: np.ndarray  # [J, C] bool: real shape, at or above the floor
    weight: np.ndarray  # [J] w_j > 0
    capacity: np.ndarray  # [R] in GPU equivalents
    optional: np.ndarray  # [J] bool: may choose "none"
    group: np.ndarray | None = None
    """[J] the row of `demand` each job's shapes draw, where jobs share them (the jobs of one family do: the
    demand is priced once per group a round, not once per job); None: row j for job j."""

    def shape_demand(self, j: int, c: int) -> np.ndarray:
        """[R] job j's demand at shape slot c."""
        return self.demand[j if self.group is None else self.group[j], c]


@dataclass(frozen=True)
class PriceResult:
    prices: np.ndarray  # [R], every entry >= 0
    choice: np.ndarray  # [J] shape slot, or NONE
    rounds: int  # rounds actually run


def unpriced(p: PriceProblem) -> np.ndarray:
    """[J, C] the part of each shape's cost that does not depend on the prices: w·(1 − v) + Γ, and inf for a
    forbidden entry (prices and demands are finite, so it stays inf whatever is added)."""
    out = p.weight[:, None] * (1.0 - p.value) + p.penalty
    np.copyto(out, np.inf, where=~p.allowed)
    return out


def _none_cost(p: PriceProblem) -> np.ndarray:
    """[J] what "none" costs each job: its weight, inf for a job that may not stay out."""
    return np.where(p.optional, p.weight, np.inf)


def costs(p: PriceProblem, prices: np.ndarray, fixed: np.ndarray | None = None) -> np.ndarray:
    """[J, C + 1] cost of each shape at `prices`; the last column is "none"; forbidden entries are inf (they are
    in `unpriced`). `fixed`: `unpriced(p)` itself, where the caller has it."""
    j, c = p.value.shape
    out = np.empty((j, c + 1))
    out[:, c] = _none_cost(p)
    priced = p.demand @ prices
    if p.group is not None:
        priced = priced[p.group]
    np.add(unpriced(p) if fixed is None else fixed, priced, out=out[:, :c])
    return out


def choose(p: PriceProblem, prices: np.ndarray) -> np.ndarray:
    """Each job's cheapest option at `prices` (ties: lowest slot, a shape before "none"); NONE when "none" wins or
    nothing is allowed."""
    return _Rounds(p).choose(prices)


def load(p: PriceProblem, choice: np.ndarray) -> np.ndarray:
    """[R] total demand of a choice vector."""
    return _Rounds(p).load(choice)


class _Rounds:
    """What `choose` and `load` read of one problem, computed once: `solve` asks them every round.

    The shapes' costs are compared with "none" apart rather than as one more column of `costs`: a contiguous
    [J, C] sum and one comparison, where the column would make every round's sum strided (same picks). The
    chosen demands are taken from the flat [G·C, R] demand and the unchosen zeroed in place (same sums as a
    masked product)."""

    def __init__(self, p: PriceProblem) -> None:
        j, c = p.value.shape
        g, _, r = p.demand.shape
        self.p, self.width = p, c
        self.flat = p.demand.reshape(g * c, r)
        self.starts = (np.arange(j) if p.group is None else p.group) * c  # each job's first entry in `flat`
        self.fixed = unpriced(p)  # w·(1 − v) + Γ, inf where forbidden
        self.shapes = np.empty_like(self.fixed)  # each round's shape costs, written over
        self.none = _none_cost(p)
        self.first = np.arange(j) * c  # each job's first entry in `shapes`, flat

    def choose(self, prices: np.ndarray) -> np.ndarray:
        p = self.p
        if self.width == 0:
            return np.full(p.value.shape[0], NONE)
        priced = p.demand @ prices
        if p.group is not None:
            priced = priced.take(p.group, axis=0)
        shapes = np.add(self.fixed, priced, out=self.shapes)
        pick = shapes.argmin(axis=1)
        best = shapes.take(self.first + pick)
        # "none" wins only below the best shape; a best shape that is not finite (nothing allowed) or NaN is no
        # choice either
        keep = best <= self.none
        keep &= np.isfinite(best)
        pick[~keep] = NONE
        return pick

    def load(self, choice: np.ndarray) -> np.ndarray:
        if choice.size == 0:
            return np.zeros(self.p.capacity.shape)
        picked = self.flat.take(self.starts + np.maximum(choice, 0), axis=0)
        picked[choice == NONE] = 0.0
        return picked.sum(axis=0)


def solve(p: PriceProblem, rounds: int, step: float) -> PriceResult:
    """Run at most `rounds` projected-subgradient rounds; keep the best choice that fits the pool in aggregate.

    Step `step/√(t+1)` on the clipped relative excess: diminishing, so prices
    settle. Weights are >= 1, so a price of about 1 per GPU equivalent already
    matches what a job stands to lose; the step is deliberately not scaled by
    the weights, so that raising one job's weight does not raise every price.
    Stops early once nothing is over capacity at zero prices (every job
    already has its favourite).
    """
    r = p.capacity.shape[0]
    prices = np.zeros(r)
    if p.value.shape[0] == 0:
        return PriceResult(prices, np.zeros(0, dtype=int), 0)
    cap = np.maximum(p.capacity, 1e-9)
    # A feasible choice is judged by the objective the jobs minimise, without prices:
    # w·(1 − T/Tmax) + Γ for a shape, w for "none".
    rounds_of = _Rounds(p)  # what every round reads, computed once
    base = costs(p, np.zeros(r), rounds_of.fixed)
    base = np.where(np.isfinite(base), base, p.weight[:, None])  # a job left out (stuck or not) loses its weight
    rows = np.arange(p.value.shape[0])
    room = p.capacity + 1e-9
    best, best_prices, best_cost = None, prices, np.inf
    done = 0
    choice = rounds_of.choose(prices)
    for t in range(rounds):
        done = t + 1
        used = rounds_of.load(choice)
        # (numpy's methods and min/max, not its wrapper functions: a round's arrays are small, its calls many)
        excess = np.minimum(np.maximum((used - cap) / cap, -1.0), MAX_EXCESS)
        if (used <= room).all():
            cost = float(base[rows, np.where(choice == NONE, p.value.shape[1], choice)].sum())
            if cost < best_cost:
                best, best_prices, best_cost = choice, prices, cost
            if not prices.any():
                break
        prices = np.maximum(0.0, prices + step * excess / math.sqrt(t + 1.0))
        choice = rounds_of.choose(prices)
    if best is None:
        return PriceResult(prices, choice, done)
    return PriceResult(best_prices, best, done)  # the prices that go with the choice returned
