"""Helper faults on the real local cluster: a helper SIGKILLed right after its requeuehold, slurmctld stopped
under `elastico sched --interval`, and two helpers on one cluster.

The jobs are a bash loop of fixed steps with a checkpoint file: on SIGTERM it finishes its step, takes a few
seconds to "checkpoint" (so Slurm shows it COMPLETING for that long, as a real checkpoint does), and exits; a
requeued run carries on from the checkpoint. Output is appended, so every step of every run is in one file
and "its work is intact" means: each step printed exactly once, in order, and the last one reached. No torch:
the file runs on both Slurm versions (`etc/dev/other-slurm` runs it in a Debian 13 chroot).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from slurm_elastico.cluster import daemons
from slurm_elastico.model import JobState
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.runner import SubprocessRunner
from slurm_elastico.store import Store

pytestmark = pytest.mark.live

ELASTICO = Path(sys.executable).with_name("elastico")
STEPS = 60
CHECKPOINT_S = 8  # how long the job takes to stop after SIGTERM (under the test cluster's KillWait of 30 s)

# Arguments: the directory of its checkpoint, its steps, the seconds its checkpoint takes. The step is saved by
# the shell itself: Slurm's SIGTERM reaches every process of the job, and on 24.11 it killed the `mv` that saved
# a step (the step then ran twice).
JOB = f"""#!/bin/bash
state="$1/$SLURM_JOB_ID.step"
steps=${{2:-{STEPS}}}
n=$(cat "$state" 2>/dev/null || echo 0)
echo "start restart=${{SLURM_RESTART_COUNT:-0}} at=$n gpus=$SLURM_JOB_GPUS mps=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
stop=0
trap 'stop=1' TERM
while [ "$n" -lt "$steps" ]; do
  sleep 0.25
  n=$((n + 1))
  echo "step $n"
  echo "$n" > "$state"
  if [ "$stop" = 1 ]; then echo "checkpointed at $n"; sleep ${{3:-{CHECKPOINT_S}}}; exit 0; fi
done
echo "done $n"
"""

# Fastest alone on a whole GPU: the planner moves a job running at 25 shares to 100 (a reshape_running).
FAMILY = """kind: train
name: faults-live
global_batch: 32
micro_batches: [8]
precisions: [fp32]
checkpointing: [false]
steps: 100000
mps_shares: [25, 100]
throughput_floor: 0.1
cpus: 1
host_mem_mib: 256
default: mb8-fp32-mps25
declared:
  mb8-fp32-mps25: {throughput: 1.0, gpu_mem_mib: 2000}
  mb8-fp32-mps100: {throughput: 3.0, gpu_mem_mib: 2000}
"""


class Site:
    """One helper's configuration and the jobs of one test; cancels them at the end."""

    def __init__(self, slurm_env: dict[str, str], root: Path, planner: dict | None = None):
        self.root, self.slurm_env = root, slurm_env
        root.mkdir(parents=True, exist_ok=True)
        self.conf = root / "elastico.yaml"
        self.conf.write_text(json.dumps({"state_dir": str(root / "state"), "slurm": {"conf": slurm_env["SLURM_CONF"]},
                                         "gpu": {"memory_mib": 16000}, **({"planner": planner} if planner else {})}))
        self.families = root / "families"
        self.families.mkdir(exist_ok=True)
        self.script = root / "job.sh"
        self.script.write_text(JOB)
        self.env = {**os.environ, **slurm_env}
        self.gateway = SlurmGateway(SubprocessRunner(env=slurm_env, timeout=30))
        self.ids: list[int] = []

    def submit(self, *opts: str, family: str | None = FAMILY, steps: int = STEPS, checkpoint_s: int = CHECKPOINT_S) -> int:
        """The step loop, `steps` steps, as a job with `family` (None: a plain job, which the helper leaves alone)."""
        job_id = self.sbatch(*opts, str(self.script), str(self.root), str(steps), str(checkpoint_s))
        if family is not None:
            (self.families / f"{job_id}.yaml").write_text(family)
        return job_id

    def sbatch(self, *argv: str) -> int:
        out = subprocess.run(["sbatch", "--parsable", "--requeue", "--open-mode=append", f"--output={self.root}/%j.out",
                              *argv], env=self.env, capture_output=True, text=True, timeout=30, check=True)
        job_id = int(out.stdout.strip().split(";")[0])
        self.ids.append(job_id)
        return job_id

    def sched(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(ELASTICO), "--config", str(self.conf), "sched", *args, "--families",
                               str(self.families)], env=env or self.env, capture_output=True, text=True, timeout=timeout)

    def start_helper(self, name: str, interval: float) -> subprocess.Popen:
        out = open(self.root / f"{name}.out", "w")
        err = open(self.root / f"{name}.err", "w")
        return subprocess.Popen([str(ELASTICO), "--config", str(self.conf), "sched", "--interval", str(interval),
                                 "--json", "--families", str(self.families)], env=self.env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL)

    def text(self, job_id: int) -> str:
        p = self.root / f"{job_id}.out"
        return p.read_text(errors="replace") if p.exists() else ""

    def journal(self, job_id: int | None = None) -> list[dict]:
        with Store(self.root / "state" / "elastico.sqlite") as store:
            rows = store.query("SELECT * FROM journal ORDER BY id")
        return [dict(r) for r in rows if job_id is None or r["job_id"] == job_id]

    def cancel(self) -> None:
        if self.ids:
            subprocess.run(["scancel", *map(str, self.ids)], env=self.env, capture_output=True, timeout=30)


