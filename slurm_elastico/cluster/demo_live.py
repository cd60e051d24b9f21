"""The demo's live runs: one job list on both halves of the local cluster at the same time (`cluster.halves`).

The plain run submits each job with `sbatch --gres=gpu:1` to the plain half's partition (whole GPUs, Slurm's own
scheduling, each job at its default shape); the elastico run submits the same job with `elastico-submit` to the
elastico half's partition, where the helper (`elastico sched --interval`, its settings naming that partition)
sets shapes, shares and GPU counts of pending jobs and reshapes running ones. Both runs go at once, so the
machine's load (other processes, the jobs' own start-up) weighs on both alike.

The shadow pass (`elastico demo --shadow-pass`) is one more run of the same list on the elastico half, alone,
through `elastico-submit`, where each epoch is a shadow epoch followed by an acting one on the same store
(`cluster.demo_shadow`): the shadow journal is compared with what the acting helper did right after it.

Times are measured by this driver polling squeue every second: submission when the job's submission command
returned (each job is submitted at its arrival time by its own thread, so a slow elastico-submit does not delay
the next), first start when the job is first seen running, end when it is no longer listed. GPU utilisation is
the allocated share of the half's GPUs (a whole GPU or an MPS share), averaged over the run, as the simulator
counts it. A job seen on a node outside its half is an error: the halves must not mix.

An error or Ctrl-C stops the runs: no job is submitted after it (the submitting threads wait for their arrival
time on an event, not in a sleep), every job the demo submitted and did not see end is cancelled, and the helper
is stopped and waited for (it runs in its own session, so the terminal's Ctrl-C does not reach it mid-reshape).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from slurm_elastico.cluster import demo_workload as workload
from slurm_elastico.cluster import install
from slurm_elastico.cluster.demo_checks import DemoError
from slurm_elastico.cluster.demo_shadow import PairedHelper
from slurm_elastico.cluster.halves import Half
from slurm_elastico.cluster.programs import program
from slurm_elastico.cluster.progress import ProgressLine
from slurm_elastico.errors import SlurmError
from slurm_elastico.model import JobState
from slurm_elastico.slurm import commands

PROGRAMS = Path(__file__).resolve().parents[2] / "wrappers" / "demo"
PROGRAM = {"train": PROGRAMS / "train_paced.py", "infer": PROGRAMS / "infer_paced.py"}
MANAGED = ("elastico", "shadow")
"""The runs submitted through elastico-submit with the helper running: `elastico sched --interval` in the elastico
run, paired shadow and acting epochs in the shadow run (`demo_shadow.PairedHelper`)."""


@dataclass
class Observed:
    """One live run as the driver saw it."""

    mode: str
    submit: dict[int, float] = field(default_factory=dict)
    start: dict[int, float] = field(default_factory=dict)
    end: dict[int, float] = field(default_factory=dict)
    samples: list[tuple[float, float]] = field(default_factory=list)
    """(time, allocated share of the half's GPUs) at each poll."""
    ids: dict[int, workload.DemoJob] = field(default_factory=dict)
    shapes: dict[int, list[str]] = field(default_factory=dict)
    actions: Counter = field(default_factory=Counter)
    """The acting helper's actions by kind (done)."""
    paired: PairedHelper | None = None
    """The shadow run's paired epochs (its actions are the pairs' acting ones)."""
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


def submit_argv(half: Half, job: workload.DemoJob, work: Path, plan: workload.Plan, truth) -> list[str]:
    """The command line that submits `job` in `half`'s run to its partition (argv, never a shell string)."""
    mode = half.mode
    out = work / mode
    args = ["--emulate", workload.emulated(job, plan).to_json(), "--pace-dir", str(out / "pace")]
    if job.kind == "infer":
        args += ["--requests", str(work / "requests.jsonl")]
    slurm = [f"--job-name=demo-{mode}-{job.name}", f"--partition={half.partition}", f"--output={out}/%j.out"]
    if mode in MANAGED:
        return [_bin("elastico-submit"), "--parsable", *slurm, "--family",
                str(work / "families" / f"{job.name}.yaml"), str(PROGRAM[job.kind]), *args]
    knobs = workload.default_knobs(truth, job)
    if job.kind == "train":
        args += ["--ckpt-dir", str(out / "ckpt" / job.name), "--global-batch", str(job.global_batch),
                 "--micro-batch", str(knobs["micro_batch"]), "--steps", str(job.work)]
    else:
        args += ["--journal", str(out / "ckpt" / f"{job.name}.jsonl"), "--max-num-seqs", str(knobs["max_num_seqs"]),
                 "--gpu-memory-utilization", str(knobs["gpu_memory_utilization"]),
                 "--kv-cache-dtype", knobs["kv_cache_dtype"]]
    return [_sbatch(), "--parsable", *slurm, "--gres=gpu:1", "--cpus-per-task=1", "--mem=512",
            str(PROGRAM[job.kind]), *args]


def state_line(elapsed_s: float, states: dict[str, Counter], to_submit: Counter) -> str:
    """The progress line: each run's jobs by state, and how many are still to be submitted."""
    parts = []
    for mode, counts in states.items():
        text = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none listed"
        parts.append(f"{mode}: {text}" + (f", {to_submit[mode]} to submit" if to_submit[mode] else ""))
    return f"   [{elapsed_s:4.0f} s] " + " | ".join(parts)


def run_halves(halves: Sequence[Half], jobs: Sequence[workload.DemoJob], work: Path, env: dict, gateway,
               plan: workload.Plan, truth, timeout_s: float, say: Callable[[str], None],
               progress: ProgressLine, slurmctld_log: Path | None = None) -> dict[str, Observed]:
    """Run `jobs` on every half at once (the elastico or shadow half with the helper running, in its mode);
    {mode: what was seen}. `slurmctld_log`: read around each shadow epoch of the shadow run."""
    obs = {h.mode: Observed(h.mode) for h in halves}
    nodes = {h.mode: set(h.nodes) for h in halves}
    mode_of: dict[int, str] = {}
    helper = log = paired = None
    managed = [m for m in obs if m in MANAGED]
    if len(managed) > 1:
        raise ValueError(f"one run with the helper at a time, not {managed}")
    if managed == ["shadow"]:
        paired = obs["shadow"].paired = PairedHelper(env, plan.interval_s, work / "shadow", slurmctld_log)
        paired.start()
    elif managed:
        log = open(work / "elastico" / "sched.log", "w")
        # Its own session: a Ctrl-C at the terminal reaches the demo only, which stops the helper itself (below).
        helper = subprocess.Popen([_bin("elastico"), "sched", "--interval", str(plan.interval_s), "--json"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
    stop = threading.Event()
    t0 = time.monotonic()
    # Each job is submitted at its arrival time by its own thread (elastico-submit takes seconds on a loaded
    # machine; one after the other they would drift later and later), while this loop polls squeue every second.
    pool = ThreadPoolExecutor(max_workers=len(jobs) * len(halves), thread_name_prefix="submit")
    pending: dict[Future, tuple[str, workload.DemoJob]] = {
        pool.submit(_submit_at, t0 + job.submit_s, submit_argv(h, job, work, plan, truth), env, work / h.mode, job,
                    stop, paired.quiet if paired is not None else None): (h.mode, job) for job in jobs for h in halves}
    try:
        while True:
            now = time.monotonic()
            if paired is not None and paired.error is not None:
                raise paired.error
            for fut in [f for f in pending if f.done()]:
                mode, job = pending.pop(fut)
                job_id, submitted, took = fut.result()  # a failed submission raises DemoError here
                o = obs[mode]
                o.ids[job_id], o.submit[job_id], o.submit_s[job_id] = job, submitted, took
                mode_of[job_id] = mode
            try:
                active = [j for j in gateway.jobs() if j.job_id in mode_of]
            except SlurmError as exc:
                progress.end()
                say(f"   squeue did not answer ({exc}); retrying")
                time.sleep(1.0)
                continue
            seen = time.monotonic()
            alloc = Counter()
            states: dict[str, Counter] = {mode: Counter() for mode in obs}
            for j in active:
                mode = mode_of[j.job_id]
                states[mode][j.state.value.lower()] += 1
                outside = sorted({n for n, _, _ in j.gpu_alloc} - nodes[mode])
                if outside:
                    raise DemoError(f"job {j.job_id} of the {mode} run holds GPUs on {', '.join(outside)}, outside "
                                    f"its half ({', '.join(sorted(nodes[mode]))})")
                if j.state is JobState.RUNNING and j.gpu_alloc:
                    obs[mode].start.setdefault(j.job_id, seen)
                    alloc[mode] += sum(1.0 if s == 0 else s / 100 for _, _, s in j.gpu_alloc)
            listed = {j.job_id for j in active}
            for mode, o in obs.items():
                o.samples.append((seen, alloc[mode] / plan.gpus))
                for job_id in o.ids:
                    if job_id not in listed and job_id not in o.end:
                        o.end[job_id] = seen
                        o.start.setdefault(job_id, seen)
            progress.update(state_line(seen - t0, states, Counter(mode for mode, _ in pending.values())))
            if not pending and all(len(o.end) == len(o.ids) for o in obs.values()):
                break
            if seen - t0 > timeout_s:
                left = {mode: sorted(set(o.ids) - set(o.end)) for mode, o in obs.items()}
                raise DemoError(f"jobs did not finish within {timeout_s:.0f} s: {left} ({len(pending)} not "
                                f"submitted yet); see {work}")
            time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
    except BaseException:  # an error or Ctrl-C: submit nothing more, stop the helper, cancel what was submitted
        stop.set()
        progress.end()
        pool.shutdown(wait=True, cancel_futures=True)  # waiting threads return at once; one mid-command ends it
        _stop_helper(helper)
        if paired is not None:
            paired.stop()
        ended = {job_id for o in obs.values() for job_id in o.end}
        _cancel(gateway, sorted((set(mode_of) | _submitted(pending)) - ended), say)
        raise
    finally:
        stop.set()
        progress.end()
        pool.shutdown(wait=True, cancel_futures=True)
        _stop_helper(helper)
        if paired is not None:
            paired.stop()
        if log is not None:
            log.close()
    for mode, o in obs.items():
        o.wall_s = max(o.end.values()) - t0
        for job_id in o.ids:
            o.shapes[job_id] = _shapes_run(work / mode / f"{job_id}.out")
    if paired is not None:
        if paired.error is not None:
            raise paired.error
        obs["shadow"].actions = Counter(kind for p in paired.pairs for _, kind in p.acting)
    elif managed:
        obs["elastico"].actions = _actions(work / "elastico" / "sched.log")
    return obs


def _submitted(pending: dict[Future, tuple[str, workload.DemoJob]]) -> set[int]:
    """The ids of the jobs whose submission ended but the loop had not yet collected."""
    return {f.result()[0] for f in pending
            if f.done() and not f.cancelled() and f.exception() is None and f.result() is not None}


def _stop_helper(helper: subprocess.Popen | None) -> None:
    """Terminate the helper and wait for it (killed if it does not end within 30 s); nothing when it has ended."""
    if helper is None or helper.poll() is not None:
        return
    helper.terminate()
    try:
        helper.wait(timeout=30)
    except subprocess.TimeoutExpired:
        helper.kill()
        helper.wait(timeout=30)


def _cancel(gateway, job_ids: list[int], say: Callable[[str], None]) -> None:
    """Cancel the demo's jobs still running or waiting (scancel); a failure is said, never raised, so the error
    that stopped the demo is the one reported."""
    if not job_ids:
        return
    argv = commands.cancel(job_ids)
    try:
        done = gateway.runner(argv)
        problem = "" if done.returncode == 0 else f"exit {done.returncode}: {(done.stderr or done.stdout).strip()}"
    except Exception as exc:  # reported: the error that stopped the demo goes on
        problem = str(exc)
    ids = " ".join(map(str, job_ids))
    say(f"   cancelled the demo's job(s) {ids}" if not problem else
        f"   cancelling the demo's job(s) {ids} failed ({problem}); cancel them with: scancel {ids}")


def _submit_at(due: float, argv: list[str], env: dict, cwd: Path, job: workload.DemoJob,
               stop: threading.Event, quiet: threading.Lock | None = None) -> tuple[int, float, float] | None:
    """Submit `job` at `due` (monotonic clock), unless `stop` is set first (then None); returns its id, when Slurm
    had it (the command returned: the JCT counts from there, as the simulator's) and how long the command took.
    `quiet`: held while the submission runs (the shadow pass's paired epochs hold it: no job arrives between a
    shadow epoch and the acting one after it)."""
    if stop.wait(max(0.0, due - time.monotonic())):
        return None
    with quiet or contextlib.nullcontext():
        if stop.is_set():  # stopped while it waited for the lock
            return None
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
    """The acting helper's actions by kind (done) from its epochs' JSON lines."""
    counts: Counter[str] = Counter()
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            counts.update(a["kind"] for a in json.loads(line)["actions"] if a["status"] == "done")
    return counts
