"""Figures of a run and of many: JCT, makespan, throughput, utilisation, fairness; means with 95 % intervals.

Per run (`summarize`): mean / median / p99 JCT, makespan, useful throughput
(training samples at the fixed global batch, inference requests, per hour of
makespan), mean allocated share of all GPUs (over the makespan, and while
jobs arrive), useful work per GPU-second beside it (the jobs' fractions of
their solo speed on a whole GPU, summed per held GPU: above 1 where sharing
paid; `engine.Engine`), mean queueing delay (first start − submission), reshapes per
job, finish-time fairness ρ = JCT / (time alone at the fastest shape) — the
Themis ratio with the whole cluster as the isolated share, since a job uses
one GPU at most — as its mean, p99 and Jain's index, and the lower bound on
mean JCT (every job alone at its fastest shape from submission) with the
run's ratio to it.

Every figure from jobs is over the jobs the run finished: a job left
unfinished (never started, or still running when the run gave up) has no
JCT. So the run's `unfinished` count (and `jobs`, all it was given) travels
beside every mean — in each table row, marked `*`, and in the JSON — and a
comparison with any unfinished job is not a result (`compare.Incomplete`).

Across seeds (`aggregate`): mean and the half-width of a Student-t 95 %
confidence interval for every figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

from slurm_elastico.sim.results import RunResult

H = 3600.0
FIGURES = ("mean_jct_h", "median_jct_h", "p99_jct_h", "makespan_h", "train_samples_per_h", "infer_requests_per_h",
           "util", "util_arrivals", "useful_per_gpu_s", "mean_queue_h", "reshapes_per_job", "ftf_mean", "ftf_p99", "ftf_jain",
           "lower_bound_h", "ratio_to_lb", "unfinished", "jobs", "events_per_s", "plan_ms_per_epoch", "wall_s")
OVER_FINISHED = tuple(f for f in FIGURES if f not in ("unfinished", "jobs", "events_per_s", "plan_ms_per_epoch",
                                                       "wall_s"))
"""The figures computed over finished jobs only (the makespan and utilisation end at the last completion)."""
LOWER_IS_BETTER = {"mean_jct_h", "median_jct_h", "p99_jct_h", "makespan_h", "mean_queue_h", "ftf_mean", "ftf_p99",
                   "ratio_to_lb"}


def summarize(r: RunResult) -> dict[str, float]:
    """One run's figures (hours for times; NaN where the run finished no job), over its finished jobs."""
    counts = {"unfinished": float(r.unfinished), "jobs": float(len(r.jobs) + r.unfinished)}
    if not r.jobs:
        return {k: math.nan for k in FIGURES} | counts
    jct = np.array([j.jct for j in r.jobs])
    best = np.array([j.best_s for j in r.jobs])
    ftf = jct / np.maximum(best, 1e-9)
    submit0 = min(j.submit for j in r.jobs)
    makespan = max(j.end for j in r.jobs) - submit0
    lb = float(best.mean())
    return {
        "mean_jct_h": float(jct.mean()) / H,
        "median_jct_h": float(np.median(jct)) / H,
        "p99_jct_h": float(np.percentile(jct, 99)) / H,
        "makespan_h": makespan / H,
        "train_samples_per_h": float(sum(j.samples for j in r.jobs)) / max(makespan / H, 1e-9),
        "infer_requests_per_h": float(sum(j.requests for j in r.jobs)) / max(makespan / H, 1e-9),
        "util": r.util_makespan,
        "util_arrivals": r.util_arrivals,
        "useful_per_gpu_s": r.useful_per_gpu_s,
        "mean_queue_h": float(np.mean([j.queued for j in r.jobs])) / H,
        "reshapes_per_job": float(np.mean([j.restarts for j in r.jobs])),
        "ftf_mean": float(ftf.mean()),
        "ftf_p99": float(np.percentile(ftf, 99)),
        "ftf_jain": float(ftf.sum() ** 2 / (len(ftf) * (ftf ** 2).sum())),
        "lower_bound_h": lb / H,
        "ratio_to_lb": float(jct.mean()) / lb if lb > 0 else math.nan,
        **counts,
        "events_per_s": r.events / max(r.wall_s, 1e-9),
        "plan_ms_per_epoch": 1000.0 * r.plan_s / max(r.epochs_planned, 1),
        "wall_s": r.wall_s,
    }


