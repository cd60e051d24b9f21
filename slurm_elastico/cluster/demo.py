"""The main job (`elastico demo`), end to end on the local development cluster (`cluster.local`) with fake GPUs.

1. Bring the local cluster up (slurmctld, 4 slurmd × 4 fake GPUs, MPS, slurmdbd
   + MariaDB for sacct).
2. Submit a mixed workload through `elastico-submit`: tiny PyTorch training
   jobs and tiny offline-inference jobs, each with its shape family.
3. Run the helper (`elastico sched --interval`) while the jobs run: it sets
   the shape and share of pending jobs, starts them, and reshapes running
   ones when that pays.
4. Check the work (every training job did exactly its steps; every inference
   job answered each request once) and print the report (`elastico report`).

The fake GPUs make no job faster or slower: the demo shows the mechanics and
the accounting, not speed-ups; `elastico sim` measures those.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slurm_elastico.cluster.local import LocalCluster
from slurm_elastico.cluster.programs import program, typed
from slurm_elastico.errors import ElasticoError
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.runner import SubprocessRunner
from slurm_elastico.store import Store

EXAMPLES = Path(__file__).resolve().parents[2] / "wrappers" / "examples"


class DemoError(ElasticoError):
    """The demo's workload did not finish as it must (names the job and what went wrong)."""


@dataclass(frozen=True)
class Workload:
    train_jobs: int = 14
    infer_jobs: int = 6
    step_sleep_s: float = 1.0  # makes each job last long enough for the helper to act on it
    batch_sleep_s: float = 2.0
    interval_s: float = 3.0
    timeout_s: float = 420.0


def _bin(name: str) -> str:
    return str(program(name))


def settings_yaml(state: Path, slurm_conf: Path) -> str:
    return json.dumps({
        "state_dir": str(state),
        "slurm": {"conf": str(slurm_conf)},
        "gpu": {"memory_mib": 16384, "type": "fake"},
        "planner": {"reshape_cost_s": 10.0},
        "submit": {"placement_window_s": 20, "grace_s": 15},
    }, indent=2)


