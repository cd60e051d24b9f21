"""Few-shot adaptation: a trained slowdown model fitted to a new GPU type (or site) from its first measured pairs.

On a GPU type it never saw, a trained model's slowdowns keep the level and spread of its training types, and
what is particular to a job on the new type it cannot know. `adapt` keeps the model (its prediction is the one input that
carries what it learnt) and fits, per GPU type, on that type's measured pairs only, in log slowdown:

    log Ŝ(a | b) = c + b·log S_model(a | b) + Σ_class (u[class of a] + v[class of b]),   Ŝ >= 1

- c, the type's offset: free (a handful of pairs fixes a level);
- b, the type's scale: shrunk toward 1 (the model's spread as it is) by a penalty worth λ_scale samples;
- u, v: per-class corrections, for a job as itself (u) and as the partner (v), each shrunk toward 0 by a
  penalty worth λ samples per class. Two kinds of class (`CLASSES`), nested: the job's model family, and
  the job itself within it (family, kind, precision and batch: the same workload measured with several
  partners; `class_of`). A class absent from the adaptation pairs gets no correction.

The penalties are counted in samples so that they mean the same on any data: a class seen in n samples
keeps n / (n + λ) of its mean residual, the scale n / (n + λ_scale) of its least-squares departure from 1.
None is set from any data set's figures: each is chosen from a fixed, wide log grid (`SCALE_PENALTIES`,
`CLASS_PENALTIES`: from a quarter of a sample, the data nearly alone, to more samples than a few-shot set
holds, by factors of 4; inf = that part not fitted), by a coordinate search (one penalty's whole grid at a
time, the others held, from the grids' middles, until a pass changes none) on cross-validation inside the
adaptation pairs
(leave-one-pair-out, or `FOLDS` folds of pairs beyond `LOO_PAIRS` pairs; both directions of a pair are
always in the same fold), by MAPE of normalized throughput
(the figure the evaluation reports); a tie goes to the larger penalty. Fitted by penalised least squares on
log S (both directions of every pair that ran together; a measured speed-up counts as S = 1, as in training).

What is kept: everything else of the model (its features, its correction, its view of the GPU type). What is
recalibrated: the admission thresholds per floor (`admission.thresholds`, pooled: at most its target share of
the bad adaptation pairs pass) and the gain rule's margin, from the chosen fit's cross-validated predictions,
which are held-out predictions of the adaptation pairs (choosing the penalties on the same predictions
makes them slightly optimistic). Two sets of thresholds: for pairs of jobs the adaptation pairs held, and, more
cautious, for a pair with a job they did not (calibrated on the same held-out predictions made without the job
corrections, and without the family ones: as such a pair is predicted). Without the second, pairs of new jobs
were admitted on the first set's trust in corrections they do not get (on Gavel's K80, a model adapted on
pairs of half the jobs let a third of the other half's bad pairs through in some draws). Pairs that did not fit train nothing
and calibrate nothing, as in training: whether a pair fits is the memory check's question.

Pure: numbers in, numbers out; `adapt_score` evaluates it as it will be used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from slurm_elastico.interference.admission import margin_of, margins, thresholds
from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.measurements import Colocation, samples
from slurm_elastico.interference.probe import pair_key
from slurm_elastico.interference.scorers import ByScorer, Derived, each_distinct, scorer_of

SCALE_PENALTIES = (0.0, 1.0, 4.0, 16.0, 64.0, math.inf)  # samples' worth of belief in the model's scale
CLASS_PENALTIES = (0.25, 1.0, 4.0, 16.0, 64.0, math.inf)  # samples' worth of belief in no correction, per class
CLASSES = ("family", "job")  # the kinds of class corrected, coarse to fine (`class_of`)
MIN_PAIRS = 4
"""Fewest pairs that ran together an adaptation accepts per GPU type: leave-one-pair-out then fits an offset and
a scale on at least 3 pairs (6 samples) and judges them on a 4th; below that the choice of penalties is noise."""
SEARCH_PASSES = 4  # passes of the coordinate search over the penalties (it stops at the first that changes none)
LOO_PAIRS = 50  # up to this many pairs, cross-validation leaves one pair out; beyond, FOLDS folds of pairs
FOLDS = 10
GAIN_QUANTILE = 0.9  # the gain rule's margin: this quantile of the held-out over-prediction of a pair's summed speed
_JITTER = 1e-9  # keeps the normal equations definite when a column is constant (a model that predicts one value)


def class_of(profile: SoloProfile, kind: str) -> str:
    """The class of `kind` (`CLASSES`) a job belongs to; "" for none.

    family: its model family ("" when not stated). job: its family, kind, precision and batch; a job without a
    family is told by its kind, precision, batch and solo speed (4 significant digits: the same measurement
    of it in every pair), and one without a measured speed has none."""
    if kind == "family":
        return profile.model_family
    batch = "" if math.isnan(profile.batch) else f"{profile.batch:g}"
    if profile.model_family:
        return f"{profile.model_family}|{profile.kind}|{profile.precision}|{batch}"
    if math.isnan(profile.throughput):
        return ""
    return f"|{profile.kind}|{profile.precision}|{batch}|{profile.throughput:.4g}"


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b, into a where b broadcasts to a's shape."""
    if np.broadcast_shapes(a.shape, np.shape(b)) == a.shape:
        a += b
        return a
    return a + b