def wait_for(what: str, predicate, timeout: float = 60, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def steps_of(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("step ")]


def assert_work_intact(site: Site, job_id: int, steps: int = STEPS) -> str:
    """The job ended, every step ran exactly once in order, the last one reached."""
    text = wait_for(f"job {job_id} to finish its {steps} steps", lambda: (t := site.text(job_id)) and
                    f"done {steps}" in t and t, timeout=120)
    assert steps_of(text) == list(range(1, steps + 1)), text
    return text


@pytest.fixture
def site(slurm_env, tmp_path):
    s = Site(slurm_env, tmp_path)
    yield s
    s.cancel()


def killing_scontrol(root: Path, step: str = "requeuehold *") -> Path:
    """A directory whose `scontrol` runs the real one and then SIGKILLs its caller after the command whose
    arguments match the shell pattern `step` succeeded (the helper dies right after that step). A space in
    `step` matches any one character (a `case` pattern cannot hold an unquoted space)."""
    real = shutil.which("scontrol")
    assert real, "scontrol is not on PATH"
    shim = root / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "scontrol").write_text(f"""#!/bin/sh
"{real}" "$@"
rc=$?
case "$*" in {step.replace(" ", "?")}) if [ "$rc" = 0 ]; then kill -KILL "$PPID"; fi ;; esac
exit "$rc"
""")
    (shim / "scontrol").chmod(0o755)
    return shim


def test_a_helper_killed_right_after_its_requeuehold_leaves_no_job_held(site):
    job = site.submit("--gres=mps:25")
    wait_for("the job to run", lambda: site.gateway.job(job).state is JobState.RUNNING)
    wait_for("a few steps", lambda: len(steps_of(site.text(job))) >= 8)
    dry = site.sched("--once", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert any(a["kind"] == "reshape_running" and a["job_id"] == job
               for a in json.loads(dry.stdout.splitlines()[-1])["actions"]), dry.stdout

    # The helper dies (SIGKILL) the moment its requeuehold returns, while the job checkpoints.
    shim = killing_scontrol(site.root)
    killed = site.sched("--once", "--json", env={**site.env, "PATH": f"{shim}{os.pathsep}{site.env['PATH']}"})
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stdout, killed.stderr)
    assert [r["status"] for r in site.journal(job) if r["kind"] == "reshape_running"] == ["planned"]
    assert site.gateway.job(job).state is JobState.COMPLETING  # still checkpointing

    # The next epoch at once: the job is still stopping, so its row stays open and the plan leaves it alone.
    first = site.sched("--once", "--json")
    assert first.returncode == 0, first.stderr
    epoch = json.loads(first.stdout.splitlines()[-1])
    assert any(f"job {job}:" in r and "still stopping" in r for r in epoch["recovered"]), epoch
    assert not any(a["job_id"] == job for a in epoch["actions"]), epoch
    assert [r["status"] for r in site.journal(job) if r["kind"] == "reshape_running"] == ["planned"]

    # Later epochs: once Slurm shows it held, the reshape is completed and the job released.
    def recovered():
        run = site.sched("--once", "--json")
        assert run.returncode == 0, run.stderr
        return [r for r in json.loads(run.stdout.splitlines()[-1])["recovered"] if f"job {job}: released" in r]

    notes = wait_for("an epoch that releases the job", recovered, timeout=90, every=1.0)
    assert "share 100" in notes[0], notes
    rows = [r for r in site.journal(job) if r["kind"] == "reshape_running"]
    assert [r["status"] for r in rows] == ["recovered"] and "released" in rows[0]["error"]
    wait_for("the job to run again", lambda: site.gateway.job(job).state is JobState.RUNNING)
    assert not site.gateway.job(job).held
    text = assert_work_intact(site, job)
    runs = [line for line in text.splitlines() if line.startswith("start ")]
    assert len(runs) == 2 and runs[1].endswith("mps=100"), text  # the reshape's new share, once
    assert not any(r["status"] == "planned" for r in site.journal())


# Every later step of a running job's reshape (the plan: AdminComment, then the reservation that keeps its place,
# requeuehold, Gres=, NodeList=, into the reservation, StartTime=now, release, out of the reservation, its
# deletion; see SlurmGateway.requeue_with_share): the helper dies right after it. The step right after
# requeuehold, while the job checkpoints, is the test above.
PLACE_STEPS = ["create reservation *", "update *Reservation=elastico-*", "update *Reservation=",
               "delete ReservationName=*"]
RESHAPE_STEPS = ["update *AdminComment=*", "update *Gres=mps:*", "update *NodeList=*", "update *StartTime=now*",
                 "release *", *PLACE_STEPS]


