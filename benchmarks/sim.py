"""Simulator quality bars: elastico against every baseline with 95 % intervals, and the simulator's scale.

Run from the repository root: `python benchmarks/sim.py` (or `--quick`, under
a minute). Prints a table per part and ends with one line of JSON.
The simulations are independent: `--jobs N` (default 2) runs them side by
side in N worker processes (`sim.pool`), longest first, with the same
results as one after another (`--jobs 1`); each section's label gives its
runs' CPU time (each on one core), the end the wall time of the whole.

Comparison: a synthetic mixed training/inference trace (Philly single-GPU
durations, Pollux-profiled training apps, Azure-sized inference jobs) at an
offered load where static Slurm keeps its GPUs ≥ 80 % allocated while jobs
arrive (the table prints that figure), every registered policy, seeds 0..4,
mean ± 95 % Student-t half-width. Two placement windows: one epoch (a job
the planner does not place within one epoch is started by Slurm as
submitted) and "hold" (family jobs start only when the planner starts them).
The ground truth of co-location is `gavel` (Gavel's measured co-run speed as
a ceiling); the full run repeats elastico and static under the optimistic
`gavel-residual` reading. Nothing here is tuned to a result: the constants
are the defaults of `SimSettings` and `Settings`. A policy that schedules
every job exactly as static did on some seed is said so, with why where the
trace shows it (Tiresias: no job reached its queue limit; an ablation
without shapes: every job's default shape is static's whole GPU).

Pollux workloads: 1..8 on the peer's cluster (16 nodes × 4 GPUs, 60 s
rounds, 30 s restarts), each policy's mean JCT and the lower bound beside
the peer's published means, 5 seeds (--quick: workload 1, one seed), each
policy's mean over the workloads with its 95 % interval over seeds. Gangs
are what Slurm can be asked for (P GPUs on each of K nodes); the
`tiresias@peer` and `pollux@peer` columns place them as the peer's
simulator does (any split, `SimSettings.even_gangs` false) and, as it does,
give the policy a running job's true gradient statistics (no error on the
statistical efficiency, `SimSettings.efficiency_noise` 0; none before the
job has run): the calibration of those baselines against the peer's
figures.

Honest settings (issue 33), in every section: `static` is Slurm as it is
(`Policy.plain`: its jobs start the moment they fit, no placement window,
backfill); the planner sees estimated speeds with errors shared per app and
job, refined only by what each job measured alone, and a goodput job's
statistical efficiency only once it has trained (`sim.belief`); the engine
charges true restart costs apart from the planner's belief: every requeue
or relaunch its checkpoint-and-restore (`restart_cost_s`) plus the kind's
overhead measured live, and an elastico job's first start the wrapper's
start-up (`SimSettings`). The restart-cost sweep repeats the first mixed
trace's comparison (elastico, static, pollux, tiresias) at true restart
costs of 10, 60 and 300 s with the planner still believing 60 s, and prints
each baseline's mean JCT over elastico's, paired by seed. The Pollux
workloads' `@peer` columns keep the peer's own rule of 30 s a restart and
nothing more (the calibration).

Goodput mode (issue 29): `elastico-goodput` (elastico with every training
family adaptive: other global batches for goodput) runs in the mixed
trace like every registered policy and in the Pollux workloads beside
`elastico` and the calibrated `pollux@peer`. Its ratios are paired by seed,
with intervals, against the issue's targets: mean JCT at most 0.85 × the
calibrated Pollux's on its workloads, static's at least 2.5 × its own on
the (first) mixed trace; the lower bound stays the fixed-batch one, which a
policy that adapts batches may go below.

Alibaba GPU-sharing trace (`--alibaba PATH` or $ELASTICO_ALIBABA_TRACE:
`openb_pod_list_default.csv` of Alibaba's cluster-trace-gpu-v2023; it states
no license, so it is not bundled, and without it the run says "alibaba: not
run" and records `"alibaba": null` with the reason): the pods created in a
window centred on the trace's median pod (12 h with `--quick`, 96 h in
full), on 8-GPU nodes just large enough for what those pods held in the
trace (their GPU shares, while they arrived), the baselines and elastico,
seeds 0..2 with paired intervals as in the comparison. A pod asking for part
of a GPU is an inference job on that MPS share; whole-GPU pods are training
jobs (see `trace_alibaba.alibaba_slice`).

A job a run leaves unfinished is never dropped silently: each table shows
every policy's unfinished jobs beside its means (marked `*`), a policy row
with any is marked "NOT A RESULT", and the final JSON counts such rows
(`unfinished_rows`), their jobs (`unfinished_jobs`, all sections) and each
section's (`unfinished_by_section`); `lower_bound` holds every section's
lower bound on mean JCT and each policy's ratio to it.

Heterogeneous (`_sim_types`): Sia's Philly workloads on Sia's 64-GPU cluster of
three types (`--sia DIR`, default ../shared/peers/sia beside the repository;
without it "heterogeneous: not run" and `"heterogeneous": null`), one seed
per workload, beside Sia's published figures.

Scale: a 24-hour replay (arrivals over 24 simulated hours) on 512 GPUs with
≥ 5,000 jobs under elastico, and a one-hour replay on 4,096 GPUs; wall time,
CPU time and events per second on one core (events: arrivals, Slurm starts,
completions, requeues, epoch ticks). Epochs every 120 s: the planner's
epoch (≈ 0.2 s at 512 GPUs with every job its own family) is nearly all of
the time, so the interval sets the cost. Target: ≤ 5 minutes of CPU for the
24-hour replay.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from slurm_elastico import jsonout  # noqa: E402
from slurm_elastico.config import Settings  # noqa: E402
from slurm_elastico.interference.base import ContentionModel  # noqa: E402
from slurm_elastico.planner import policies  # noqa: E402
from slurm_elastico.sim import compare, families, metrics, pool, settings, trace  # noqa: E402
from slurm_elastico.sim import trace_alibaba, trace_pollux  # noqa: E402
from slurm_elastico.sim.experiment import check_runnable, seed_varies  # noqa: E402
from slurm_elastico.sim.settings import SimSettings  # noqa: E402
from slurm_elastico.sim.trace_synthetic import MixSpec, synthetic  # noqa: E402
from slurm_elastico.sim.truth import GroundTruth  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _sim_types as sim_types  # noqa: E402


def comparison(runs, gpus, jobs, load, seeds, window, colocation, names):
    """Submit the mixed-trace comparison's runs; returns what prints its table and gives its figures."""
    sim = SimSettings(gpus=gpus, placement_window_s=window, colocation=colocation)
    spec = MixSpec(n_jobs=jobs, gpus=gpus, load=load, gpu_memory_mib=sim.gpu_memory_mib)
    pending = compare.submit(lambda s: synthetic(spec, s, runs.truth), names, list(range(seeds)), Settings(),
                             sim, ContentionModel(), runs.truth,
                             seed_varies=seed_varies("synthetic", 0.0, sim), runs=runs)

    def finish():
        res = pending.result()
        label = f"{gpus} GPUs, {jobs} jobs, load {load:g}, window {'hold' if window < 0 else f'{window:g} s'}, " \
                f"truth {colocation}, {seeds} seeds ({run_time(res.runs.values())})"
        return report(res, label, names, runs.truth, sim)
    return finish


