"""The main job (`elastico demo`): one job list on the local Slurm cluster, plain Slurm against elastico, beside
the simulator's prediction for the same list.

1. Bring the local cluster up (slurmctld, 4 slurmd × 4 fake GPUs, MPS,
   slurmdbd + MariaDB for sacct).
2. The job list (`cluster.demo_workload`): tiny PyTorch training jobs (most
   of them data-parallel with GPU counts 1 and 2, or 1, 2 and 4) and tiny
   offline-inference jobs, arriving a few seconds apart. Each job runs its
   real code on emulated GPUs (`cluster.pacing`): every step is padded to
   the time the simulator's ground truth gives it at its current shape, GPU
   count and placement, MPS share and co-runners, so it is as fast on the
   local cluster as in the simulator.
3. The simulator's prediction for the same list and cluster, in process:
   `static` (plain Slurm) and `elastico`; after the live runs, again with
   each policy on the list as its live run really submitted it (a loaded
   machine delays elastico-submit, a Python program, by seconds).
4. Run the list twice on the cluster: with plain `sbatch --gres=gpu:1`
   (whole GPUs, Slurm's own scheduling, each job at its default shape), then
   with `elastico-submit` and the helper (`elastico sched --interval`), which
   sets shapes, shares and GPU counts of pending jobs and reshapes running
   ones.
5. Check the work of every job of both runs (every training job ran exactly
   its steps; every inference job answered each request once), print the
   side-by-side table (measured and predicted: mean, median and p99 JCT,
   waiting, GPU utilisation, reshapes by kind, the JCT ratio plain ÷
   elastico) and the helper run's report, and plot the JCT distributions.

Times are measured by this driver polling squeue every second: submission
when the job's submission command returned (each job is submitted at its
arrival time by its own thread, so a slow elastico-submit does not delay the
next; how long the commands took is printed beside the table), first start when the job is first seen running, end
when it is no longer listed. GPU utilisation is the allocated share of all
GPUs (a whole GPU or an MPS share), averaged over the run, as the simulator
counts it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from slurm_elastico import jsonout
from slurm_elastico.cluster import demo_workload as workload
from slurm_elastico.cluster import install
from slurm_elastico.cluster.local import LocalCluster
from slurm_elastico.cluster.programs import program, typed
from slurm_elastico.errors import ElasticoError, SlurmError
from slurm_elastico.model import JobState
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.runner import SubprocessRunner
from slurm_elastico.store import Store

PROGRAMS = Path(__file__).resolve().parents[2] / "wrappers" / "demo"
PROGRAM = {"train": PROGRAMS / "train_paced.py", "infer": PROGRAMS / "infer_paced.py"}
RESHAPE_KINDS = ("share", "micro-batch", "engine", "gpus")
"""What a reshape changed, from the shape names before and after: the MPS share, the training micro-batch, the
inference engine's arguments (gpu_memory_utilization, max_num_seqs, kv_cache_dtype), the GPU count."""


class DemoError(ElasticoError):
    """The demo's workload did not finish as it must (names the job and what went wrong)."""


@dataclass(frozen=True)
class Workload:
    train_jobs: int = 10
    infer_jobs: int = 10
    gap_s: float = 2.0
    steps: int | None = None
    """Optimizer steps of every training job; None: each app's own (`demo_workload.APPS`)."""
    requests: int = 120
    timeout_s: float = 420.0
    """Per run: every job of the list must be done by then."""
    plan: workload.Plan = field(default_factory=workload.Plan)


@dataclass
class Observed:
    """One live run as the driver saw it."""

    mode: str
    submit: dict[int, float] = field(default_factory=dict)
    start: dict[int, float] = field(default_factory=dict)
    end: dict[int, float] = field(default_factory=dict)
    samples: list[tuple[float, float]] = field(default_factory=list)
    """(time, allocated share of all GPUs) at each poll."""
    ids: dict[int, workload.DemoJob] = field(default_factory=dict)
    shapes: dict[int, list[str]] = field(default_factory=dict)
    actions: Counter = field(default_factory=Counter)
    wall_s: float = 0.0
    submit_s: dict[int, float] = field(default_factory=dict)
    """How long each job's submission command took (sbatch, or elastico-submit: a Python program)."""


