"""The trained prior-corrected predictor: slowdowns, admission margins, GPU-type views and online refits.

`PriorCorrected` implements `SlowdownModel`: the prior times e^f, f summed over the training samples through
their distinct jobs (`Fitted`); its file is `transfer.modelfile`'s, its making `transfer.fit`'s. `_Scorer` answers
the planner's pair cache by index, tabulating every pair at once when that is cheaper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from slurm_elastico.interference.admission import margin_of, margins
from slurm_elastico.interference.base import ContentionModel, SoloProfile, distinct
from slurm_elastico.interference.errors import ModelFileError
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.interference.scorers import pick
from slurm_elastico.interference.transfer import modelfile
from slurm_elastico.interference.transfer.calibration import Cross, margins_from_heldout
from slurm_elastico.interference.transfer.encoding import Encoder, shift_direction
from slurm_elastico.interference.transfer.kernel import (
    KernelConfig, distance2, gpu_kernel, linear_features, nearness, similarity,
)
from slurm_elastico.interference.transfer.training import Fitted, samples_of


_ROWS = 64
"""Rows of the pair table `PriorCorrected._pairs_of` works on at a time (64 × a few hundred floats: temporaries
that stay in the cache)."""


class PriorCorrected:
    """The trained transfer predictor; implements `SlowdownModel`. Build with `fit_transfer` or `load`."""

    def __init__(self, prior: ContentionModel, encoder: Encoder, config: KernelConfig, fitted: Fitted,
                 training_mean_norm: float, heldout: dict[str, dict[str, float]], gpu_types: Sequence[str],
                 admission: dict[str, np.ndarray], gpu: str | None = None):
        self.prior, self.encoder, self.config, self.fitted = prior, encoder, config, fitted
        self.training_mean_norm = training_mean_norm
        self.heldout = heldout
        self.admission = admission  # thresholds per floor (`admission.FLOORS`) for seen, family, gpu pairs
        # The held-out pairs `admission` was calibrated on, per kind of fold (`admission_tables`); None when loaded
        # from a file (it keeps the thresholds only).
        self.calibration: dict[str, Cross] | None = None
        self.gpu_types = tuple(gpu_types)
        self.gpu = gpu  # None: each training sample counts as if on the query's GPU (no discount); use on_gpu
        self.margins = margins_from_heldout(heldout)
        self._base = fitted  # what `fine_tune` adds to
        self._pair_weights = self._weights(gpu)

    def _weights(self, gpu: str | None) -> np.ndarray:
        """W[s, p]: summed weight of the training samples whose self is distinct job s and partner p, each weighed by
        how alike its GPU type is to `gpu` (None: no discount). The correction is then k(a)·W·k(b)ᵀ."""
        f = self.fitted
        alpha = f.alpha
        if gpu is not None:  # the kernel once per training GPU type, not per sample (`on_gpu` runs every epoch)
            types = sorted(set(f.gpus))
            near = dict(zip(types, gpu_kernel([gpu], types, self.config)[0].tolist()))
            alpha = alpha * np.array([near[g] for g in f.gpus], dtype=float)
        u = len(f.jobs.family)
        w = np.zeros((u, u))
        np.add.at(w, (f.self_idx, f.partner_idx), alpha)
        return w

    def _parts(self, profiles: Sequence[SoloProfile]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(kernel of each profile to the training jobs, the correction's linear part of each profile as the job
        itself and as the partner (zeros without one), its nearness to the training jobs). The linear part of a
        pair is its two jobs' nearness times (own part of the job + partner part of the partner)."""
        cfg, train = self.config, self.fitted.jobs
        jobs = self.encoder.encode(profiles, self.gpu)
        d2, same_family = distance2(jobs, train, cfg)
        k = similarity(d2, same_family, cfg)
        n = len(profiles)
        if not cfg.linear or not len(train.family):
            return k, np.zeros(n), np.zeros(n), np.zeros(n)
        phi, phi_train, w = cfg.linear * linear_features(jobs), linear_features(train), self._pair_weights
        return k, phi @ (phi_train.T @ w.sum(axis=1)), phi @ (phi_train.T @ w.sum(axis=0)), nearness(d2)

    @property
    def gain_margin(self) -> float:
        """Margin for the rule that a shared GPU gains (combined speed > 1 + margin) on this view's GPU type: from
        the held-out over-prediction of pairs' combined speed (an unseen GPU type: the largest shift's figure)."""
        if self.gpu is not None and not self.seen_gpu(self.gpu):
            return self.margins["gain_gpu"]
        return self.margins["gain_family"]

    # -- views -------------------------------------------------------------------
    def seen_gpu(self, gpu_type: str) -> bool:
        return gpu_type in self.gpu_types

    def on_gpu(self, gpu_type: str) -> PriorCorrected:
        """The model as it answers on `gpu_type`: the correction weighted by how alike that type is to training's."""
        view = PriorCorrected(self.prior, self.encoder, self.config, self.fitted, self.training_mean_norm,
                              self.heldout, self.gpu_types, self.admission, gpu_type)
        view._base = self._base
        return view

    # -- predictions ---------------------------------------------------------------
    def _table(self, profiles: Sequence[SoloProfile], parts: tuple | None = None) -> np.ndarray:
        """Correction f of every pair of `profiles` (i next to j); `parts`: their `_parts`, if computed already."""
        return self._pairs_of(profiles, parts, None)

    def _pairs_of(self, profiles: Sequence[SoloProfile], parts: tuple | None,
                  prior: tuple[np.ndarray, list[int]] | None) -> np.ndarray:
        """f of every pair (`_table`), or with `prior` (the prior's `predict_blocks` of `profiles`) the slowdowns
        max(1, prior·e^f) (`_matrix`). Past the one matrix product, `_ROWS` rows at a time, in place: at the
        planner's few hundred profiles, whole-table temporaries cost as much as their arithmetic (the same numbers,
        half the time)."""
        k, own, partner, near = self._parts(profiles) if parts is None else parts
        table = (k @ self._pair_weights) @ k.T  # a new array
        n = len(profiles)
        step = max(1, min(_ROWS, n))
        linear, both = np.empty((step, n)), np.empty((step, n))
        if prior is not None:  # the prior's few distinct rows, each spread over the columns once
            at = np.asarray(prior[1], dtype=np.int64)
            distinct_rows, spread = prior[0].take(at, 1), np.empty((step, n))
        for lo in range(0, n, step):
            hi = min(lo + step, n)
            rows, lin = table[lo:hi], linear[:hi - lo]
            np.multiply.outer(near[lo:hi], near, out=lin)
            lin *= np.add.outer(own[lo:hi], partner, out=both[:hi - lo])
            rows += lin
            if prior is not None:
                np.exp(rows, out=rows)
                rows *= distinct_rows.take(at[lo:hi], 0, out=spread[:hi - lo])
                np.maximum(rows, 1.0, out=rows)
        return table

    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        """Slowdown S >= 1 of a[k] next to b[k], for every k."""
        profiles, ia, ib = distinct(a, b, "predict")
        if not profiles:
            return np.zeros(0)
        if len(profiles) ** 2 <= 4 * len(ia):  # few distinct jobs: the whole table, then look pairs up
            return self.predict_matrix(profiles)[ia, ib]
        parts = self._parts(profiles)
        return self._predict_parts(profiles, parts, ia, profiles, parts, ib)

    def _predict_parts(self, a: Sequence[SoloProfile], a_parts: tuple, ia: np.ndarray, b: Sequence[SoloProfile],
                       b_parts: tuple, ib: np.ndarray) -> np.ndarray:
        """Slowdown of a[ia[k]] next to b[ib[k]], the two lists given with their `_parts` (computed once each)."""
        k, own, _, near = a_parts
        k_b, _, partner, near_b = b_parts
        kw = k @ self._pair_weights
        corr = np.einsum("ij,ij->i", kw[ia], k_b[ib]) + near[ia] * near_b[ib] * (own[ia] + partner[ib])
        prior = self.prior.predict_indexed(a, ia, b, ib)
        return np.maximum(1.0, prior * np.exp(corr))

    def predict_matrix(self, profiles: Sequence[SoloProfile]) -> np.ndarray:
        """S[i, j]: slowdown of profiles[i] next to profiles[j]."""
        if not profiles:
            return np.zeros((0, 0))
        return self._matrix(profiles)

    def _matrix(self, profiles: Sequence[SoloProfile], parts: tuple | None = None) -> np.ndarray:
        return self._pairs_of(profiles, parts, self.prior.predict_blocks(profiles))

    def admission_margins(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        """Margin on the floor per pair (`admission.margins`): from the pair's predicted worst normalized throughput
        and the thresholds of its kind of shift (an unseen GPU type; else an unseen family; else seen)."""
        profiles, ia, ib = distinct(a, b, "admission_margins")
        return self.scorer(profiles).margins(ia, ib)

    def _unseen_families(self, profiles: Sequence[SoloProfile]) -> np.ndarray:
        """Whether each profile's model family is one training never saw (the family thresholds apply)."""
        known = set(self.encoder.families)
        return np.array([p.model_family not in known for p in profiles], dtype=bool)

    def _thresholds(self, new: bool) -> np.ndarray:
        """The admission thresholds of a pair on this view's GPU type (an unseen one: its kind of shift's); `new`:
        whether the pair holds a job of a family training never saw."""
        t = self.admission
        if self.gpu is not None and not self.seen_gpu(self.gpu):
            direction = shift_direction(self.gpu, self.gpu_types)
            return t[f"gpu_{direction}" if direction else "gpu"]
        return t["family"] if new else t["seen"]

    def _margins_of(self, worst: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Margin of each pair from its predicted worst normalized throughput `worst` (any shape); `new` (same
        shape): whether the pair holds a job of a family training never saw. Elementwise, so one call per
        threshold set over all the pairs it applies to."""
        seen, fresh = self._thresholds(False), self._thresholds(True)
        # (one call where one set is every pair's: the planner's jobs' families are rarely training's, and on an
        # unseen GPU type no pair's family matters)
        if new.all() or seen is fresh:
            return margins(worst, fresh)
        out = margins(worst, seen)
        if new.any():
            out[new] = margins(worst[new], fresh)
        return out

    def scorer(self, profiles: Sequence[SoloProfile]) -> _Scorer:
        """Slowdowns and margins of pairs of `profiles` by index (what the planner's pair cache asks)."""
        return _Scorer(self, list(profiles))

    # -- online learning (interference.online) ------------------------------------------
    def fine_tune(self, observations: Sequence[Colocation], epochs: int = 0, lr: float = 0.0) -> None:
        """Refits the correction, in place, on its training samples (as trained or loaded) plus `observations`
        (the learner's replay: reference data, already among them, and new observations), same config, prior
        and encoder; `epochs` and `lr` are the MLP's and are not used. A call replaces the previous call's
        additions. The GPU types counted as seen, the held-out error and the margins stay as trained."""
        smp = samples_of(observations)
        if len(smp.log_s) < 2:
            return
        jobs = self.encoder.encode([*smp.selves, *smp.partners], [*smp.gpus, *smp.gpus])
        n = len(smp.selves)
        target = smp.log_s - np.log(self.prior.predict(smp.selves, smp.partners))
        self.restore(self._base.plus(jobs, np.arange(n), np.arange(n, 2 * n), smp.gpus, target).refit(self.config))

    def state(self) -> Fitted:
        """What `fine_tune` changes, for rollback."""
        return self.fitted

    def restore(self, state: Fitted) -> None:
        self.fitted = state
        self._pair_weights = self._weights(self.gpu)

    # -- files (`transfer.modelfile`) -------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Writes the model as one JSON file (atomically: write, fsync, rename)."""
        modelfile.write(self, path)

    @classmethod
    def load(cls, path: str | Path) -> PriorCorrected:
        """The model in the file at `path` (`ModelFileError` saying what is wrong with it, the constructor's
        complaints about the file's values included)."""
        fields = modelfile.read(path)
        try:
            return cls(*fields)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"{path}: incomplete or inconsistent predictor file ({exc!r})") from None


class _Scorer:
    """Pairs of fixed profiles by index: every pair tabulated at once (`tabulate`), or the pairs asked for. The
    table's margins are computed when first asked for (a model that wraps this one may keep only the slowdowns), or
    one pair's at a time (`margin`: the planner's pair cache, which looks up a few hundred of them)."""

    def __init__(self, model: PriorCorrected, profiles: list[SoloProfile]):
        self.model, self.profiles = model, profiles
        self.unseen = model._unseen_families(profiles)
        self.table: np.ndarray | None = None  # slowdowns of all pairs
        self._table_margins: np.ndarray | None = None  # their margins, once asked for
        self._parts: tuple | None = None  # the profiles' encoding and kernels (`PriorCorrected._parts`), once
        self._one: tuple | None = None  # for `margin`: the table's `item`, `unseen` and both thresholds as lists

    def parts(self) -> tuple:
        if self._parts is None:
            self._parts = self.model._parts(self.profiles)
        return self._parts

    def tabulate(self, limit: int = 2_560_000) -> bool:
        """Fills the table of all pairs unless there are more than `limit`; whether it is filled."""
        n = len(self.profiles)
        if self.table is None and n * n <= limit:
            self.table = self.model._matrix(self.profiles, self.parts()) if n else np.zeros((0, 0))
        return self.table is not None

    def _margin_table(self) -> np.ndarray:
        if self._table_margins is None:
            s = self.table
            worst = np.maximum(s, s.T)  # the pair's worse job: 1 / the larger slowdown, in place
            self._table_margins = self.model._margins_of(np.divide(1.0, worst, out=worst),
                                                         self.unseen[:, None] | self.unseen)
        return self._table_margins

    def matrices(self, with_margins: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """(slowdowns, margins) of every pair, [i, j] for profiles[i] next to profiles[j]; after `tabulate`.
        `with_margins` False: None for the margins, which `margin` then answers pair by pair."""
        assert self.table is not None, "matrices() before tabulate()"
        return self.table, self._margin_table() if with_margins else None

    def margin(self, i: int, j: int) -> float:
        """The margin of profiles[i] next to profiles[j], as `matrices()` has it, from the table (after
        `tabulate`) in Python floats: the planner asks for a few hundred pairs of the table's ~10^5."""
        if self._one is None:
            model = self.model
            self._one = (self.table.item, self.unseen.tolist(), model._thresholds(False).tolist(),
                         model._thresholds(True).tolist())
        item, unseen, old, new = self._one
        a, b = item(i, j), item(j, i)
        worst = a if a > b else b  # (`np.maximum`: NaN if either is)
        if a != a or b != b:
            worst = math.nan
        return margin_of(1.0 / worst, new if unseen[i] or unseen[j] else old)

    def against(self, ia: np.ndarray, partners: Sequence[SoloProfile]) -> np.ndarray:
        """Slowdown of profiles[ia[k]] next to partners[k], profiles the scorer does not hold (the planner's stand-in
        neighbours): its own profiles are not encoded again, the partners once each."""
        others, ib, _ = distinct(partners, partners, "against")
        return self.model._predict_parts(self.profiles, self.parts(), np.asarray(ia, dtype=np.int64), others,
                                         self.model._parts(others), ib)

    def _pairs(self, ia: np.ndarray, ib: np.ndarray) -> tuple[list[SoloProfile], list[SoloProfile]]:
        return [self.profiles[i] for i in ia], [self.profiles[j] for j in ib]

    def slowdown(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        if self.table is not None or len(self.profiles) ** 2 <= 4 * len(ia) and self.tabulate():
            return pick(self.table, ia, ib)
        return self.model.predict(*self._pairs(ia, ib))

    def margins(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        if self.table is not None or len(self.profiles) ** 2 <= 4 * len(ia) and self.tabulate():
            return pick(self._margin_table(), ia, ib)
        a, b = self._pairs(ia, ib)
        worst = 1.0 / np.maximum(self.model.predict(a, b), self.model.predict(b, a))
        return self.model._margins_of(worst, self.unseen[ia] | self.unseen[ib])