def ci95(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95 % Student-t interval); half-width NaN with fewer than two values."""
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=float)
    if len(v) == 0:
        return math.nan, math.nan
    if len(v) < 2:
        return float(v.mean()), math.nan
    return float(v.mean()), float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def aggregate(summaries: Sequence[dict[str, float]]) -> dict[str, tuple[float, float]]:
    """Every figure's (mean, 95 % half-width) over runs (seeds) of one policy."""
    return {k: ci95([s[k] for s in summaries]) for k in FIGURES}


def separated(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two (mean, half-width) intervals do not overlap."""
    (ma, ha), (mb, hb) = a, b
    if math.isnan(ha) or math.isnan(hb):
        return False
    return ma + ha < mb - hb or mb + hb < ma - ha


def same_schedule(a: RunResult, b: RunResult) -> bool:
    """Whether two runs of one trace finished every job and started and ended each at the same instants."""
    def when(r: RunResult) -> list[tuple[int, float, float]]:
        return [(j.job_id, j.first_start, j.end) for j in sorted(r.jobs, key=lambda j: j.job_id)]

    return a.unfinished == b.unfinished == 0 and when(a) == when(b)


def longest_service_gpu_s(r: RunResult) -> float:
    """An upper bound on the GPU-seconds of service any job of `r` attained: its submitted GPUs × the time from
    its first start to its end (the time between counts too, so it bounds). Valid for a policy that runs every
    job at its submitted GPU count (Tiresias); infinite when `r` left a job unfinished (its service is unknown)."""
    if r.unfinished:
        return math.inf
    return max((j.gpus * (j.end - j.first_start) for j in r.jobs), default=0.0)


Unfinished = Mapping[int, tuple[int, int]]
"""One policy's runs: {seed: (jobs left unfinished, jobs given)}."""


def unfinished_cell(per_seed: Unfinished) -> str:
    """`0`; `42 of 160` for one seed; `7 (seed 0: 3/40, seed 2: 4/40)` over several."""
    total = sum(c for c, _ in per_seed.values())
    if total == 0:
        return "0"
    if len(per_seed) == 1:
        (c, n), = per_seed.values()
        return f"{c} of {n}"
    return f"{total} (" + ", ".join(f"seed {s}: {c}/{n}" for s, (c, n) in per_seed.items() if c) + ")"


def table(rows: Mapping[str, Mapping[str, tuple[float, float]]], figures: Sequence[str],
          unfinished: Mapping[str, Unfinished] | None = None) -> str:
    """A fixed-width text table: one row per policy, its unfinished jobs, then `mean ± half-width` per figure.

    A row with unfinished jobs has its means over finished jobs marked `*`,
    explained under the table. Without `unfinished` ({policy: {seed:
    (count, jobs)}}) the count is the mean per seed from `rows`.
    """
    head = ["policy", "unfinished"] + list(figures)
    lines = [head]
    notes = []
    for name, agg in rows.items():
        if unfinished is not None and name in unfinished:
            per_seed = unfinished[name]
            count = sum(c for c, _ in per_seed.values())
            cell = unfinished_cell(per_seed)
        else:
            count = agg["unfinished"][0]
            cell = "0" if count == 0 else f"{count:.3g} per seed"
        mark = "*" if count else ""
        if count:
            notes.append(name)
        cells = [name, cell]
        for f in figures:
            m, h = agg[f]
            cells.append(f"{m:.3g}" + ("" if math.isnan(h) else f" ± {h:.2g}") + (mark if f in OVER_FINISHED else ""))
        lines.append(cells)
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines)
    if notes:
        text += (f"\n* over finished jobs only: {', '.join(notes)} left jobs unfinished, so "
                 f"{'its' if len(notes) == 1 else 'their'} figures are not a result")
    return text