SWEEP_COSTS_S = (10.0, 60.0, 300.0)
"""The true restart costs (`SimSettings.restart_cost_s`, each requeue or relaunch, beyond its kind's measured
overhead) the headline comparison is repeated at; the planner's belief stays `planner.reshape_cost_s`."""
SWEEP_POLICIES = ["elastico", "static", "pollux", "tiresias"]


def restart_sweep(runs, gpus, jobs, load, seeds):
    """Submit the mixed-trace comparison at each true restart cost of `SWEEP_COSTS_S` (the planner believing its
    default); returns what prints one table of static, pollux and tiresias over elastico, paired by seed."""
    pending = {}
    for cost in SWEEP_COSTS_S:
        sim = SimSettings(gpus=gpus, placement_window_s=60.0, colocation="gavel", restart_cost_s=cost)
        spec = MixSpec(n_jobs=jobs, gpus=gpus, load=load, gpu_memory_mib=sim.gpu_memory_mib)
        pending[cost] = compare.submit(lambda sd, spec=spec: synthetic(spec, sd, runs.truth), SWEEP_POLICIES,
                                       list(range(seeds)), Settings(), sim, ContentionModel(), runs.truth,
                                       seed_varies=seed_varies("synthetic", 0.0, sim), runs=runs)

    def finish():
        belief = Settings().planner.reshape_cost_s
        rows = []
        res_all = {c: p.result() for c, p in pending.items()}
        print(f"\n== restart-cost sweep: {gpus} GPUs, {jobs} jobs, load {load:g}, window 60 s, truth gavel, {seeds} "
              f"seeds ({run_time([r for res in res_all.values() for r in res.runs.values()])}); the true restart "
              f"cost of every requeue and relaunch (plus its measured overhead), the planner believing {belief:g} s")
        print(f"  {'true cost s':>11}  {'elastico h':>10}  " + "  ".join(f"{n + ' ÷ elastico':>22}" for n in
                                                                      SWEEP_POLICIES[1:]) + "  unfinished  refused")
        for cost, res in res_all.items():
            mine = [x["mean_jct_h"] for x in res.summaries["elastico"]]
            row = {"true_restart_cost_s": cost, "believed_restart_cost_s": belief,
                   "elastico_mean_jct_h": statistics.fmean(mine), "over_elastico": {},
                   "unfinished": {n: sum(r.unfinished for r in res.runs[n]) for n in SWEEP_POLICIES},
                   "refused_actions": {n: action_outcomes(res.runs[n])["refused_actions"] for n in SWEEP_POLICIES}}
            cells = []
            for n in SWEEP_POLICIES[1:]:
                mean, half = metrics.ci95([x["mean_jct_h"] / e for x, e in zip(res.summaries[n], mine)])
                row["over_elastico"][n] = {"paired_ratio": mean, "paired_ci95": half}
                cells.append(f"{mean:>15.2f} ± {half:4.2f}")
            left, refused = sum(row["unfinished"].values()), sum(row["refused_actions"].values())
            print(f"  {cost:>11g}  {row['elastico_mean_jct_h']:>10.3f}  " + "  ".join(cells)
                  + f"  {left:>10d}  {refused:>7d}" + ("  NOT A RESULT (unfinished jobs)" if left else ""))
            rows.append(row)
        return {"rows": rows, "gpus": gpus, "jobs": jobs, "load": load, "seeds": seeds,
                "unfinished_jobs": sum(sum(r["unfinished"].values()) for r in rows)}
    return finish


