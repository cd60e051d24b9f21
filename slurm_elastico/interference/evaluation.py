"""Honest evaluation of slowdown predictors: held-out splits, baselines, and admission decisions.

All error figures are on the normalized throughput (co-located / solo = 1/S),
the quantity observed and compared with the admission floor. Splits group by
pair, so the two directions of one pair never straddle train and test.
Hyper-parameters and the admission margin are chosen on inner folds of the
training part only (inner split of the same kind: leave-one-model-out inside
leave-one-model-out; with one GPU type left in training, leave-one-GPU-out
selects by leave-one-model-out, the nearest kind of shift the training data
can show). The test part is used once, for the figures.

`fit_model` also calibrates how cautious the model is outside its training
data (`predictor.Coverage`), again on training folds only: the margin for
unseen families on leave-one-model-out folds, and for unseen GPU types the
family-free transfer config, its shrinkage toward the training mean and its
margin on leave-one-GPU-out folds (leave-one-model-out with one GPU type).
The false-admission target is met on held-out *groups*, so the margins
reflect extrapolation error, not in-distribution error. A test pair is
judged by the view its GPU type gets (`MlpPredictor.on_gpu`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.measurements import Colocation, samples
from slurm_elastico.interference.predictor import MlpPredictor, TrainConfig, coverage_of, train
from slurm_elastico.interference.splits import Fold, split

METHODS = ("model", "no-interference", "mean-slowdown", "contention")
GRID = (
    # Widths <= 32 keep one 10,000-pair planner call within a few milliseconds on one core.
    TrainConfig(hidden=32, weight_decay=1e-4, epochs=500, use_family=True),
    TrainConfig(hidden=16, weight_decay=1e-3, epochs=400, use_family=True),
    TrainConfig(hidden=16, weight_decay=1e-2, epochs=300, use_family=False),
    TrainConfig(hidden=8, weight_decay=1e-2, epochs=300, use_family=False),
)
MARGINS = tuple(i / 100 for i in range(0, 41))  # safety margins on the floor the calibration may pick
SHRINKS = (0.0, 0.25, 0.5, 0.75, 1.0)  # weight kept on the model on an unseen GPU type (rest: training mean)
FALSE_ADMISSION_TARGET = 0.05

def _inner_kind(outer: str, observations: Sequence[Colocation]) -> str:
    families = {p.model_family for o in observations for p in (o.a, o.b) if p.model_family}
    if outer in ("leave-one-model-out", "leave-one-gpu-out") and len(families) >= 3:
        return "leave-one-model-out"
    return "kfold"


@dataclass
class Predictions:
    """Per-sample truth and predictions of every method (normalized throughput), plus per-pair decisions."""

    truth: list[float] = field(default_factory=list)
    pred: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METHODS})
    # Pairs: (truly bad, admitted by method) per method; a pair that did not fit is bad.
    pairs: dict[str, list[tuple[bool, bool]]] = field(default_factory=lambda: {m: [] for m in METHODS})


def _pair_norms(model_predict: Callable, obs: Sequence[Colocation]) -> np.ndarray:
    """(n, 2) predicted normalized throughput of a and of b for every pair (fitting or not)."""
    if not obs:
        return np.zeros((0, 2))
    a = [o.a for o in obs]
    b = [o.b for o in obs]
    return np.stack([1.0 / model_predict(a, b), 1.0 / model_predict(b, a)], axis=1)


def _truth(obs: Sequence[Colocation]) -> np.ndarray:
    return np.array([[o.norm_a, o.norm_b] if o.fits else [0.0, 0.0] for o in obs])


def calibrate_margin(pred_pairs: np.ndarray, true_pairs: np.ndarray, floor: float,
                     target: float = FALSE_ADMISSION_TARGET) -> float:
    """Smallest margin m such that admitting min(pred) >= floor·(1+m) admits <= target of the bad pairs."""
    bad = true_pairs.min(axis=1) < floor
    if not bad.any():
        return 0.0
    worst = pred_pairs.min(axis=1)
    for m in MARGINS:
        if np.mean(worst[bad] >= floor * (1 + m)) <= target:
            return m
    return MARGINS[-1]


def _mape(truth: np.ndarray, pred: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - truth) / truth))


CrossPred = tuple[np.ndarray, np.ndarray, np.ndarray]  # (predicted pair norms, true pair norms, fold prior norm)


def _cross_predict(observations: Sequence[Colocation], folds: Sequence[Fold], cfg: TrainConfig,
                   seed: int) -> CrossPred:
    """Held-out pair predictions of `cfg` over `folds`, with each fold's training mean normalized throughput."""
    preds, truths, priors = [], [], []
    for _, tr, te in folds:
        train_obs = [observations[i] for i in tr]
        test_obs = [observations[i] for i in te]
        if not any(o.fits for o in train_obs) or not test_obs:
            continue
        model = train(train_obs, cfg, seed=seed)
        preds.append(_pair_norms(model.predict, test_obs))
        truths.append(_truth(test_obs))
        priors.append(np.full(len(test_obs), model.coverage.prior_norm))
    if not preds:
        raise MeasurementError("model selection left no inner fold with both training and test pairs")
    return np.concatenate(preds), np.concatenate(truths), np.concatenate(priors)