@pytest.mark.parametrize("step", RESHAPE_STEPS)
def test_a_helper_killed_after_any_step_of_a_reshape_leaves_no_job_held_and_runs_nothing_twice(site, step):
    job = site.submit("--gres=mps:25")
    wait_for("the job to run", lambda: site.gateway.job(job).state is JobState.RUNNING)
    wait_for("a few steps", lambda: len(steps_of(site.text(job))) >= 4)
    shim = killing_scontrol(site.root, step)
    killed = site.sched("--once", "--json", env={**site.env, "PATH": f"{shim}{os.pathsep}{site.env['PATH']}"})
    assert killed.returncode == -signal.SIGKILL, (step, killed.returncode, killed.stdout, killed.stderr)

    def settled():
        run = site.sched("--once", "--json")
        assert run.returncode == 0, run.stderr
        view = site.gateway.job(job)
        return (view.state in (JobState.RUNNING, JobState.COMPLETED) and not view.held and view.mps_share == 100
                and not any(r["status"] == "planned" for r in site.journal()))

    wait_for(f"epochs after a kill at {step!r} to settle the journal and run the job at share 100", settled,
             timeout=120, every=1.0)
    text = assert_work_intact(site, job)
    runs = [line for line in text.splitlines() if line.startswith("start ")]
    assert len(runs) == 2 and runs[1].endswith("mps=100"), (step, text)  # one requeue: no action ran twice
    # One reshape carried out, besides at most the one the kill cut off (after the reservation that precedes the
    # requeue, the job still runs and the next plan reshapes it); the start lines above are Slurm's one requeue.
    holds = Counter(r["status"] for r in site.journal(job) if r["kind"] == "reshape_running")
    assert set(holds) <= {"done", "recovered"} and holds["done"] <= 1 and 1 <= holds.total() <= 2, (step, holds)
    assert not site.gateway.job(job).held


def test_slurmctld_stopped_under_interval_is_an_outage_not_an_empty_cluster(site, slurm_cluster):
    running = site.submit("--gres=mps:100")
    wait_for("the job to run", lambda: site.gateway.job(running).state is JobState.RUNNING)
    err, out = site.root / "helper.err", site.root / "helper.out"
    helpers: list[subprocess.Popen] = []
    try:
        stopped_at = time.time()
        daemons.stop(slurm_cluster.layout.pid_file("slurmctld"), "slurmctld")
        try:
            once = site.sched("--once", "--json")
            assert once.returncode == 75 and once.stdout == "", (once.returncode, once.stdout, once.stderr)
            assert "Slurm is unavailable; planned nothing, changed nothing" in once.stderr, once.stderr
            helpers.append(site.start_helper("helper", 1.0))  # a helper started during the outage waits it out
            wait_for("two outage lines", lambda: err.read_text().count("Slurm is unavailable; planned nothing") >= 2,
                     timeout=90)
            time.sleep(5)
            assert helpers[0].poll() is None, err.read_text()  # an outage does not end the helper
            assert out.read_text() == "", "an epoch was planned during the outage"
        finally:
            slurm_cluster.up()
        restarted_at = time.time()
        assert not [r for r in site.journal() if stopped_at <= r["epoch"] < restarted_at], "acted during the outage"
        wait_for("the helper to see Slurm again", lambda: "Slurm answers again" in err.read_text(), timeout=120)
        # Work resumes: a job submitted now is planned (its share set, started now) by the same helper.
        fresh = site.submit("--gres=mps:25", "--begin=now+600")
        wait_for("the helper to start the new job", lambda: site.gateway.job(fresh).state is JobState.RUNNING,
                 timeout=60)
        assert site.journal(fresh) and all(r["status"] == "done" for r in site.journal(fresh))
    finally:
        for h in helpers:
            h.terminate()
            h.wait(timeout=30)
    assert_work_intact(site, running)  # the job that ran through the outage lost nothing
    text = err.read_text()
    assert "next try in" in text and "epoch failed" not in text, text  # outages only, no other failure


def test_a_second_helper_on_the_cluster_is_refused_naming_the_first(site, tmp_path):
    first = site.start_helper("first", 5.0)
    other = Site(site.slurm_env, tmp_path / "other")  # another state directory, the same cluster
    try:
        wait_for("the first helper's epoch", lambda: (site.root / "first.out").read_text().count("\n") >= 1)
        second = subprocess.run([str(ELASTICO), "--config", str(other.conf), "sched", "--interval", "5"],
                                env=other.env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1, (second.stdout, second.stderr)
        assert f"another elastico helper already runs for cluster" in second.stderr
        assert f"pid {first.pid}" in second.stderr and second.stdout == ""
        once = other.sched("--once")
        assert once.returncode == 0 and "this epoch is skipped" in once.stderr and "epoch at" not in once.stdout
        assert first.poll() is None
    finally:
        first.terminate()
        first.wait(timeout=30)
    after = other.sched("--once")
    assert after.returncode == 0 and "epoch at" in after.stdout, after.stderr  # the lock went with its process
