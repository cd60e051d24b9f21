"""The heterogeneous table of benchmarks/sim.py: Sia's Philly workloads on Sia's 64-GPU cluster of three types.

`heterogeneous(sia_dir, quick, workers)` runs Sia's 8 Philly workloads
(`workloads/philly/workload-N.csv`; with `--quick` only the first, to keep
the quick run near a minute: no spread then, and its ratios are one
workload's) on Sia's cluster (`--cluster sia`: 6 × 4 aws T4, 2 × 8 dgx-ext
A100, 3 × 8 rtx RTX 2080 Ti) under static, pollux, gavel, sia, elastico,
elastico-goodput (every training family adaptive, issue 29's goodput mode,
choosing the batch with the GPU type and count), elastico type-blind
(`SimSettings.type_blind`: families name no type, at the app's slowest
type's speed) and sia at fixed batch (`SimSettings.fixed_batch`:
Sia's policy with every job held to its submitted global batch, as elastico
holds it: the ablation that separates Sia's batch-size choice from its choice
of GPU type and count), and prints each policy's mean JCT per workload
and over the workloads, its unfinished jobs beside every mean (`*`), the
spread over the workloads, the lower bound and the published figures beside
(`PUBLISHED_H`). Then the ratios issue 28 targets: elastico ÷ sia (≤ 1),
type-blind ÷ elastico (≥ 1.3), and our sia and pollux against their
published means (within ±15 %); beside them, with no target, elastico ÷ sia
at fixed batch (the same constraint on both sides), and elastico-goodput
÷ sia and ÷ elastico (both sides free to change batches; what adapting the
batch gains elastico on several types).

One seed per workload (the workloads are the replicas): each workload's
exact arrivals (no jitter), profiling noise drawn with the workload's number
as its seed. The settings are the peer simulator's (its scheduler starts
every job: no Slurm placement window; 60 s rounds; Sia's per-app restart
seconds and step-time calibration, `SimSettings.sia_model`; each job's
profile on every type, and once it has trained its true gradient
statistics, `sim.belief`), nothing tuned.

Sia's data (profiles and workloads) is read where `sia_dir` says (default
`../shared/peers/sia` from the repository root), never bundled: its
repository states no licence. Without it the section says
"heterogeneous: not run" with the reason, and the JSON holds null.

Traps: the typed ground truth differs from the one-type section's, so the
runs get a pool of their own (`sim.pool.Runs` with the typed truth), run
after the other sections' pool has closed (the machine's cores are theirs
until then). The lower bound is the trace's (every job alone at its fastest
shape on any type, taken from elastico's run; each policy's is in the JSON:
they differ only where a policy left jobs unfinished). The runs are
submitted most expensive first (pollux, then sia), so the workers end
together.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.sim import gpu_types, metrics, pool, settings, trace_pollux
from slurm_elastico.sim.families_typed import check_typed
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.truth_types import TypedTruth

DEFAULT_SIA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "peers" / "sia"
"""Where Sia's data is looked for when `--sia` is not given (beside the repository, never inside it)."""

PUBLISHED_H = {"sia": (0.6, 0.1), "pollux": (1.0, 0.1), "gavel": (1.9, 0.3)}
"""Average JCT in hours, mean ± std over the 8 Philly workloads: Table 3 of Subramanya et al., "Sia:
Heterogeneity-aware, goodput-optimized ML-cluster scheduling", SOSP 2023 (Gavel: Gavel + TunedJobs)."""

BLIND = "type-blind"
FIXED = "sia-fixed-batch"
GOODPUT = "elastico-goodput"
COLUMNS = ("static", "pollux", "gavel", "sia", FIXED, "elastico", GOODPUT, BLIND)
"""The table's policies; `type-blind` is elastico with `SimSettings.type_blind`, `sia-fixed-batch` sia with
`SimSettings.fixed_batch`."""
VARIANT = {BLIND: ("elastico", {"type_blind": True}), FIXED: ("sia", {"fixed_batch": True})}
"""A column that runs a registry policy under other simulator settings."""
COSTLIEST_FIRST = ("pollux", "sia", GOODPUT, FIXED, "elastico", "static", BLIND, "gavel")
TARGET_ELASTICO_OVER_SIA = 1.0
TARGET_BLIND_OVER_ELASTICO = 1.3
TARGET_PUBLISHED_REL = 0.15
WORKLOADS = 8
QUICK_WORKLOADS = 1
"""Workload 1 alone costs about a minute of CPU over the table's columns (58 s in the quick run at cd7bddf)."""