def _cv_mape(cp: CrossPred) -> float:
    pred, truth, _ = cp
    fit = truth.min(axis=1) > 0
    return _mape(truth[fit].ravel(), pred[fit].ravel())


def _best(observations: Sequence[Colocation], kind: str, seed: int, grid: Sequence[TrainConfig],
          cache: dict) -> tuple[TrainConfig, CrossPred, dict[int, float]]:
    """The config of `grid` with the lowest inner-fold MAPE on `kind` folds; `cache` reuses identical runs."""
    folds = split(observations, kind, k=4, seed=seed + 1)
    scores: dict[int, float] = {}
    best: tuple[float, TrainConfig, CrossPred] | None = None
    for g, cfg in enumerate(grid):
        if (kind, cfg) not in cache:
            cache[(kind, cfg)] = _cross_predict(observations, folds, cfg, seed)
        scores[g] = _cv_mape(cache[(kind, cfg)])
        if best is None or scores[g] < best[0]:
            best = (scores[g], cfg, cache[(kind, cfg)])
    assert best is not None
    return best[1], best[2], scores


def select_config(observations: Sequence[Colocation], inner: str, floor: float, seed: int = 0,
                  grid: Sequence[TrainConfig] | None = None) -> tuple[TrainConfig, float, dict[int, float]]:
    """Best config by inner-fold MAPE on `observations` (training data only), its calibrated margin, all scores."""
    cfg, (pp, tt, _), scores = _best(observations, inner, seed, GRID if grid is None else grid, {})
    return cfg, calibrate_margin(pp, tt, floor), scores


def _shrink(cp: CrossPred, w: float) -> np.ndarray:
    pred, _, prior = cp
    return w * pred + (1.0 - w) * prior[:, None]


def fit_model(observations: Sequence[Colocation], select_by: str, floor: float, seed: int = 0,
              grid: Sequence[TrainConfig] | None = None) -> tuple[MlpPredictor, dict[int, float]]:
    """Chooses, calibrates and trains a predictor on `observations` alone; also returns the inner MAPE per config.

    Main nets: best config on `select_by` folds, margin at the false-admission
    target on those folds. Unseen family: margin on leave-one-model-out folds
    (>= the main margin). Unseen GPU type: best family-free config on
    leave-one-GPU-out folds (leave-one-model-out with one GPU type, kfold with
    fewer than 3 families), the shrinkage weight with the lowest MAPE there,
    and the margin of the shrunk predictions there (>= the main margin).
    """
    grid = GRID if grid is None else grid
    cache: dict = {}
    cfg, cp, scores = _best(observations, select_by, seed, grid, cache)
    margin = calibrate_margin(cp[0], cp[1], floor)
    families = {p.model_family for o in observations for p in (o.a, o.b) if p.model_family}
    group = "leave-one-model-out" if len(families) >= 3 else "kfold"
    if select_by == group:
        family_margin = margin
    else:
        fam_cp = cache.get((group, cfg)) or _cross_predict(observations, split(observations, group, k=4, seed=seed + 1),
                                                           cfg, seed)
        family_margin = max(margin, calibrate_margin(fam_cp[0], fam_cp[1], floor))
    gpu_kind = "leave-one-gpu-out" if len({o.gpu_type for o in observations}) >= 2 else group
    free = [c for c in grid if not c.use_family] or list(grid)
    t_cfg, t_cp, _ = _best(observations, gpu_kind, seed, free, cache)
    fit = t_cp[1].min(axis=1) > 0
    shrink = min(SHRINKS, key=lambda w: (_mape(t_cp[1][fit].ravel(), _shrink(t_cp, w)[fit].ravel()), -w))
    gpu_margin = max(margin, calibrate_margin(_shrink(t_cp, shrink), t_cp[1], floor))
    coverage = coverage_of(observations, family_margin, gpu_margin, shrink)
    transfer = None if t_cfg == cfg else train(observations, t_cfg, seed=seed)
    model = train(observations, cfg, seed=seed, admission_margin=margin, coverage=coverage, transfer=transfer)
    return model, scores


