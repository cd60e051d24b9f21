"""A trained model adapted online to one GPU type from the pairs measured there, with margins from its own error.

`OnlineAdapted` is what a planner is given on a GPU type the model never saw: it answers as the model's view of
that type (`on_gpu`) and, as pairs are measured there (`observe`: every probe and co-located epoch the observer
turns into a `Colocation`), refits the few-shot adaptation (`adapt.fit_type`) on every distinct pair measured so
far (the latest measurement of each). Its margins follow what was measured, in three stages:

- no pair measured: the model's own margins on that type, at least `untrained_margin` for the gain rule (the
  constant the planner gives an uncalibrated model, `planner.slowdown.UNCALIBRATED_GAIN_MARGIN`): nothing says
  how wrong it is here;
- 1 to `adapt.MIN_PAIRS` − 1 pairs: the model's predictions, with one margin for every pair from its error on
  the measured ones: the largest over-prediction of a pair's worse normalized throughput (admission) and of
  its summed speed (gain rule), each at least 0. Few pairs, so the largest, not a quantile;
- from `adapt.MIN_PAIRS` pairs: the adapted model (`adapt.AdaptedView`), whose per-pair margins are calibrated
  on its own cross-validated error in the measured pairs (`adapt.fit_type`): they shrink as measured pairs
  agree with it and grow when they do not.

A pair that did not fit is kept (it says the pair cannot share) but fits nothing, as in `adapt`. Pure: numbers
in, numbers out; the observer decides what was measured.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slurm_elastico.interference.adapt import MIN_PAIRS, AdaptedView, TypeFit, fit_type
from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.interference.probe import profile_key


def _pair_key(o: Colocation) -> frozenset:
    return frozenset((profile_key(o.a), profile_key(o.b)))


class OnlineAdapted:
    """`base` on `gpu_type`, adapted to the pairs measured there as they come (module docstring)."""

    def __init__(self, base, gpu_type: str, untrained_margin: float = 0.0):
        if not untrained_margin >= 0:
            raise ValueError(f"untrained_margin {untrained_margin!r}: must be a number >= 0")
        self.base, self.gpu_type, self.untrained_margin = base, gpu_type, float(untrained_margin)
        self.base_view = base.on_gpu(gpu_type) if hasattr(base, "on_gpu") else base
        self.measured: dict[frozenset, Colocation] = {}
        self.fit: TypeFit | None = None
        self.refits = 0
        self._margin, self._gain = 0.0, float(untrained_margin)
        self._view = self.base_view

    @property
    def stage(self) -> str:
        """"untrained", "measured" (too few pairs to adapt: margins from the model's error) or "adapted"."""
        return "adapted" if self.fit is not None else "measured" if self._fitting() else "untrained"

    def _fitting(self) -> list[Colocation]:
        return [o for o in self.measured.values() if o.fits]

    def observe(self, observations: Sequence[Colocation]) -> bool:
        """Adds measured pairs of `gpu_type` (others are ignored; a pair measured again replaces its earlier
        measurement) and refits; True when anything new came."""
        new = False
        for o in observations:
            if o.gpu_type != self.gpu_type:
                continue
            key = _pair_key(o)
            old = self.measured.get(key)
            if old is None or (old.norm_a, old.norm_b, old.fits) != (o.norm_a, o.norm_b, o.fits):
                self.measured[key] = o
                new = True
        if new:
            self._refit()
        return new

    def _refit(self) -> None:
        pairs = self._fitting()
        self.refits += 1
        if len(pairs) >= MIN_PAIRS:
            self.fit = fit_type(self.base_view, pairs, self.gpu_type)
            self._view = AdaptedView(self.base_view, self.fit)
            return
        self.fit, self._view = None, self.base_view
        if not pairs:
            self._margin, self._gain = 0.0, self.untrained_margin
            return
        a, b = [o.a for o in pairs], [o.b for o in pairs]
        p_ab = 1.0 / np.asarray(self.base_view.predict(a, b), dtype=float)
        p_ba = 1.0 / np.asarray(self.base_view.predict(b, a), dtype=float)
        t_ab = np.array([o.norm_a for o in pairs])
        t_ba = np.array([o.norm_b for o in pairs])
        worst_over = np.minimum(p_ab, p_ba) / np.minimum(t_ab, t_ba)
        sum_over = (p_ab + p_ba) / (t_ab + t_ba)
        self._margin = max(0.0, float(np.max(worst_over)) - 1.0)
        self._gain = max(0.0, float(np.max(sum_over)) - 1.0)

    # -- SlowdownModel ---------------------------------------------------------------------------------

    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        return np.asarray(self._view.predict(a, b), dtype=float)

    def admission_margins(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        if self.fit is not None:
            return np.asarray(self._view.admission_margins(a, b), dtype=float)
        if self.measured and self._fitting():
            return np.full(len(a), self._margin)
        own = getattr(self.base_view, "admission_margins", None)
        if own is not None:
            return np.asarray(own(a, b), dtype=float)
        return np.full(len(a), float(getattr(self.base_view, "admission_margin", 0.0)))

    @property
    def gain_margin(self) -> float:
        if self.fit is not None:
            return self.fit.gain_margin
        if self._fitting():
            return self._gain
        own = float(getattr(self.base_view, "gain_margin", getattr(self.base_view, "admission_margin", 0.0)))
        return max(own, self.untrained_margin)

    def summary(self) -> dict:
        """What it has learnt so far, for reports."""
        return {"gpu_type": self.gpu_type, "stage": self.stage, "pairs_measured": len(self.measured),
                "pairs_fitting": len(self._fitting()), "refits": self.refits, "gain_margin": self.gain_margin,
                "fit": self.fit.to_dict() if self.fit is not None else None}
