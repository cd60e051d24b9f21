"""Benchmark: held-out accuracy and transfer of the slowdown predictors, and their speed for the planner.

Run from the repository root: `python benchmarks/interference.py [--quick]`.

Accuracy: on the bundled Gavel pairs, the prior-corrected predictor
(`interference.transfer.fit`, what `elastico iac train` fits) and the MLP
(`interference.predictor`, a fixed config) are trained on one part and scored
on a held-out part: leave-one-GPU-out (K80 -> P100, P100 -> K80: transfer to
a GPU type never seen), leave-one-model-out (a model family never seen) and
4-fold (in distribution). Beside them: the untrained contention model, the
contention prior with its fitted defaults alone, and the trivial predictors
(training mean, the test part's median, no slowdown). Figures are pooled over
folds: MAPE on normalized throughput and on slowdown, false admissions (bad
pairs admitted), good pairs admitted and the share of admitted pairs that
were bad, at floor 0.6, each with the model's own margins. The MLP is what `elastico iac train --predictor mlp` fits
(hyper-parameters and margins chosen on inner folds); `--quick` gives it a
fixed config instead and runs leave-one-GPU-out and two leave-one-model-out
folds only. Nothing is tuned to the test parts. For the prior-corrected model
each split also prints the trade-off curve (the same predictions, thresholds
calibrated on the training folds to false-admission targets `TARGETS`) and,
per fold, how well its predictions rank good above bad pairs (AUC) with the
good pairs that the best threshold admitting <= 10 % of the fold's bad pairs
would admit, chosen on the answers: a bound no calibration can beat.

Few-shot adaptation (`interference.adapt`): the prior-corrected model trained
on one GPU type's pairs, adapted on a random fraction F of the other type's
pairs and scored on the rest (`elastico iac evaluate --adapt-fraction F
--seeds N`: 5 draws quick, 20 in full), beside the trivial predictor that
sees the same pairs; and the harder case of a site whose next pairs bring
jobs the adaptation never saw: adapted on up to 35 pairs among a random half
of the jobs, scored on the pairs of the other half (10 draws).

Speed: trains a predictor on the bundled Gavel data (a fixed config, seconds), builds
N distinct job profiles and all N×N = 10,000 pairs (N = 100), and times one
batched `predict(a, b)` call for each model (median of repeats), plus
`predict_matrix`. Target: <= 5 ms for 10,000 pairs. Then a planner-like epoch
through `PairCache`: 2,000 packing lookups of a few pairs each (the MLP fills
all pairs in one call; the contention model is asked per lookup's misses).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_elastico import jsonout  # noqa: E402
from slurm_elastico.interference.adapt import adapt, class_of  # noqa: E402
from slurm_elastico.interference.adapt_score import score_adaptation  # noqa: E402
from slurm_elastico.interference.base import ContentionModel, SoloProfile  # noqa: E402
from slurm_elastico.interference.evaluation import fit_model  # noqa: E402
from slurm_elastico.interference.gavel import import_gavel  # noqa: E402
from slurm_elastico.interference.predictor import TrainConfig, train  # noqa: E402
from slurm_elastico.interference.scoring import (  # noqa: E402
    TRIVIAL, cross_score, metrics, model_norms_and_margins, pair_norms, true_norms,
)
from slurm_elastico.interference.splits import split  # noqa: E402
from slurm_elastico.interference.transfer.calibration import admission_tables  # noqa: E402
from slurm_elastico.interference.transfer.fit import fit_transfer  # noqa: E402
from slurm_elastico.planner.slowdown import PairCache  # noqa: E402

GAVEL = ROOT / "tests" / "data" / "gavel"
MLP = TrainConfig(hidden=32, weight_decay=1e-4, epochs=500, use_family=True)
FLOOR = 0.6
METHODS = ("prior-corrected", "mlp", "contention", "fitted prior", *TRIVIAL)
TARGETS = (0.05, 0.10, 0.15, 0.20)  # false-admission targets of the calibration: the trade-off curve


def auc(pred: np.ndarray, good: np.ndarray) -> float:
    """Probability that a good pair is predicted above a bad one (ties half): how well predictions rank pairs."""
    g, b = pred[good], pred[~good]
    if not len(g) or not len(b):
        return float("nan")
    return float(np.mean(g[:, None] > b[None, :]) + 0.5 * np.mean(g[:, None] == b[None, :]))


def oracle(pred: np.ndarray, good: np.ndarray, false_rate: float = 0.10) -> float:
    """Good pairs admitted by the best single threshold on `pred` that admits at most `false_rate` of the bad ones,
    chosen on the answers: a bound for any calibration of these predictions, not a result."""
    if not good.any() or good.all():
        return float("nan")
    bad = np.sort(pred[~good])[::-1]
    k = int(np.floor(false_rate * len(bad)))  # admit the k highest bad pairs at most
    bar = bad[k] if k < len(bad) else -np.inf
    return float(np.mean(pred[good] > bar))


def heldout(obs, kind: str, quick: bool) -> tuple[dict, dict, list[dict], list[str], float]:
    """Pooled held-out metrics per method over the folds of `kind`: (metrics, the prior-corrected model's metrics
    per calibration target, its ranking per fold, the names of the folds run, seconds)."""
    folds = split(obs, kind, k=4, seed=0)
    if quick and kind == "leave-one-model-out":
        folds = folds[:2]

    per_fold: list[dict] = []

    def others(model, train_obs, test_obs):
        mlp = train(train_obs, MLP, seed=0) if quick else fit_model(train_obs, "leave-one-model-out", FLOOR)[0]
        out = {"mlp": model_norms_and_margins(mlp, test_obs),
               "fitted prior": (pair_norms(model.prior, test_obs), np.zeros(len(test_obs)))}
        norms, margin = model_norms_and_margins(model, test_obs)
        pred = norms.min(axis=1)
        good = true_norms(test_obs).min(axis=1) >= FLOOR
        admitted = pred >= FLOOR * (1.0 + margin)
        per_fold.append({"good": int(good.sum()), "pairs": len(good),
                         "good_admitted": float(np.mean(admitted[good])) if good.any() else float("nan"),
                         "false_admission": float(np.mean(admitted[~good])) if (~good).any() else float("nan"),
                         "auc": auc(pred, good), "oracle": oracle(pred, good)})
        calibrated = model.admission
        for target in TARGETS:  # the same predictions, thresholds calibrated to another false-admission target
            model.admission = admission_tables(model.calibration, target)
            out[f"target {target:.2f}"] = model_norms_and_margins(model, test_obs)
        model.admission = calibrated
        return out

    t0 = time.perf_counter()
    score = cross_score(obs, folds, fit_transfer, FLOOR, others)
    table = dict(score.metrics)
    table["prior-corrected"] = table.pop("model")
    curve = {t: table[f"target {t:.2f}"] for t in TARGETS}
    ran = [name for name, tr, te in folds  # the folds cross_score runs: pairs that ran together on both sides
           if any(obs[i].fits for i in tr) and any(obs[i].fits for i in te)]
    return {m: table[m] for m in METHODS}, curve, per_fold, ran, time.perf_counter() - t0


def accuracy(obs, quick: bool) -> dict:
    kinds = ["leave-one-gpu-out", "leave-one-model-out"] + ([] if quick else ["kfold"])
    result = {}
    for kind in kinds:
        table, curve, per_fold, names, secs = heldout(obs, kind, quick)
        n_folds = len(names)
        best = min(TRIVIAL, key=lambda m: table[m]["mape_norm"])
        print(f"\n{kind}: {n_folds} folds, {secs:.0f} s; pooled held-out pairs; floor {FLOOR}")
        print(f"{'method':<17}{'MAPE norm':>10}{'MAPE slowdown':>15}{'false adm.':>12}{'good admitted':>15}"
              f"{'bad of adm.':>13}{'/ best trivial':>16}")
        for m in METHODS:
            x = table[m]
            print(f"{m:<17}{x['mape_norm']:>10.1%}{x['mape_slowdown']:>15.1%}{x['false_admission']:>12.1%}"
                  f"{x['good_admitted']:>15.1%}{x['bad_of_admitted']:>13.1%}"
                  f"{x['mape_norm'] / table[best]['mape_norm']:>16.2f}")
        print("prior-corrected, thresholds calibrated (on training folds) to another false-admission target:")
        print(f"{'target':>8}{'false adm.':>12}{'good admitted':>15}{'bad of adm.':>13}")
        for t, x in curve.items():
            print(f"{t:>8.2f}{x['false_admission']:>12.1%}{x['good_admitted']:>15.1%}{x['bad_of_admitted']:>13.1%}")
        print("per fold: good admitted and false admissions by the rule (target 0.10); ranking of good above bad pairs "
              "by predicted worst normalized throughput (AUC); good admitted by the best threshold admitting <= 10 % "
              "of the fold's bad pairs, chosen on its answers (oracle: a bound, not a result)")
        for name, f in zip(names, per_fold, strict=True):
            print(f"  {name:<18} {f['good']:>3} good of {f['pairs']:>3}  admitted {f['good_admitted']:>5.0%}  "
                  f"false {f['false_admission']:>5.1%}  AUC {f['auc']:.2f}  oracle {f['oracle']:.0%}")
        result[kind] = {"folds": n_folds, "best_trivial": best, "metrics": table,
                        "curve": {f"{t:.2f}": x for t, x in curve.items()},
                        "per_fold": {n: f for n, f in zip(names, per_fold, strict=True)}}
    return result


FRACTIONS = (0.05, 0.1, 0.2)  # adaptation fractions of the new GPU type's pairs
NEW_JOBS_PAIRS, NEW_JOBS_DRAWS = 35, 10  # the new-jobs case: adaptation pairs among half of the jobs, draws


def _band(x: dict, spec: str) -> str:
    """An interval over draws (`adapt_score.interval`) as "mean [low-high]"."""
    return f"{x['mean']:{spec}} [{x['low']:{spec}}-{x['high']:{spec}}]"


def _new_jobs(model, obs, seed: int) -> dict:
    """Adapted on up to `NEW_JOBS_PAIRS` pairs of a random half of the jobs, scored on the other half's pairs."""
    rng = np.random.default_rng(seed)
    jobs = sorted({class_of(p, "job") for o in obs for p in (o.a, o.b)})
    half = set(rng.permutation(jobs)[:len(jobs) // 2].tolist())
    ours = [o for o in obs if class_of(o.a, "job") in half and class_of(o.b, "job") in half]
    theirs = [o for o in obs if class_of(o.a, "job") not in half and class_of(o.b, "job") not in half]
    adapted = adapt(model, [ours[i] for i in rng.permutation(len(ours))[:NEW_JOBS_PAIRS]])
    return metrics(true_norms(theirs), *model_norms_and_margins(adapted, theirs), FLOOR)


def adaptation(obs, quick: bool) -> dict:
    """Leave-one-GPU-out few-shot adaptation: per direction, each fraction's figures and the new-jobs case."""
    seeds = 5 if quick else 20
    types = sorted({o.gpu_type for o in obs})
    result = {}
    print(f"\nfew-shot adaptation: a model trained on one GPU type, adapted on a fraction F of the other's pairs and "
          f"scored on the rest; {seeds} draws; floor {FLOOR}; mean [95 % interval]")
    print(f"{'model -> data':<14}{'F':>6}{'pairs':>7}{'adapted MAPE':>14}{'trivial':>9}{'adapted/trivial':>22}"
          f"{'false adm.':>24}{'good admitted':>24}")
    for source in types:
        for target in types:
            if source == target:
                continue
            model = fit_transfer([o for o in obs if o.gpu_type == source])
            data = [o for o in obs if o.gpu_type == target]
            rows = {}
            for fraction in FRACTIONS:
                d = score_adaptation(model, data, fraction, seed=0, seeds=seeds, floor=FLOOR).to_dict()
                m = d["methods"]["adapted"]
                rows[f"{fraction:g}"] = {
                    "adapt_pairs": d["draws"][0]["n_adapt_pairs"], "mape": d["mape"], "trivial_mape": d["trivial_mape"],
                    "unadapted_mape": d["unadapted_mape"], "mape_over_trivial": d["mape_over_trivial"],
                    "false_admit": m["false_admission"], "good_admitted": m["good_admitted"]}
                r = rows[f"{fraction:g}"]
                print(f"{source + ' -> ' + target:<14}{fraction:>6g}{r['adapt_pairs']:>7}{r['mape']:>14.1%}"
                      f"{r['trivial_mape']:>9.1%}{_band(r['mape_over_trivial'], '.2f'):>22}"
                      f"{_band(r['false_admit'], '.1%'):>24}{_band(r['good_admitted'], '.0%'):>24}")
            new = [_new_jobs(model, data, s) for s in range(NEW_JOBS_DRAWS)]
            fa = [x["false_admission"] for x in new if not np.isnan(x["false_admission"])]
            good = [x["good_admitted"] for x in new if not np.isnan(x["good_admitted"])]
            summary = {"draws": NEW_JOBS_DRAWS, "adapt_pairs": NEW_JOBS_PAIRS,
                       "mape": float(np.mean([x["mape_norm"] for x in new])),
                       "false_admit": float(np.mean(fa)) if fa else None, "false_admit_max": max(fa) if fa else None,
                       "good_admitted": float(np.mean(good)) if good else None}
            print(f"{'':<14}new jobs: {NEW_JOBS_PAIRS} pairs among half of the jobs, scored on the other half's, "
                  f"{NEW_JOBS_DRAWS} draws: MAPE {summary['mape']:.1%}, false admissions "
                  f"{summary['false_admit'] or 0:.1%} (at most {summary['false_admit_max'] or 0:.1%} in a draw), good "
                  f"admitted {summary['good_admitted'] or 0:.0%}")
            result[f"{source}->{target}"] = {"fractions": rows, "new_jobs": summary}
    return {"seeds": seeds, "floor": FLOOR, "directions": result}


def _time(fn, repeats: int) -> float:
    fn()  # warm-up: first call allocates
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (< 1 minute)")
    parser.add_argument("--jobs", type=int, default=100, help="distinct jobs; pairs = jobs²")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: the planner's setting; more threads only add jitter at this size)")
    args = parser.parse_args()
    repeats = 20 if args.quick else 100
    torch.set_num_threads(args.threads)

    obs = import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations
    held = accuracy(obs, args.quick)
    adapted = adaptation(obs, args.quick)
    t0 = time.perf_counter()
    model = train(obs, MLP, seed=0)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    transfer = fit_transfer([o for o in obs if o.gpu_type == "k80"] if args.quick else obs)
    transfer_s = time.perf_counter() - t0

    rng = np.random.default_rng(0)
    families = ["ResNet-50", "LM", "Transformer", "llama", ""]
    jobs = [SoloProfile(kind=str(rng.choice(["train", "infer"])), throughput=float(10 ** rng.uniform(-1, 3)),
                        batch=float(rng.choice([8, 32, 128])), precision=str(rng.choice(["fp32", "bf16"])),
                        model_family=str(rng.choice(families)), sm_util=float(rng.uniform(0.2, 1)),
                        membw_util=float(rng.uniform(0.1, 0.9)), mps_share=int(rng.choice([25, 50, 100])))
            for _ in range(args.jobs)]
    a = [jobs[i] for i in range(args.jobs) for _ in range(args.jobs)]
    b = [jobs[j] for _ in range(args.jobs) for j in range(args.jobs)]
    contention = ContentionModel()
    lookups = [[(int(x), int(y)) for x, y in rng.integers(0, args.jobs, size=(int(rng.integers(1, 4)) * 2, 2))]
               for _ in range(2000)]

    def epoch(m) -> None:
        cache = PairCache(m)
        for p in jobs:
            cache.add(p)
        for pairs in lookups:
            cache.get(pairs)

    unseen, mlp_unseen = transfer.on_gpu("h100"), model.on_gpu("h100")
    rows = [
        ("prior-corrected predict(a, b)", _time(lambda: unseen.predict(a, b), repeats)),
        ("prior-corrected predict_matrix", _time(lambda: unseen.predict_matrix(jobs), repeats)),
        ("mlp predict(a, b)", _time(lambda: mlp_unseen.predict(a, b), repeats)),
        ("mlp predict_matrix", _time(lambda: mlp_unseen.predict_matrix(jobs), repeats)),
        ("contention predict(a, b)", _time(lambda: contention.predict(a, b), max(3, repeats // 5))),
        ("prior-corrected PairCache epoch", _time(lambda: epoch(unseen), max(3, repeats // 5))),
        ("mlp PairCache epoch", _time(lambda: epoch(mlp_unseen), max(3, repeats // 5))),
        ("contention PairCache epoch", _time(lambda: epoch(contention), max(3, repeats // 5))),
    ]
    for m in (mlp_unseen, unseen):
        assert np.allclose(m.predict(a, b).reshape(args.jobs, args.jobs), m.predict_matrix(jobs), rtol=1e-5)
    print(f"\n{len(a)} pairs of {args.jobs} distinct jobs, {args.threads} torch thread(s); training on {len(obs)} "
          f"Gavel pairs took {train_s:.1f} s (mlp, fixed config); prior-corrected, with selection, "
          f"{transfer_s:.1f} s on {'the K80 pairs' if args.quick else 'all'}; both asked as on an unseen GPU (h100)")
    print(f"{'call':<34}{'median ms':>10}")
    for name, ms in rows:
        print(f"{name:<34}{ms:>10.2f}")
    figures = {"pairs": len(a), "threads": args.threads, "train_s": round(train_s, 2),
               "transfer_train_s": round(transfer_s, 2), "target_ms": 5.0,
               "heldout": {k: {"folds": v["folds"], "best_trivial": v["best_trivial"],
                               "metrics": {m: {x: round(y, 4) for x, y in d.items()} for m, d in v["metrics"].items()},
                               "curve": {t: {x: round(y, 4) for x, y in d.items()} for t, d in v["curve"].items()},
                               "per_fold": {n: {x: round(y, 4) for x, y in d.items()}
                                            for n, d in v["per_fold"].items()}}
                           for k, v in held.items()},
               "adaptation": adapted}
    figures.update({name.replace(" ", "_").replace("(a,_b)", "ab").lower(): round(ms, 3) for name, ms in rows})
    print(jsonout.dumps(figures))


if __name__ == "__main__":
    main()