def run_time(results) -> str:
    """The runs' CPU time in all (each on one core, whatever else ran on the machine), for a section's label."""
    rs = [r for group in results for r in (group if isinstance(group, list) else [group])]
    return f"{len(rs)} runs, {sum(r.cpu_s for r in rs):.0f} s CPU"


def report(res, label, names, truth, sim):
    """Print a comparison's table, its unfinished jobs and each policy's mean JCT over elastico's, paired by seed;
    return its figures for the final JSON (mean JCT, lower bound, unfinished jobs per policy)."""
    agg = res.aggregated()
    left = res.unfinished()
    print(f"\n== {label}")
    print(res.table(compare.SHOWN_FIGURES))
    priced = priced_jobs(res, truth, sim)
    el = agg["elastico"]["mean_jct_h"]
    out = {"label": label, "static_util_arrivals": agg["static"]["util_arrivals"][0], "policies": {},
           "unfinished_rows": 0, "unfinished_jobs": 0}
    mine = [s["mean_jct_h"] for s in res.summaries["elastico"]]
    for n in names:
        m = agg[n]["mean_jct_h"]
        count = sum(c for c, _ in left[n].values())
        out["policies"][n] = {"mean_jct_h": m[0], "ci95": m[1], "lower_bound_h": agg[n]["lower_bound_h"][0],
                              "ratio_to_lb": agg[n]["ratio_to_lb"][0], "unfinished": count,
                              "unfinished_by_seed": {str(sd): c for sd, (c, _) in left[n].items()},
                              "result": count == 0, **action_outcomes(res.runs[n])}
        out["unfinished_rows"] += count > 0
        out["unfinished_jobs"] += count
        if count:
            print(f"  {n:>16}: NOT A RESULT: {metrics.unfinished_cell(left[n])} jobs unfinished; its means are over "
                  "finished jobs only")
        if n != "elastico":
            ratio = m[0] / el[0] if el[0] > 0 else math.nan
            # Paired by seed (the same trace): the ratio's own interval, free of the traces' spread.
            paired = metrics.ci95([s["mean_jct_h"] / e for s, e in zip(res.summaries[n], mine)])
            out["policies"][n].update(over_elastico=ratio, paired_ratio=paired[0], paired_ci95=paired[1])
            print(f"  {n:>16}: mean JCT {ratio:5.2f}x elastico's (paired by seed {paired[0]:.2f} ± {paired[1]:.2f}); "
                  f"unpaired intervals {'separate' if metrics.separated(m, el) else 'overlap'}"
                  f"{'' if m[0] > el[0] else '  (elastico NOT lower)'}")
        if n == "no-pricing":
            out["policies"][n].update(priced_jobs=priced[0], jobs=priced[1])
            print(f"  {'':>16}  (what it ablates: under the allotment, elastico's GPU counts for jobs with "
                  f"data-parallel shapes, prices choose only the shapes of the other jobs, {priced[0]} of "
                  f"{priced[1]} over the seeds, and the upgrades; without prices those jobs ask for their fastest "
                  "shape)")
    same_as_static(res, names, out)
    if GOODPUT in names and "static" in names:
        out["goodput"] = static_over_goodput(res, truth, sim)
    print(f"  static keeps GPUs {100 * out['static_util_arrivals']:.0f} % allocated while jobs arrive")
    return out


def static_over_goodput(res, truth=None, sim=None) -> dict:
    """Static's mean JCT over elastico-goodput's, paired by seed (the same trace), printed with issue 29's target."""
    ratios = [s["mean_jct_h"] / g for s, g in zip(res.summaries["static"], (x["mean_jct_h"] for x in
                                                                             res.summaries[GOODPUT]))]
    mean, half = metrics.ci95(ratios)
    op, target = GOODPUT_TARGETS["static_over"]
    left = sum(r.unfinished for r in res.runs[GOODPUT]) + sum(r.unfinished for r in res.runs["static"])
    met = left == 0 and mean >= target
    print(f"  {'static':>16}: mean JCT {mean:5.2f} ± {half:.2f}x {GOODPUT}'s, paired by seed (target {op} {target:g}: "
          f"{'met' if met else 'NOT met'}; {left} unfinished)")
    return {"static_over": mean, "ci95": half, "seeds": len(ratios), "target": f"{op} {target:g}", "met": met,
            "unfinished": left, "headroom": goodput_headroom(res, target, truth, sim)}


