"""Shadow prices of GPU types for the allotment: a type jobs want beyond what it has gets dearer.

On a cluster of several GPU types, the allotment (`planner.allot`) gives
each job, in order of its weighted GPU-seconds left, the slot with the least
priced time per unit of work, `(1 + λ_t·size) / throughput`. At zero prices
every job wants its fastest type, and the first in line take it whether it
gains 1.2× there or 5×. The prices make the choice one of comparative
advantage, as Gavel's and Sia's optimisations do over their whole allocation.

They come from a relaxation of the allotment, solved by projected
subgradient as `pricing.solve` solves the shape prices: every job picks its
cheapest slot within its cap at the current prices, whatever the room; in
the allotment's order the jobs are served while the GPUs they pick fit in
all the cluster has (the allotment serves the shortest first); a type whose
served picks exceed what it has gets dearer by the relative excess, one with
GPUs left over cheaper (never below 0), with a diminishing step. Vectorised
over jobs × slots, so the rounds cost little next to the one allotment that
follows at the final prices. A cluster of one type skips them (its price
stays 0: the allotment as it always was).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from slurm_elastico.planner.allot import EPS, Claim, allot, order

ROUNDS = 20
"""Subgradient rounds; the step in round k is STEP/√k."""
STEP = 0.5
"""λ's step per unit of relative excess: λ is per GPU (1 doubles the priced time of a one-GPU slot), so a type
wanted by twice what it has rises by half a GPU's price in the first round."""
MAX_EXCESS = 10.0
"""Relative excess is clipped, as in `pricing.solve`."""


def type_prices(claims: Sequence[Claim], pools: Sequence[float]) -> np.ndarray:
    """λ per type for `claims` over `pools` (GPU equivalents free per type, elastic holdings included)."""
    n_types = len(pools)
    lam = np.zeros(n_types)
    if n_types < 2 or not claims:
        return lam
    seq = order(claims)
    width = max(len(c.sizes) for c in claims)
    size = np.zeros((len(seq), width))
    tput = np.ones((len(seq), width))
    ok = np.zeros((len(seq), width), dtype=bool)
    kind = np.zeros((len(seq), width), dtype=int)  # the slot's type; -1 (any) is priced at the cheapest
    limit = np.zeros((len(seq), 1))  # each claim's largest size
    for r, i in enumerate(seq):  # the claims as rows (padding: size 0, throughput 1, not allowed)
        c = claims[i]
        k = len(c.sizes)
        limit[r] = max(c.cap, c.sizes[c.current]) if c.current is not None else c.cap
        size[r, :k], tput[r, :k], ok[r, :k] = c.sizes, c.tput, c.allowed
        kind[r, :k] = c.types if c.types else -1
    ok &= (size <= limit + EPS) & (tput > 0)
    tput = np.maximum(tput, 1e-12)
    absent = kind >= n_types  # a type no usable node of the partition has (drained, say): never chosen here
    ok &= ~absent
    kind[absent] = -1
    live = ok.any(axis=1)
    size, tput, ok, kind = size[live], tput[live], ok[live], kind[live]
    if not len(size):
        return lam
    cap = np.maximum(np.asarray(pools, dtype=float), 1e-9)
    total = float(cap.sum())
    starts = np.arange(len(size)) * size.shape[1]  # each row's first entry in the flat arrays
    flat_size, flat_kind = size.ravel(), kind.ravel()
    slot_type = np.where(kind >= 0, kind, n_types)  # a slot of any type: the cheapest price, λ's last entry here
    refused = ~ok
    priced = np.empty(n_types + 1)  # each type's λ, then the cheapest (a slot of any type's)
    for k in range(1, ROUNDS + 1):
        priced[:n_types] = lam
        priced[n_types] = lam.min()
        cost = priced.take(slot_type)  # (1 + λ·size) / throughput, in place
        cost *= size
        cost += 1.0
        cost /= tput
        cost[refused] = np.inf
        pick = cost.argmin(axis=1)
        pick += starts
        z, t = flat_size.take(pick), flat_kind.take(pick)
        served = z.cumsum() <= total + EPS  # in the allotment's order, while the cluster holds them
        counted = served & (t >= 0)
        used = np.bincount(t[counted], weights=z[counted], minlength=n_types)
        # (numpy's methods and min/max, not its wrapper functions: a round's arrays are small, its calls many)
        excess = np.minimum(np.maximum((used - cap) / cap, -1.0), MAX_EXCESS)
        if not lam.any() and (used <= cap + EPS).all():
            break  # nobody wants a type beyond what it has at zero prices
        lam = np.maximum(0.0, lam + STEP * excess / math.sqrt(k))
    return lam


def priced_allotment(claims: Sequence[Claim], pools: Sequence[float], hysteresis: float,
                     preempt: bool = True, node_room: Sequence[float] | None = None,
                     node_types: Sequence[int] | None = None,
                     booked: Sequence[tuple[frozenset[int] | None, int, float]] = ()) -> tuple[list[int], list[float]]:
    """The allotment of `claims` over `pools` (and `node_room`, `node_types`, `booked`: `allot`'s) at the types'
    shadow prices (`type_prices`); (its picks, the prices)."""
    lam = [float(x) for x in type_prices(claims, pools)]
    return allot(claims, list(pools), hysteresis, preempt, lam, node_room, node_types, booked), lam