def _bin(name: str) -> str:
    return str(program(name))


def _sbatch() -> str:
    found = install.which("sbatch")
    if found is None:
        raise DemoError("sbatch is not installed (Debian package slurm-client); `elastico cluster up` installs it")
    return found


def settings_yaml(state: Path, slurm_conf: Path, plan: workload.Plan) -> str:
    """The helper's elastico.yaml: the planner, GPU and interference settings the simulator plans with
    (`workload.settings`), this run's state directory and Slurm, and the placement window."""
    planned = workload.settings(plan)
    return json.dumps({
        "state_dir": str(state),
        "slurm": {"conf": str(slurm_conf)},
        "gpu": dataclasses.asdict(planned.gpu),
        "planner": dataclasses.asdict(planned.planner),
        "interference": dataclasses.asdict(planned.interference),
        "submit": {"placement_window_s": plan.placement_window_s, "grace_s": 15},
    }, indent=2)


def run(state_dir: str | None, load: Workload = Workload(), say: Callable[[str], None] = print,
        keep: bool = True) -> dict:
    """Run the demo; returns the comparison as a dict. Raises `DemoError` when the work is not exactly done.

    `keep`: leave the cluster running afterwards; without it the cluster is stopped however the demo ends."""
    began = time.monotonic()
    cluster = LocalCluster.from_state_dir(state_dir, accounting=True)
    say(f"== 1. local Slurm cluster in {cluster.state_dir}")
    up = cluster.up()
    say(f"   {up.version}: {'already running' if up.already_running else f'started in {up.seconds:.1f} s'}")
    try:
        result = _run_on(cluster, load, say, began)
    finally:
        if not keep:
            cluster.down()
            say("== cluster stopped")
    if keep:
        say(f"== the cluster keeps running; stop it with: {typed('elastico')} cluster down "
            f"--state-dir {shlex.quote(str(cluster.state_dir))}")
    return result