def goodput_headroom(res, target: float, truth=None, sim=None) -> dict:
    """What the target asks of the trace, from the runs alone: static's mean JCT over the fixed-batch lower bound
    (every job alone at its fastest shape at its own batch from its submission), each kind's mean JCT under
    elastico-goodput over that bound (inference jobs have no batch to choose), and per seed the training jobs'
    mean JCT the target needs with the inference jobs as they ran, over the training jobs' bound. With the
    trace's truth and settings, also per seed the training jobs' *adaptive* bound over the fixed one (each alone
    at the fastest goodput shape of each epoch: what no policy beats, `alone_s`), so the target's need
    can be read against what a batch of the job's choice allows."""
    def mean(xs):
        xs = list(xs)
        return sum(xs) / len(xs) if xs else math.nan

    over_lb = metrics.ci95([mean(j.jct for j in r.jobs) / mean(j.best_s for j in r.jobs) for r in res.runs["static"]])
    kinds = {k: mean(mean(j.jct for j in r.jobs if j.kind == k) / mean(j.best_s for j in r.jobs if j.kind == k)
                     for r in res.runs[GOODPUT]) for k in sorted({j.kind for r in res.runs[GOODPUT] for j in r.jobs})}
    needed, adaptive, ceiling = [], [], []
    for st, r in zip(res.runs["static"], res.runs[GOODPUT]):
        train = [j for j in r.jobs if j.kind == "train"]
        if train:
            rest = sum(j.jct for j in r.jobs if j.kind != "train")
            needed.append((mean(j.jct for j in st.jobs) / target * len(r.jobs) - rest) / len(train)
                          / mean(j.best_s for j in train))
            if truth is not None and r.seed in getattr(res, "traces", {}):
                jobs = res.traces[r.seed]
                best = alone_s(jobs, truth, sim, True)  # each job alone at its best, once per seed
                trained = [b for j, b in zip(jobs, best) if j.kind == "train"]
                fixed = alone_s([j for j in jobs if j.kind == "train"], truth, sim, False)
                adaptive.append(sum(trained) / sum(fixed) if fixed else math.nan)
                # no policy beats static by more than every job alone at its best from submission allows
                ceiling.append(mean(j.jct for j in st.jobs) / mean(best))
    print(f"  {'':>16}  (static is {over_lb[0]:.2f} ± {over_lb[1]:.2f}x the fixed-batch lower bound; under {GOODPUT} "
          + ", ".join(f"{k} jobs {v:.2f}x theirs" for k, v in kinds.items())
          + (f"; the target needs training jobs at {min(needed):.2f}-{max(needed):.2f}x theirs, by seed" if needed
             else "")
          + (f", where a batch of their choice bounds them at {min(adaptive):.2f}-{max(adaptive):.2f}x" if adaptive
             else "") + ")")
    if ceiling:
        print(f"  {'':>16}  (no policy can make static's mean JCT more than {statistics.fmean(ceiling):.2f}x its own, "
              "on the mean over seeds: every job alone at its best from its submission, a training job with a batch "
              "of its choice)")
    return {"static_over_lb": over_lb[0], "static_over_lb_ci95": over_lb[1], "jct_over_lb_by_kind": kinds,
            "train_needed_over_lb_by_seed": needed, "train_adaptive_lb_over_lb_by_seed": adaptive,
            "static_over_best_alone_by_seed": ceiling}


def alone_s(jobs, truth, sim, adaptive: bool) -> list[float]:
    """Each job's seconds alone at its fastest shape on at most the cluster's GPUs (`families.fastest_speed`); with
    `adaptive`, a training job at the fastest goodput shape of each epoch (a batch of its choice)."""
    most = min(sim.max_gpus_per_job, sim.gpus)
    return [j.work / families.fastest_speed(j, truth, sim.gpu_memory_mib, adaptive and j.kind == "train", most,
                                            sim.gpus_per_node) for j in jobs]


def action_outcomes(runs) -> dict[str, int]:
    """Actions over `runs` that the simulated Slurm refused (`refused_actions`) and that were skipped after a refusal
    of the same job's earlier action (`skipped_actions`): counted beside the means, as unfinished jobs are."""
    return {k: sum(r.counters[k] for r in runs) for k in ("refused_actions", "skipped_actions")}


def same_as_static(res, names, out) -> None:
    """Print (and add to `out`) each policy that scheduled every job exactly as static did on some seed, and why
    where the trace says: Tiresias when no job can leave its first queue, an ablation without shapes when every
    job's default shape is static's (one whole GPU)."""
    static = {r.seed: r for r in res.runs["static"]}
    whole = all(j.gpus == 1 and j.share == 100 for t in res.traces.values() for j in t)
    for n in names:
        if n == "static":
            continue
        same = sum(metrics.same_schedule(r, static[r.seed]) for r in res.runs[n])
        out["policies"][n]["same_schedule_as_static"] = same
        why = ""
        if n == "tiresias":
            limit = policies.get(n).threshold_gpu_s
            longest = max(metrics.longest_service_gpu_s(r) for r in res.runs[n])
            preempted = sum(r.counters["actions"].get("preempt", 0) for r in res.runs[n])
            out["policies"][n].update(preemptions=preempted, longest_service_gpu_h=longest / 3600,
                                      queue_limit_gpu_h=limit / 3600)
            if longest < limit:
                why = (f": {preempted} preemptions; no job attained more than {longest / 3600:.1f} GPU-h (GPUs x time "
                       f"from first start to end), under its {limit / 3600:g} GPU-h queue limit, so every job stayed "
                       "in Q0 (arrival order, nothing to preempt for): Slurm's first come first served on whole GPUs")
        elif whole and policies.get(n).narrow is policies.default_shape:
            why = (": every job's default shape here is one whole GPU, static's, so it keeps only elastico's queue "
                   "order, which acts on a job only within its placement window (then Slurm starts it first come "
                   "first served)")
        if same:
            print(f"  {n:>16}: the same schedule as static, job for job, on {same} of {len(res.runs[n])} seeds{why}")


