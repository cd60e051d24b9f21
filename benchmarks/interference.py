"""Benchmark: batched slowdown prediction for the planner, MLP vs the contention baseline.

Run from the repository root: `python benchmarks/interference.py [--quick]`.
Trains a predictor on the bundled Gavel data (a fixed config, seconds), builds
N distinct job profiles and all N×N = 10,000 pairs (N = 100), and times one
batched `predict(a, b)` call for each model (median of repeats), plus
`predict_matrix`. Target: <= 5 ms for 10,000 pairs. Then a planner-like epoch
through `PairCache`: 2,000 packing lookups of a few pairs each (the MLP fills
all pairs in one call; the contention model is asked per lookup's misses).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_elastico.interference.base import ContentionModel, SoloProfile  # noqa: E402
from slurm_elastico.interference.gavel import import_gavel  # noqa: E402
from slurm_elastico.interference.predictor import TrainConfig, train  # noqa: E402
from slurm_elastico.planner.slowdown import PairCache  # noqa: E402

GAVEL = ROOT / "tests" / "data" / "gavel"


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
    t0 = time.perf_counter()
    model = train(obs, TrainConfig(hidden=32, weight_decay=1e-4, epochs=500, use_family=True), seed=0)
    train_s = time.perf_counter() - t0

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

    rows = [
        ("mlp predict(a, b)", _time(lambda: model.predict(a, b), repeats)),
        ("mlp predict_matrix", _time(lambda: model.predict_matrix(jobs), repeats)),
        ("contention predict(a, b)", _time(lambda: contention.predict(a, b), max(3, repeats // 5))),
        ("mlp PairCache epoch", _time(lambda: epoch(model), max(3, repeats // 5))),
        ("contention PairCache epoch", _time(lambda: epoch(contention), max(3, repeats // 5))),
    ]
    assert np.allclose(model.predict(a, b).reshape(args.jobs, args.jobs), model.predict_matrix(jobs), rtol=1e-5)
    print(f"{len(a)} pairs of {args.jobs} distinct jobs, {args.threads} torch thread(s); "
          f"training on {len(obs)} Gavel pairs took {train_s:.1f} s")
    print(f"{'call':<30}{'median ms':>10}")
    for name, ms in rows:
        print(f"{name:<30}{ms:>10.2f}")
    figures = {"pairs": len(a), "threads": args.threads, "train_s": round(train_s, 2), "target_ms": 5.0}
    figures.update({name.replace(" ", "_").replace("(a,_b)", "ab").lower(): round(ms, 3) for name, ms in rows})
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
