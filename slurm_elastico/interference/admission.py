"""Admission margins calibrated per decision on held-out pairs: a Neyman-Pearson threshold for every floor.

A pair is bad at floor f when its worse job keeps less than f of its solo
speed; admitting it is a false admission. On the held-out pairs of a training
split (pairs that ran together), `thresholds` finds for every floor f of
`FLOORS` the least predicted worst normalized throughput t(f) such that at
most `TARGET` of the pairs truly bad at f are predicted at or above it (rank
ceil(n(1 − TARGET)) + 1 of the n bad pairs' predictions, a split-conformal
quantile; with fewer than 1 / TARGET bad pairs, just above the highest). A
new pair predicted p is then admitted at floor f when t(f) <= p.

The planner knows floors, not thresholds, and admits a pair when predicted
>= floor × (1 + margin). `margins` turns the thresholds into that form, per
pair and floor-free: L(p) = the highest floor f with t(f) <= p, margin
p / L(p) − 1, so that predicted >= floor × (1 + margin) holds exactly when
floor <= L(p). The margin depends on the prediction, as the error does:
a model whose predictions are pulled toward its training mean over-predicts
its worst pairs and under-predicts its best, so one margin from all pairs
(their over-prediction quantile) is the margin of the worst pairs applied to
the best ones, and refuses nearly every good pair. Where held-out truth below
a floor never reached the predictions near the floor, the margin is negative
(the bar is below the floor): the held-out pairs say so. No held-out pair
below f: nothing bounds that floor, it is admitted (t = −inf); a prediction
below every threshold gets an infinite margin (refused at every floor).

t must not fall as the floor rises (a pair admitted at a floor is admitted at
every lower one), and the floors' own quantiles need not be so. A floor with
too few bad pairs has no quantile to speak of: its bar is its
highest bad prediction, or just above it, so one mispredicted pair sets it
(`determined`: 20 bad pairs at TARGET 0.10 are the fewest whose quantile is
below their highest). From the lowest floor with a quantile up, t is the
greatest of the floors' own quantiles so far (each such floor keeps its
bound); below that floor, the least of a floor's own bar and the bar of the
floor above it. A pair bad at a low floor is bad at every higher one, and a
model that ranks pairs at all predicts the worse pairs no higher, so the bar
of the floor above, calibrated on a superset of its bad pairs, also holds
the lower floor's rate. Raised from below instead, a low floor's outlier
refused nearly every good pair at every floor the planner uses (a model
adapted on 35 pairs of Gavel's P100 holding one Recommendation pair
predicted 0.17 too high: its bar at floor 0.5 was that pair, and 3 % of the
good pairs were admitted at floor 0.6, where the floor's own quantile
admits most). With no floor determined, the greatest from below throughout.

`groups`: the held-out pairs of each fold (each left-out family or GPU
type). Pooled, every held-out pair counts alike: the bound of exchangeable
pairs. But a shift moves a whole group: the pairs of one unseen family are
over- or under-predicted together, and a group with few pairs can hold most
of the bad ones. `by_group="mean"` also holds the mean of the groups' rates
to the target (the expected rate of a new group, each group one draw);
`"worst"` holds every group with at least 1 / TARGET bad pairs at that
floor (fewer cannot show a rate of TARGET) to it: an unseen GPU type shifts
every pair of a cluster at once, and the worst of G held-out groups bounds a
new group's rate with about G / (G + 1) confidence. Both are never below
the pooled threshold.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

TARGET = 0.10  # share of truly bad held-out pairs that may be admitted, at every floor
FLOORS = tuple(round(0.05 + 0.01 * i, 2) for i in range(95))  # 0.05 .. 0.99

_FLOORS = np.array(FLOORS)
_SLACK = 1.0 - 1e-12  # a margin's factor below exact: see `margins`
Group = tuple[np.ndarray, np.ndarray]  # (predicted, true) worst normalized throughput of each held-out pair


def _threshold(pred: np.ndarray, truth: np.ndarray, floor: float, target: float = TARGET) -> float:
    bad = np.sort(pred[truth < floor])
    n = len(bad)
    if n == 0:
        return -math.inf
    k = math.ceil(n * (1.0 - target)) + 1  # 1-based rank: at most target·n of the n bad pairs are >= it
    return float(bad[k - 1]) if k <= n else float(np.nextafter(bad[-1], math.inf))


def determined(target: float = TARGET) -> int:
    """The fewest bad pairs whose threshold (`_threshold`) is below the highest of their predictions."""
    n = 2
    while math.ceil(n * (1.0 - target)) + 1 >= n:
        n += 1
    return n


def _nondecreasing(t: np.ndarray, n_bad: np.ndarray, target: float) -> np.ndarray:
    """t made nondecreasing in the floor: from the lowest floor with `determined(target)` bad pairs up, the greatest
    so far; below it, the least of a floor's own and the one above (see the module); none such: the greatest so far."""
    t = np.array(t, dtype=float)
    enough = n_bad >= determined(target)
    if not enough.any():
        return np.maximum.accumulate(t)
    first = int(np.argmax(enough))  # bad pairs only grow with the floor: every floor from here up has enough
    t[first:] = np.maximum.accumulate(t[first:])
    t[:first + 1] = np.minimum.accumulate(t[:first + 1][::-1])[::-1]
    return t