def priced_jobs(res, truth, sim) -> tuple[int, int]:
    """(jobs of every seed's trace whose shapes the prices choose under the allotment, jobs): those whose family
    has no data-parallel shapes (inference, apps measured on one GPU only)."""
    jobs = [j for t in res.traces.values() for j in t]
    return sum(not families.gang_ranks(j, truth, sim.max_gpus_per_job) for j in jobs), len(jobs)


ALIBABA_ENV = "ELASTICO_ALIBABA_TRACE"
ALIBABA_FILE = "openb_pod_list_default.csv"
ALIBABA_LOAD = 1.0
"""The cluster holds on average what the slice's pods held in the trace while they arrived (`AlibabaSlice.gpus_for`)."""


PEER_PLACED = "@peer"
POLLUX_COLUMNS = ["static", "tiresias", "pollux", "elastico", "elastico-goodput", "tiresias" + PEER_PLACED,
                  "pollux" + PEER_PLACED]
GOODPUT = "elastico-goodput"
"""Elastico with every training family adaptive (issue 29): compared with the calibrated Pollux on its workloads and
with static on the mixed trace, paired by seed."""
GOODPUT_TARGETS = {"pollux" + PEER_PLACED: ("<=", 0.85), "static_over": (">=", 2.5)}
"""Issue 29's targets: elastico-goodput's mean JCT at most 0.85 x the calibrated Pollux's (the peer's placement) on
Pollux's workloads, and static's at least 2.5 x elastico-goodput's on the mixed trace."""
ALIBABA_POLICIES = ("static", "static-mps", "tiresias", "pollux", "elastico")


def alibaba_or_why_not(runs, path, quick):
    """Submit the Alibaba section's runs; returns what prints it and gives (its figures, None), or without
    `path` (None, why) after printing one line saying so."""
    if not path:
        why = (f"give --alibaba PATH to {ALIBABA_FILE} (or set {ALIBABA_ENV}); the trace is not bundled: it states "
               "no license")

        def not_run():
            print(f"\nalibaba: not run ({why})")
            return None, why
        return not_run
    finish = alibaba(runs, path, 12.0 if quick else 96.0, 3, list(ALIBABA_POLICIES))
    return lambda: (finish(), None)


def alibaba(runs, path, hours, seeds, names):
    """A slice of Alibaba's GPU-sharing trace: `hours` of pod creations centred on the trace's median one, on
    whole 8-GPU nodes (the trace's usual node) sized to the slice's GPU demand at `ALIBABA_LOAD`.

    The window follows a rule, not a result: the median pod (the trace's
    pods are spread over 149 days, nearly all in its last 36) and the
    cluster the pods' own GPU shares ask for. A seed draws each job's model,
    batch and inference sizes (the trace has none) and the profiling noise;
    arrivals and durations are the trace's.
    """
    truth = runs.truth
    whole = trace_alibaba.alibaba_slice(path, truth)
    centre_h = (whole.start_s + statistics.median(j.submit_s for j in whole.jobs)) / 3600
    start_h = max(0.0, centre_h - hours / 2)
    first = trace_alibaba.alibaba_slice(path, truth, 0, start_h, hours)
    sim = SimSettings(gpus=first.gpus_for(ALIBABA_LOAD, 8), gpus_per_node=8, placement_window_s=60.0,
                      colocation="gavel")

    def make(seed):
        jobs = trace_alibaba.alibaba(path, truth, seed, start_h, hours)
        check_runnable(jobs, truth, sim, f"alibaba slice {start_h:g} h + {hours:g} h")
        return jobs

    pending = compare.submit(make, names, list(range(seeds)), Settings(), sim, ContentionModel(), truth,
                             seed_varies=seed_varies("alibaba", 0.0, sim), runs=runs)

    def finish():
        res = pending.result()
        jobs = first.jobs
        shared = sum(j.kind == "infer" for j in jobs)
        multi = sum(j.gpus > 1 for j in jobs)
        left_out = ", ".join(f"{k} {v}" for k, v in first.skipped.items() if v) or "none"
        label = (f"Alibaba GPU-sharing trace, {hours:g} h of pods from day {start_h / 24:.1f} (centred on its "
                 f"median pod), {len(jobs)} jobs ({shared} on a GPU share, {multi} on several GPUs; pods left out: "
                 f"{left_out}), {sim.gpus} GPUs (8 per node; the pods held {first.load_on(sim.gpus):.2f} of them "
                 f"while they arrived), window 60 s, truth gavel, {seeds} seeds ({run_time(res.runs.values())})")
        out = report(res, label, names, truth, sim)
        out.update(start_h=start_h, hours=hours, jobs=len(jobs), shared_gpu_jobs=shared, multi_gpu_jobs=multi,
                   gpus=sim.gpus, demand=first.load_on(sim.gpus), pods_left_out=first.skipped, seeds=seeds)
        return out
    return finish


PEER_MEAN_JCT_S = {  # Pollux's published per-job JCTs (results-jobload/<policy>-1.0/summary.json), mean per workload
    1: (2089, 2474, 4087), 2: (3323, 5145, 6914), 3: (2188, 3876, 3944), 4: (2721, 3280, 5968),
    5: (2674, 3501, 5656), 6: (2446, 3470, 5302), 7: (3616, 5480, 7291), 8: (2952, 5080, 6294)}
"""(Pollux, Tiresias, Optimus) in seconds, 16 nodes × 4 T4, as the Pollux artifact published them."""