def run(state_dir: str | None, workload: Workload = Workload(), say: Callable[[str], None] = print,
        keep: bool = True) -> dict:
    """Run the demo; returns the report as a dict. Raises `DemoError` when the work is not exactly done."""
    cluster = LocalCluster.from_state_dir(state_dir, accounting=True)
    say(f"== 1. local Slurm cluster in {cluster.state_dir}")
    up = cluster.up()
    say(f"   {up.version}: {'already running' if up.already_running else f'started in {up.seconds:.1f} s'}")
    work = cluster.state_dir / "demo" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    conf = work / "elastico.yaml"
    conf.write_text(settings_yaml(work / "state", cluster.slurm_conf))
    env = {**os.environ, **cluster.env(), "ELASTICO_CONFIG": str(conf),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    gateway = SlurmGateway(SubprocessRunner(env=cluster.env()))
    started = time.time()
    start_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started - 1))

    say(f"== 2. submitting {workload.train_jobs} training and {workload.infer_jobs} inference jobs with elastico-submit")
    jobs: dict[int, str] = {}
    for i in range(workload.train_jobs):
        jobs[_submit(env, work, "train_tiny", i, ["--step-sleep", str(workload.step_sleep_s)])] = "train"
    for i in range(workload.infer_jobs):
        jobs[_submit(env, work, "infer_tiny", i, ["--batch-sleep", str(workload.batch_sleep_s),
                                                   "--requests", str(EXAMPLES / "requests.jsonl")])] = "infer"
    say(f"   jobs {', '.join(map(str, jobs))}: pending for the placement window, so the helper shapes them first")

    say(f"== 3. the helper: elastico sched --interval {workload.interval_s:g} (log: {work / 'sched.log'})")
    with open(work / "sched.log", "w") as log:
        helper = subprocess.Popen([_bin("elastico"), "sched", "--interval", str(workload.interval_s), "--json"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            _wait_done(gateway, set(jobs), workload.timeout_s, say)
        finally:
            helper.terminate()
            helper.wait(timeout=30)
    say(f"   all jobs finished in {time.time() - started:.0f} s; the helper's actions: {_actions(work / 'sched.log')}")

    say("== 4. checking the work and reporting")
    for job_id, kind in jobs.items():
        _check_output(work / f"{job_id}.out", job_id, kind)
    say("   every training job ran exactly its steps; every inference job answered each request once")
    report = subprocess.run([_bin("elastico"), "report", "--start", start_text, "--plot", str(work / "jct.png")],
                            env=env, capture_output=True, text=True, timeout=120)
    if report.returncode != 0:
        raise DemoError(f"elastico report failed: {report.stderr.strip()}")
    say(report.stdout.rstrip())
    say(f"   JCT plot: {work / 'jct.png'}")
    say(f"   {_observed(work / 'state' / 'elastico.sqlite')}")
    data = json.loads(subprocess.run([_bin("elastico"), "report", "--start", start_text, "--format", "json"],
                                     env=env, capture_output=True, text=True, timeout=120, check=True).stdout)
    if not keep:
        cluster.down()
        say("== cluster stopped")
    else:
        say(f"== the cluster keeps running; stop it with: {typed('elastico')} cluster down "
            f"--state-dir {shlex.quote(str(cluster.state_dir))}")
    return data


def _submit(env: dict, work: Path, example: str, index: int, extra: list[str]) -> int:
    argv = [_bin("elastico-submit"), "--parsable", f"--job-name=demo-{example}-{index}", f"--output={work}/%j.out",
            "--family", str(EXAMPLES / f"{example}.family.yaml"), str(EXAMPLES / f"{example}.py"), *extra]
    # Submitted from the work directory: jobs run there and keep their checkpoints under it.
    out = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise DemoError(f"elastico-submit of {example} failed ({out.returncode}): {out.stderr.strip()}")
    return int(out.stdout.strip().split(";")[0])


def _wait_done(gateway: SlurmGateway, ids: set[int], timeout_s: float, say: Callable[[str], None]) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        active = [j for j in gateway.jobs() if j.job_id in ids]
        if not active:
            return
        states = Counter(j.state.value.lower() for j in active)
        line = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        if line != last:
            say(f"   {line}")
            last = line
        time.sleep(2)
    raise DemoError(f"jobs {sorted(j.job_id for j in gateway.jobs() if j.job_id in ids)} did not finish "
                    f"within {timeout_s:.0f} s")


def _actions(log: Path) -> str:
    counts: Counter[str] = Counter()
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            counts.update(a["kind"] for a in json.loads(line)["actions"] if a["status"] == "done")
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none"


def _observed(store_path: Path) -> str:
    """What the helper learned from the jobs' progress reports (see slurm_elastico.helper.observe)."""
    from slurm_elastico.interference.measurements import load_from_store
    from slurm_elastico.helper.observe import SOURCE

    with Store(store_path) as store:
        obs = load_from_store(store, source=SOURCE)
    if not obs:
        return ("progress reports: no pair of jobs ran side by side long enough, with both solo speeds known, "
                "to be observed")
    norms = [x for o in obs for x in (o.norm_a, o.norm_b)]
    return (f"progress reports: {len(obs)} co-located pair(s) observed, jobs at {min(norms):.2f}-{max(norms):.2f} "
            f"of their solo speed (store table `colocation`, source '{SOURCE}')")


def _check_output(path: Path, job_id: int, kind: str) -> None:
    """The last JSON line of the job's final run says the work is complete."""
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("{")] if path.exists() else []
    if not lines:
        raise DemoError(f"job {job_id} ({kind}) printed no summary; see {path}")
    last = json.loads(lines[-1])
    if kind == "train" and not (last.get("status") == "done" and last.get("step") == 20):
        raise DemoError(f"training job {job_id} ended at step {last.get('step')} ({last.get('status')}); see {path}")
    if kind == "infer" and not (last.get("done") == last.get("total") == 24):
        raise DemoError(f"inference job {job_id} answered {last.get('done')}/{last.get('total')}; see {path}")