def _group_mean_threshold(groups: Sequence[Group], floor: float, target: float = TARGET) -> float:
    """The least t at which the mean over groups (with a bad pair at `floor`) of each group's share of bad pairs
    predicted >= t is at most `target`."""
    bad = [np.sort(p[y < floor]) for p, y in groups]
    bad = [b for b in bad if len(b)]
    if not bad:
        return -math.inf
    cand = np.unique(np.concatenate(bad + [np.array([np.nextafter(max(b[-1] for b in bad), math.inf)])]))
    share = np.mean([1.0 - np.searchsorted(b, cand, side="left") / len(b) for b in bad], axis=0)
    return float(cand[np.argmax(share <= target)])  # share is nonincreasing and 0 at the last candidate


def thresholds(groups: Sequence[Group], by_group: str = "pooled", target: float = TARGET) -> np.ndarray:
    """t(f) for every floor of `FLOORS` (nondecreasing in f: `_nondecreasing`); empty groups are skipped; no
    pairs: all inf.

    `by_group`: "pooled" (every pair counts alike), "mean" (also the mean of the groups' rates within the
    target) or "worst" (also every group with at least 1 / target bad pairs at that floor within it).
    `target`: the share of bad pairs that may pass (`TARGET`; another value draws a trade-off curve)."""
    if by_group not in ("pooled", "mean", "worst"):
        raise ValueError(f"by_group {by_group!r}: use pooled, mean or worst")
    if not 0 < target < 1:
        raise ValueError(f"target {target!r}: the share of bad pairs admitted must be in (0, 1)")
    groups = [(np.asarray(p, dtype=float), np.asarray(t, dtype=float)) for p, t in groups if len(p)]
    if not groups:
        return np.full(len(FLOORS), math.inf)
    p, y = np.concatenate([g[0] for g in groups]), np.concatenate([g[1] for g in groups])
    t = np.array([_threshold(p, y, f, target) for f in FLOORS])
    if by_group == "mean":
        t = np.maximum(t, [_group_mean_threshold(groups, f, target) for f in FLOORS])
    elif by_group == "worst":
        least = math.ceil(1.0 / target)  # a group's rate of `target` is measurable from this many bad pairs on
        for gp, gy in groups:
            t = np.maximum(t, [_threshold(gp, gy, f, target) if np.sum(gy < f) >= least else -math.inf
                               for f in FLOORS])
    return _nondecreasing(t, np.array([np.sum(y < f) for f in FLOORS]), target)


def margins(pred: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Margin of each pair whose predicted worst normalized throughput is `pred`, under thresholds `t`.

    (In place on arrays of pred's size: the planner asks it of every pair of an epoch's few hundred profiles at
    once, where each temporary of that size costs about as much as its arithmetic.)"""
    pred = np.asarray(pred, dtype=float)
    top = np.asarray(np.searchsorted(t, pred, side="right"))
    top -= 1  # the highest floor with t(f) <= pred (t is nondecreasing)
    some = top >= 0
    some &= np.isfinite(pred)
    np.maximum(top, 0, out=top)
    out = np.asarray(_FLOORS.take(top))  # the floor L(p)
    with np.errstate(invalid="ignore"):
        # (`_SLACK`: floor × (1 + margin) <= pred must hold at floor L(p) itself, whatever the rounding)
        np.divide(pred, out, out=out)
        out *= _SLACK
        out -= 1.0
    out[~some] = math.inf
    return out


def margin_of(pred: float, t: Sequence[float]) -> float:
    """`margins` of one pair, in Python floats (the same arithmetic): the planner asks for pairs one GPU at a
    time, a few hundred in an epoch, where a table of every pair's margins would cost more than all of them."""
    top = bisect_right(t, pred) - 1
    if top < 0 or not math.isfinite(pred):
        return math.inf
    return pred / FLOORS[top] * _SLACK - 1.0


def to_json(t: np.ndarray) -> list[float | None]:
    """Thresholds for a JSON file: None for −inf (a floor nothing bounds), a string for inf."""
    return [None if x == -math.inf else ("inf" if x == math.inf else float(x)) for x in np.asarray(t).tolist()]


def from_json(values: Sequence) -> np.ndarray:
    if len(values) != len(FLOORS):
        raise ValueError(f"{len(values)} admission thresholds, {len(FLOORS)} expected (one per floor)")
    return np.array([-math.inf if v is None else float(v) for v in values], dtype=float)