def pollux_workloads(runs, workloads, names, seeds):
    """The Pollux workloads on the peer's cluster (16 nodes × 4 GPUs, 60 s rounds, 30 s restarts), beside the
    peer's figures.

    Every job's work is its measured iterations to the app's end at its
    submitted global batch; elastico keeps that batch (data-parallel shapes
    at the same global batch), so its completion is the same point as a
    fixed-batch policy's. A seed moves each arrival by a seeded ±60 s and
    draws the profiling noise.
    """
    # The peer's simulator: its scheduler starts every job (no Slurm placement window) and charges 30 s per restart.
    sim = SimSettings(gpus=64, gpus_per_node=4, epoch_s=60.0, placement_window_s=-1.0, restart_cost_s=30.0)
    # A name ending in PEER_PLACED runs the policy with the peer's placement (a gang's GPUs in any split over its
    # nodes): the calibration against the peer's figures, not a comparison (Slurm cannot be asked for it).
    # The peer's simulator also hands its policy a running job's true gradient statistics (its Job.update_params at
    # every step): the efficiency without an estimate's error, once the job has run.
    peer_sim = settings.replace(sim, even_gangs=False, requeue_overhead_s=0.0, relaunch_overhead_s=0.0,
                                efficiency_noise=0.0)
    width = {n: max(10, len(n)) for n in names}
    futures = {}
    for w in workloads:
        base = trace_pollux.pollux(w, runs.truth)
        for n in names:
            policy, peer_placed = n.removesuffix(PEER_PLACED), n.endswith(PEER_PLACED)
            for sd in range(seeds):
                futures[w, n, sd] = runs.submit(trace.jitter_arrivals(base, sd), policy, Settings(),
                                                peer_sim if peer_placed else sim, ContentionModel(), sd)
    return lambda: pollux_table(futures, workloads, names, seeds, width)


def pollux_table(futures, workloads, names, seeds, width):
    """The Pollux workloads' table from their runs (`pollux_workloads`), printed; its figures."""
    rows, table = [], []
    by_seed: dict[str, list[list[float]]] = {}  # policy -> per workload, each seed's mean JCT
    for w in workloads:
        means = {}
        for n in names:
            got, bound, left = [], [], 0
            for sd in range(seeds):
                r = futures[w, n, sd].result()
                s = metrics.summarize(r)
                got.append(s["mean_jct_h"] * 3600)
                bound.append(s["lower_bound_h"] * 3600)
                left += r.unfinished
            means[n] = (statistics.fmean(got), statistics.fmean(bound), left)
            by_seed.setdefault(n, []).append(got)
        peer = PEER_MEAN_JCT_S[w]
        rows.append({"workload": w, "mean_jct_s": {n: m for n, (m, _, _) in means.items()},
                     "lower_bound_s": {n: b for n, (_, b, _) in means.items()},
                     "unfinished": {n: c for n, (_, _, c) in means.items()},
                     "refused_actions": {n: action_outcomes([futures[w, n, sd].result() for sd in range(seeds)])[
                         "refused_actions"] for n in names},
                     "peer_mean_jct_s": {"pollux": peer[0], "tiresias": peer[1], "optimus": peer[2]}})
        # The bound is the trace's (every job alone at its fastest shape); a row differs only where a policy left
        # jobs unfinished, and those are marked.
        table.append(f"  {w:8d}  " + "  ".join(f"{means[n][0]:>{width[n] - 1}.0f}{'*' if means[n][2] else ' '}"
                                               for n in names)
                     + f"  {means[names[0]][1]:>11.0f}  " + "  ".join(f"{v:>13d}" for v in peer))
    print(f"\n== Pollux workloads, 64 GPUs (16 nodes × 4), 60 s rounds, {seeds} seed(s) each "
          f"({run_time([f.result() for f in futures.values()])}); mean JCT in seconds; * = unfinished jobs (not a result); "
          f"{PEER_PLACED}: the peer's placement (any split of a gang over nodes), the calibration against the "
          "peer's figures; the others: gangs Slurm can be asked for (P GPUs on each of K nodes), the comparison")
    print("  workload  " + "  ".join(f"{n:>{width[n]}}" for n in names) + "  lower bound  " + "  ".join(
        f"{'peer ' + p:>13}" for p in ("pollux", "tiresias", "optimus")))
    print("\n".join(table))
    avg = {n: statistics.fmean(r["mean_jct_s"][n] for r in rows) for n in names}
    lb = {n: statistics.fmean(r["lower_bound_s"][n] for r in rows) for n in names}
    peer_avg = [statistics.fmean(PEER_MEAN_JCT_S[w][k] for w in workloads) for k in range(3)]
    print("  mean      " + "  ".join(f"{avg[n]:>{width[n] - 1}.0f} " for n in names) + f"  {lb[names[0]]:>11.0f}  "
          + "  ".join(f"{v:>13.0f}" for v in peer_avg))
    left = {n: sum(r["unfinished"][n] for r in rows) for n in names}
    for n in names:
        if left[n]:
            print(f"  {n}: NOT A RESULT: {left[n]} job(s) unfinished over the workloads and seeds")
    # Each seed's mean over the workloads, and its interval over seeds (seeds: arrival jitter, profiling noise)
    seed_means = {n: [statistics.fmean(per[sd] for per in by_seed[n]) for sd in range(seeds)] for n in names}
    ci = {n: metrics.ci95(v)[1] for n, v in seed_means.items()}
    print("  ± 95 % over seeds: " + ", ".join(f"{n} {ci[n]:.0f}" for n in names))
    goodput = goodput_over(seed_means, left) if GOODPUT in names else None
    return {"workloads": rows, "mean_jct_s": avg, "ci95_s": ci, "lower_bound_s": lb, "seeds": seeds,
            "goodput": goodput,
            "ratio_to_lb": {n: avg[n] / lb[n] if lb[n] > 0 else math.nan for n in names},
            "peer_mean_jct_s": dict(zip(("pollux", "tiresias", "optimus"), peer_avg)),
            "unfinished": left, "unfinished_jobs": sum(left.values()),
            "refused_actions": {n: sum(r["refused_actions"][n] for r in rows) for n in names}}


