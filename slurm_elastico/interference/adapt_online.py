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

Probing (`probing`, set by the observer each epoch while its budget of probe time lasts): optimism where the
model is uncertain. A pair never measured is predicted at its slowdown ÷ (1 + `optimism`) (at least 1), with
margin 0 and only the planner's least gain (`MIN_GAIN`) for the gain rule, so the planner tries the unmeasured
pairs that might gain most if the model's error on this type is that large; measured pairs keep their predictions
and the margins their error gave. `optimism` follows what was measured, as the margins do: `probe_optimism`, the
error one allows the model on a type it never saw (the caller's: the untrained model's measured error,
`planner.slowdown.UNCALIBRATED_GAIN_MARGIN`), until a pair that fits is measured; then the current view's largest
under-prediction of a measured pair's summed speed (0 when it under-predicted none: on a type where pairs are worse
than it says, it no longer pairs what it calls bad to find out).
The probe is judged like any pairing and reverted when it loses (`interference.probe`), after which the pair is
measured, and its error counts.

A pair measured is predicted at its measurement (its latest), with margin 0: nothing predicts a pair better than
the pair itself (the probe that measured it has judged it already); the stages above are for the others.

A pair that did not fit is kept (it says the pair cannot share) but fits nothing, as in `adapt`. Pure: numbers
in, numbers out; the observer decides what was measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

from slurm_elastico.interference.adapt import MIN_PAIRS, AdaptedView, TypeFit, fit_type
from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.interference.probe import keys_among, pair_key, profile_key
from slurm_elastico.interference.scorers import ByScorer, Derived, PairValues, scorer_of, values_against