def why_not(sia_dir: Path) -> str | None:
    """Why Sia's data at `sia_dir` cannot be used (None: it can)."""
    missing = [p for p in ("profiles", "workloads/philly") if not (sia_dir / p).is_dir()]
    if missing:
        return (f"Sia's data is not at {sia_dir} (no {' or '.join(missing)}); give --sia DIR, the folder with "
                "profiles/ and workloads/philly/ of Sia's artifact (SOSP 2023); it is not bundled: it states no "
                "licence")
    return None


def heterogeneous(sia_dir: Path, quick: bool, workers: int):
    """Run and print the table; (its figures, None), or (None, why) after printing one line saying so."""
    why = why_not(sia_dir)
    if why:
        print(f"\nheterogeneous: not run ({why})")
        return None, why
    groups = gpu_types.parse_cluster(gpu_types.SIA_CLUSTER, "sim.cluster")
    truth = TypedTruth.from_sia(str(sia_dir / "profiles"), [g.gpu_type for g in groups])
    sim = SimSettings(gpus=sum(g.gpus for g in groups), cluster=gpu_types.SIA_CLUSTER,
                      profiles=str(sia_dir / "profiles"), epoch_s=60.0, placement_window_s=-1.0)
    workloads = list(range(1, (QUICK_WORKLOADS if quick else WORKLOADS) + 1))
    futures = {}
    with pool.Runs(truth, workers) as runs:
        for w in workloads:
            path = sia_dir / "workloads" / "philly" / f"workload-{w}.csv"
            jobs = trace_pollux.pollux(path, truth.reference)
            check_typed(jobs, truth, groups, str(path))
            for n in COSTLIEST_FIRST:
                policy, changes = VARIANT.get(n, (n, {}))
                futures[w, n] = runs.submit(jobs, policy, Settings(), settings.replace(sim, **changes),
                                            ContentionModel(), w)
        results = {k: f.result() for k, f in futures.items()}
    return table(results, workloads), None