def goodput_over(seed_means: dict[str, list[float]], left: dict[str, int]) -> dict:
    """Elastico-goodput's mean JCT over each other column's, paired by seed (each seed's mean over the workloads),
    printed, with issue 29's target against the calibrated Pollux (the peer's placement)."""
    out = {}
    for n, theirs in seed_means.items():
        if n == GOODPUT:
            continue
        mean, half = metrics.ci95([g / t for g, t in zip(seed_means[GOODPUT], theirs)])
        out[n] = {"ratio": mean, "ci95": half, "unfinished": left[n] + left[GOODPUT]}
        if n in GOODPUT_TARGETS:
            op, target = GOODPUT_TARGETS[n]
            out[n].update(target=f"{op} {target:g}", met=out[n]["unfinished"] == 0 and mean <= target)
        print(f"  {GOODPUT} / {n}: {mean:.3f} ± {half:.3f} paired by seed"
              + (f" (target {out[n]['target']}: {'met' if out[n]['met'] else 'NOT met'})" if "target" in out[n] else "")
              + (f"; {out[n]['unfinished']} unfinished: not a result" if out[n]["unfinished"] else ""))
    return out


def scale(runs, gpus, hours, load, max_duration_s, epoch_s, policy="elastico"):
    """Submit a run of arrivals over `hours` on `gpus` GPUs at `load`; returns what prints it and gives its
    figures."""
    truth = runs.truth
    pilot = synthetic(MixSpec(n_jobs=2000, gpus=gpus, load=load, max_duration_s=max_duration_s), 99, truth)
    per_job = pilot[-1].submit_s / len(pilot)  # seconds between arrivals at this load
    n = max(100, int(hours * 3600 / per_job))
    jobs = synthetic(MixSpec(n_jobs=n, gpus=gpus, load=load, max_duration_s=max_duration_s), 1, truth)
    sim = SimSettings(gpus=gpus, epoch_s=epoch_s, placement_window_s=epoch_s)
    future = runs.submit(jobs, policy, Settings(), sim, ContentionModel(), 1)
    return lambda: scale_row(future.result(), gpus, n, jobs, sim)


