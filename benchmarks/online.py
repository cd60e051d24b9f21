"""Benchmark: how fast online learning recovers on a model family the predictor never saw.

Run from the repository root: `python benchmarks/online.py [--quick] [--predictor mlp|prior-corrected]`.
For each held-out model family of the bundled Gavel data (leave-one-model-out):
train on the other families (the MLP: a fixed config; the prior-corrected
predictor: `fit_transfer`, its own selection on those families), then hand the held-out family's
pairs to `OnlineLearner.observe` in batches, as the helper would after each
epoch, and after each batch measure the MAPE of the normalized throughput on
the held-out family's pairs not yet observed. The baseline is the same model
with no updates, on the same remaining pairs. Observation order is a seeded
shuffle; the held-out family never enters model choice. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_elastico import jsonout  # noqa: E402
from slurm_elastico.interference.gavel import import_gavel  # noqa: E402
from slurm_elastico.interference.online import OnlineLearner, holdout_error  # noqa: E402
from slurm_elastico.interference.predictor import TrainConfig, train  # noqa: E402
from slurm_elastico.interference.transfer.fit import fit_transfer  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three families, one GPU type (< 1 minute)")
    parser.add_argument("--batch", type=int, default=10, help="pairs observed per helper epoch")
    parser.add_argument("--steps", type=int, default=4, help="epochs of observations per family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--predictor", default="mlp", choices=["mlp", "prior-corrected"])
    args = parser.parse_args()

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
    print(jsonout.dumps({"benchmark": "online", "predictor": args.predictor, "quick": args.quick, "batch": args.batch, "steps": args.steps,
                      "mean_mape_unseen": float(np.mean(first)), "mean_mape_online": float(np.mean(last)),
                      "mean_mape_frozen": float(np.mean(frozen)), "families": rows}))


if __name__ == "__main__":
    main()
