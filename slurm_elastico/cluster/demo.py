"""The main job (`elastico demo`): one job list on the local Slurm cluster, plain Slurm against elastico at the same
time, beside the simulator's prediction for the same list.

1. Bring the local cluster up (slurmctld, 4 slurmd × 4 fake GPUs, MPS,
   slurmdbd + MariaDB for sacct) and split it into two halves of 2 nodes
   × 4 GPUs (`cluster.halves`): a partition for each run.
2. The job list (`cluster.demo_workload`): tiny PyTorch training jobs (most
   of them data-parallel with GPU counts 1 and 2) and tiny
   offline-inference jobs, arriving a few seconds apart. Each job runs its
   real code on emulated GPUs (`cluster.pacing`): every step is padded to
   the time the simulator's ground truth gives it at its current shape, GPU
   count and placement, MPS share and co-runners, so it is as fast on the
   local cluster as in the simulator.
3. The simulator's prediction for the same list on one half, in process:
   `static` (plain Slurm) and `elastico`, with a nominal start-up cost per job.
4. Run the list on both halves at once (`cluster.demo_live`): with plain
   `sbatch --gres=gpu:1` on one (whole GPUs, Slurm's own scheduling, each job
   at its default shape), with `elastico-submit` and the helper
   (`elastico sched --interval`, managing its half's partition only) on the
   other, which sets shapes, shares and GPU counts of pending jobs and
   reshapes running ones. Both runs meet the same load of the machine.
5. Check the work of every job of both runs (`cluster.demo_checks`: every
   training job ran exactly its steps; every inference job answered each
   request once), measure each job's start-up and exit on the plain half
   (`demo_figures.start_cost`), replay the simulator with it on each run's
   real submission times, and print the side-by-side table (measured and
   predicted: mean, median and p99 JCT, waiting, GPU utilisation, reshapes
   by kind, the JCT ratio plain ÷ elastico), the helper's report, and plot
   the JCT distributions.
6. With `--shadow-pass`: the same list once more on the elastico half, each
   epoch a shadow epoch followed by an acting one that plans on the shadow
   epoch's read of Slurm, on the same store (`cluster.demo_shadow`,
   `cluster.demo_pair`). No shadow epoch may
   change Slurm (its `slurm_changes` 0, every job's `scontrol show job` the
   same before and after it, and slurmctld logs no update, requeue, signal,
   hold or release meanwhile), and its journal must list the actions the
   acting epoch then took: the same kinds, each within 30 % of its count
   (`demo_figures.shadow_agreement`), and one by one (`demo_shadow.matched`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from slurm_elastico import jsonout
from slurm_elastico.cluster import demo_checks as checks
from slurm_elastico.cluster import demo_figures as figures
from slurm_elastico.cluster import demo_workload as workload
from slurm_elastico.cluster import halves as cluster_halves
from slurm_elastico.cluster.demo_checks import DemoError
from slurm_elastico.cluster.demo_live import Observed, run_halves
from slurm_elastico.cluster.local import LocalCluster
from slurm_elastico.cluster.programs import program, typed
from slurm_elastico.cluster.progress import ProgressLine
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.runner import SubprocessRunner
from slurm_elastico.store import Store


@dataclass(frozen=True)
class Workload:
    train_jobs: int = 6
    infer_jobs: int = 3
    gap_s: float = 6.0
    steps: int | None = None
    """Optimizer steps of every training job; None: each app's own (`demo_workload.APPS`)."""
    requests: int = 120
    timeout_s: float = 420.0
    """Both runs (they go at once): every job of the list must be done by then (the shadow pass too)."""
    shadow_pass: bool = False
    """Then run the list again on the elastico half with the helper in shadow mode (`shadow_pass`)."""
    plan: workload.Plan = field(default_factory=workload.Plan)


def settings_yaml(state: Path, slurm_conf: Path, plan: workload.Plan, partition: str = "") -> str:
    """The helper's elastico.yaml: the planner, GPU and interference settings the simulator plans with
    (`workload.settings`), this run's state directory, Slurm and the partition it manages (its half), and the
    placement window."""
    planned = workload.settings(plan)
    return json.dumps({
        "state_dir": str(state),
        "slurm": {"conf": str(slurm_conf), "partition": partition},
        "gpu": dataclasses.asdict(planned.gpu),
        "planner": dataclasses.asdict(planned.planner),
        "interference": dataclasses.asdict(planned.interference),
        "submit": {"placement_window_s": plan.placement_window_s, "grace_s": 15},
    }, indent=2)