@dataclass(frozen=True)
class TypeFit:
    """The adaptation of one GPU type: its parameters, what chose them, and the calibration they carry."""

    gpu_type: str
    offset: float  # c
    scale: float  # b
    own: dict[str, dict[str, float]]  # u: per kind of class (`CLASSES`), per class, as the job itself
    partner: dict[str, dict[str, float]]  # v: the same, as the partner
    scale_penalty: float  # λ_scale chosen (inf: scale held at 1)
    class_penalties: dict[str, float]  # λ chosen per kind of class (inf: no corrections of that kind)
    cv_mape: float  # cross-validated MAPE of normalized throughput of the chosen fit, in the adaptation pairs
    model_cv_mape: float  # the unadapted model's MAPE on the same pairs (for comparison)
    thresholds: np.ndarray = field(repr=False)  # admission threshold per floor (`admission.FLOORS`), known jobs
    thresholds_new: np.ndarray = field(repr=False)  # the same for a pair with a job the adaptation did not hold
    known_jobs: frozenset[str] = frozenset()  # the job classes (`class_of`) of the adaptation pairs
    gain_margin: float = 0.0  # the gain rule's margin (the larger of known and new jobs')
    mean_norm: float = 1.0  # 1 / mean slowdown of the adaptation samples (the trivial predictor on these pairs)
    n_pairs: int = 0  # adaptation pairs that ran together

    def corrections(self, profiles: Sequence[SoloProfile]) -> tuple[np.ndarray, np.ndarray]:
        """Per profile, its summed class corrections as the job itself (u) and as the partner (v)."""
        own_sum, partner_sum = np.zeros(len(profiles)), np.zeros(len(profiles))
        for kind in CLASSES:
            own, partner = self.own.get(kind, {}), self.partner.get(kind, {})
            if own or partner:
                classes = [class_of(p, kind) for p in profiles]
                own_sum += np.array([own.get(c, 0.0) for c in classes], dtype=float)
                partner_sum += np.array([partner.get(c, 0.0) for c in classes], dtype=float)
        return own_sum, partner_sum

    def slowdown(self, model_s: np.ndarray, own: np.ndarray, partner: np.ndarray) -> np.ndarray:
        """Ŝ >= 1 of each pair from the model's slowdown of it, the job's own correction and its partner's."""
        # In place where the shapes allow (the planner's table of every pair: a temporary costs as its arithmetic).
        log_s = np.maximum(np.asarray(model_s, dtype=float), 1.0)
        np.log(log_s, out=log_s)
        log_s *= self.scale
        log_s += self.offset
        log_s = _add(_add(log_s, own), partner)
        np.maximum(log_s, 0.0, out=log_s)
        return np.exp(log_s, out=log_s)

    def to_dict(self) -> dict:
        """What the adaptation chose, for reports; an infinite penalty (that part not fitted) is null in JSON."""
        return {"gpu_type": self.gpu_type, "offset": self.offset, "scale": self.scale, "own": self.own,
                "partner": self.partner, "scale_penalty": self.scale_penalty, "class_penalties": self.class_penalties,
                "cv_mape": self.cv_mape, "model_cv_mape": self.model_cv_mape, "gain_margin": self.gain_margin,
                "mean_norm": self.mean_norm, "n_pairs": self.n_pairs}