def _run_on(cluster: LocalCluster, load: Workload, say: Callable[[str], None], began: float) -> dict:
    from slurm_elastico.sim.truth import GroundTruth

    work = cluster.state_dir / "demo" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    plan = load.plan
    conf = work / "elastico.yaml"
    conf.write_text(settings_yaml(work / "state", cluster.slurm_conf, plan))
    env = {**os.environ, **cluster.env(), "ELASTICO_CONFIG": str(conf),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    gateway = SlurmGateway(SubprocessRunner(env=cluster.env()))

    truth = GroundTruth()
    jobs = workload.job_list(load.train_jobs, load.infer_jobs, load.gap_s, load.steps, load.requests)
    _write_inputs(work, jobs, plan, truth, load.requests)
    train = sorted({(j.app, j.global_batch, j.work) for j in jobs if j.kind == "train"})
    apps = ", ".join(f"{app} {steps} steps at batch {batch}" for app, batch, steps in train)
    n_train = sum(j.kind == "train" for j in jobs)
    say(f"== 2. the job list: {n_train} training jobs{f' ({apps})' if apps else ''}"
        f" and {len(jobs) - n_train} inference jobs ({load.requests} requests), one every "
        f"{load.gap_s:g} s; on emulated GPUs (cluster.pacing: each step takes the simulator's time)")

    version = gateway.snapshot().slurm_version  # the Slurm the helper plans for: the simulator models its GPU choice
    say(f"== 3. the simulator's prediction for the same list and cluster, on Slurm {version} (in process)")
    t0 = time.monotonic()
    predicted = workload.predict(jobs, plan, truth, slurm_version=version)
    say(f"   static and elastico simulated in {time.monotonic() - t0:.1f} s")

    say(f"== 4a. plain Slurm: sbatch --gres=gpu:1, each job at its default shape ({work / 'plain'})")
    plain = _run_live("plain", jobs, work, env, gateway, plan, truth, load.timeout_s, say)
    say(f"   all {len(jobs)} jobs finished in {plain.wall_s:.0f} s")
    time.sleep(2.0)  # so that the helper run's report (sacct from its first submission's second) has no plain job
    say(f"== 4b. elastico: elastico-submit + elastico sched --interval {plan.interval_s:g} ({work / 'elastico'})")
    elastic = _run_live("elastico", jobs, work, env, gateway, plan, truth, load.timeout_s, say)
    say(f"   all {len(jobs)} jobs finished in {elastic.wall_s:.0f} s; the helper's actions: "
        f"{', '.join(f'{n} {k}' for k, n in sorted(elastic.actions.items())) or 'none'}")

    say("== 5. checking the work")
    for obs in (plain, elastic):
        for job_id, job in obs.ids.items():
            _check_output(work / obs.mode / f"{job_id}.out", job_id, job)
    say(f"   both runs: every training job ran exactly its steps; every inference job answered each "
        f"of its {load.requests} requests once")

    # The simulator again, each policy on the list as its live run really got it (submission times drift when the
    # machine is loaded: elastico-submit is a Python program): the fidelity check compares like with like.
    replayed = workload.predict(jobs, plan, truth, arrivals={
        "static": workload.at_arrivals(jobs, {j.index: plain.submit[i] for i, j in plain.ids.items()}),
        "elastico": workload.at_arrivals(jobs, {j.index: elastic.submit[i] for i, j in elastic.ids.items()})},
        slurm_version=version)
    rows = {"plain (measured)": measured_figures(plain, plan.gpus),
            "elastico (measured)": measured_figures(elastic, plan.gpus),
            "static (simulated)": simulated_figures(*replayed["static"]),
            "elastico (simulated)": simulated_figures(*replayed["elastico"])}
    measured_ratio = rows["plain (measured)"]["mean_jct_s"] / rows["elastico (measured)"]["mean_jct_s"]
    predicted_ratio = rows["static (simulated)"]["mean_jct_s"] / rows["elastico (simulated)"]["mean_jct_s"]
    nominal = {p: simulated_figures(*predicted[p])["mean_jct_s"] for p in predicted}
    say("")
    say("   simulated: each policy on the list as its live run submitted it (measured submission times)")
    say(comparison_table(rows))
    say("")
    say("   submission commands took " + ", ".join(
        f"{np.mean(list(o.submit_s.values())):.1f} s ({o.mode}, mean)" for o in (plain, elastic))
        + "; JCT counts from when Slurm had the job, as in the simulator")
    say(f"   at the list's own arrival times (every {load.gap_s:g} s) the simulator predicts mean JCT "
        f"{nominal['static']:.1f} s (static) and {nominal['elastico']:.1f} s (elastico): ratio "
        f"{nominal['static'] / nominal['elastico']:.2f}")
    say(f"   JCT ratio plain / elastico: measured {measured_ratio:.2f}, simulator {predicted_ratio:.2f} "
        f"(measured is {100 * (measured_ratio / predicted_ratio - 1):+.0f} % of the prediction)")
    jobs_rows = per_job(jobs, {"plain": plain, "elastico": elastic}, replayed)
    say(f"   {gap_line(jobs_rows)}; each job's figures in {work / 'comparison.json'}")
    lag = {o.mode: [ended_late(work / o.mode / f"{i}.out") for i in sorted(o.ids)] for o in (plain, elastic)}
    for line in pace_lines(lag, {"plain": rows["plain (measured)"], "elastico": rows["elastico (measured)"]}):
        say(f"   {line}")
    plot = work / "jct.png"
    from slurm_elastico.report import plots

    plots.jct_cdf_compare({label: r["jct"] for label, r in rows.items()}, plot,
                          title="JCT of the demo's job list: plain Slurm and elastico, measured and simulated")
    say(f"   JCT distributions: {plot}")
    say("== 6. the helper run's report (elastico report: sacct and the helper's journal)")
    say(_report(env, elastic, work))
    say(f"   {_observed(work / 'state' / 'elastico.sqlite')}")
    say(f"== the demo took {time.monotonic() - began:.0f} s")
    result = {"rows": {k: {f: v for f, v in r.items() if f != "jct"} for k, r in rows.items()},
              "ratio": {"measured": measured_ratio, "simulated": predicted_ratio,
                        "simulated_at_list_arrivals": nominal["static"] / nominal["elastico"]}, "work": str(work),
              "slurm_version": version, "seconds": time.monotonic() - began,
              "ended_late_s": {mode: {"mean": float(np.mean(v)), "max": max(v)} for mode, v in lag.items()},
              "jobs": jobs_rows}
    (work / "comparison.json").write_text(jsonout.dumps(result, indent=2, sort_keys=True))
    return result


# ----------------------------------------------------------------------------------------------- inputs

def _write_inputs(work: Path, jobs: Sequence[workload.DemoJob], plan: workload.Plan, truth, requests: int) -> None:
    """The families (one per job: the simulator's, declared), the requests file, the run directories."""
    (work / "families").mkdir()
    for job in jobs:
        (work / "families" / f"{job.name}.yaml").write_text(json.dumps(workload.family_spec(truth, job, plan)))
    with open(work / "requests.jsonl", "w") as fh:
        for i in range(requests):
            fh.write(json.dumps({"id": f"req-{i:04d}", "prompt": f"Say {i}.", "max_tokens": 2}) + "\n")
    for mode in ("plain", "elastico"):
        (work / mode / "pace").mkdir(parents=True)


def _argv(mode: str, job: workload.DemoJob, work: Path, plan: workload.Plan, truth) -> list[str]:
    """The command line that submits `job` in run `mode` (argv, never a shell string)."""
    out = work / mode
    args = ["--emulate", workload.emulated(job, plan).to_json(), "--pace-dir", str(out / "pace")]
    if job.kind == "infer":
        args += ["--requests", str(work / "requests.jsonl")]
    name = f"--job-name=demo-{mode}-{job.name}"
    if mode == "elastico":
        return [_bin("elastico-submit"), "--parsable", name, f"--output={out}/%j.out", "--family",
                str(work / "families" / f"{job.name}.yaml"), str(PROGRAM[job.kind]), *args]
    knobs = workload.default_knobs(truth, job)
    if job.kind == "train":
        args += ["--ckpt-dir", str(out / "ckpt" / job.name), "--global-batch", str(job.global_batch),
                 "--micro-batch", str(knobs["micro_batch"]), "--steps", str(job.work)]
    else:
        args += ["--journal", str(out / "ckpt" / f"{job.name}.jsonl"), "--max-num-seqs", str(knobs["max_num_seqs"]),
                 "--gpu-memory-utilization", str(knobs["gpu_memory_utilization"]),
                 "--kv-cache-dtype", knobs["kv_cache_dtype"]]
    return [_sbatch(), "--parsable", name, f"--output={out}/%j.out", "--gres=gpu:1", "--cpus-per-task=1",
            "--mem=512", str(PROGRAM[job.kind]), *args]


# ----------------------------------------------------------------------------------------------- live runs

def _run_live(mode: str, jobs: Sequence[workload.DemoJob], work: Path, env: dict, gateway: SlurmGateway,
              plan: workload.Plan, truth, timeout_s: float, say: Callable[[str], None]) -> Observed:
    obs = Observed(mode)
    helper = None
    log = None
    if mode == "elastico":
        log = open(work / "elastico" / "sched.log", "w")
        helper = subprocess.Popen([_bin("elastico"), "sched", "--interval", str(plan.interval_s), "--json"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    t0 = time.monotonic()
    # Each job is submitted at its arrival time by its own thread (elastico-submit takes seconds on a loaded
    # machine; one after the other they would drift later and later), while this loop polls squeue every second.
    pool = ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="submit")
    pending = {pool.submit(_submit_at, t0 + job.submit_s, _argv(mode, job, work, plan, truth), env, work / mode, job):
               job for job in jobs}
    last = ""
    try:
        while True:
            now = time.monotonic()
            for fut in [f for f in pending if f.done()]:
                job = pending.pop(fut)
                job_id, submitted, took = fut.result()  # a failed submission raises DemoError here
                obs.ids[job_id], obs.submit[job_id], obs.submit_s[job_id] = job, submitted, took
            try:
                active = [j for j in gateway.jobs() if j.job_id in obs.ids]
            except SlurmError as exc:
                say(f"   squeue did not answer ({exc}); retrying")
                time.sleep(1.0)
                continue
            seen = time.monotonic()
            listed = {j.job_id for j in active}
            alloc = 0.0
            for j in active:
                if j.state is JobState.RUNNING and j.gpu_alloc:
                    obs.start.setdefault(j.job_id, seen)
                    alloc += sum(1.0 if s == 0 else s / 100 for _, _, s in j.gpu_alloc)
            obs.samples.append((seen, alloc / plan.gpus))
            for job_id in obs.ids:
                if job_id not in listed and job_id not in obs.end:
                    obs.end[job_id] = seen
                    obs.start.setdefault(job_id, seen)
            states = Counter(j.state.value.lower() for j in active)
            line = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + (
                f", {len(pending)} to submit" if pending else "")
            if line != last and active:
                say(f"   [{seen - t0:4.0f} s] {line}")
                last = line
            if not pending and len(obs.end) == len(obs.ids):
                break
            if seen - t0 > timeout_s:
                left = sorted(set(obs.ids) - set(obs.end))
                raise DemoError(f"{mode} run: jobs {left} did not finish within {timeout_s:.0f} s "
                                f"({len(pending)} not submitted yet); see {work / mode}")
            time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if helper is not None:
            helper.terminate()
            helper.wait(timeout=30)
            log.close()
    obs.wall_s = time.monotonic() - t0
    for job_id in obs.ids:
        obs.shapes[job_id] = _shapes_run(work / mode / f"{job_id}.out")
    if mode == "elastico":
        obs.actions = _actions(work / "elastico" / "sched.log")
    return obs


def _submit_at(due: float, argv: list[str], env: dict, cwd: Path, job: workload.DemoJob) -> tuple[int, float, float]:
    """Submit `job` at `due` (monotonic clock); returns its id, when Slurm had it (the command returned: the JCT
    counts from there, as the simulator's) and how long the command took."""
    time.sleep(max(0.0, due - time.monotonic()))
    began = time.monotonic()
    # Run from the run's directory: jobs run there and keep their checkpoints under it.
    out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise DemoError(f"submitting {job.name} ({Path(argv[0]).name}) failed ({out.returncode}): {out.stderr.strip()}")
    done = time.monotonic()
    return int(out.stdout.strip().split(";")[0]), done, done - began


def _shapes_run(path: Path) -> list[str]:
    """The shape of each start of a job, from the line its program prints when it starts."""
    if not path.exists():
        return []
    return [ln.split()[2].rstrip(":") for ln in path.read_text().splitlines()
            if ln.startswith(("train_paced: shape ", "infer_paced: shape "))]


def _actions(log: Path) -> Counter:
    counts: Counter[str] = Counter()
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            counts.update(a["kind"] for a in json.loads(line)["actions"] if a["status"] == "done")
    return counts


# ----------------------------------------------------------------------------------------------- figures

def reshape_kinds(shapes: Sequence[str]) -> Counter:
    """What each change of shape between a job's starts changed (`RESHAPE_KINDS`), from the shape names."""
    out: Counter[str] = Counter()
    for a, b in zip(shapes, shapes[1:]):
        if a == b:
            continue
        ka, _, ta = a.rpartition("-")
        kb, _, tb = b.rpartition("-")
        if ta != tb:
            out["gpus" if "gpus" in (ta[:4], tb[:4]) else "share"] += 1
        if ka != kb:
            out["micro-batch" if a.startswith("mb") else "engine"] += 1
    return out


def _figures(jct: list[float], wait: list[float], util: float, kinds: Counter, restarts: int) -> dict:
    arr = np.array(jct, dtype=float)
    return {"jobs": len(jct), "mean_jct_s": float(arr.mean()), "median_jct_s": float(np.median(arr)),
            "p99_jct_s": float(np.percentile(arr, 99)), "mean_wait_s": float(np.mean(wait)), "gpu_util": util,
            "restarts": restarts, **{f"reshape_{k}": kinds.get(k, 0) for k in RESHAPE_KINDS}, "jct": list(jct)}


def measured_figures(obs: Observed, gpus: int) -> dict:
    ids = sorted(obs.ids)
    jct = [obs.end[i] - obs.submit[i] for i in ids]
    wait = [obs.start[i] - obs.submit[i] for i in ids]
    t = [s[0] for s in obs.samples]
    u = [s[1] for s in obs.samples]
    span = (min(obs.submit.values()), max(obs.end.values()))
    area = sum(u[k] * (t[k + 1] - t[k]) for k in range(len(t) - 1) if span[0] <= t[k] < span[1])
    kinds: Counter = Counter()
    restarts = 0
    for i in ids:
        kinds += reshape_kinds(obs.shapes[i])
        restarts += max(0, len(obs.shapes[i]) - 1)
    return _figures(jct, wait, area / max(span[1] - span[0], 1e-9), kinds, restarts)


def simulated_figures(result, shapes: dict[int, list[str]]) -> dict:
    """The figures of a simulated run (`workload.predict`), with the shapes its jobs ran at each start."""
    kinds: Counter = Counter()
    for seq in shapes.values():
        kinds += reshape_kinds(seq)
    return _figures([j.jct for j in result.jobs], [j.queued for j in result.jobs], result.util_makespan, kinds,
                    sum(j.restarts for j in result.jobs))


COLUMNS = (("mean_jct_s", "mean JCT s"), ("median_jct_s", "median JCT s"), ("p99_jct_s", "p99 JCT s"),
           ("mean_wait_s", "mean wait s"), ("gpu_util", "GPU util"), ("restarts", "restarts"),
           *((f"reshape_{k}", f"reshapes: {k}") for k in RESHAPE_KINDS))


def per_job(jobs: Sequence[workload.DemoJob], live: dict[str, Observed], simulated: dict) -> list[dict]:
    """Each job's wait, JCT and shapes, live (`live`: plain and elastico) and simulated at the same arrivals
    (`simulated`: `workload.predict`'s static and elastico), so a user sees which jobs the simulator got wrong."""
    policy = {"plain": "static", "elastico": "elastico"}
    ids = {mode: {j.index: i for i, j in obs.ids.items()} for mode, obs in live.items()}
    done = {mode: {r.job_id: r for r in simulated[policy[mode]][0].jobs} for mode in live}  # trace ids: index + 1
    out = []
    for job in jobs:
        row: dict = {"job": job.name}
        for mode, obs in live.items():
            job_id = ids[mode][job.index]
            sim = done[mode].get(job.index + 1)  # None: it did not finish
            shapes = simulated[policy[mode]][1]
            row[mode] = {"wait_s": obs.start[job_id] - obs.submit[job_id],
                         "jct_s": obs.end[job_id] - obs.submit[job_id], "shapes": obs.shapes[job_id]}
            row[f"{policy[mode]} (simulated)"] = {"wait_s": sim.queued if sim else None,
                                                   "jct_s": sim.jct if sim else None,
                                                   "shapes": shapes.get(job.index + 1, [])}
        out.append(row)
    return out


def comparison_table(rows: dict[str, dict]) -> str:
    labels = list(rows)
    width = max(len(c[1]) for c in COLUMNS)
    colw = max(12, *(len(label) for label in labels))
    lines = [" " * width + "  " + "  ".join(label.rjust(colw) for label in labels)]
    for key, title in COLUMNS:
        cells = []
        for label in labels:
            v = rows[label][key]
            cells.append((f"{v:.2f}" if key == "gpu_util" else f"{v:.1f}" if isinstance(v, float) else str(v))
                         .rjust(colw))
        lines.append(title.ljust(width) + "  " + "  ".join(cells))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- checks, report

def _report(env: dict, obs: Observed, work: Path) -> str:
    first = min(obs.submit.values())
    start_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - (time.monotonic() - first)))
    report = subprocess.run([_bin("elastico"), "report", "--start", start_text, "--no-jobs", "--plot",
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


PACE_TOLERANCE = 0.05
"""A run whose jobs ended, on average, more than this fraction of its mean JCT after their emulated GPUs would
have finished them is flagged: the machine did not keep pace, and its JCTs are longer than the truth's."""


def summaries(path: Path) -> list[dict]:
    """The JSON summary line each run of a paced job printed when it ended, in order (none: no output file)."""
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.startswith("{")] if path.exists() else []


def ended_late(path: Path) -> float:
    """Seconds after its emulated GPU the job ended: the sum over its runs' summary lines (`pacing.finish`), as a
    relaunched run's emulated start is the previous run's stop plus the restart cost, so each run's delay carries
    over to the job's end. A summary without the figure is an error: every paced run prints it."""
    runs = summaries(path)
    missing = [i for i, run in enumerate(runs) if "ended_late_s" not in run]
    if missing:
        raise DemoError(f"{path}: run(s) {missing} printed no ended_late_s in their summary "
                        "(see cluster.pacing.finish)")
    return sum(float(run["ended_late_s"]) for run in runs)


def pace_lines(lag: dict[str, list[float]], figures: dict[str, dict]) -> list[str]:
    """How far each live run fell behind its emulated GPUs, and a warning for a run that did not keep pace."""
    out = ["emulated GPUs: how long after their emulated GPUs would have finished them the jobs ended (start-up "
           "included): " + "; ".join(f"{mode} mean {np.mean(v):.1f} s, max {max(v):.1f} s" for mode, v in lag.items())]
    for mode, v in lag.items():
        share = float(np.mean(v)) / figures[mode]["mean_jct_s"]
        if share > PACE_TOLERANCE:
            out.append(f"warning: the {mode} run did not keep pace with its emulated GPUs (its jobs ended "
                       f"{100 * share:.0f} % of its mean JCT late on average; more than {100 * PACE_TOLERANCE:.0f} % "
                       "is the machine, not the schedule): the real code, or its start-up, ran slower than the GPUs "
                       "it emulates, so its JCTs are longer than the simulator's truth gives and the comparison "
                       "with the simulator does not check the simulator. Run the demo again on a less loaded machine.")
    return out


def gap_line(rows: list[dict]) -> str:
    """How much longer the jobs took live than simulated at the same arrivals (`per_job` rows): the time the
    simulator does not model (a job's processes starting and exiting, Slurm's completing state, the helper's
    epoch), apart for the elastico run's jobs that ran on several GPUs (a process per rank, each start and exit)."""
    def mean_gap(mode: str, sim: str, keep=lambda r: True) -> tuple[float, int]:
        gaps = [r[mode]["jct_s"] - r[sim]["jct_s"] for r in rows if keep(r) and r[sim]["jct_s"] is not None]
        return (float(np.mean(gaps)) if gaps else math.nan), len(gaps)

    def gang(r: dict) -> bool:
        return any("-gpus" in s for s in r["elastico"]["shapes"])

    plain, _ = mean_gap("plain", "static (simulated)")
    elastico, _ = mean_gap("elastico", "elastico (simulated)")
    several, n = mean_gap("elastico", "elastico (simulated)", gang)
    one, m = mean_gap("elastico", "elastico (simulated)", lambda r: not gang(r))
    parts = [f"{several:+.1f} s for the {n} jobs that ran on several GPUs"] if n else []
    if m:
        parts.append(f"{one:+.1f} s for the other {m}" if n else f"{one:+.1f} s")
    split = ", ".join(parts)
    unfinished = sum(r[s]["jct_s"] is None for r in rows for s in ("static (simulated)", "elastico (simulated)"))
    return (f"live minus simulated JCT per job (what the simulator does not model: processes starting and exiting, "
            f"Slurm's completing state, the helper's epoch): plain {plain:+.1f} s mean; elastico {elastico:+.1f} s "
            f"mean ({split})" + (f"; {unfinished} simulated job(s) did not finish, left out" if unfinished else ""))


def _check_output(path: Path, job_id: int, job: workload.DemoJob) -> None:
    """The last JSON line of the job's final run says the work is complete."""
    runs = summaries(path)
    if not runs:
        raise DemoError(f"job {job_id} ({job.name}) printed no summary; see {path}")
    last = runs[-1]
    if job.kind == "train" and not (last.get("status") == "done" and last.get("step") == job.work):
        raise DemoError(f"training job {job_id} ({job.name}) ended at step {last.get('step')} of {job.work} "
                        f"({last.get('status')}); see {path}")
    if job.kind == "infer" and not (last.get("status") == "done" and last.get("done") == last.get("total") == job.work):
        raise DemoError(f"inference job {job_id} ({job.name}) answered {last.get('done')}/{last.get('total')} of "
                        f"{job.work}; see {path}")