def table(results, workloads) -> dict:
    """Print the table of `results` ({(workload, column): RunResult}); its figures for the final JSON."""
    rows = []
    for w in workloads:
        s = {n: metrics.summarize(results[w, n]) for n in COLUMNS}
        rows.append({"workload": w, "mean_jct_h": {n: s[n]["mean_jct_h"] for n in COLUMNS},
                     "unfinished": {n: results[w, n].unfinished for n in COLUMNS},
                     "lower_bound_h": {n: s[n]["lower_bound_h"] for n in COLUMNS},
                     "refused_actions": {n: results[w, n].counters["refused_actions"] for n in COLUMNS}})
    mean = {n: statistics.fmean(r["mean_jct_h"][n] for r in rows) for n in COLUMNS}
    sd = {n: statistics.stdev(r["mean_jct_h"][n] for r in rows) if len(rows) > 1 else math.nan for n in COLUMNS}
    left = {n: sum(r["unfinished"][n] for r in rows) for n in COLUMNS}
    lb = {n: statistics.fmean(r["lower_bound_h"][n] for r in rows) for n in COLUMNS}
    cpu = sum(r.cpu_s for r in results.values())
    w = 11
    which = f"workloads {workloads[0]}..{workloads[-1]}" if len(workloads) > 1 else f"workload {workloads[0]}"
    print(f"\n== heterogeneous: Sia's Philly {which} on Sia's cluster "
          f"({gpu_types.SIA_CLUSTER}, 64 GPUs), 60 s rounds, no placement window, one seed per workload "
          f"({len(results)} runs, {cpu:.0f} s CPU); mean JCT in hours; * = unfinished jobs (not a result); "
          f"published: Sia SOSP 2023 Table 3, mean ± std over its 8 workloads")
    print("  workload  " + "  ".join(f"{n:>{w}}" for n in COLUMNS) + "  lower bound")

    def cells(get, marks):
        return "  ".join(f"{get(n):>{w - 1}.2f}{'*' if marks(n) else ' '}" for n in COLUMNS)
    for r in rows:
        print(f"  {r['workload']:8d}  " + cells(lambda n: r["mean_jct_h"][n], lambda n: r["unfinished"][n])
              + f"  {r['lower_bound_h']['elastico']:11.2f}")
    print("  mean      " + cells(lambda n: mean[n], lambda n: left[n])
          + f"  {lb['elastico']:11.2f}")
    if len(rows) > 1:
        print("  std       " + "  ".join(f"{sd[n]:>{w - 1}.2f} " for n in COLUMNS))
    print("  published " + "  ".join(f"{'%.1f ± %.1f' % PUBLISHED_H[n] if n in PUBLISHED_H else '':>{w}}"
                                     for n in COLUMNS))
    for n in COLUMNS:
        if left[n]:
            print(f"  {n}: NOT A RESULT: {left[n]} job(s) unfinished over the workloads; its means are over finished "
                  "jobs only")
    ratios = {"elastico_over_sia": mean["elastico"] / mean["sia"],
              "blind_over_elastico": mean[BLIND] / mean["elastico"],
              "sia_over_published": mean["sia"] / PUBLISHED_H["sia"][0],
              "pollux_over_published": mean["pollux"] / PUBLISHED_H["pollux"][0],
              "gavel_over_published": mean["gavel"] / PUBLISHED_H["gavel"][0],
              "elastico_over_sia_fixed_batch": mean["elastico"] / mean[FIXED],
              "goodput_over_sia": mean[GOODPUT] / mean["sia"],
              "goodput_over_elastico": mean[GOODPUT] / mean["elastico"]}
    paired = {"elastico_over_sia": metrics.ci95([r["mean_jct_h"]["elastico"] / r["mean_jct_h"]["sia"] for r in rows]),
              "blind_over_elastico": metrics.ci95([r["mean_jct_h"][BLIND] / r["mean_jct_h"]["elastico"]
                                                   for r in rows]),
              "elastico_over_sia_fixed_batch": metrics.ci95([r["mean_jct_h"]["elastico"] / r["mean_jct_h"][FIXED]
                                                             for r in rows]),
              "goodput_over_sia": metrics.ci95([r["mean_jct_h"][GOODPUT] / r["mean_jct_h"]["sia"] for r in rows]),
              "goodput_over_elastico": metrics.ci95([r["mean_jct_h"][GOODPUT] / r["mean_jct_h"]["elastico"]
                                                     for r in rows])}
    met = {"elastico_over_sia": ratios["elastico_over_sia"] <= TARGET_ELASTICO_OVER_SIA,
           "blind_over_elastico": ratios["blind_over_elastico"] >= TARGET_BLIND_OVER_ELASTICO,
           "sia_over_published": abs(ratios["sia_over_published"] - 1) <= TARGET_PUBLISHED_REL,
           "pollux_over_published": abs(ratios["pollux_over_published"] - 1) <= TARGET_PUBLISHED_REL}
    involved = {"elastico_over_sia": ("elastico", "sia"), "blind_over_elastico": (BLIND, "elastico"),
                "sia_over_published": ("sia",), "pollux_over_published": ("pollux",)}
    # a ratio over a policy that left jobs unfinished is not a result: neither met nor missed
    met = {k: None if any(left[n] for n in involved[k]) else v for k, v in met.items()}
    targets = {"elastico_over_sia": f"<= {TARGET_ELASTICO_OVER_SIA:g}",
               "blind_over_elastico": f">= {TARGET_BLIND_OVER_ELASTICO:g}",
               "sia_over_published": f"1 ± {TARGET_PUBLISHED_REL:g}",
               "pollux_over_published": f"1 ± {TARGET_PUBLISHED_REL:g}"}
    for k, v in ratios.items():
        pair = f" (paired by workload {paired[k][0]:.2f} ± {paired[k][1]:.2f})" if k in paired and len(rows) > 1 else ""
        verdict = "not a result (jobs unfinished)" if met.get(k) is None else "met" if met[k] else "NOT met"
        goal = f"; target {targets[k]}: {verdict}" if k in targets else ""
        print(f"  {k:>22}: {v:5.2f}{pair}{goal}")
    return {"workloads": rows, "mean_jct_h": mean, "std_jct_h": sd, "lower_bound_h": lb, "unfinished": left,
            "unfinished_jobs": sum(left.values()), "ratios": ratios,
            "paired": {k: {"mean": m, "ci95": h} for k, (m, h) in paired.items()}, "targets": targets,
            "targets_met": met, "published_h": {k: {"mean": m, "std": s} for k, (m, s) in PUBLISHED_H.items()},
            "seeds": "one per workload (the workload's number)", "cluster": gpu_types.SIA_CLUSTER,
            "cpu_s": cpu, "complete": sum(left.values()) == 0}
