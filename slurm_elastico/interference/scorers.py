"""Scorers: a model's slowdowns and admission margins for pairs of one list of profiles, asked by index.

The planner's pair cache (`planner.slowdown.PairCache`) gives a model with `scorer(profiles)` its profiles
once and asks for pairs by index; the scorer tabulates every pair at once when there are not too many
(`tabulate`), so a lookup is an index. A scorer has `profiles`, `tabulate(limit)`, `matrices()` (after
`tabulate`), `slowdown(ia, ib)`, `margins(ia, ib)` and `against(ia, partners)` (profiles[ia[k]] next to
partners[k], profiles it does not hold: the planner's stand-in neighbours). One that can give a single pair's
margin as a float (`margin(i, j)`: the prior-corrected model's, and a wrapper's over it) is asked for margins
pair by pair instead, as the epoch meets them (`matrices(with_margins=False)`: no table of every pair's margin;
an epoch at 200 jobs looks up about a hundred of its ~10^5).

A model that wraps another (the few-shot adaptation `adapt.AdaptedView`, the online learner
`adapt_online.OnlineAdapted`, the refusals of probe and revert `probe.RefusingModel`) answers through
`Derived`: its answers for pairs by index are array arithmetic on the inner model's scorer over the same
profiles, so a table of every pair costs no Python step per pair (at 200 jobs a planner epoch asks for a
few hundred thousand pairs). `scorer_of` gives any model a scorer: its own, else `Plain` (from its
`predict`, `predict_matrix` and `admission_margins`). `ByScorer` gives a model with a scorer its
`predict`, `predict_matrix` and `admission_margins` through it: one path for both ways of asking.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence

import numpy as np

from slurm_elastico.interference.base import SoloProfile, distinct

TABLE_LIMIT = 2_560_000
"""Most pairs a scorer tabulates at once (1,600 distinct profiles): a table of float64 slowdowns and margins is
then 41 MB."""


def scorer_of(model, profiles: Sequence[SoloProfile]):
    """`model`'s scorer over `profiles`: its own (`scorer`), else a `Plain` one."""
    return model.scorer(profiles) if hasattr(model, "scorer") else Plain(model, profiles)