class OnlineAdapted(ByScorer):
    """`base` on `gpu_type`, adapted to the pairs measured there as they come (module docstring)."""

    def __init__(self, base, gpu_type: str, untrained_margin: float = 0.0, probe_optimism: float = 0.0):
        for name, v in (("untrained_margin", untrained_margin), ("probe_optimism", probe_optimism)):
            if not (v >= 0 and np.isfinite(v)):
                raise ValueError(f"{name} {v!r}: must be a finite number >= 0")
        self.base, self.gpu_type, self.untrained_margin = base, gpu_type, float(untrained_margin)
        self.probe_optimism = float(probe_optimism)
        self.base_view = base.on_gpu(gpu_type) if hasattr(base, "on_gpu") else base
        self.measured: dict[frozenset, Colocation] = {}
        self.fit: TypeFit | None = None
        self.refits = 0
        self._margin, self._gain = 0.0, float(untrained_margin)
        self._view = self.base_view
        self.probing = False
        """Whether pairs never measured are taken at the model's word this epoch (module docstring)."""
        self.optimism = self.probe_optimism
        """How much better than predicted a pair never measured is taken while probing: `probe_optimism` until a
        pair that fits is measured; then the current view's largest under-prediction of a measured pair's summed speed
        (0 when it under-predicted none)."""

    def knows(self, o: Colocation) -> bool:
        """Whether the pair of `o` was measured on this type before (a new one is a probe's first measurement)."""
        return o.gpu_type == self.gpu_type and pair_key(o) in self.measured

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
            key = pair_key(o)
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
        self.optimism = self.probe_optimism
        if len(pairs) >= MIN_PAIRS:
            self.fit = fit_type(self.base_view, pairs, self.gpu_type)
            self._view = AdaptedView(self.base_view, self.fit)
        else:
            self.fit, self._view = None, self.base_view
        if not pairs:
            self._margin, self._gain = 0.0, self.untrained_margin
            return
        sum_over, worst_over = self._over(pairs)
        if self.fit is None:
            self._margin = max(0.0, float(np.max(worst_over)) - 1.0)
            self._gain = max(0.0, float(np.max(sum_over)) - 1.0)
        if self.probe_optimism > 0:  # the view's own error on this type, not a constant (module docstring)
            self.optimism = max(0.0, float(np.max(1.0 / sum_over)) - 1.0)

    def _over(self, pairs: Sequence[Colocation]) -> tuple[np.ndarray, np.ndarray]:
        """The current view's over-prediction of each measured pair: of its summed speed, of its worse job's."""
        a, b = [o.a for o in pairs], [o.b for o in pairs]
        p_ab = 1.0 / np.asarray(self._view.predict(a, b), dtype=float)
        p_ba = 1.0 / np.asarray(self._view.predict(b, a), dtype=float)
        t_ab = np.array([o.norm_a for o in pairs])
        t_ba = np.array([o.norm_b for o in pairs])
        return (p_ab + p_ba) / (t_ab + t_ba), np.minimum(p_ab, p_ba) / np.minimum(t_ab, t_ba)

    # -- SlowdownModel ---------------------------------------------------------------------------------

    def _fresh(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        """Which pairs were never measured."""
        return np.array([frozenset((profile_key(p), profile_key(q))) not in self.measured for p, q in zip(a, b)],
                        dtype=bool)

    def probes(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        """Per pair: whether putting a[k] beside b[k] now is a probe (probing, and the pair never measured)."""
        return self._fresh(a, b) & (self.probing and self.probe_optimism > 0)

    def _measured(self) -> Iterator[tuple[tuple, tuple, float]]:
        """(key of a, key of b, the measured slowdown of a next to b) of every measured pair, both ways: 1 / its
        normalized throughput (a speed-up counts as 1, a pair that did not fit as inf). A pair of two jobs of one
        key counts as its first job's, as measured."""
        for o in self.measured.values():
            ka, kb = profile_key(o.a), profile_key(o.b)
            for k1, k2, norm in ((kb, ka, o.norm_b), (ka, kb, o.norm_a)):
                yield k1, k2, (1.0 / min(norm, 1.0) if o.fits and norm > 0 else np.inf)

    def scorer(self, profiles: Sequence[SoloProfile]) -> Derived:
        """Pairs of `profiles` as the current view answers them (`scorers.Derived`), except: a measured pair at its
        measurement with margin 0; while probing, a pair never measured at its slowdown ÷ (1 + optimism) with
        margin 0; in the "measured" stage, the one margin from the measured pairs' error."""
        inner = scorer_of(self._view, profiles)
        seen = [p for o in self.measured.values() for p in (o.a, o.b)]
        keys = keys_among(inner.profiles, seen)
        known = PairValues(keys, self._measured())
        # (the stage, read once as the view above: 1 to MIN_PAIRS − 1 pairs measured give one margin for every pair)
        one_margin = self.fit is None and bool(self._fitting())

        def answer(s, measured):
            """The view's slowdowns `s` with the measured ones where there are (NaN: none), and optimism."""
            fresh = np.isnan(measured)
            if self.probing and self.probe_optimism > 0:
                s = np.where(fresh, np.maximum(1.0, s / (1.0 + self.optimism)), s)
            return np.where(fresh, s, measured)

        def slow(view, ia, ib):
            s = view.slowdown(ia, ib)
            if not len(known) and not (self.probing and self.probe_optimism > 0):
                return s
            return answer(s, known.lookup(ia, ib))

        def margin(view, ia, ib, _):
            if one_margin:
                out = np.full(np.broadcast_shapes(np.shape(ia), np.shape(ib)), self._margin)
            else:
                out = view.margins(ia, ib)
            if not self.measured and not self.probing:
                return out
            keep = np.isnan(known.lookup(ia, ib)) & (not self.probing)
            return np.where(keep, out, 0.0)

        def one(view, i, j, *_):  # `margin` of one pair, in Python floats
            if self.probing or (self.measured and not math.isnan(known.value(i, j))):
                return 0.0  # probing, or a measured pair
            return self._margin if one_margin else view.margin(i, j)

        def against(view, ia, partners):
            measured = values_against(keys, lambda ps: keys_among(ps, seen), self._measured(), ia, partners)
            return answer(view.against(ia, partners), measured)

        return Derived(inner, slow, margin, against, one if getattr(inner, "margin", None) is not None else None)

    @property
    def gain_margin(self) -> float:
        if self.probing:
            return 0.0  # the planner's least gain; measured pairs keep their own margins (admission_margins)
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
                "optimism": self.optimism,
                "fit": self.fit.to_dict() if self.fit is not None else None}
