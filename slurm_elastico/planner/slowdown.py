"""Pairwise slowdowns for packing: batched calls to the interference model, cached per epoch.

Profiles get integer ids (one per distinct shape of a family, one per foreign
job). The model is asked for every pair of the profiles known so far in one
call at the first lookup (`predict_matrix` where the model has it, else one
`predict` over all pairs); profiles added later cost one more call for their
rows and columns only. Packing then never calls the model: its many small
lookups (a few pairs per candidate GPU) would otherwise each pay the model's
fixed per-call cost (2,000 lookups: ~90 ms with the contention model, vs ~8 ms
all pairs at once; the contention model's all-pairs answer is kept as it
computes it, a block over its few distinct demands and each profile's row
there, `ContentionModel.predict_blocks`, not spread to a table of every pair
until a profile comes after the first lookup). Past `max_dense_pairs` only
the pairs asked for are predicted, in one batched call per lookup. A model with `scorer(profiles)`
(the trained predictor) is asked once per set of profiles: its scorer
tabulates every pair of distinct profiles, so a block 16 times larger is that
table as it is (`matrices()`), and any lookup an index into it; a profile
added after that rebuilds the scorer, so the epoch adds every profile before
its first lookup. With several
co-runners, slowdowns add: `S = 1 + Σ_k (S_k − 1)` — the pairwise model knows
nothing better, and adding is the cautious choice (it is never below the worst
pair).

Admission margins come from the same cache: a model with
`admission_margins(a, b)` is asked for every pair's margin in one call next to
each prediction call (a scorer with `margin(i, j)` for each pair the epoch
looks up, once: a few hundred of a table's ~10^5); one with only `admission_margin` (or neither: 0) gives
one margin for all pairs (`per_pair` is then False and packing never looks
margins up). `for_gpu` gives the model as it should be used on the cluster's
GPU type.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slurm_elastico.interference.base import MIN_GAIN, ContentionModel, SlowdownModel, SoloProfile


def for_gpu(model: SlowdownModel | None, gpu_type: str) -> SlowdownModel | None:
    """`model.on_gpu(gpu_type)` where the model has it and a type is set, else the model as is.

    On a GPU type it never trained on, a predictor answers with its cautious
    view (shrunk predictions, larger margins); protocol, not class: no import
    of the predictor here.
    """
    if model is None or not gpu_type or not hasattr(model, "on_gpu"):
        return model
    return model.on_gpu(gpu_type)


def _clean_margin(m: np.ndarray) -> np.ndarray:
    """Margins as the planner uses them: inf for anything not finite (an unknown margin refuses the pair)."""
    out = np.array(m, dtype=float)  # a copy: the model's own table stays as it is
    out[~np.isfinite(out)] = np.inf
    return out


def _clean(s: np.ndarray) -> np.ndarray:
    """Slowdowns as the planner uses them: >= 1, and inf for anything not finite (never admit on NaN)."""
    s = np.asarray(s, dtype=float)
    out = np.maximum(s, 1.0, out=np.empty(s.shape))  # one float array for the planner's table, not two
    out[~np.isfinite(s)] = np.inf
    return out


def _clean_table(s: np.ndarray) -> np.ndarray:
    """`_clean`'s numbers, in the table itself when none needs cleaning, as a scorer's all-pairs table rarely does
    (one pass and no copy; the planner only reads it)."""
    s = np.asarray(s, dtype=float)
    return s if s.min(initial=1.0) >= 1.0 else _clean(s)  # (NaN: the minimum is NaN, and `_clean` maps it)


def _blocks(model: SlowdownModel | None) -> bool:
    """Whether the model's all-pairs call is the contention model's spread of its blocks (`predict_blocks`): a
    model that answers `predict_matrix` otherwise (a subclass that records or changes it) is asked through it."""
    return getattr(type(model), "predict_matrix", None) is ContentionModel.predict_matrix


UNCALIBRATED_GAIN_MARGIN = 0.4
"""The gain rule's margin for the untrained `ContentionModel` (whose own margin is 0: it was never checked
against anything). Measured, not tuned: on Gavel's co-located pairs that fit
(`sim/data/gavel_pairs_p100.csv`), the stand-in predicts a pair's summed fraction of solo speed above the
measured sum by 0.25 at the median and 0.41 at the 95th percentile (the test in
tests/unit/test_planner_gain_margin.py recomputes it), so a GPU it says gains by less may well lose."""


class PairCache:
    """Slowdown (and admission margin) of profile a next to profile b, by id; `model=None`: no interference."""

    def __init__(self, model: SlowdownModel | None, max_dense_pairs: int = 160_000):
        self.model = model
        self.profiles: list[SoloProfile] = []
        self.max_dense_pairs = max_dense_pairs  # 400 profiles: ~40 ms (MLP) to ~120 ms (contention) on one core
        self.model_calls = 0  # how often the model was asked for slowdowns (tests and notes)
        self.margin_calls = 0  # how often it was asked for per-pair margins
        self.per_pair = model is not None and hasattr(model, "admission_margins")
        # The one margin of every pair when not per pair (see interference.base.admissible).
        self.margin = 0.0 if model is None or self.per_pair else float(getattr(model, "admission_margin", 0.0))
        # The gain rule's least margin: the model's own for that rule (calibrated on pairs' combined speed, where it
        # has one), else its one admission margin; the untrained stand-in's, its measured error. With per-pair
        # margins, packing takes the larger of this and each pair's (which may be below 0: admission's bar).
        # Never below `MIN_GAIN`: a pairing predicted to gain less is not tried (the probe would undo it). Whether the
        # model is the untrained stand-in is asked of the model a `probe.RefusingModel` wraps, whose per-pair margins
        # are the stand-in's one margin: refusing some pairs must not lower the bar for the others.
        own = float(getattr(model, "gain_margin", self.margin)) if model is not None else 0.0
        inner = getattr(model, "inner", model)
        uncalibrated = isinstance(inner, ContentionModel) and not hasattr(inner, "admission_margins")
        least = max(MIN_GAIN, UNCALIBRATED_GAIN_MARGIN) if uncalibrated else MIN_GAIN
        self.gain_margin = max(own, least) if model is not None else 0.0
        self._dense = np.zeros((0, 0))  # slowdowns of the first len(_dense) profiles, all pairs
        # ...or, from the contention model (`_blocks`), the slowdowns among its few distinct demands and each
        # profile's row there: the same numbers without a table of every pair (`_block` None: `_dense` holds them)
        self._block: np.ndarray | None = None
        self._rows: list[int] = []
        self._dense_margin = np.zeros((0, 0))  # their margins (per_pair only)
        self._known: dict[tuple[int, int], float] = {}  # pairs outside the dense block
        self._known_margin: dict[tuple[int, int], float] = {}  # their margins (per_pair only)
        self._pair_margin = None  # the scorer's `margin(i, j)`, when it answers margins pair by pair (per_pair)
        self._margin_memo: dict[tuple[int, int], float] = {}  # what it answered
        self._scorer = None  # the model's scorer over `profiles` (models with `scorer`), past the dense limit
        self._scorer_size = 0

    @property
    def enabled(self) -> bool:
        return self.model is not None

    def add(self, profile: SoloProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def _call(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        self.model_calls += 1
        return _clean(np.asarray(self.model.predict(a, b), dtype=float).reshape(-1))

    def _margins(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        self.margin_calls += 1
        return _clean_margin(np.asarray(self.model.admission_margins(a, b), dtype=float).reshape(-1))

    def _grow_dense(self) -> bool:
        """Extends the all-pairs block to every profile; False when the model or the size does not allow it."""
        n, m = len(self.profiles), len(self._rows) if self._block is not None else len(self._dense)
        if n == m:
            return True
        if hasattr(self.model, "scorer"):
            return self._dense_from_scorer(n)
        # A model with an all-pairs call (`predict_matrix`) fills a block 16 times larger as fast as one
        # without fills the default block; past that, only the pairs asked for are predicted.
        limit = self.max_dense_pairs * (16 if hasattr(self.model, "predict_matrix") and not self.per_pair else 1)
        if n * n > limit:
            return False
        p = self.profiles
        if m == 0 and not self.per_pair and _blocks(self.model):
            self.model_calls += 1
            block, rows = self.model.predict_blocks(p)
            self._block, self._rows = _clean(np.asarray(block, dtype=float)), rows
            return True
        if self._block is not None:  # profiles added since: every pair's table from here on (the same numbers)
            self._dense = self._block.take(self._rows, 0).take(self._rows, 1)
            self._block, self._rows = None, []
        dense = np.empty((n, n))
        margin = np.empty((n, n)) if self.per_pair else self._dense_margin
        if m == 0:
            if hasattr(self.model, "predict_matrix"):
                self.model_calls += 1
                dense = _clean(np.asarray(self.model.predict_matrix(p), dtype=float).reshape(n, n))  # a new array
            if self.per_pair or not hasattr(self.model, "predict_matrix"):
                a, b = [x for x in p for _ in p], p * n
                if not hasattr(self.model, "predict_matrix"):
                    dense[:] = self._call(a, b).reshape(n, n)
                if self.per_pair:
                    margin[:] = self._margins(a, b).reshape(n, n)
        else:
            # Only the new rows and columns: (new, all) and (old, new), one call.
            new = range(m, n)
            rows = [(i, j) for i in new for j in range(n)] + [(i, j) for i in range(m) for j in new]
            a, b = [p[i] for i, _ in rows], [p[j] for _, j in rows]
            ii, jj = np.array(rows).T
            dense[:m, :m] = self._dense
            dense[ii, jj] = self._call(a, b)
            if self.per_pair:
                margin[:m, :m] = self._dense_margin
                margin[ii, jj] = self._margins(a, b)
        self._dense, self._dense_margin = dense, margin
        return True

    def _current_scorer(self):
        """The model's scorer over every profile so far, its table of distinct pairs filled if not too large."""
        if self._scorer is None or self._scorer_size != len(self.profiles):
            self._scorer, self._scorer_size = self.model.scorer(self.profiles), len(self.profiles)
            self._scorer.tabulate()
        return self._scorer

    def _dense_from_scorer(self, n: int) -> bool:
        """All pairs from the scorer's table (an index per pair, so a block 16 times the default is cheap)."""
        scorer = self._current_scorer()
        if n * n > 16 * self.max_dense_pairs or not scorer.tabulate():
            return False
        # A scorer that answers one pair's margin (`margin`) is asked pair by pair, as `margins` meets them: an
        # epoch looks up a few hundred of the table's pairs, and a table of every margin costs more.
        one = getattr(scorer, "margin", None) if self.per_pair else None
        slowdowns, margins = scorer.matrices(with_margins=False) if one is not None else scorer.matrices()
        self.model_calls += 1
        self._dense = _clean_table(slowdowns)
        if one is not None:
            self.margin_calls += 1
            self._pair_margin, self._margin_memo = one, {}
        elif self.per_pair:
            self.margin_calls += 1
            self._dense_margin = _clean_margin(margins)
        return True

    def _lookup(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Past the dense limit: predicts the pairs not known yet (and their margins) in one batched call.

        A model with `scorer(profiles)` (the trained predictor) encodes every profile once per set of
        profiles, and tabulates every pair of distinct profiles when there are not too many; a lookup then
        costs only its own pairs, or an index (epoch latency: `benchmarks/planner.py`).
        """
        known = self._known
        missing = list(dict.fromkeys(q for q in pairs if q not in known))
        if not missing:
            return
        if hasattr(self.model, "scorer"):
            scorer = self._current_scorer()
            ia, ib = np.array(missing, dtype=np.int64).T
            self.model_calls += 1
            known.update(zip(missing, _clean(scorer.slowdown(ia, ib)).tolist()))
            if self.per_pair:
                self.margin_calls += 1
                self._known_margin.update(zip(missing, _clean_margin(scorer.margins(ia, ib)).tolist()))
            return
        a, b = [self.profiles[i] for i, _ in missing], [self.profiles[j] for _, j in missing]
        known.update(zip(missing, self._call(a, b).tolist()))
        if self.per_pair:
            self._known_margin.update(zip(missing, self._margins(a, b).tolist()))

    def get(self, pairs: Sequence[tuple[int, int]]) -> list[float]:
        """Slowdown (>= 1) of each pair's first id next to its second; the model is asked at most once per call."""
        if self.model is None:
            return [1.0] * len(pairs)
        if self._grow_dense():
            if self._block is not None:
                item, rows = self._block.item, self._rows
                return [item(rows[i], rows[j]) for i, j in pairs]
            return list(map(self._dense.item, pairs))  # a Python float each, without numpy's scalar indexing
        self._lookup(pairs)
        known = self._known
        return [known[q] for q in pairs]

    def margins(self, pairs: Sequence[tuple[int, int]]) -> list[float]:
        """Admission margin of each pair (`self.margin` for all unless `per_pair`); same calls as `get`."""
        if not self.per_pair:
            return [self.margin] * len(pairs)
        if self._grow_dense():
            if self._pair_margin is not None:  # from the scorer, each pair once
                memo, one = self._margin_memo, self._pair_margin
                return [memo[q] if q in memo else memo.setdefault(q, one(*q)) for q in pairs]
            return list(map(self._dense_margin.item, pairs))  # a Python float each, without numpy's scalar indexing
        self._lookup(pairs)
        known = self._known_margin
        return [known[q] for q in pairs]

    def vs_partners(self, ids: Sequence[int], partners: Sequence[SoloProfile]) -> np.ndarray:
        """Slowdown of each id next to a stand-in partner profile, one batched call (pricing's Γ)."""
        if self.model is None or not ids:
            return np.ones(len(ids))
        scorer = self._current_scorer() if hasattr(self.model, "scorer") else None
        if hasattr(scorer, "against"):  # the scorer's profiles are encoded once an epoch, for this and the table
            self.model_calls += 1
            return _clean(np.asarray(scorer.against(np.asarray(ids, dtype=np.int64), list(partners)), dtype=float))
        return self._call([self.profiles[i] for i in ids], list(partners))
