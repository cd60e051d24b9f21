"""A helper SIGKILLed after each step of every action sequence, on the real local cluster.

test_helper_faults_live kills the helper during a running job's share reshape; this file does the same for
the other sequences the planner writes: the start of a pending job on a share (AdminComment, Gres=mps,
NodeList=, StartTime=now) and on whole GPUs (AdminComment, Gres=gpu NumNodes NodeList, StartTime=now), a
running job's GPU-count reshape (AdminComment, requeuehold, Gres=gpu, StartTime=now, release, and the
reservation that keeps its place meanwhile: created, entered, left, deleted), and a
preemption (AdminComment with elastico:held=1, requeuehold) with its resume (Gres=gpu, NodeList=,
StartTime=now, release). The helper dies right after the chosen `scontrol` command succeeded (a wrapper
`scontrol` kills its caller; see `killing_scontrol`); then plain epochs run until the journal is settled.

Each case then checks the three things a crash must not break: no job is left held (a preempted job is held
only until its resume, marked `elastico:held=1` meanwhile), no action ran twice (Slurm's restart count and
the job's own start lines: one start per intended run; the journal: each requeue and each start once), and the
job's work is exact (each step once, in order, to the last). The jobs are the bash step loop of
test_helper_faults_live (no torch), so the file runs on both Slurm versions.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from slurm_elastico.model import JobState
from slurm_elastico.shapes.current import PREEMPTED_MARK, preempted_by_us

from test_helper_faults_live import FAMILY as SHARE_FAMILY
from test_helper_faults_live import PLACE_STEPS, Site, assert_work_intact, killing_scontrol, wait_for

pytestmark = pytest.mark.live

# A restart costs 0.5 s to the planner: a running gang job may be reshaped or preempted once its life reaches ten
# restart costs per restart (planner.running.RESTART_BUDGET), 5 s for the first, so the cases need not wait long.
PLANNER = {"reshape_cost_s": 0.5}
CHECKPOINT_S = 3  # the step loop's checkpoint after SIGTERM: the job is COMPLETING this long


def gang_family(steps: int, gpus: list[int]) -> str:
    """A data-parallel family on whole GPUs: fastest on the most GPUs; `steps` is what the planner expects."""
    speed = {2: 1.9, 4: 3.6}
    return f"""kind: train
name: kill-gang
global_batch: 32
micro_batches: [8]
precisions: [fp32]
checkpointing: [false]
steps: {steps}
gpus: {gpus}
gpus_per_node: 4
throughput_floor: 0.1
cpus: 1
host_mem_mib: 256
default: mb8-fp32-gpus{gpus[0]}
declared:
""" + "".join(f"  mb8-fp32-gpus{n}: {{throughput: {speed[n]}, gpu_mem_mib: 2000}}\n" for n in gpus)


@pytest.fixture
def site(slurm_env, tmp_path):
    s = Site(slurm_env, tmp_path, planner=PLANNER)
    yield s
    s.cancel()


def wait_running(site: Site, job_id: int, what: str, gpus: int | None = None) -> None:
    """Wait for the job to run (on `gpus` GPUs when given); on a timeout, every job Slurm lists."""
    def running():
        view = site.gateway.job(job_id)
        return view.state is JobState.RUNNING and (gpus is None or len(view.gpu_alloc) == gpus)
    try:
        wait_for(what, running)
    except AssertionError as exc:
        queue = subprocess.run(["squeue", "--all", "--format=%i %T %r %b %N %S"], env=site.env, capture_output=True,
                               text=True, timeout=30).stdout
        raise AssertionError(f"{exc}\nsqueue:\n{queue}") from None


def epoch(site: Site) -> dict:
    run = site.sched("--once", "--json")
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr)
    return json.loads(run.stdout.splitlines()[-1])


def killed_at(site: Site, step: str, tries: int = 40) -> None:
    """Epochs under the killing `scontrol` until one dies right after `step` (earlier ones may not reach it)."""
    shim = killing_scontrol(site.root, step)
    env = {**site.env, "PATH": f"{shim}{os.pathsep}{site.env['PATH']}"}
    for _ in range(tries):
        run = site.sched("--once", "--json", env=env)
        if run.returncode == -signal.SIGKILL:
            return
        assert run.returncode == 0, (step, run.returncode, run.stdout, run.stderr)
    raise AssertionError(f"no epoch of {tries} reached {step!r}")


def settle(site: Site, what: str, done, timeout: float = 120) -> None:
    """Plain epochs until `done()` holds and no journal row is open; on a timeout, what the last epochs did."""
    seen: list[dict] = []

    def settled():
        seen.append(epoch(site))
        return done() and not any(r["status"] == "planned" for r in site.journal())

    try:
        wait_for(what, settled, timeout=timeout, every=1.0)
    except AssertionError as exc:
        acted = [{k: e[k] for k in ("actions", "recovered", "notes")} for e in seen if e["actions"] or e["recovered"]]
        rows = [(r["job_id"], r["kind"], r["status"], r["error"]) for r in site.journal()]
        raise AssertionError(f"{exc}\nepochs that acted or recovered: {acted[-6:]}\njournal: {rows}\n"
                             f"jobs: {[site.gateway.job(j) for j in site.ids]}") from None


def starts(site: Site, job_id: int) -> list[dict[str, str]]:
    """The job's start lines (one per run), as fields."""
    return [dict(kv.split("=", 1) for kv in line.split()[1:])
            for line in site.text(job_id).splitlines() if line.startswith("start ")]