def run(state_dir: str | None, load: Workload = Workload(), say: Callable[[str], None] = print,
        keep: bool = True, progress: ProgressLine | None = None) -> dict:
    """Run the demo; returns the comparison as a dict. Raises `DemoError` when the work is not exactly done.

    `keep`: leave the cluster running afterwards; without it the cluster is stopped however the demo ends.
    `progress`: where the runs' state is shown while they go (default: one line on stdout, `ProgressLine`)."""
    began = time.monotonic()
    cluster = LocalCluster.from_state_dir(state_dir, accounting=True)
    say(f"== 1. local Slurm cluster in {cluster.state_dir}")
    up = cluster.up()
    say(f"   {up.version}: {'already running' if up.already_running else f'started in {up.seconds:.1f} s'}")
    try:
        result = _run_on(cluster, load, say, began, progress or ProgressLine(sys.stdout))
    finally:
        if not keep:
            cluster.down()
            say("== cluster stopped")
    if keep:
        say(f"== the cluster keeps running; stop it with: {typed('elastico')} cluster down "
            f"--state-dir {shlex.quote(str(cluster.state_dir))}")
    return result


def _run_on(cluster: LocalCluster, load: Workload, say: Callable[[str], None], began: float,
            progress: ProgressLine) -> dict:
    from slurm_elastico.sim.truth import GroundTruth

    plan = load.plan
    gateway = SlurmGateway(SubprocessRunner(env=cluster.env()))
    halves = cluster_halves.ensure(gateway, plan.gpus, plan.gpus_per_node, cluster.state_dir)
    say("   two halves of " + " and ".join(f"{', '.join(h.nodes)} (partition {h.partition}, {h.mode})"
                                           for h in halves) + f": {plan.gpus} GPUs each")
    work = cluster.state_dir / "demo" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    conf = work / "elastico.yaml"
    conf.write_text(settings_yaml(work / "state", cluster.slurm_conf, plan, cluster_halves.PARTITION["elastico"]))
    env = {**os.environ, **cluster.env(), "ELASTICO_CONFIG": str(conf),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    truth = GroundTruth()
    jobs = workload.job_list(load.train_jobs, load.infer_jobs, load.gap_s, load.steps, load.requests)
    _write_inputs(work, jobs, plan, truth, load.requests, load.shadow_pass)
    train = sorted({(j.app, j.global_batch, j.work) for j in jobs if j.kind == "train"})
    apps = ", ".join(f"{app} {steps} steps at batch {batch}" for app, batch, steps in train)
    n_train = sum(j.kind == "train" for j in jobs)
    say(f"== 2. the job list: {n_train} training jobs{f' ({apps})' if apps else ''}"
        f" and {len(jobs) - n_train} inference jobs ({load.requests} requests), one every "
        f"{load.gap_s:g} s; on emulated GPUs (cluster.pacing: each step takes the simulator's time)")

    version = gateway.snapshot().slurm_version  # the Slurm the helper plans for: the simulator models its GPU choice
    say(f"== 3. the simulator's prediction for the same list on one half, on Slurm {version} (in process)")
    t0 = time.monotonic()
    predicted = workload.predict(jobs, plan, truth, slurm_version=version, start_cost_s=plan.start_cost_s)
    nominal = {p: figures.simulated_figures(*predicted[p])["mean_jct_s"] for p in predicted}
    say(f"   static and elastico simulated in {time.monotonic() - t0:.1f} s: mean JCT {nominal['static']:.1f} s "
        f"and {nominal['elastico']:.1f} s, ratio {nominal['static'] / nominal['elastico']:.2f} (with "
        f"{plan.start_cost_s:g} s of start-up and exit per job)")

    say(f"== 4. both runs at once ({work}): plain sbatch --gres=gpu:1 on one half, elastico-submit + "
        f"elastico sched --interval {plan.interval_s:g} on the other")
    runs = run_halves(halves, jobs, work, env, gateway, plan, truth, load.timeout_s, say, progress)
    plain, elastic = runs["plain"], runs["elastico"]
    load_avg = os.getloadavg()[1]  # the last 5 minutes: about the runs' time
    say(f"   all {len(jobs)} jobs of each run finished: plain in {plain.wall_s:.0f} s, elastico in "
        f"{elastic.wall_s:.0f} s; the helper's actions: "
        f"{', '.join(f'{n} {k}' for k, n in sorted(elastic.actions.items())) or 'none'}")
    say(f"   the machine's load meanwhile: {load_avg:.1f} runnable processes on {os.cpu_count()} cores (5-minute "
        "load average, the demo's own included)")

    say("== 5. checking the work")
    for obs in (plain, elastic):
        for job_id, job in obs.ids.items():
            checks.check_output(work / obs.mode / f"{job_id}.out", job_id, job)
    say(f"   both runs: every training job ran exactly its steps; every inference job answered each "
        f"of its {load.requests} requests once")

    # The simulator again, each policy on the list as its live run really got it (submission times drift when the
    # machine is loaded: elastico-submit is a Python program), with the start-up and exit measured on the plain
    # half: the fidelity check compares like with like.
    cost = figures.start_cost(plain, truth, plan)
    replayed = workload.predict(jobs, plan, truth, arrivals={
        "static": workload.at_arrivals(jobs, {j.index: plain.submit[i] for i, j in plain.ids.items()}),
        "elastico": workload.at_arrivals(jobs, {j.index: elastic.submit[i] for i, j in elastic.ids.items()})},
        slurm_version=version, start_cost_s=cost)
    rows = {"plain (measured)": figures.measured_figures(plain, plan.gpus),
            "elastico (measured)": figures.measured_figures(elastic, plan.gpus),
            "static (simulated)": figures.simulated_figures(*replayed["static"]),
            "elastico (simulated)": figures.simulated_figures(*replayed["elastico"])}
    measured_ratio = rows["plain (measured)"]["mean_jct_s"] / rows["elastico (measured)"]["mean_jct_s"]
    predicted_ratio = rows["static (simulated)"]["mean_jct_s"] / rows["elastico (simulated)"]["mean_jct_s"]
    say("")
    say(f"   simulated: each policy on the list as its live run submitted it (measured submission times), each job "
        f"with {cost:.1f} s of start-up and exit (measured on the plain half: its jobs' time on their GPU beyond "
        "their work)")
    say(figures.comparison_table(rows))
    say("")
    say("   submission commands took " + ", ".join(
        f"{np.mean(list(o.submit_s.values())):.1f} s ({o.mode}, mean)" for o in (plain, elastic))
        + "; JCT counts from when Slurm had the job, as in the simulator")
    say(f"   JCT ratio plain / elastico: measured {measured_ratio:.2f}, simulator {predicted_ratio:.2f} "
        f"(measured is {100 * (measured_ratio / predicted_ratio - 1):+.0f} % of the prediction)")
    jobs_rows = figures.per_job(jobs, {"plain": plain, "elastico": elastic}, replayed)
    say(f"   {figures.gap_line(jobs_rows)}; each job's figures in {work / 'comparison.json'}")
    lag = {o.mode: [checks.ended_late(work / o.mode / f"{i}.out") for i in sorted(o.ids)] for o in (plain, elastic)}
    for line in checks.pace_lines(lag, {"plain": rows["plain (measured)"], "elastico": rows["elastico (measured)"]}):
        say(f"   {line}")
    plot = work / "jct.png"
    from slurm_elastico.report import plots

    plots.jct_cdf_compare({label: r["jct"] for label, r in rows.items()}, plot,
                          title="JCT of the demo's job list: plain Slurm and elastico, measured and simulated")
    say(f"   JCT distributions: {plot}")
    say("== 6. the report of both halves (elastico report: sacct and the helper's journal; plain jobs are 'other')")
    say(_report(env, elastic, work))
    say(f"   {_observed(work / 'state' / 'elastico.sqlite')}")
    shadow = None
    if load.shadow_pass:
        elastico_half = next(h for h in halves if h.mode == "elastico")
        shadow = shadow_pass(cluster, cluster_halves.Half("shadow", elastico_half.partition, elastico_half.nodes),
                             jobs, work, env, gateway, load, truth, elastic.actions, say, progress)
    say(f"== the demo took {time.monotonic() - began:.0f} s")
    result = {"rows": {k: {f: v for f, v in r.items() if f != "jct"} for k, r in rows.items()},
              "ratio": {"measured": measured_ratio, "simulated": predicted_ratio,
                        "simulated_at_list_arrivals": nominal["static"] / nominal["elastico"]},
              "start_cost_s": {"nominal": plan.start_cost_s, "measured": cost}, "work": str(work),
              "halves": {h.mode: {"partition": h.partition, "nodes": list(h.nodes)} for h in halves},
              "slurm_version": version, "seconds": time.monotonic() - began, "load_average_5min": load_avg,
              "wall_s": {o.mode: o.wall_s for o in (plain, elastic)},
              "ended_late_s": {mode: {"mean": float(np.mean(v)), "max": max(v)} for mode, v in lag.items()},
              "jobs": jobs_rows, "plain_pass": plain_pass(plain, {h.mode: h.partition for h in halves}["plain"]),
              **({"shadow_pass": shadow} if shadow is not None else {})}
    (work / "comparison.json").write_text(jsonout.dumps(result, indent=2, sort_keys=True))
    return result


def shadow_pass(cluster: LocalCluster, half: cluster_halves.Half, jobs: Sequence[workload.DemoJob], work: Path,
                env: dict, gateway, load: Workload, truth, acting: Counter, say: Callable[[str], None],
                progress: ProgressLine) -> dict:
    """The list again on `half` (the elastico half), alone, each epoch a shadow epoch then an acting one on the same
    store (`demo_shadow`): what changed in Slurm across the shadow epochs (their own count, every job's
    `scontrol show job`, slurmctld's log), and the shadow journal beside the actions taken right after each of its
    epochs, by kind and one by one (`acting`: the elastico run's actions, for comparison). Raises `DemoError`
    when a shadow epoch changed Slurm or a job's work is wrong; disagreeing counts are reported, not raised (they
    are a figure)."""
    from slurm_elastico.cluster import demo_shadow

    say(f"== 7. the shadow pass: the same list on {', '.join(half.nodes)} (partition {half.partition}) through "
        f"elastico-submit; every {load.plan.interval_s:g} s a shadow epoch, then an acting one on the same store "
        f"that plans on the shadow epoch's read of Slurm")
    obs = run_halves([half], jobs, work, env, gateway, load.plan, truth, load.timeout_s, say, progress,
                     slurmctld_log=cluster.layout.log_file("slurmctld"))["shadow"]
    for job_id, job in obs.ids.items():
        checks.check_output(work / "shadow" / f"{job_id}.out", job_id, job)
    pairs = obs.paired.pairs
    counted = sum(p.shadow_changes for p in pairs)
    changed = {p.shadow_at: p.changed for p in pairs if p.changed}
    logged = [line for p in pairs for line in p.logged]
    if counted or changed or logged:
        raise DemoError(f"a shadow epoch changed Slurm: the epochs counted {counted} change(s); "
                        f"scontrol show job changed across {len(changed)} of them ({list(changed.values())[:2]}); "
                        f"slurmctld logged {len(logged)} ({'; '.join(logged[:3])}); see {work / 'shadow'}")
    with Store(work / "state" / "elastico.sqlite") as store:
        journaled = demo_shadow.journal_pairs(store, pairs)
    by_kind = Counter(kind for rows in journaled for _, kind in rows)
    agreement = figures.shadow_agreement(obs.actions, dict(by_kind))
    # the same over the pairs where Slurm moved no job (submitted, started, ended one) before the acting epoch's
    # actions: none of them can have been refused for a move
    still = [i for i, p in enumerate(pairs) if not p.moved]
    agreement_still = figures.shadow_agreement(Counter(kind for i in still for _, kind in pairs[i].acting),
                                               dict(Counter(kind for i in still for _, kind in journaled[i])))
    one_by_one = demo_shadow.matched(pairs, journaled)
    control = sum(p.acting_changed for p in pairs)
    say(f"   all {len(jobs)} jobs finished in {obs.wall_s:.0f} s, each with exactly its work; {len(pairs)} shadow "
        f"epochs ({sum(p.outage for p in pairs)} without an answer from Slurm): Slurm changes 0 (their count, "
        f"every job's scontrol show job before and after, slurmctld's log); the acting epochs after them changed "
        f"{control} job record(s) ({obs.paired.acting_failed} acting epoch(s) failed)")
    say(f"   {figures.shadow_line(agreement)}")
    say(f"   the {len(still)} of {len(pairs)} pairs where Slurm moved no job before the acting epoch acted: "
        f"{figures.shadow_line(agreement_still)}")
    say(f"   {figures.matched_line(one_by_one)}")
    say(f"   (the elastico run's acting helper, for comparison: "
        f"{', '.join(f'{k} {n}' for k, n in sorted(acting.items())) or 'no action'})")
    return {"wall_s": obs.wall_s, "slurm_changes": counted, "slurmctld_changes": len(logged),
            "job_records_changed": len(changed), "shadow_epochs": len(pairs),
            "shadow_epochs_unanswered": sum(p.outage for p in pairs), "acting_epochs_failed": obs.paired.acting_failed,
            "acting_job_records_changed": control, "journaled": dict(by_kind), "agreement": agreement,
            "matched": one_by_one, "pairs_where_slurm_moved_nothing": len(still),
            "agreement_where_slurm_moved_nothing": agreement_still, "elastico_run_actions": dict(acting),
            "partition": half.partition}


PASS_MARGIN_S = 5.0
"""Seconds either side of a pass's first submission and last end in `plain_pass`: the submission command's own
time (Slurm's submit time falls inside it) and clock rounding; far less than the gap to an earlier demo's jobs."""


def plain_pass(obs: Observed, partition: str, wall_now: float | None = None, mono_now: float | None = None) -> dict:
    """{since, until, partition} of a pass, for `elastico whatif --since --until --partition`: local ISO times (as
    sacct reads them) bracketing its submissions and ends (the driver's monotonic clock turned into wall time),
    and the partition it ran in ("" when it had the whole cluster)."""
    wall_now = time.time() if wall_now is None else wall_now
    mono_now = time.monotonic() if mono_now is None else mono_now

    def iso(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(wall_now - (mono_now - t)))

    first = min(obs.submit[i] - obs.submit_s.get(i, 0.0) for i in obs.submit)
    return {"since": iso(first - PASS_MARGIN_S), "until": iso(max(obs.end.values()) + PASS_MARGIN_S),
            "partition": partition}


def _write_inputs(work: Path, jobs: Sequence[workload.DemoJob], plan: workload.Plan, truth, requests: int,
                  shadow: bool = False) -> None:
    """The families (one per job: the simulator's, declared), the requests file, the run directories (the shadow
    pass's too, with `shadow`)."""
    (work / "families").mkdir()
    for job in jobs:
        (work / "families" / f"{job.name}.yaml").write_text(json.dumps(workload.family_spec(truth, job, plan)))
    with open(work / "requests.jsonl", "w") as fh:
        for i in range(requests):
            fh.write(json.dumps({"id": f"req-{i:04d}", "prompt": f"Say {i}.", "max_tokens": 2}) + "\n")
    for mode in ("plain", "elastico", *(("shadow",) if shadow else ())):
        (work / mode / "pace").mkdir(parents=True)


def _report(env: dict, obs: Observed, work: Path) -> str:
    """elastico report from the runs' first submission: both halves' jobs (the plain ones have no family)."""
    first = min(obs.submit.values())
    start_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - (time.monotonic() - first)))
    report = subprocess.run([str(program("elastico")), "report", "--start", start_text, "--no-jobs", "--plot",
                             str(work / "elastico" / "report-jct.png")],
                            env=env, capture_output=True, text=True, timeout=120)
    if report.returncode != 0:
        raise DemoError(f"elastico report failed: {report.stderr.strip()}")
    return report.stdout.rstrip() + f"\n   report plot: {work / 'elastico' / 'report-jct.png'}"


def _observed(store_path: Path) -> str:
    """What the helper learned from the jobs' progress reports (see slurm_elastico.helper.observe)."""
    from slurm_elastico.helper.observe import SOURCE
    from slurm_elastico.interference.measurements import load_from_store

    with Store(store_path) as store:
        obs = load_from_store(store, source=SOURCE)
    if not obs:
        return ("progress reports: no pair of jobs ran side by side long enough, with both solo speeds known, "
                "to be observed")
    norms = [x for o in obs for x in (o.norm_a, o.norm_b)]
    return (f"progress reports: {len(obs)} co-located pair(s) observed, jobs at {min(norms):.2f}-{max(norms):.2f} "
            f"of their solo speed (store table `colocation`, source '{SOURCE}')")
