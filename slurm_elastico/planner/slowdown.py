"""Pairwise slowdowns for packing: batched calls to the interference model, cached per epoch.

Profiles get integer ids (one per distinct shape of a family, one per foreign
job). The model is asked for every pair of the profiles known so far in one
call at the first lookup (`predict_matrix` where the model has it, else one
`predict` over all pairs); profiles added later cost one more call for their
rows and columns only. Packing then never calls the model: its many small
lookups (a few pairs per candidate GPU) would otherwise each pay the model's
fixed per-call cost (2,000 lookups: ~90 ms with the contention model, vs ~8 ms
all pairs at once). Past `max_dense_pairs` only the pairs asked for are
predicted, in one batched call per lookup. With several
co-runners, slowdowns add: `S = 1 + Σ_k (S_k − 1)` — the pairwise model knows
nothing better, and adding is the cautious choice (it is never below the worst
pair).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slurm_elastico.interference.base import SlowdownModel, SoloProfile


def _clean(s: np.ndarray) -> np.ndarray:
    """Slowdowns as the planner uses them: >= 1, and inf for anything not finite (never admit on NaN)."""
    s = np.asarray(s, dtype=float)
    return np.where(np.isfinite(s), np.maximum(s, 1.0), np.inf)


class PairCache:
    """Slowdown of profile a next to profile b, by id; `model=None` means no interference at all."""

    def __init__(self, model: SlowdownModel | None, max_dense_pairs: int = 160_000):
        self.model = model
        self.profiles: list[SoloProfile] = []
        self.max_dense_pairs = max_dense_pairs  # 400 profiles: ~40 ms (MLP) to ~120 ms (contention) on one core
        self.model_calls = 0  # how often the model was asked (tests and notes)
        self._dense = np.zeros((0, 0))  # slowdowns of the first len(_dense) profiles, all pairs
        self._known: dict[tuple[int, int], float] = {}  # pairs outside the dense block

    @property
    def enabled(self) -> bool:
        return self.model is not None

    def add(self, profile: SoloProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def _call(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        self.model_calls += 1
        return _clean(np.asarray(self.model.predict(a, b), dtype=float).reshape(-1))

    def _grow_dense(self) -> bool:
        """Extends the all-pairs block to every profile; False when the model or the size does not allow it."""
        n, m = len(self.profiles), len(self._dense)
        if n == m:
            return True
        if n * n > self.max_dense_pairs:
            return False
        dense = np.empty((n, n))
        if m == 0 and hasattr(self.model, "predict_matrix"):
            self.model_calls += 1
            dense[:] = _clean(np.asarray(self.model.predict_matrix(self.profiles), dtype=float).reshape(n, n))
        elif m == 0:
            p = self.profiles
            dense[:] = self._call([x for x in p for _ in p], p * n).reshape(n, n)
        else:
            # Only the new rows and columns: (new, all) and (old, new), one call.
            new = range(m, n)
            rows = [(i, j) for i in new for j in range(n)] + [(i, j) for i in range(m) for j in new]
            got = self._call([self.profiles[i] for i, _ in rows], [self.profiles[j] for _, j in rows])
            dense[:m, :m] = self._dense
            ii, jj = np.array(rows).T
            dense[ii, jj] = got
        self._dense = dense
        return True

    def get(self, pairs: Sequence[tuple[int, int]]) -> list[float]:
        """Slowdown (>= 1) of each pair's first id next to its second; the model is asked at most once per call."""
        if self.model is None:
            return [1.0] * len(pairs)
        if self._grow_dense():
            dense = self._dense
            return [float(dense[a, b]) for a, b in pairs]
        known = self._known
        missing = list(dict.fromkeys(p for p in pairs if p not in known))
        if missing:
            got = self._call([self.profiles[a] for a, _ in missing], [self.profiles[b] for _, b in missing])
            known.update(zip(missing, got.tolist()))
        return [known[p] for p in pairs]

    def vs_partners(self, ids: Sequence[int], partners: Sequence[SoloProfile]) -> np.ndarray:
        """Slowdown of each id next to a stand-in partner profile, one batched call (pricing's Γ)."""
        if self.model is None or not ids:
            return np.ones(len(ids))
        return self._call([self.profiles[i] for i in ids], list(partners))