def scale_row(r, gpus, n, jobs, sim):
    """A scale run's line, printed, and its figures: the run's wall time and CPU time (one core; the wall time also
    counts the time it waited for a core when other processes shared the machine)."""
    wall = r.wall_s
    s = metrics.summarize(r)
    row = {"gpus": gpus, "jobs": n, "arrival_hours": jobs[-1].submit_s / 3600, "wall_s": wall, "cpu_s": r.cpu_s,
           "events": r.events,
           "events_per_s": r.events / wall, "epochs": r.epochs, "epochs_planned": r.epochs_planned,
           "plan_ms_per_epoch": s["plan_ms_per_epoch"], "epoch_s": sim.epoch_s, "unfinished": r.unfinished,
           "refused_actions": r.counters["refused_actions"],
           "mean_jct_h": s["mean_jct_h"], "lower_bound_h": s["lower_bound_h"], "ratio_to_lb": s["ratio_to_lb"],
           "util_arrivals": s["util_arrivals"]}
    print(f"  {gpus:5d} GPUs {n:6d} jobs over {row['arrival_hours']:.1f} h, epoch {sim.epoch_s:g} s: {wall:6.1f} s wall "
          f"({r.cpu_s:.1f} s CPU), {r.events} events ({row['events_per_s']:.0f}/s), {r.epochs_planned}/{r.epochs} "
          f"epochs planned at "
          f"{row['plan_ms_per_epoch']:.0f} ms, unfinished {r.unfinished}")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--jobs", type=int, default=2, metavar="N",
                    help="simulations run side by side in N worker processes (default 2; 1: one after another in "
                         "this process); each run's results are the same either way")
    ap.add_argument("--alibaba", metavar="PATH", default=os.environ.get(ALIBABA_ENV) or None,
                    help=f"Alibaba's {ALIBABA_FILE} (cluster-trace-gpu-v2023), not bundled since it states no "
                         f"license; default: ${ALIBABA_ENV}. Without it the Alibaba slice is not run (and says so)")
    ap.add_argument("--sia", metavar="DIR", type=sim_types.Path, default=None,
                    help="Sia's artifact data (profiles/, workloads/philly/), not bundled; default: "
                         "../shared/peers/sia beside the repository. Without it the heterogeneous table is not run")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: give at least 1 (worker processes)")
    if args.alibaba is not None and not os.path.isfile(args.alibaba):
        ap.error(f"--alibaba {args.alibaba!r} (or ${ALIBABA_ENV}) is not a file; give the path to {ALIBABA_FILE}")
    if args.sia is not None and sim_types.why_not(args.sia):
        ap.error(f"--sia: {sim_types.why_not(args.sia)}")
    names = list(policies.REGISTRY)
    out: dict = {"quick": args.quick, "workers": args.jobs}
    t0 = time.perf_counter()
    with pool.Runs(GroundTruth(), args.jobs) as runs:
        # Submitted longest first (the scale runs, then the Alibaba slice) so the workers end together; printed in
        # the usual order.
        scales = [] if args.skip_scale else (
            [scale(runs, 32, 2.0, 0.9, 2 * 3600, 120.0)] if args.quick else
            [scale(runs, 512, 24.0, 0.9, 12 * 3600, 120.0), scale(runs, 4096, 1.0, 0.9, 2 * 3600, 120.0)])
        ali = alibaba_or_why_not(runs, args.alibaba, args.quick)
        if args.quick:
            comparisons = [comparison(runs, 8, 40, 2.0, 5, 60.0, "gavel", names)]
            sweep = restart_sweep(runs, 8, 40, 2.0, 5)
            pollux = pollux_workloads(runs, [1], POLLUX_COLUMNS, 1)
        else:
            comparisons = [comparison(runs, 32, 300, 2.0, 5, 60.0, "gavel", names),
                           # the held placement window again, for the baselines a reader compares against
                           comparison(runs, 32, 300, 2.0, 5, -1.0, "gavel",
                                      ["elastico", "static", "tiresias", "pollux", "no-allot", "no-shapes"]),
                           comparison(runs, 32, 300, 2.0, 5, -1.0, "gavel-residual", ["elastico", "static"])]
            sweep = restart_sweep(runs, 32, 300, 2.0, 5)
            pollux = pollux_workloads(runs, range(1, 9), POLLUX_COLUMNS, 5)
        out["comparison"] = [finish() for finish in comparisons]
        out["restart_sweep"] = sweep()
        out["pollux"] = pollux()
        out["alibaba"], reason = ali()
        if reason:
            out["alibaba_not_run"] = reason
        if scales:
            print("\n== scale (elastico, one core each)")
            out["scale"] = [finish() for finish in scales]
    # Its own pool (a typed ground truth), once the one-type runs have left the cores.
    out["heterogeneous"], why = sim_types.heterogeneous(args.sia or sim_types.DEFAULT_SIA_DIR, args.quick, args.jobs)
    if why:
        out["heterogeneous_not_run"] = why
    out["wall_s"] = time.perf_counter() - t0
    print(f"\nwall time {out['wall_s']:.0f} s on {args.jobs} worker process(es)")
    first = out["comparison"][0]["policies"]
    out["elastico_vs_static"] = first["static"]["over_elastico"]
    # A row with unfinished jobs is not a result; counted per section here so no reader of this line can miss it.
    sections = {"comparison": [c["unfinished_jobs"] for c in out["comparison"]],
                "restart_sweep": out["restart_sweep"]["unfinished_jobs"],
                "pollux": out["pollux"]["unfinished_jobs"],
                "alibaba": out["alibaba"]["unfinished_jobs"] if out["alibaba"] else None,
                "scale": [r["unfinished"] for r in out.get("scale", [])],
                "heterogeneous": out["heterogeneous"]["unfinished_jobs"] if out["heterogeneous"] else None}
    out["unfinished_by_section"] = sections
    out["unfinished_rows"] = sum(c["unfinished_rows"] for c in out["comparison"]) + (
        out["alibaba"]["unfinished_rows"] if out["alibaba"] else 0)
    out["unfinished_jobs"] = sum(sections["comparison"]) + sections["restart_sweep"] + sections["pollux"] + (
        sections["alibaba"] or 0) + sum(
        sections["scale"]) + (sections["heterogeneous"] or 0)
    # The lower bound on mean JCT (every job alone at its fastest shape from submission) and each policy's ratio.
    out["lower_bound"] = {
        "comparison": [{n: {"lower_bound_h": p["lower_bound_h"], "ratio_to_lb": p["ratio_to_lb"]}
                        for n, p in c["policies"].items()} for c in out["comparison"]],
        "pollux": {n: {"lower_bound_s": out["pollux"]["lower_bound_s"][n], "ratio_to_lb": r}
                   for n, r in out["pollux"]["ratio_to_lb"].items()},
        "alibaba": {n: {"lower_bound_h": p["lower_bound_h"], "ratio_to_lb": p["ratio_to_lb"]}
                    for n, p in out["alibaba"]["policies"].items()} if out["alibaba"] else None,
        "scale": [{"lower_bound_h": r["lower_bound_h"], "ratio_to_lb": r["ratio_to_lb"]} for r in out.get("scale", [])],
        "heterogeneous": out["heterogeneous"] and {"lower_bound_h": out["heterogeneous"]["lower_bound_h"]}}
    out["goodput"] = {"pollux": out["pollux"].get("goodput"), "mixed": out["comparison"][0].get("goodput")}
    out["complete"] = out["unfinished_jobs"] == 0
    if not out["complete"]:
        totals = {k: sum(v) if isinstance(v, list) else v or 0 for k, v in sections.items()}
        print(f"\nNOT A RESULT: {out['unfinished_jobs']} unfinished job(s): " + ", ".join(
            f"{k} {v}" for k, v in totals.items() if v))
    print("\n" + jsonout.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
