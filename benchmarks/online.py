"""Benchmark: how fast online learning recovers on a model family the predictor never saw.

Run from the repository root: `python benchmarks/online.py [--quick] [--predictor mlp|prior-corrected]`.
For each held-out model family of the bundled Gavel data (leave-one-model-out):
train on the other families (the MLP: a fixed config; the prior-corrected
predictor: `fit_transfer`, its own selection on those families), then hand the held-out family's
pairs to `OnlineLearner.observe` in batches, as the helper would after each
epoch, and after each batch measure the MAPE of the normalized throughput on
the held-out family's pairs not yet observed. The baseline is the same model
with no updates, on the same remaining pairs. Observation order is a seeded
shuffle; the held-out family never enters model choice.

New cluster (`sim.new_cluster`): the simulator's co-location truth is one GPU type's Gavel pairs (P100, then K80),
the planner's model is the prior-corrected predictor trained on the other type only. elastico runs the same
traces (seeds 0..S-1) with sharing off, the model unadapted, the model adapting online from the pairs it
observes, the same also probing within its budget (probe and revert on in all), and the true model's
predictions; the table gives mean JCT, useful work per GPU-second beside allocation, and the pairs probed,
reverted, what they cost and when the model was adapted and a pairing first gained. Two traces: `small`
(`new_cluster.small_jobs`: jobs that leave the GPU idle, where sharing can pay) and, in full, the synthetic
mix (where under MPS it cannot). Paired by seed: adapted (and probing) over true and over off (targets: <= 1.05
and <= 1.02). `--quick`: the small trace only (30 jobs, 8 GPUs), one seed unless `--seeds`, a fixed predictor config.
`--section` runs one part. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_elastico import jsonout  # noqa: E402
from slurm_elastico.interference.gavel import import_gavel  # noqa: E402
from slurm_elastico.interference.online import OnlineLearner, holdout_error  # noqa: E402
from slurm_elastico.interference.predictor import TrainConfig, train  # noqa: E402
from slurm_elastico.interference.transfer.fit import GRID, fit_transfer  # noqa: E402

GAVEL = ROOT / "tests" / "data" / "gavel"
CONFIG = TrainConfig(hidden=16, weight_decay=1e-2, epochs=300, use_family=False)


def _fit(kind: str, observations, seed: int):
    return fit_transfer(observations, seed=seed) if kind == "prior-corrected" else train(observations, CONFIG, seed=seed)


def curve(observations, family: str, batch: int, steps: int, seed: int,
          kind: str = "mlp") -> tuple[list[int], list[float], list[float], int]:
    """(observed counts, MAPE with updates, MAPE without, accepted updates) for one held-out family."""
    old = [o for o in observations if family not in (o.a.model_family, o.b.model_family)]
    new = [o for o in observations if family in (o.a.model_family, o.b.model_family)]
    order = np.random.default_rng(seed).permutation(len(new))
    new = [new[i] for i in order]
    model = _fit(kind, old, seed)
    frozen = _fit(kind, old, seed)
    learner = OnlineLearner(model, old)
    counts, updated, fixed, accepted = [0], [holdout_error(model, new)], [holdout_error(frozen, new)], 0
    for k in range(1, steps + 1):
        seen = batch * k
        if seen >= len(new) - batch:  # keep at least one batch unseen to judge on
            break
        accepted += learner.observe(new[seen - batch:seen]).accepted
        counts.append(seen)
        updated.append(holdout_error(model, new[seen:]))
        fixed.append(holdout_error(frozen, new[seen:]))
    return counts, updated, fixed, accepted


def new_cluster(quick: bool, seeds: int) -> dict:
    """elastico on a simulated new cluster in every mode of `sim.new_cluster.MODES`, both directions, two traces."""
    from slurm_elastico.config import Settings
    from slurm_elastico.sim import metrics
    from slurm_elastico.sim import new_cluster as nc
    from slurm_elastico.sim.settings import SimSettings
    from slurm_elastico.sim.trace_synthetic import MixSpec, synthetic

    pairs_csv, iso_csv = GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv"
    directions = [("k80", "p100"), ("p100", "k80")]
    n_jobs, gpus = (30, 8) if quick else (200, 32)
    traces = {"small": lambda truth, seed: nc.small_jobs(truth, n_jobs, gpus, 1.0, seed)}
    if not quick:
        traces["mixed"] = lambda truth, seed: synthetic(MixSpec(n_jobs=n_jobs, gpus=gpus, load=2.0), seed, truth)
    out = {}
    print(f"\n== new cluster: truth one GPU type's pairs, model trained on the other; {n_jobs} jobs, {gpus} GPUs, "
          f"truth gavel, seeds 0..{seeds - 1}; small: training jobs that leave the GPU idle (load 1), mixed: the "
          "synthetic mix (load 2)")
    print(f"{'trace':<7}{'model -> truth':<15}{'mode':<11}{'mean JCT h':>11}{'useful/GPU-s':>13}{'alloc':>7}"
          f"{'probes':>7}{'reverted':>9}{'cost GPU-h':>11}{'adapted at h':>13}{'first gain h':>13}")
    for src, dst in directions:
        base = fit_transfer(nc.gavel_pairs(pairs_csv, iso_csv, src), seed=0, grid=GRID[:1] if quick else GRID)
        pairs = nc.gavel_pairs(pairs_csv, iso_csv, dst)
        truth, profiles = nc.truth_of(pairs), nc.solo_profiles(pairs)
        sim = SimSettings(gpus=gpus, placement_window_s=60.0, colocation="gavel")
        for name, make in traces.items():
            rows: dict[str, list] = {m: [] for m in nc.MODES}
            for seed in range(seeds):
                trace = make(truth, seed)
                for mode in nc.MODES:
                    r = nc.run_mode(mode, trace, Settings(), sim, truth, profiles, base, dst, seed)
                    s = metrics.summarize(r.result)
                    rows[mode].append({"seed": seed, "mean_jct_h": s["mean_jct_h"],
                                       "useful_per_gpu_s": s["useful_per_gpu_s"], "util_arrivals": s["util_arrivals"],
                                       "unfinished": s["unfinished"], **r.probes.to_dict(), "learner": r.learner})
            key = f"{name} {src}->{dst}"
            out[key] = {"runs": rows}
            for mode in nc.MODES:
                rs = rows[mode]

                def mean(k, rs=rs):
                    v = [x[k] for x in rs if not math.isnan(x[k])]
                    return float(np.mean(v)) if v else math.nan
                out[key][mode] = {k: mean(k) for k in ("mean_jct_h", "useful_per_gpu_s", "util_arrivals", "probes",
                                                       "reverted", "cost_gpu_s", "probe_gpu_s", "first_adapted_s",
                                                       "first_gain_s", "unfinished")}
                first = mode == nc.MODES[0]
                print(f"{name if first else '':<7}{f'{src}->{dst}' if first else '':<15}{mode:<11}"
                      f"{mean('mean_jct_h'):>11.3f}{mean('useful_per_gpu_s'):>13.3f}{mean('util_arrivals'):>7.2f}"
                      f"{mean('probes'):>7.1f}{mean('reverted'):>9.1f}{mean('cost_gpu_s') / 3600:>11.3f}"
                      f"{mean('first_adapted_s') / 3600:>13.2f}{mean('first_gain_s') / 3600:>13.2f}")
            for mode in ("adapted", "probing"):
                for other in ("true", "off"):
                    ratios = [a["mean_jct_h"] / b["mean_jct_h"] for a, b in zip(rows[mode], rows[other])]
                    half = (float(stats.t.ppf(0.975, len(ratios) - 1) * np.std(ratios, ddof=1) / math.sqrt(len(ratios)))
                            if len(ratios) > 1 else math.nan)
                    out[key][f"{mode}_over_{other}"] = {"mean": float(np.mean(ratios)), "ci95": half}
                    print(f"{'':<22}{mode} / {other} mean JCT (paired by seed): {np.mean(ratios):.3f} ± {half:.3f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three families, one GPU type (< 1 minute)")
    parser.add_argument("--batch", type=int, default=10, help="pairs observed per helper epoch")
    parser.add_argument("--steps", type=int, default=4, help="epochs of observations per family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--predictor", default="mlp", choices=["mlp", "prior-corrected"])
    parser.add_argument("--section", default="all", choices=["all", "families", "new-cluster"])
    parser.add_argument("--seeds", type=int, default=0, help="new cluster: seeds (default 1 with --quick, else 5)")
    args = parser.parse_args()
    if args.section == "new-cluster":
        seeds = args.seeds or (1 if args.quick else 5)
        result = new_cluster(args.quick, seeds)
        print(jsonout.dumps({"benchmark": "online", "quick": args.quick, "seeds": seeds, "new_cluster": result}))
        return

    obs = [o for o in import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations
           if o.fits]
    if args.quick:
        obs = [o for o in obs if o.gpu_type == "p100"]
    families = sorted({p.model_family for o in obs for p in (o.a, o.b)})
    if args.quick:
        families = families[:3]
    t0 = time.perf_counter()
    rows = {}
    print(f"{'held-out family':<18}{'observed pairs':>16}{'MAPE, online':>14}{'MAPE, frozen':>14}{'kept updates':>14}")
    for fam in families:
        counts, updated, fixed, accepted = curve(obs, fam, args.batch, args.steps, args.seed, args.predictor)
        rows[fam] = {"observed": counts, "mape_online": updated, "mape_frozen": fixed, "accepted": accepted}
        for i, n in enumerate(counts):
            print(f"{fam if i == 0 else '':<18}{n:>16}{updated[i]:>14.1%}{fixed[i]:>14.1%}"
                  f"{accepted if i == len(counts) - 1 else '':>14}")
    last = [r["mape_online"][-1] for r in rows.values()]
    frozen = [r["mape_frozen"][-1] for r in rows.values()]
    first = [r["mape_online"][0] for r in rows.values()]
    print(f"\nmean over families: {np.mean(first):.1%} unseen -> {np.mean(last):.1%} after "
          f"{args.batch * args.steps} observed pairs (frozen model on the same pairs: {np.mean(frozen):.1%}); "
          f"{time.perf_counter() - t0:.0f} s")
    extra = {}
    if args.section == "all":
        extra["new_cluster"] = new_cluster(args.quick, args.seeds or (1 if args.quick else 5))
    print(jsonout.dumps({**extra, "benchmark": "online", "predictor": args.predictor, "quick": args.quick, "batch": args.batch, "steps": args.steps,
                      "mean_mape_unseen": float(np.mean(first)), "mean_mape_online": float(np.mean(last)),
                      "mean_mape_frozen": float(np.mean(frozen)), "families": rows}))


if __name__ == "__main__":
    main()