class AdaptedView(ByScorer):
    """The adapted model on one GPU type; implements `SlowdownModel` with per-pair admission margins, through a
    scorer derived from the model's (`scorers.Derived`): a table of every pair is array arithmetic on the model's."""

    def __init__(self, base_view, fit: TypeFit):
        self.base, self.fit = base_view, fit

    @property
    def gain_margin(self) -> float:
        return self.fit.gain_margin

    @property
    def training_mean_norm(self) -> float:
        return self.fit.mean_norm

    def scorer(self, profiles: Sequence[SoloProfile]) -> Derived:
        """Slowdowns and margins (`admission.margins`, from the pair's adapted worst normalized throughput, with the
        new jobs' thresholds where a job's class is not among the adaptation pairs') of pairs of `profiles`."""
        inner = scorer_of(self.base, profiles)
        own, partner = self.fit.corrections(inner.profiles)
        known = np.array([class_of(p, "job") in self.fit.known_jobs for p in inner.profiles], dtype=bool)

        def slow(base, ia, ib):
            return self.fit.slowdown(base.slowdown(ia, ib), own[ia], partner[ib])

        def margin(_, ia, ib, both):
            worst = 1.0 / np.maximum(*both())
            new = ~(known[ia] & known[ib])
            if new.all():  # the planner's usual case: its jobs are rarely the adaptation pairs'
                return margins(worst, self.fit.thresholds_new)
            out = margins(worst, self.fit.thresholds)
            if new.any():
                out[new] = margins(worst[new], self.fit.thresholds_new)
            return out

        t_known, t_new = self.fit.thresholds.tolist(), self.fit.thresholds_new.tolist()
        known_of = known.tolist()

        def one(_, i, j, s_ij, s_ji):  # `margin` of one pair, in Python floats (the same arithmetic; slowdowns >= 1)
            worst = math.nan if s_ij != s_ij or s_ji != s_ji else s_ij if s_ij > s_ji else s_ji
            return margin_of(1.0 / worst, t_known if known_of[i] and known_of[j] else t_new)

        def against(base, ia, partners):
            once, at = each_distinct(partners)
            return self.fit.slowdown(base.against(ia, partners), own[ia], self.fit.corrections(once)[1][at])

        return Derived(inner, slow, margin, against, one)


class Adapted:
    """A trained model with the adaptations of some GPU types; other types get the model's own view."""

    def __init__(self, base, fits: dict[str, TypeFit]):
        self.base, self.fits = base, dict(fits)

    def seen_gpu(self, gpu_type: str) -> bool:
        return gpu_type in self.fits or bool(getattr(self.base, "seen_gpu", lambda _: True)(gpu_type))

    def on_gpu(self, gpu_type: str):
        view = self.base.on_gpu(gpu_type) if hasattr(self.base, "on_gpu") else self.base
        fit = self.fits.get(gpu_type)
        return view if fit is None else AdaptedView(view, fit)

    def _only(self):
        """The view of the one adapted type (a question asked without a GPU type), else the model itself."""
        return self.on_gpu(next(iter(self.fits))) if len(self.fits) == 1 else self.base

    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        return self._only().predict(a, b)

    @property
    def training_mean_norm(self) -> float:
        return float(getattr(self._only(), "training_mean_norm", 1.0))


