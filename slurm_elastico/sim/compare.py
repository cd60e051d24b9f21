"""Run several policies over several seeds of one trace recipe, and write the results (CSV, JSON, PNG).

`compare` is what `elastico sim compare` and the benchmark call. A seed
changes the trace where the recipe draws (synthetic mixes, Philly's model
assignment) and the profiling error; every policy sees the same traces.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.planner import policies
from slurm_elastico.sim import metrics, plots
from slurm_elastico.sim.engine import RunResult, run
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth


@dataclass
class Comparison:
    runs: dict[str, list[RunResult]]
    summaries: dict[str, list[dict[str, float]]]

    def aggregated(self) -> dict[str, dict[str, tuple[float, float]]]:
        return {p: metrics.aggregate(s) for p, s in self.summaries.items()}

    def to_json(self) -> dict:
        agg = self.aggregated()
        return {p: {k: {"mean": m, "ci95": h} for k, (m, h) in a.items()} for p, a in agg.items()}


def compare(make_trace: Callable[[int], Sequence[TraceJob]], names: Sequence[str], seeds: Sequence[int],
            settings: Settings, sim: SimSettings, model: SlowdownModel | None, truth: GroundTruth | None = None,
            on_progress: Callable[[str, int, float], None] | None = None) -> Comparison:
    """Every policy in `names` on `make_trace(seed)` for every seed."""
    for n in names:
        policies.get(n)
    truth = truth or GroundTruth()
    runs: dict[str, list[RunResult]] = {n: [] for n in names}
    for seed in seeds:
        trace = make_trace(seed)
        for n in names:
            cb = (lambda f, n=n, seed=seed: on_progress(n, seed, f)) if on_progress else None
            runs[n].append(run(trace, n, settings, sim, model, truth, seed, cb))
    return Comparison(runs, {n: [metrics.summarize(r) for r in rs] for n, rs in runs.items()})


def write(result: Comparison, out: str | Path, plot: bool = True) -> list[Path]:
    """runs.csv (one row per policy and seed), jobs.csv (one row per job), summary.json, and PNG plots."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "runs.csv", out / "jobs.csv", out / "summary.json"]
    with paths[0].open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["policy", "seed", *metrics.FIGURES])
        for p, rs in result.runs.items():
            for r, s in zip(rs, result.summaries[p]):
                w.writerow([p, r.seed, *(f"{s[k]:.6g}" for k in metrics.FIGURES)])
    with paths[1].open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        cols = ["job_id", "kind", "app", "gpus", "submit", "first_start", "end", "restarts", "work", "best_s"]
        w.writerow(["policy", "seed", *cols, "jct"])
        for p, rs in result.runs.items():
            for r in rs:
                for j in r.jobs:
                    d = asdict(j)
                    w.writerow([p, r.seed, *(d[c] for c in cols), j.jct])
    paths[2].write_text(json.dumps(result.to_json(), indent=2, sort_keys=True))
    if plot:
        paths.append(plots.jct_cdf(result.runs, out / "jct_cdf.png"))
        paths.append(plots.utilization(result.runs, out / "utilization.png"))
    return paths
