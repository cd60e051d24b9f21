"""Scoring a trained slowdown model on a separate file of observations, beside trivial predictors.

`score(model, observations, floor)` is what `elastico iac evaluate --model
FILE --data FILE` prints: the model is used as the cluster would use it (its
`on_gpu(type)` view per GPU type, its own admission margins), and beside it
predictors that need no model:

- `training-mean`: the normalized throughput the model's training data had
  on average (`model.training_mean_norm`), for every pair;
- `test-median`: the median normalized throughput of the file being scored
  (it peeks at the answers: a bar, not a usable predictor);
- `no-slowdown`: 1.0 for every pair;
- `contention`: the untrained `ContentionModel`, fed whatever solo counters the file has.

Errors are given both on normalized throughput (co-located / solo) and on
slowdown (solo / co-located): a MAPE on one can differ a lot from a MAPE on
the other. Admission: a pair is bad when either job falls below `floor` (or
the pair did not fit); `false_admission` is the share of bad pairs admitted,
`good_admitted` the share of good pairs admitted, `bad_of_admitted` the share
of admitted pairs that were bad (where good pairs are rare, a low
`false_admission` can still mean that most admitted pairs are bad). Trivial predictors admit
with no margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from slurm_elastico.interference.base import ContentionModel, SlowdownModel
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.measurements import Colocation

METHODS = ("model", "training-mean", "test-median", "no-slowdown", "contention")
TRIVIAL = ("training-mean", "test-median", "no-slowdown")


@dataclass
class Score:
    floor: float
    n_pairs: int  # pairs scored (fitting or not)
    n_samples: int  # job samples with a measured normalized throughput (two per fitting pair)
    n_bad_pairs: int
    n_speedups: int  # samples whose normalized throughput is > 1 (faster than solo)
    gpu_types: list[str]
    unseen_gpu_types: list[str]  # GPU types the model was not trained on (its cautious view answered)
    metrics: dict[str, dict[str, float]]  # method -> mape_norm, mape_slowdown, false_admission, good_admitted

    def best_trivial(self, metric: str = "mape_norm") -> tuple[str, float]:
        """(name, value) of the trivial predictor with the lowest `metric`."""
        name = min(TRIVIAL, key=lambda m: self.metrics[m][metric])
        return name, self.metrics[name][metric]

    def to_dict(self) -> dict:
        return {"floor": self.floor, "n_pairs": self.n_pairs, "n_samples": self.n_samples,
                "n_bad_pairs": self.n_bad_pairs, "n_speedups": self.n_speedups, "gpu_types": self.gpu_types,
                "unseen_gpu_types": self.unseen_gpu_types,
                "target": "normalized throughput (co-located / solo) and slowdown (solo / co-located)",
                "metrics": self.metrics}


def pair_norms(model: SlowdownModel, obs: Sequence[Colocation]) -> np.ndarray:
    """(n, 2) predicted normalized throughput of a and of b next to each other, for every pair."""
    if not obs:
        return np.zeros((0, 2))
    a, b = [o.a for o in obs], [o.b for o in obs]
    return np.stack([1.0 / np.asarray(model.predict(a, b)), 1.0 / np.asarray(model.predict(b, a))], axis=1)


def true_norms(obs: Sequence[Colocation]) -> np.ndarray:
    """(n, 2) observed normalized throughputs; 0 for a pair that did not fit (it is bad, it has no slowdown)."""
    return np.array([[o.norm_a, o.norm_b] if o.fits else [0.0, 0.0] for o in obs], dtype=float).reshape(-1, 2)


def view_for(model, gpu_type: str):
    """The model as it answers on `gpu_type` (`on_gpu` where it has it)."""
    return model.on_gpu(gpu_type) if hasattr(model, "on_gpu") else model


def model_norms_and_margins(model, obs: Sequence[Colocation]) -> tuple[np.ndarray, np.ndarray]:
    """Predicted pair norms and admission margin per pair, each GPU type through the model's view of it."""
    pred, margin = np.zeros((len(obs), 2)), np.zeros(len(obs))
    for gpu in sorted({o.gpu_type for o in obs}):
        rows = [i for i, o in enumerate(obs) if o.gpu_type == gpu]
        group = [obs[i] for i in rows]
        view = view_for(model, gpu)
        pred[rows] = pair_norms(view, group)
        if hasattr(view, "admission_margins"):
            margin[rows] = view.admission_margins([o.a for o in group], [o.b for o in group])
        else:
            margin[rows] = float(getattr(view, "admission_margin", 0.0))
    return pred, margin


def metrics(truth: np.ndarray, pred: np.ndarray, margin: np.ndarray | float, floor: float) -> dict[str, float]:
    """Errors over the fitting pairs' samples and admission over all pairs, for (n, 2) truth and predictions."""
    fit = truth.min(axis=1) > 0
    t, p = truth[fit].ravel(), pred[fit].ravel()
    bad = truth.min(axis=1) < floor
    admitted = pred.min(axis=1) >= floor * (1.0 + np.asarray(margin, dtype=float))
    return {
        "mape_norm": float(np.mean(np.abs(p - t) / t)) if t.size else math.nan,
        "mape_slowdown": float(np.mean(np.abs(1.0 / p - 1.0 / t) * t)) if t.size else math.nan,
        "false_admission": float(np.mean(admitted[bad])) if bad.any() else math.nan,
        "good_admitted": float(np.mean(admitted[~bad])) if (~bad).any() else math.nan,
        "bad_of_admitted": float(np.mean(bad[admitted])) if admitted.any() else math.nan,
    }