def assert_journal_once(site: Site, job_id: int, **expected: int) -> None:
    """Every row of the job is settled, and each kind in `expected` (a requeue or a start: never safe to repeat)
    has that many rows carried out, besides at most the one the kill cut off ('recovered').

    The journal alone cannot say whether the cut-off one took effect (a kill after the reservation that precedes
    a requeue leaves the job running, and the next plan reshapes it); Slurm's own restart count, which the
    cases check, does. An update of the request (AdminComment=, Gres=, NodeList=) that a crash cut off may be
    issued again by the next plan, with the same value."""
    rows = site.journal(job_id)
    assert rows and all(r["status"] in ("done", "recovered", "failed") for r in rows), rows
    for kind, n in expected.items():
        done = [r for r in rows if r["kind"] == kind and r["status"] == "done"]
        cut = [r for r in rows if r["kind"] == kind and r["status"] == "recovered"]
        assert len(done) <= n and len(cut) <= 1 and n <= len(done) + len(cut), (
            kind, [(r["kind"], r["status"], r["error"]) for r in rows])


# --------------------------------------------------------------------------- start of a pending job

START_SHARE = ["update *AdminComment=*", "update *Gres=mps:*", "update *NodeList=*", "update *StartTime=now*"]
START_GPUS = ["update *AdminComment=*", "update *Gres=gpu:*", "update *StartTime=now*"]


@pytest.mark.parametrize("kind,step", [("share", s) for s in START_SHARE] + [("gpus", s) for s in START_GPUS])
def test_a_helper_killed_while_starting_a_pending_job_starts_it_once(site, kind, step):
    steps = 16
    if kind == "share":  # at 25 shares; the plan: its fastest shape alone, 100 shares
        job = site.submit("--gres=mps:25", "--begin=now+600", steps=steps, checkpoint_s=CHECKPOINT_S)
    else:  # on one GPU; the plan: its fastest shape, 4 whole GPUs on one node
        job = site.submit("--gres=gpu:1", "--nodes=1", "--begin=now+600", family=gang_family(100000, [2, 4]),
                          steps=steps, checkpoint_s=CHECKPOINT_S)
    killed_at(site, step)
    assert any(r["status"] == "planned" for r in site.journal(job)), site.journal(job)  # the step's row is open

    def running():
        view = site.gateway.job(job)
        if view.state not in (JobState.RUNNING, JobState.COMPLETED) or view.held:
            return False
        return view.mps_share == 100 if kind == "share" else len(view.gpu_alloc) == 4 or view.state is JobState.COMPLETED

    settle(site, f"the job started after a kill at {step!r}", running)
    assert_work_intact(site, job, steps)
    runs = starts(site, job)
    assert len(runs) == 1 and runs[0]["restart"] == "0", (step, runs)  # started once, never requeued
    if kind == "share":
        assert runs[0]["mps"] == "100", runs
    else:
        assert len(runs[0]["gpus"].split(",")) == 4, runs
    assert_journal_once(site, job, start_now=1)
    assert not any(r["status"] == "planned" for r in site.journal())


# --------------------------------------------------------------------------- a running job's GPU count

RESHAPE_GPUS = ["update *AdminComment=*", "requeuehold *", "update *Gres=gpu:*", "update *StartTime=now*",
                "release *", *PLACE_STEPS]


