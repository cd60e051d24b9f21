"""Pairwise slowdowns for packing: batched calls to the interference model, cached per epoch.

Profiles get integer ids (one per distinct shape of a family, one per foreign
job); a pair's slowdown is asked of the model once per epoch. With several
co-runners, slowdowns add: `S = 1 + Σ_k (S_k − 1)` — the pairwise model knows
nothing better, and adding is the cautious choice (it is never below the
worst pair).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slurm_elastico.interference.base import SlowdownModel, SoloProfile


class PairCache:
    """Slowdown of profile a next to profile b, by id; `model=None` means no interference at all."""

    def __init__(self, model: SlowdownModel | None):
        self.model = model
        self.profiles: list[SoloProfile] = []
        self._known: dict[tuple[int, int], float] = {}

    @property
    def enabled(self) -> bool:
        return self.model is not None

    def add(self, profile: SoloProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def get(self, pairs: Sequence[tuple[int, int]]) -> list[float]:
        """Slowdown (>= 1) of each pair's first id next to its second, asking the model once for the misses."""
        if self.model is None:
            return [1.0] * len(pairs)
        known = self._known
        missing = list(dict.fromkeys(p for p in pairs if p not in known))
        if missing:
            got = np.asarray(self.model.predict([self.profiles[a] for a, _ in missing],
                                                [self.profiles[b] for _, b in missing]), dtype=float)
            for pair, s in zip(missing, got.reshape(-1)):
                known[pair] = max(1.0, float(s)) if np.isfinite(s) else float("inf")
        return [known[p] for p in pairs]

    def vs_partners(self, ids: Sequence[int], partners: Sequence[SoloProfile]) -> np.ndarray:
        """Slowdown of each id next to a stand-in partner profile, one batched call (pricing's Γ)."""
        if self.model is None or not ids:
            return np.ones(len(ids))
        got = np.asarray(self.model.predict([self.profiles[i] for i in ids], list(partners)), dtype=float)
        return np.where(np.isfinite(got), np.maximum(got, 1.0), np.inf)