@dataclass
class _Design:
    """The adaptation's least-squares problem: columns [1, log S_model, then per kind of class (`CLASSES`) the
    one-hot of the job's class as itself and of the partner's as the partner]."""

    x: np.ndarray  # (n samples, columns)
    y: np.ndarray  # log S observed − log S_model: what the columns explain (the scale enters as b − 1)
    base: np.ndarray  # log S_model
    norm: np.ndarray  # observed normalized throughput (the figure the MAPE is of)
    pair: np.ndarray  # the pair of each sample (two samples a row, a before b; a pair measured twice: one pair)
    classes: dict[str, list[str]]  # per kind of class, its classes in column order
    blocks: dict[str, np.ndarray]  # per kind of class, its columns (own then partner)
    spread: float  # variance of log S_model: the scale penalty is λ_scale samples of it

    def columns(self, scale_penalty: float, class_penalties: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
        """(columns used, penalty of each) for the scale's and each kind of class's penalty (inf: not fitted)."""
        cols, pen = [0], [0.0]
        if math.isfinite(scale_penalty):
            cols.append(1)
            pen.append(scale_penalty * self.spread)
        for kind, lam in zip(CLASSES, class_penalties, strict=True):
            if math.isfinite(lam):
                cols += self.blocks[kind].tolist()
                pen += [lam] * len(self.blocks[kind])
        return np.array(cols, dtype=np.int64), np.array(pen, dtype=float)


def _design(model_view, pairs: Sequence[Colocation]) -> _Design:
    bad = [i for i, o in enumerate(pairs) if o.fits and not all(math.isfinite(x) and 0 < x <= 2
                                                                  for x in (o.norm_a, o.norm_b))]
    if bad:
        o = pairs[bad[0]]
        raise MeasurementError(f"{len(bad)} pair(s) that ran together with a normalized throughput that is not a "
                               f"number in (0, 2] (first: {o.a.model_family or o.a.kind} beside "
                               f"{o.b.model_family or o.b.kind}: {o.norm_a}, {o.norm_b}); allowed: measured speeds")
    selves, partners, norms, rows = samples(pairs)
    groups: dict[frozenset, int] = {}
    pair = [groups.setdefault(pair_key(pairs[i]), len(groups)) for i in rows]  # a pair measured twice is one
    s_model = np.asarray(model_view.predict(selves, partners), dtype=float) if selves else np.zeros(0)
    base = np.log(np.maximum(s_model, 1.0))
    norm = np.array(norms, dtype=float)
    z = np.log(np.maximum(1.0, 1.0 / norm))  # a measured speed-up counts as no slowdown, as in training
    n = len(selves)
    parts, classes, blocks, width = [np.ones(n), base], {}, {}, 2
    for kind in CLASSES:
        own = [class_of(p, kind) for p in selves]
        other = [class_of(p, kind) for p in partners]
        names = sorted((set(own) | set(other)) - {""})
        index = {c: i for i, c in enumerate(names)}
        k = len(names)
        block = np.zeros((n, 2 * k))
        for row, (c, d) in enumerate(zip(own, other, strict=True)):
            if c:
                block[row, index[c]] = 1.0
            if d:
                block[row, k + index[d]] = 1.0
        parts.append(block)
        classes[kind], blocks[kind] = names, np.arange(width, width + 2 * k)
        width += 2 * k
    x = np.column_stack([p.reshape(n, -1) for p in parts]) if n else np.zeros((0, width))
    spread = float(np.var(base)) if n else 0.0
    return _Design(x, z - base, base, norm, np.array(pair, dtype=np.int64), classes, blocks, spread)


def _solve(gram: np.ndarray, rhs: np.ndarray, pen: np.ndarray) -> np.ndarray:
    """Penalised least squares for one or a stack of normal equations (gram (..., d, d), rhs (..., d))."""
    d = gram.shape[-1]
    scale = 1.0 + float(np.max(np.trace(gram, axis1=-2, axis2=-1))) / max(d, 1)
    return np.linalg.solve(gram + np.diag(pen + _JITTER * scale), rhs[..., None])[..., 0]


def _predict_norm(base: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Normalized throughput from log S_model, the used columns `x` and their weights `w` (one set, or one per
    sample), S clamped at 1."""
    log_s = base + (x @ w if w.ndim == 1 else np.einsum("nd,nd->n", x, w))
    return np.exp(-np.maximum(log_s, 0.0))


def _fold_of(pair: np.ndarray) -> np.ndarray:
    """The cross-validation fold of each sample: its pair (leave-one-pair-out) up to `LOO_PAIRS` pairs, else one of
    `FOLDS` folds of pairs dealt in a fixed shuffled order (the same for every penalty)."""
    pairs, at = np.unique(pair, return_inverse=True)
    if len(pairs) <= LOO_PAIRS:
        return at
    deal = np.random.default_rng(0).permutation(len(pairs)) % FOLDS
    return deal[at]


@dataclass
class _Folds:
    """Each fold's share of the normal equations over every column, summed once: a penalty's cross-validation then
    takes its columns' rows and solves, for all folds in one batched call."""

    fold: np.ndarray  # the fold of each sample
    gram: np.ndarray  # XᵀX of all samples
    rhs: np.ndarray  # Xᵀy of all samples
    fold_gram: np.ndarray  # (folds, d, d): the same over each fold's samples
    fold_rhs: np.ndarray  # (folds, d)

    @classmethod
    def of(cls, design: _Design) -> _Folds:
        fold = _fold_of(design.pair)
        x, y = design.x, design.y
        k, d = int(fold.max()) + 1, x.shape[1]
        fold_gram, fold_rhs = np.zeros((k, d, d)), np.zeros((k, d))
        for f in range(k):
            rows = x[fold == f]
            fold_gram[f] = rows.T @ rows
            fold_rhs[f] = rows.T @ y[fold == f]
        return cls(fold, x.T @ x, x.T @ y, fold_gram, fold_rhs)

    def held_out(self, design: _Design, cols: np.ndarray, pen: np.ndarray, drop: Sequence[str] = ()) -> np.ndarray:
        """Cross-validated normalized throughput of every sample: fitted on the samples outside its fold; without
        the corrections of the kinds of class in `drop` (as a job of a class the fit never saw is predicted)."""
        sub = np.ix_(cols, cols)
        w = _solve(self.gram[sub][None] - self.fold_gram[:, cols][:, :, cols], self.rhs[cols][None]
                   - self.fold_rhs[:, cols], pen)
        if drop:
            w[:, np.isin(cols, np.concatenate([design.blocks[kind] for kind in drop]))] = 0.0
        return _predict_norm(design.base, design.x[:, cols], w[self.fold])


def _mape(pred: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - truth) / truth))