@pytest.mark.parametrize("step", RESHAPE_GPUS)
def test_a_helper_killed_during_a_gpu_count_reshape_requeues_the_job_once_to_its_new_count(site, step):
    steps = 80
    job = site.submit("--gres=gpu:2", "--nodes=1", family=gang_family(100000, [2, 4]), steps=steps,
                      checkpoint_s=CHECKPOINT_S)
    wait_running(site, job, "the job to run on 2 GPUs", gpus=2)
    killed_at(site, step)  # its first epochs leave it (it just started); then it grows to 4 GPUs

    def grown():
        view = site.gateway.job(job)
        return view.state is JobState.RUNNING and not view.held and len(view.gpu_alloc) == 4

    settle(site, f"the job running on 4 GPUs after a kill at {step!r}", grown)
    assert site.gateway.job(job).restarts == 1  # Slurm's own count: requeued once
    assert_work_intact(site, job, steps)
    runs = starts(site, job)
    assert [(r["restart"], len(r["gpus"].split(","))) for r in runs] == [("0", 2), ("1", 4)], (step, runs)
    assert_journal_once(site, job, reshape_running=1)


# --------------------------------------------------------------------------- preemption and resume

# Kill the preemption at one step and the resume at another: each step of each is killed once in the four cases.
PREEMPT = ["update?JobId={job}?AdminComment=*{mark}*", "requeuehold {job}"]
RESUME = ["update?JobId={job}?Gres=gpu:*", "update?JobId={job}?NodeList=*", "update?JobId={job}?StartTime=now",
          "release {job}"]


@pytest.mark.parametrize("preempt_step,resume_step", [(PREEMPT[i % 2], r) for i, r in enumerate(RESUME)],
                         ids=["comment+gres", "requeuehold+nodelist", "comment+starttime", "requeuehold+release"])
def test_a_helper_killed_during_a_preemption_and_during_the_resume_holds_the_job_only_between_them(
        site, preempt_step, resume_step):
    # Three nodes' GPUs are taken by a job the helper does not manage; a long job holds the fourth node's four.
    # The case needs every GPU: it waits for the jobs of earlier tests to be gone (in one run the filler did not
    # get the first three nodes and the long job waited over 60 s for the fourth).
    try:
        wait_for("the cluster to be idle", lambda: not site.gateway.jobs(), timeout=120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {site.gateway.jobs()}") from None
    filler = site.sbatch("--gres=gpu:4", "--nodes=3", "--wrap=sleep 600")
    wait_running(site, filler, "the filler to run")
    long_steps, short_steps = 100, 12
    long = site.submit("--gres=gpu:4", "--nodes=1", family=gang_family(100000, [4]), steps=long_steps,
                       checkpoint_s=CHECKPOINT_S)
    wait_running(site, long, "the long job to run")
    # A much shorter job asks for the same four GPUs: the allotment gives them to it and preempts the long one.
    short = site.submit("--gres=gpu:1", "--nodes=1", "--begin=now+600", family=gang_family(20, [4]),
                        steps=short_steps, checkpoint_s=CHECKPOINT_S)
    killed_at(site, preempt_step.format(job=long, mark=PREEMPTED_MARK))

    def preempted():
        view = site.gateway.job(long)
        return view.state is JobState.PENDING and view.held and site.gateway.job(short).state in (
            JobState.RUNNING, JobState.COMPLETING, JobState.COMPLETED)

    settle(site, f"the long job held and the short one started after a kill at {preempt_step!r}", preempted)
    view = site.gateway.job(long)
    assert preempted_by_us(view.admin_comment), view.admin_comment  # held by the policy, and marked so

    killed_at(site, resume_step.format(job=long), tries=60)  # epochs pass until the short job ends

    def resumed():
        view = site.gateway.job(long)
        return (view.state in (JobState.RUNNING, JobState.COMPLETED) and not view.held
                and not preempted_by_us(view.admin_comment))  # the mark is lifted once it runs

    settle(site, f"the long job running again after a kill at {resume_step!r}", resumed)
    assert site.gateway.job(long).restarts == 1  # Slurm's own count: requeued once, by the preemption
    assert_work_intact(site, short, short_steps)
    assert_work_intact(site, long, long_steps)
    assert [r["restart"] for r in starts(site, long)] == ["0", "1"], site.text(long)
    assert [r["restart"] for r in starts(site, short)] == ["0"], site.text(short)
    assert_journal_once(site, long, preempt=1, resume=1)
    assert_journal_once(site, short, start_now=1)
    assert not any(r["status"] == "planned" for r in site.journal())