@dataclass
class FoldResult:
    name: str
    config: TrainConfig  # the config whose nets answered (transfer nets on an unseen GPU type)
    margin: float  # the margin that applied to seen-family pairs of this fold's test part
    n_test_samples: int
    mape: dict[str, float]
    caution: dict[str, float] = field(default_factory=dict)  # family_margin, gpu_margin, shrink
    unseen_gpu: bool = False  # the test GPU type was not in training: the cautious view answered


@dataclass
class Report:
    split: str
    floor: float
    folds: list[FoldResult]
    metrics: dict[str, dict[str, float]]  # method -> {mape, median_ape, r2, false_admission, false_refusal, ...}
    n_pairs: int
    n_samples: int
    n_bad_pairs: int

    def to_dict(self) -> dict:
        return {"split": self.split, "floor": self.floor, "target": "normalized throughput (co-located / solo)",
                "n_pairs": self.n_pairs, "n_samples": self.n_samples, "n_bad_pairs": self.n_bad_pairs,
                "metrics": self.metrics,
                "folds": [{"name": f.name, "config": vars(f.config), "margin": f.margin, "caution": f.caution,
                           "unseen_gpu": f.unseen_gpu, "n_test_samples": f.n_test_samples, "mape": f.mape}
                          for f in self.folds]}


def _metrics(truth: np.ndarray, pred: np.ndarray, decisions: list[tuple[bool, bool]]) -> dict[str, float]:
    ape = np.abs(pred - truth) / truth
    ss_res = float(np.sum((truth - pred) ** 2))
    ss_tot = float(np.sum((truth - truth.mean()) ** 2))
    bad = [adm for is_bad, adm in decisions if is_bad]
    good = [adm for is_bad, adm in decisions if not is_bad]
    return {"mape": float(ape.mean()), "median_ape": float(np.median(ape)),
            "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan,
            "false_admission": float(np.mean(bad)) if bad else math.nan,
            "false_refusal": float(1 - np.mean(good)) if good else math.nan,
            "bad_pairs": len(bad), "good_pairs": len(good)}