def fit_type(model_view, pairs: Sequence[Colocation], gpu_type: str) -> TypeFit:
    """The adaptation of `model_view` (the model's view of `gpu_type`) to `pairs` measured on that type."""
    design = _design(model_view, pairs)
    n_pairs = len(np.unique(design.pair))
    if n_pairs < MIN_PAIRS:
        raise MeasurementError(
            f"too few pairs to adapt on GPU type {gpu_type}: {n_pairs} ran together, adaptation needs at least "
            f"{MIN_PAIRS} (measure more pairs, or give a larger adaptation fraction)")
    folds = _Folds.of(design)
    tried: dict[tuple[float, ...], tuple[float, np.ndarray]] = {}

    def judge(point: tuple[float, ...]) -> float:
        if point not in tried:
            held = folds.held_out(design, *design.columns(point[0], point[1:]))
            tried[point] = (_mape(held, design.norm), held)
        return tried[point][0]

    grids = [SCALE_PENALTIES] + [CLASS_PENALTIES] * len(CLASSES)
    point = tuple(g[len(g) // 2] for g in grids)
    for _ in range(SEARCH_PASSES):
        before = point
        for i, grid in enumerate(grids):
            # The grids ascend: on a tie the later, more penalised value wins.
            errors = [judge(point[:i] + (v,) + point[i + 1:]) for v in grid]
            best = min(range(len(grid)), key=lambda j: (round(errors[j], 12), -j))
            point = point[:i] + (grid[best],) + point[i + 1:]
        if point == before:
            break
    lam_s, lams = point[0], point[1:]
    err, held = tried[point]
    cols, pen = design.columns(lam_s, lams)
    x = design.x[:, cols]
    w = np.zeros(design.x.shape[1])
    w[cols] = _solve(x.T @ x, x.T @ design.y, pen)
    own, partner = {}, {}
    for kind in CLASSES:
        names, block = design.classes[kind], design.blocks[kind]
        k = len(names)
        own[kind] = {c: float(w[block[i]]) for i, c in enumerate(names) if w[block[i]] != 0.0}
        partner[kind] = {c: float(w[block[k + i]]) for i, c in enumerate(names) if w[block[k + i]] != 0.0}
    true_pairs = design.norm.reshape(-1, 2)  # samples come a, b per pair

    def calibrated(pred: np.ndarray) -> tuple[np.ndarray, float]:
        pairs = pred.reshape(-1, 2)
        over = pairs.sum(axis=1) / true_pairs.sum(axis=1)
        return (thresholds([(pairs.min(axis=1), true_pairs.min(axis=1))]),
                max(0.0, float(np.quantile(over, GAIN_QUANTILE)) - 1.0))

    t_seen, gain = calibrated(held)
    # A pair with a job the adaptation pairs did not hold is predicted without that job's correction (and, for a new
    # family, without the family's): its thresholds come from held-out predictions made the same way, the more
    # cautious of the two, never below the seen pairs'.
    t_new, gain_new = t_seen, gain
    for drop in (CLASSES[1:], CLASSES):
        t, g = calibrated(folds.held_out(design, cols, pen, drop))
        t_new, gain_new = np.maximum(t_new, t), max(gain_new, g)
    return TypeFit(gpu_type, float(w[0]), 1.0 + float(w[1]), own, partner, lam_s, dict(zip(CLASSES, lams)), err,
                   _mape(np.exp(-design.base), design.norm), t_seen, t_new, frozenset(design.classes["job"]),
                   max(gain, gain_new), float(1.0 / np.mean(1.0 / design.norm)), n_pairs)


def adapt(model, observations: Sequence[Colocation]) -> Adapted:
    """`model` adapted, per GPU type of `observations`, to that type's measured pairs (`fit_type`)."""
    by_type: dict[str, list[Colocation]] = {}
    for o in observations:
        by_type.setdefault(o.gpu_type, []).append(o)
    if not by_type:
        raise MeasurementError("nothing to adapt on: no measured pairs given")
    fits = {}
    for gpu, pairs in sorted(by_type.items()):
        view = model.on_gpu(gpu) if hasattr(model, "on_gpu") else model
        fits[gpu] = fit_type(view, pairs, gpu)
    return Adapted(model, fits)
