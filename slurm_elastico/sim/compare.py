"""Run several policies over several seeds of one trace recipe, and write the results (CSV, JSON, PNG).

`compare` is what `elastico sim compare` and the benchmark call. A seed
changes the trace where the recipe draws (synthetic mixes, Philly's model
assignment), the arrival jitter of a fixed trace (see `experiment.setup`)
and the profiling error; every policy sees the same traces. What it varies
is said in `Comparison.seed_varies`, printed with the table.

A run that leaves jobs unfinished is kept and reported (`unfinished`), never
dropped: its means are over finished jobs and marked, and the comparison is
not a result — `check_complete` raises `Incomplete` naming each such run.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurm_elastico import jsonout
from slurm_elastico.config import Settings
from slurm_elastico.errors import ElasticoError
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.planner import policies
from slurm_elastico.sim import metrics, plots
from slurm_elastico.sim.pool import Runs
from slurm_elastico.sim.results import RunResult
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth


SHOWN_FIGURES = ("mean_jct_h", "median_jct_h", "p99_jct_h", "makespan_h", "util_arrivals", "useful_per_gpu_s",
                 "mean_queue_h",
                 "reshapes_per_job", "ftf_mean", "ratio_to_lb")
"""The figures of `elastico sim run|compare`'s table (`Comparison.table`), each a mean over seeds with its interval."""


class Incomplete(ElasticoError):
    """Runs of a comparison left jobs unfinished, so its figures are not a result; names each policy and seed."""

    exit_code = 5

    def __init__(self, runs: Sequence[tuple[str, int, int, int]]):
        self.runs = tuple(runs)
        lines = "\n".join(f"  - policy {p} seed {s}: {c} of {n} jobs unfinished" for p, s, c, n in self.runs)
        super().__init__(f"{len(self.runs)} run(s) left jobs unfinished; their means are over finished jobs only "
                         f"and the comparison is not a result:\n{lines}")


@dataclass
class Comparison:
    runs: dict[str, list[RunResult]]
    summaries: dict[str, list[dict[str, float]]]
    traces: dict[int, list[TraceJob]] = field(default_factory=dict)
    """The trace of each seed, as every policy got it (names the unfinished jobs)."""
    seed_varies: str = ""
    """What differs between seeds, in words (printed with the table)."""

    def aggregated(self) -> dict[str, dict[str, tuple[float, float]]]:
        return {p: metrics.aggregate(s) for p, s in self.summaries.items()}

    def unfinished(self) -> dict[str, dict[int, tuple[int, int]]]:
        """{policy: {seed: (jobs left unfinished, jobs given)}}."""
        return {p: {r.seed: (r.unfinished, len(r.jobs) + r.unfinished) for r in rs} for p, rs in self.runs.items()}

    def incomplete(self) -> list[tuple[str, int, int, int]]:
        """(policy, seed, unfinished, jobs) of every run that left jobs unfinished."""
        return [(p, s, c, n) for p, per in self.unfinished().items() for s, (c, n) in per.items() if c]

    def unfinished_ids(self, r: RunResult) -> list[int]:
        """The job ids of `r`'s trace that `r` did not finish (empty when the trace was not kept)."""
        done = {j.job_id for j in r.jobs}
        return [j.job_id for j in self.traces.get(r.seed, []) if j.job_id not in done]

    def check_complete(self) -> None:
        """Raise `Incomplete` if any run left a job unfinished."""
        bad = self.incomplete()
        if bad:
            raise Incomplete(bad)

    def table(self, figures: Sequence[str]) -> str:
        """The aggregated figures per policy with each row's unfinished jobs, then what the seeds varied."""
        seeds = sorted({r.seed for rs in self.runs.values() for r in rs})
        text = metrics.table(self.aggregated(), figures, self.unfinished())
        if self.seed_varies:
            label = f"seed {seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} seeds ({_span(seeds)})"
            text += f"\n{label}; a seed varies {self.seed_varies}"
        return text

    def to_json(self) -> dict:
        """{"policies": {policy: {figure: {mean, ci95, unfinished}, unfinished_by_seed}}, "complete", "unfinished",
        "unfinished_jobs", "mean_jct_h", "seeds", "seed_varies"}; `unfinished` beside each mean over finished jobs
        is the policy's total, the top-level `unfinished` lists the runs that left jobs (`unfinished_jobs` counts
        those jobs), and `mean_jct_h` is the mean JCT in hours over the seeds, over finished jobs: a number for one
        policy (`elastico sim run`), {policy: number} for several."""
        agg = self.aggregated()
        per = self.unfinished()
        out: dict = {}
        for p, a in agg.items():
            total = sum(c for c, _ in per[p].values())
            out[p] = {k: {"mean": m, "ci95": h} | ({"unfinished": total} if k in metrics.OVER_FINISHED else {})
                      for k, (m, h) in a.items()}
            out[p]["unfinished_by_seed"] = {str(s): c for s, (c, _) in per[p].items()}
            out[p]["jobs_by_seed"] = {str(s): n for s, (_, n) in per[p].items()}
        bad = [{"policy": p, "seed": r.seed, "unfinished": r.unfinished, "jobs": len(r.jobs) + r.unfinished,
                "job_ids": self.unfinished_ids(r)} for p, rs in self.runs.items() for r in rs if r.unfinished]
        seeds = sorted({r.seed for rs in self.runs.values() for r in rs})
        jct = {p: a["mean_jct_h"][0] for p, a in agg.items()}
        return {"policies": out, "complete": not bad, "unfinished": bad, "seeds": seeds,
                "unfinished_jobs": sum(b["unfinished"] for b in bad),
                "mean_jct_h": next(iter(jct.values())) if len(jct) == 1 else jct,
                "seed_varies": self.seed_varies, "means_over": "finished jobs"}