def predictions(model, obs: Sequence[Colocation]) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """(true pair norms, {method: (predicted pair norms, margin per pair)}) for `METHODS` on `obs`."""
    truth = true_norms(obs)
    fit = truth.min(axis=1) > 0
    if not fit.any():
        raise MeasurementError("nothing to score: the data has no pair that ran together (every row has fits = 0)")
    zero = np.zeros(len(obs))
    median = float(np.median(truth[fit].ravel()))
    return truth, {
        "model": model_norms_and_margins(model, obs),
        "training-mean": (np.full_like(truth, float(model.training_mean_norm)), zero),
        "test-median": (np.full_like(truth, median), zero),
        "no-slowdown": (np.ones_like(truth), zero),
        "contention": (pair_norms(ContentionModel(), obs), zero),
    }


def score(model, observations: Sequence[Colocation], floor: float = 0.6) -> Score:
    """Scores `model` (a trained predictor) on `observations` it was not trained on, beside the trivial predictors."""
    if not 0 < floor < 1:
        raise MeasurementError(f"floor {floor:g} is outside (0, 1): it is the least normalized throughput admitted")
    obs = list(observations)
    truth, table = predictions(model, obs)
    fit = truth.min(axis=1) > 0
    gpus = sorted({o.gpu_type for o in obs})
    unseen = [g for g in gpus if hasattr(model, "seen_gpu") and not model.seen_gpu(g)]
    return Score(floor, len(obs), int(fit.sum()) * 2, int((truth.min(axis=1) < floor).sum()),
                 int((truth[fit] > 1.0).sum()), gpus, unseen,
                 {m: metrics(truth, p, mg, floor) for m, (p, mg) in table.items()})


Table = dict[str, tuple[np.ndarray, np.ndarray]]  # method -> (predicted pair norms, margin per pair)


def cross_score(observations: Sequence[Colocation], folds: Sequence[tuple[str, list[int], list[int]]],
                fit: Callable[[list[Colocation]], object], floor: float = 0.6,
                extra: Callable[[object, list[Colocation], list[Colocation]], Table] | None = None) -> Score:
    """Trains `fit(training part)` on each fold and scores it on the held-out part; metrics pooled over folds.

    `extra(model, training part, test part)` may add methods to the table (benchmarks compare other models).
    """
    obs = list(observations)
    truths: list[np.ndarray] = []
    pooled: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    unseen: set[str] = set()
    for _, tr, te in folds:
        train_obs, test_obs = [obs[i] for i in tr], [obs[i] for i in te]
        if not any(o.fits for o in train_obs) or not any(o.fits for o in test_obs):
            continue
        model = fit(train_obs)
        truth, table = predictions(model, test_obs)
        if extra is not None:
            table.update(extra(model, train_obs, test_obs))
        unseen |= {o.gpu_type for o in test_obs if hasattr(model, "seen_gpu") and not model.seen_gpu(o.gpu_type)}
        truths.append(truth)
        for m, entry in table.items():
            pooled.setdefault(m, []).append(entry)
    if not truths:
        raise MeasurementError("no fold had pairs that ran together in both its training and its test part")
    truth = np.concatenate(truths)
    fit_ = truth.min(axis=1) > 0
    table = {m: metrics(truth, np.concatenate([p for p, _ in v]), np.concatenate([np.broadcast_to(g, len(p))
                                                                                   for p, g in v]), floor)
             for m, v in pooled.items()}
    return Score(floor, len(truth), int(fit_.sum()) * 2, int((truth.min(axis=1) < floor).sum()),
                 int((truth[fit_] > 1.0).sum()), sorted({o.gpu_type for o in obs}), sorted(unseen), table)


def format_score(s: Score) -> str:
    """A readable table of `score`'s figures."""
    lines = [f"scored (held out): {s.n_pairs} pairs on {', '.join(s.gpu_types)} ({s.n_bad_pairs} bad: below floor {s.floor} "
             f"or did not fit), {s.n_samples} job samples, {s.n_speedups} faster than solo",
             f"GPU types scored where the model had not trained on them: {', '.join(s.unseen_gpu_types) or 'none'}",
             "",
             f"{'method':<15}{'MAPE norm':>11}{'MAPE slowdown':>15}{'false adm.':>12}{'good admitted':>15}"
             f"{'bad of adm.':>13}"]
    for m in s.metrics:
        x = s.metrics[m]
        lines.append(f"{m:<15}{x['mape_norm']:>11.1%}{x['mape_slowdown']:>15.1%}{x['false_admission']:>12.1%}"
                     f"{x['good_admitted']:>15.1%}{x['bad_of_admitted']:>13.1%}")
    name, value = s.best_trivial()
    ratio = s.metrics["model"]["mape_norm"] / value if value > 0 else math.inf
    lines.append(f"\nmodel / best trivial ({name}) MAPE on normalized throughput: {ratio:.2f}")
    return "\n".join(lines)