def _grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (i, j) of n profiles, i-major: (ia, ib)."""
    return np.divmod(np.arange(n * n, dtype=np.int64), n)


class ByScorer:
    """`predict`, `predict_matrix` and `admission_margins` of a model through its `scorer(profiles)`: one path."""

    def scorer(self, profiles: Sequence[SoloProfile]):
        raise NotImplementedError

    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        """Slowdown S >= 1 of a[k] when it shares one GPU with b[k], for every k, in one batched call."""
        profiles, ia, ib = distinct(a, b, "predict")
        return self.scorer(profiles).slowdown(ia, ib) if profiles else np.zeros(0)

    def predict_matrix(self, profiles: Sequence[SoloProfile]) -> np.ndarray:
        """S[i, j]: slowdown of profiles[i] next to profiles[j], all pairs (the diagonal is a job with its twin)."""
        n = len(profiles)
        ia, ib = _grid(n)
        scorer = self.scorer(profiles)
        scorer.tabulate(limit=n * n)  # never more pairs than asked for; fewer when profiles repeat
        return scorer.slowdown(ia, ib).reshape(n, n)

    def admission_margins(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        """Margin on the floor per pair (`base.admissible`)."""
        profiles, ia, ib = distinct(a, b, "admission_margins")
        return self.scorer(profiles).margins(ia, ib) if profiles else np.zeros(0)


class Plain:
    """The scorer of a model without one: its `predict` (or `predict_matrix`, for a table) and `admission_margins`
    (or its one `admission_margin`) asked for the pairs by profile."""

    def __init__(self, model, profiles: Sequence[SoloProfile]):
        self.model, self.profiles = model, list(profiles)
        self.table: tuple[np.ndarray, np.ndarray] | None = None

    def _pairs(self, ia: np.ndarray, ib: np.ndarray) -> tuple[list[SoloProfile], list[SoloProfile]]:
        p = self.profiles
        return [p[i] for i in ia.tolist()], [p[j] for j in ib.tolist()]

    def slowdown(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        if self.table is not None:
            return self.table[0][ia, ib]
        return np.asarray(self.model.predict(*self._pairs(ia, ib)), dtype=float).reshape(-1)

    def margins(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        if self.table is not None:
            return self.table[1][ia, ib]
        own = getattr(self.model, "admission_margins", None)
        if own is None:
            return np.full(len(ia), float(getattr(self.model, "admission_margin", 0.0)))
        return np.asarray(own(*self._pairs(ia, ib)), dtype=float).reshape(-1)

    def tabulate(self, limit: int = TABLE_LIMIT) -> bool:
        n = len(self.profiles)
        if self.table is None and n * n <= limit:
            ia, ib = _grid(n)
            matrix = getattr(self.model, "predict_matrix", None)
            s = (np.asarray(matrix(self.profiles), dtype=float).reshape(n, n) if matrix is not None
                 else self.slowdown(ia, ib).reshape(n, n))
            self.table = (s, self.margins(ia, ib).reshape(n, n))
        return self.table is not None

    def matrices(self) -> tuple[np.ndarray, np.ndarray]:
        assert self.table is not None, "matrices() before tabulate()"
        return self.table

    def against(self, ia: np.ndarray, partners: Sequence[SoloProfile]) -> np.ndarray:
        return np.asarray(self.model.predict([self.profiles[i] for i in np.asarray(ia).tolist()], list(partners)),
                          dtype=float).reshape(-1)


Slow = Callable[[object, np.ndarray, np.ndarray], np.ndarray]
Margin = Callable[[object, np.ndarray, np.ndarray, Callable[[], tuple[np.ndarray, np.ndarray]]], np.ndarray]
Against = Callable[[object, np.ndarray, Sequence[SoloProfile]], np.ndarray]
One = Callable[[object, int, int, float, float], float]


class Derived:
    """The scorer of a model that wraps another, from the inner model's scorer `inner` over the same profiles.

    `slow(inner, ia, ib)`: the wrapper's slowdown of profiles[ia[k]] next to profiles[ib[k]];
    `margin(inner, ia, ib, both)`: their margins; `both()` gives the wrapper's slowdowns both ways, (s_ab, s_ba), for
    a wrapper whose margins follow them (computed only when asked);
    `against(inner, ia, partners)`: the wrapper's slowdown of profiles[ia[k]] next to partners[k] (from
    `inner.against`). The table is both over every pair of the inner table, each an array operation: for it, ia
    is a column (n, 1) and ib a row (1, n), so both must take index arrays that broadcast, and answer in their
    broadcast shape.

    `one(inner, i, j, s_ij, s_ji)`, where the wrapper has it: the margin of the one pair (i, j) in Python floats,
    as `margin` has it, given the wrapper's slowdowns both ways (after `tabulate`). The scorer then answers
    `margin(i, j)` (None without), and the planner's pair cache asks it for the few hundred pairs an epoch looks
    up; the table of every pair's margins is computed only when asked for (`matrices()`, `margins`)."""

    def __init__(self, inner, slow: Slow, margin: Margin, against: Against, one: One | None = None):
        self.inner, self._slow, self._margin, self._against, self._one = inner, slow, margin, against, one
        self.profiles = inner.profiles
        self.table: np.ndarray | None = None  # slowdowns of every pair
        self._table_margins: np.ndarray | None = None  # their margins, once asked for
        self._item = None  # the table's `item`, once tabulated
        if one is None:
            self.margin = None  # no margin pair by pair: whoever asks takes the table's (`matrices`)

    def margin(self, i: int, j: int) -> float:
        """The margin of profiles[i] next to profiles[j] as `matrices()` has it, in Python floats (after
        `tabulate`; None where the wrapper gives no `one`)."""
        item = self._item
        return self._one(self.inner, i, j, item(i, j), item(j, i))

    def slowdown(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        if self.table is not None:
            return pick(self.table, ia, ib)
        return self._slow(self.inner, ia, ib)

    def margins(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        if self.table is not None:
            return pick(self._margin_table(), ia, ib)
        inner = self.inner
        return self._margin(inner, ia, ib, lambda: (self._slow(inner, ia, ib), self._slow(inner, ib, ia)))

    def tabulate(self, limit: int = TABLE_LIMIT) -> bool:
        if self.table is None and self.inner.tabulate(limit):
            # A column of rows and a row of columns: every (n, n) result broadcasts from them, and what is per
            # profile (a correction, a flag) is indexed n times, not n² times.
            n = len(self.profiles)
            self.table = self._slow(self.inner, np.arange(n)[:, None], np.arange(n)[None, :])
            self._item = self.table.item
        return self.table is not None

    def _margin_table(self) -> np.ndarray:
        if self._table_margins is None:
            n, s = len(self.profiles), self.table
            self._table_margins = self._margin(self.inner, np.arange(n)[:, None], np.arange(n)[None, :],
                                               lambda: (s, s.T))
        return self._table_margins

    def matrices(self, with_margins: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """(slowdowns, margins) of every pair, after `tabulate`; `with_margins` False: None for the margins (which
        `margin` then answers pair by pair)."""
        assert self.table is not None, "matrices() before tabulate()"
        return self.table, self._margin_table() if with_margins else None

    def against(self, ia: np.ndarray, partners: Sequence[SoloProfile]) -> np.ndarray:
        return self._against(self.inner, np.asarray(ia, dtype=np.int64), list(partners))


def each_distinct(profiles: Sequence[SoloProfile]) -> tuple[list[SoloProfile], np.ndarray]:
    """(each distinct profile object once, the position of each of `profiles` among them)."""
    once, at, _ = distinct(profiles, profiles, "each_distinct")
    return once, at


def values_against(keys: Sequence[Hashable], key_of: Callable[[list[SoloProfile]], list[Hashable]],
                   entries: Iterable[tuple[Hashable, Hashable, float]], ia: np.ndarray,
                   partners: Sequence[SoloProfile]) -> np.ndarray:
    """`PairValues`' value of each pair (profiles[ia[k]], partners[k]), partners a scorer does not hold (its
    `against`): `keys` the profiles' keys, `key_of` the keys of a list of profiles (each distinct partner's once)."""
    once, at = each_distinct(partners)
    return PairValues([*keys, *key_of(once)], entries).lookup(ia, len(keys) + at)


def _is_grid(ia: np.ndarray, ib: np.ndarray, n: int) -> bool:
    """Whether (ia, ib) is every pair of n profiles as `Derived.tabulate` asks: a column of 0..n-1 and a row of
    0..n-1."""
    return (np.shape(ia) == (n, 1) and np.shape(ib) == (1, n) and n > 0
            and bool(np.all(ia[:, 0] == np.arange(n))) and bool(np.all(ib[0] == np.arange(n))))


def pick(table: np.ndarray, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
    """`table[ia, ib]`, a new array; for every pair (`_is_grid`: a wrapper's table asked of its inner scorer's) a
    copy of the table, several times quicker than numpy's indexing of each pair."""
    return table.copy() if _is_grid(ia, ib, len(table)) else table[ia, ib]


class PairValues:
    """Values of some ordered pairs of a list of profiles, picked out by the profiles' keys, looked up by index in
    bulk (NaN for a pair without one).

    `keys`: each profile's key (None: a profile no entry is for); `entries`: (key of a, key of b, value of a
    next to b), a later entry replacing an earlier one for the same pair of keys. Every profile with a key gets
    its entries."""

    def __init__(self, keys: Sequence[Hashable], entries: Iterable[tuple[Hashable, Hashable, float]]):
        where: dict[Hashable, list[int]] = {}
        for i, k in enumerate(keys):
            if k is not None:
                where.setdefault(k, []).append(i)
        self.n = len(keys)
        values: dict[int, float] = {}
        for ka, kb, v in entries:
            for i in where.get(ka, ()):
                for j in where.get(kb, ()):
                    values[i * self.n + j] = float(v)
        self.codes = np.array(sorted(values), dtype=np.int64)
        self.values = np.array([values[c] for c in self.codes.tolist()], dtype=float)
        self._by_code = values

    def __len__(self) -> int:
        return len(self.codes)

    def value(self, i: int, j: int) -> float:
        """The value of the one pair (profiles[i], profiles[j]) as `lookup` has it, a Python float (NaN: none)."""
        return self._by_code.get(i * self.n + j, math.nan)

    def lookup(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        """The value of each pair (profiles[ia[k]], profiles[ib[k]]); ia and ib broadcast."""
        ia, ib = np.asarray(ia, dtype=np.int64), np.asarray(ib, dtype=np.int64)
        if _is_grid(ia, ib, self.n):  # every pair (a table's): the few values go straight to their places
            out = np.full((self.n, self.n), np.nan)
            out.reshape(-1)[self.codes] = self.values
            return out
        codes = ia * self.n + ib
        out = np.full(codes.shape, np.nan)
        if not len(self.codes):
            return out
        at = np.minimum(np.searchsorted(self.codes, codes), len(self.codes) - 1)
        hit = self.codes[at] == codes
        out[hit] = self.values[at[hit]]
        return out