def _span(seeds: Sequence[int]) -> str:
    contiguous = list(seeds) == list(range(seeds[0], seeds[0] + len(seeds)))
    return f"{seeds[0]}..{seeds[-1]}" if contiguous else ", ".join(map(str, seeds))


def compare(make_trace: Callable[[int], Sequence[TraceJob]], names: Sequence[str], seeds: Sequence[int],
            settings: Settings, sim: SimSettings, model: SlowdownModel | None, truth: GroundTruth | None = None,
            on_progress: Callable[[str, int, float], None] | None = None, seed_varies: str = "",
            runs: Runs | None = None) -> Comparison:
    """Every policy in `names` on `make_trace(seed)` for every seed; `seed_varies` says what a seed changes.

    `runs` (a `pool.Runs` on `truth`) runs them on its workers; without it they run here, one after another,
    with the same results.
    """
    return submit(make_trace, names, seeds, settings, sim, model, truth, on_progress, seed_varies, runs).result()


class Pending:
    """A comparison whose runs were submitted (`submit`); `result()` waits for them."""

    def __init__(self, names: Sequence[str], futures: dict[str, list[tuple[int, Future]]],
                 traces: dict[int, list[TraceJob]], seed_varies: str,
                 on_progress: Callable[[str, int, float], None] | None):
        self.names, self.futures, self.traces, self.seed_varies = list(names), futures, traces, seed_varies
        self.on_progress = on_progress

    def result(self) -> Comparison:
        got: dict[str, list[RunResult]] = {n: [] for n in self.names}
        for n in self.names:
            for seed, f in self.futures[n]:
                got[n].append(f.result())
                if self.on_progress is not None:
                    self.on_progress(n, seed, 1.0)
        return Comparison(got, {n: [metrics.summarize(r) for r in rs] for n, rs in got.items()}, self.traces,
                          self.seed_varies)


def submit(make_trace: Callable[[int], Sequence[TraceJob]], names: Sequence[str], seeds: Sequence[int],
           settings: Settings, sim: SimSettings, model: SlowdownModel | None, truth: GroundTruth | None = None,
           on_progress: Callable[[str, int, float], None] | None = None, seed_varies: str = "",
           runs: Runs | None = None) -> Pending:
    """`compare`'s runs handed to `runs` (without it, or with one worker, each runs here as it is submitted);
    `Pending.result()` gives the comparison. Progress: within each run when it runs here, else as each ends."""
    for n in names:
        policies.get(n)
    if runs is not None and truth is not None and runs.truth is not truth:
        raise ValueError("compare: `runs` was made with another ground truth than `truth`")
    runs = runs if runs is not None else Runs(truth or GroundTruth())
    futures: dict[str, list[tuple[int, Future]]] = {n: [] for n in names}
    traces: dict[int, list[TraceJob]] = {}
    for seed in seeds:
        trace = traces[seed] = list(make_trace(seed))
        for n in names:
            cb = (lambda f, n=n, seed=seed: on_progress(n, seed, f)) if on_progress and runs.here else None
            futures[n].append((seed, runs.submit(trace, n, settings, sim, model, seed, cb)))
    return Pending(names, futures, traces, seed_varies, None if runs.here else on_progress)


def write(result: Comparison, out: str | Path, plot: bool = True) -> list[Path]:
    """runs.csv (one row per policy and seed), jobs.csv (one row per job, unfinished ones with `finished` 0 and
    no start, end or JCT), summary.json, and PNG plots."""
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
        w.writerow(["policy", "seed", *cols, "jct", "finished"])
        for p, rs in result.runs.items():
            for r in rs:
                for j in r.jobs:
                    d = asdict(j)
                    w.writerow([p, r.seed, *(d[c] for c in cols), j.jct, 1])
                left = set(result.unfinished_ids(r))
                for t in result.traces.get(r.seed, []):
                    if t.job_id in left:
                        w.writerow([p, r.seed, t.job_id, t.kind, t.app, t.gpus, t.submit_s, "", "", "", t.work,
                                    "", "", 0])
    paths[2].write_text(jsonout.dumps(result.to_json(), indent=2, sort_keys=True))
    if plot:
        paths.append(plots.jct_cdf(result.runs, out / "jct_cdf.png"))
        paths.append(plots.utilization(result.runs, out / "utilization.png"))
    return paths