def evaluate(observations: Sequence[Colocation], kind: str, floor: float = 0.6, k: int = 5, seed: int = 0,
             grid: Sequence[TrainConfig] | None = None) -> Report:
    """Runs split `kind` with nested model selection; pooled metrics over every held-out sample."""
    folds = split(observations, kind, k=k, seed=seed)
    acc = Predictions()
    results = []
    contention = ContentionModel()
    for name, tr, te in folds:
        train_obs = [observations[i] for i in tr]
        test_obs = [observations[i] for i in te]
        if not any(o.fits for o in train_obs) or not test_obs:
            continue
        model, _ = fit_model(train_obs, _inner_kind(kind, train_obs), floor, seed, grid)
        _, _, train_norms, _ = samples(train_obs)
        mean_s = float(np.mean([1.0 / v for v in train_norms]))
        truth = _truth(test_obs)
        fit = np.array([o.fits for o in test_obs], dtype=bool)
        model_pred, model_margin = np.zeros_like(truth), np.zeros(len(test_obs))
        for gpu in sorted({o.gpu_type for o in test_obs}):
            rows = [i for i, o in enumerate(test_obs) if o.gpu_type == gpu]
            view = model.on_gpu(gpu)
            group = [test_obs[i] for i in rows]
            model_pred[rows] = _pair_norms(view.predict, group)
            model_margin[rows] = view.admission_margins([o.a for o in group], [o.b for o in group])
        preds = {
            "model": (model_pred, model_margin),
            "no-interference": (np.ones_like(truth), 0.0),
            "mean-slowdown": (np.full_like(truth, 1.0 / mean_s), 0.0),
            "contention": (_pair_norms(contention.predict, test_obs), 0.0),
        }
        bad = truth.min(axis=1) < floor
        fold_mape = {}
        for method, (pp, m) in preds.items():
            acc.pred[method].extend(pp[fit].ravel().tolist())
            admitted = pp.min(axis=1) >= floor * (1 + m)
            acc.pairs[method].extend(zip(bad.tolist(), admitted.tolist(), strict=True))
            fold_mape[method] = _mape(truth[fit].ravel(), pp[fit].ravel())
        acc.truth.extend(truth[fit].ravel().tolist())
        cov = model.coverage
        caution = {"family_margin": cov.family_margin, "gpu_margin": cov.gpu_margin, "shrink": cov.shrink}
        unseen = not all(model.seen_gpu(o.gpu_type) for o in test_obs)
        # Report what answered: on an unseen GPU type, the transfer nets and the GPU margin.
        answered = model.transfer if unseen and model.transfer is not None else model
        margin = max(model.admission_margin, cov.gpu_margin) if unseen else model.admission_margin
        results.append(FoldResult(name, answered.config, margin, int(fit.sum() * 2), fold_mape, caution, unseen))
    if not results:
        raise MeasurementError(f"split {kind!r} left no fold with both training pairs and test pairs")
    truth = np.array(acc.truth)
    metrics = {m: _metrics(truth, np.array(acc.pred[m]), acc.pairs[m]) for m in METHODS}
    n_bad = sum(b for b, _ in acc.pairs["model"])
    return Report(kind, floor, results, metrics, len(acc.pairs["model"]), len(truth), n_bad)


def format_report(report: Report) -> str:
    """A readable table: pooled metrics per method, then per-fold MAPE and the chosen config."""
    lines = [f"split: {report.split}   target: normalized throughput (co-located / solo)   floor: {report.floor}",
             f"held-out: {report.n_pairs} pair evaluations ({report.n_bad_pairs} bad: below the floor or did not fit), "
             f"{report.n_samples} job samples with a measured slowdown", "",
             f"{'method':<16}{'MAPE':>8}{'medAPE':>8}{'R2':>8}{'false adm.':>12}{'false ref.':>12}"]
    for m in METHODS:
        x = report.metrics[m]
        lines.append(f"{m:<16}{x['mape']:>8.1%}{x['median_ape']:>8.1%}{x['r2']:>8.3f}"
                     f"{x['false_admission']:>12.1%}{x['false_refusal']:>12.1%}")
    lines += ["", f"{'fold':<20}{'model':>8}{'mean':>8}{'contention':>12}  chosen config (inner folds), margin "
              "(unseen family / unseen GPU, shrink)"]
    for f in report.folds:
        c, k = f.config, f.caution
        lines.append(f"{f.name:<20}{f.mape['model']:>8.1%}{f.mape['mean-slowdown']:>8.1%}{f.mape['contention']:>12.1%}"
                     f"  hidden={c.hidden} wd={c.weight_decay:g} family={'yes' if c.use_family else 'no'}, "
                     f"{f.margin:.2f} ({k.get('family_margin', f.margin):.2f} / {k.get('gpu_margin', f.margin):.2f}, "
                     f"{k.get('shrink', 1.0):g}){'  [unseen GPU: cautious view]' if f.unseen_gpu else ''}")
    return "\n".join(lines)


def format_fit(model: MlpPredictor, scores: dict[int, float], out: str) -> str:
    """What `elastico iac train` says about a model `fit_model` chose and trained, saved at `out`."""
    cfg, cov = model.config, model.coverage
    return "\n".join([
        f"inner-fold MAPE per config: {', '.join(f'{s:.1%}' for s in scores.values())}",
        f"chosen: hidden={cfg.hidden} weight_decay={cfg.weight_decay:g} family={cfg.use_family}; "
        f"admission margin {model.admission_margin:.2f}; saved {out}",
        f"trained on GPU types {', '.join(cov.gpu_types)}; {len(cov.families)} families. Outside them: "
        f"margin {cov.family_margin:.2f} for an unseen family; on an unseen GPU type margin "
        f"{cov.gpu_margin:.2f}, predictions shrunk toward mean {cov.prior_norm:.2f} (weight {1 - cov.shrink:g})",
    ])
