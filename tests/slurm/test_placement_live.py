"""The placement the plan assumes is the one Slurm makes, and a requeued job keeps its place (real local cluster).

Slurm, not the helper, picks the GPU on the node the helper pins; `planner.gpu_choice` models its rule and the
planner follows it. Here the rule is checked against what Slurm really gives (each job's `gres_detail`, read back
through squeue), then the real planner's plan against Slurm's placement of the plan's jobs, and then the requeue
gap: a reshaped job's GPU is wanted by a plain pending job, and the reshaped job must get it back.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.helper.executor import execute
from slurm_elastico.helper.journal import MemoryJournal
from slurm_elastico.model import Family, JobState, NodeView, Resources, Shape
from slurm_elastico.planner import run_epoch
from slurm_elastico.planner.gpu_choice import lowest_unused, mps_gpu, whole_gpus
from slurm_elastico.slurm import commands
from slurm_elastico.slurm.gateway import SlurmGateway
from tests.synthetic import family

from live_helpers import wait_for

pytestmark = pytest.mark.live


class Jobs:
    """Plain sbatch jobs (argv, no shell) that sleep; every one is cancelled afterwards."""

    def __init__(self, env: dict[str, str], gateway: SlurmGateway):
        self.env, self.gateway, self.ids = {**os.environ, **env}, gateway, []

    def submit(self, node: str, gres: str, *options: str) -> int:
        """A job asking `gres` on `node` ("": anywhere)."""
        where = [f"--nodelist={node}"] if node else []
        done = subprocess.run(["sbatch", "--parsable", *where, f"--gres={gres}", "--output=/dev/null",
                               "--requeue", *options, "--wrap", "sleep 600"],
                              env=self.env, capture_output=True, text=True, timeout=30, check=True)
        self.ids.append(int(done.stdout.strip().split(";")[0]))
        return self.ids[-1]

    def gpus(self, job_id: int, timeout: float = 60) -> tuple[tuple[str, int, int], ...]:
        """(node, GPU index, shares; 0 = whole) of the job once it runs, from squeue's gres_detail."""
        view = wait_for(lambda: (v := self.gateway.job(job_id)).state is JobState.RUNNING and v.gpu_alloc and v,
                        f"job {job_id} running with its GPUs", timeout)
        return view.gpu_alloc

    def node(self, name: str) -> NodeView:
        return self.gateway.snapshot().node(name)


@pytest.fixture
def jobs(slurm_env, gateway):
    j = Jobs(slurm_env, gateway)
    yield j
    if j.ids:
        subprocess.run(commands.cancel(j.ids), env=j.env, capture_output=True, timeout=30)
        wait_for(lambda: not any(v.state.active for v in gateway.jobs() if v.job_id in j.ids),
                 "the test's jobs to end", 60)


def slurm_free(node: NodeView) -> tuple[list[int], list[bool]]:
    """Per GPU of the node, in index order: MPS shares free as Slurm counts them, and whether it is held whole."""
    return [g.shares_free for g in node.gpus], [g.held_whole for g in node.gpus]


def test_mps_shares_go_to_the_gpu_the_model_says(jobs):
    # 50, 70, 30, 40 on one node: first fit gives GPUs 0, 1, 0, 2 (best fit would put the 30 on GPU 1, spread
    # on GPU 2); then an mps:20 next to a GPU held whole goes past it.
    node = "n1"
    seen = []
    for share in (50, 70, 30, 40):
        free, whole = slurm_free(jobs.node(node))
        want = mps_gpu(free, share, whole)
        got = jobs.gpus(jobs.submit(node, f"mps:{share}"))
        seen.append((share, free, want, got))
        assert got == ((node, want, share),), seen
    print("mps first fit:", [(s, w) for s, _, w, _ in seen])
    assert [w for *_, w, _ in seen] == [0, 1, 0, 2]


def test_whole_gpus_go_to_the_lowest_not_held_whole(jobs, gateway):
    node = "n2"
    first = jobs.gpus(jobs.submit(node, "gpu:1"))
    assert first == ((node, 0, 0),)
    free, whole = slurm_free(jobs.node(node))
    share = jobs.gpus(jobs.submit(node, "mps:20"))
    assert share == ((node, mps_gpu(free, 20, whole), 20),) == ((node, 1, 20),)  # past the GPU held whole
    # gpu:2 now: 22.05 takes the two lowest not held whole, GPUs 1 and 2, though GPU 1 has an MPS user; 24.11
    # the two lowest idle ones, 2 and 3. The planner's rule, right on both, does not ask this node for a pair.
    view = jobs.node(node)
    idle = [not g.users for g in view.gpus]
    assert whole_gpus(idle, 2, [g.held_whole for g in view.gpus]) == ()
    pair = jobs.submit(node, "gpu:2")
    taken = sorted(i for _, i, _ in jobs.gpus(pair))
    version = gateway.snapshot().slurm_version
    print(f"Slurm {version}: gpu:2 beside an MPS user on GPU 1 of {node} took GPUs {taken}")
    assert taken == ([1, 2] if version.startswith("22.") else [2, 3])
    if lowest_unused(version):  # the planner's rule for this version names exactly the GPUs Slurm took
        assert list(whole_gpus(idle, 2, [g.held_whole for g in view.gpus], idle)) == taken


FILLER = 100  # a whole GPU's shares


def test_the_plan_puts_each_job_on_the_gpu_slurm_gives_it(jobs, gateway):
    """The real planner on the live snapshot: every started job runs on the node and GPU the plan named."""
    for node in ("n2", "n3", "n4"):  # only n1 has room, so the plan's GPU choice within n1 is what is tested
        for _ in range(4):
            jobs.submit(node, f"mps:{FILLER}")
    jobs.submit("n1", "mps:50")
    jobs.submit("n1", "mps:70")
    for j in jobs.ids:
        jobs.gpus(j)
    # Pending in a placement window (as elastico-submit makes them): the plan sets the node and starts them.
    fams = {}
    for share in (30, 60):
        job = jobs.submit("", f"mps:{share}", "--begin=now+3600")
        fams[job] = family((share, 1.0, 1000))
    wait_for(lambda: all(gateway.job(j).reason == "BeginTime" for j in fams), "the new jobs to wait for BeginTime")
    snap = gateway.snapshot()
    plan = run_epoch(snap, fams, Settings(), None, time.time())
    placed = {p.job_id: (p.node, p.gpu) for p in plan.placements}
    # GPU 0 has 50 free and GPU 1 30: Slurm gives the 30 GPU 0 (best fit would have said GPU 1); the 60 then
    # fits neither and goes to GPU 2.
    assert placed == {min(fams): ("n1", 0), max(fams): ("n1", 2)}, (plan.actions, plan.notes)
    outcomes = execute(plan.actions, gateway, MemoryJournal(), time.time())
    assert all(o.status == "done" for o in outcomes), outcomes
    for job, (node, gpu) in placed.items():
        assert jobs.gpus(job) == ((node, gpu, fams[job].shapes[0].resources.mps),)


def test_the_plan_puts_a_gang_where_slurm_puts_it_beside_an_mps_user(jobs, gateway):
    """The real planner on the live snapshot, with the live Slurm version: a pending job of two whole GPUs, and the
    only node with room has an MPS user on GPU 0. From 24.11 Slurm gives `gpu:2` GPUs 1 and 2 there and the plan
    says so; before (22.05) Slurm would put it on GPUs 0 and 1, beside the MPS user, so the plan does not start it."""
    for node in ("n2", "n3", "n4"):  # only n1 has room
        for _ in range(4):
            jobs.submit(node, f"mps:{FILLER}")
    jobs.submit("n1", "mps:20")
    for j in jobs.ids:
        jobs.gpus(j)
    job = jobs.submit("", "gpu:2", "--begin=now+3600")
    pair = Family(kind="train", shapes=(Shape("gpus2", Resources(0, 1000, 1, 1024, gpus=2), 1.0),), total_work=1000.0)
    wait_for(lambda: gateway.job(job).reason == "BeginTime", "the pair to wait for BeginTime")
    snap = gateway.snapshot()
    plan = run_epoch(snap, {job: pair}, Settings(), None, time.time())
    placed = [(p.node, p.gpu) for p in plan.placements if p.job_id == job]
    print(f"Slurm {snap.slurm_version}: the plan puts gpu:2 beside mps:20 on GPU 0 of n1 at {placed}")
    if not lowest_unused(snap.slurm_version):
        assert placed == [], (plan.actions, plan.notes)
        return
    assert placed == [("n1", 1)], (plan.actions, plan.notes)
    outcomes = execute(plan.actions, gateway, MemoryJournal(), time.time())
    assert all(o.status == "done" for o in outcomes), outcomes
    assert sorted(jobs.gpus(job)) == [("n1", 1, 0), ("n1", 2, 0)]


@pytest.mark.parametrize("last_priority", [1_000, 2_000_000])
def test_jobs_started_in_one_epoch_run_where_the_plan_put_them(jobs, gateway, last_priority):
    """Slurm starts the jobs of one plan in its priority order, one possibly before the next is released; the
    plan places a gang after the shares. With a share at the head (GPU 0 of n1), a gang next and another share
    last, Slurm starts the gang before the last share: a plan that counted that share's GPU as used would put the
    gang on GPUs 2 and 3 where Slurm (24.11) takes GPUs 1 and 2, the share's. With the last share first in
    priority (it has the highest id; 22.05's default priority/basic ranks it so too), Slurm gives it GPU 0: a plan
    that released the shares in id order had Slurm start the first released at once on GPU 0 (CI, 22.05.8).
    Every job the plan starts runs where it said."""
    for node in ("n2", "n3", "n4"):  # only n1 has room
        for _ in range(4):
            jobs.submit(node, f"mps:{FILLER}")
    for j in jobs.ids:
        jobs.gpus(j)
    shares = family((50, 1.0, 1000), (FILLER, 1.5, 1000))
    head, gang, last = (jobs.submit("", gres, "--begin=now+3600") for gres in ("mps:50", "gpu:2", "mps:50"))
    for job, priority in ((head, 1_000_000), (gang, 500_000), (last, last_priority)):
        subprocess.run(["scontrol", "update", f"JobId={job}", f"Priority={priority}"], env=jobs.env, check=True,
                       capture_output=True, timeout=30)
    fams = {head: shares, last: shares,
            gang: Family(kind="train", shapes=(Shape("gpus2", Resources(0, 1000, 1, 1024, gpus=2), 1.0),),
                         total_work=1000.0)}
    wait_for(lambda: all(gateway.job(j).reason == "BeginTime" for j in fams), "the new jobs to wait for BeginTime")
    snap = gateway.snapshot()
    plan = run_epoch(snap, fams, Settings(), None, time.time())
    placed = {p.job_id: (p.node, p.gpu) for p in plan.placements}
    print(f"Slurm {snap.slurm_version}: planned {placed}")
    assert {head, last} <= set(placed), (plan.actions, plan.notes)
    outcomes = execute(plan.actions, gateway, MemoryJournal(), time.time())
    assert all(o.status == "done" for o in outcomes), outcomes
    ran = {job: jobs.gpus(job) for job in placed}
    print(f"Slurm {snap.slurm_version}: ran {ran}")
    for job, (node, gpu) in placed.items():
        assert min(ran[job])[:2] == (node, gpu), (placed, ran)


def _full_node_and_rival(jobs, gateway, node: str) -> tuple[int, int, tuple[str, int, int]]:
    """`node`'s four GPUs held by four mps:100 jobs, and a plain mps:100 job pending for one; (job on the last GPU,
    the rival, where that job runs)."""
    for _ in range(3):
        jobs.submit(node, f"mps:{FILLER}")
    for j in list(jobs.ids):
        jobs.gpus(j)
    job = jobs.submit(node, f"mps:{FILLER}")
    (where,) = jobs.gpus(job)
    rival = jobs.submit(node, f"mps:{FILLER}")  # a plain job waiting for exactly that GPU
    wait_for(lambda: gateway.job(rival).reason == "Resources", "the rival to wait for resources")
    return job, rival, where


def test_without_its_place_kept_a_reshaped_job_loses_its_gpu_to_a_pending_job(jobs, gateway):
    """The gap as it was (requeuehold, update, StartTime=now, release 2 s after the hold; no reservation): the
    pending job starts on the GPU the moment the reshaped job ends, which is why the gateway keeps its place."""
    job, rival, where = _full_node_and_rival(jobs, gateway, "n2")
    began = time.monotonic()
    subprocess.run(commands.requeue_hold(job), env=jobs.env, check=True, capture_output=True, timeout=30)
    gateway.wait_state(job, (JobState.PENDING,), 60)
    for argv in (commands.set_share(job, 50), commands.set_nodes(job, ("n2",)), commands.start_now(job)):
        subprocess.run(argv, env=jobs.env, check=True, capture_output=True, timeout=30)
    time.sleep(max(0.0, began + 2 - time.monotonic()))
    subprocess.run(commands.release(job), env=jobs.env, check=True, capture_output=True, timeout=30)
    time.sleep(10)
    mine, theirs = gateway.job(job), gateway.job(rival)
    print(f"requeue without a place kept: 10 s after the release the job is {mine.state.value} ({mine.reason}) "
          f"{mine.gpu_alloc}, the rival {theirs.state.value} {theirs.gpu_alloc} (the job's GPU was {where})")
    assert theirs.gpu_alloc == (where[:2] + (FILLER,),) and mine.state is JobState.PENDING


def test_a_reshaped_job_gets_its_gpu_back_though_a_pending_job_wants_it(jobs, gateway):
    node = "n3"
    job, rival, where = _full_node_and_rival(jobs, gateway, node)
    began = time.monotonic()
    gateway.requeue_with_share(job, 50, (node,))
    back = jobs.gpus(job)
    took = time.monotonic() - began
    rival_view = gateway.job(rival)
    print(f"requeue with a rival pending: job back on {back} {took:.1f} s after the requeuehold; rival "
          f"{rival_view.state.value} ({rival_view.reason})")
    assert back == ((node, where[1], 50),)
    assert rival_view.state is JobState.PENDING  # and with 50 shares left on that GPU, it stays so
    listed = subprocess.run(["scontrol", "show", "reservation"], env=jobs.env, capture_output=True, text=True,
                            timeout=30)
    assert commands.place_name(job) not in listed.stdout  # deleted once the job ran again
    assert gateway.job(job).restarts == 1


def test_a_job_taken_out_of_its_place_outlives_the_reservation(jobs, gateway):
    """A job started inside the reservation that kept its place, then taken out of it (`forget_place`: what a
    reshape does once the job runs, and recovery after a helper died), keeps running past the reservation's
    end; left inside, Slurm kills it then (measured on 22.05: TIMEOUT, reason TimeLimit)."""
    node = "n4"
    kept, left = jobs.submit(node, "mps:10", "--hold"), jobs.submit(node, "mps:10", "--hold")
    subprocess.run(commands.reserve_place(kept, (node,), gateway.job(kept).user, 1), env=jobs.env, check=True,
                   capture_output=True, timeout=30)
    ends = time.monotonic() + 60
    try:
        for job in (kept, left):
            subprocess.run(commands.set_reservation(job, commands.place_name(kept)), env=jobs.env, check=True,
                           capture_output=True, timeout=30)
            subprocess.run(commands.release(job), env=jobs.env, check=True, capture_output=True, timeout=30)
            jobs.gpus(job)
        gateway.forget_place(kept)  # takes `kept` out and deletes the reservation
        # past the reservation's end by more than two of slurmctld's 30 s time-limit checks
        time.sleep(max(0.0, ends + 65 - time.monotonic()))
        assert gateway.job(kept).state is JobState.RUNNING
    finally:
        subprocess.run(commands.delete_place(kept), env=jobs.env, capture_output=True, timeout=30)
    print(f"a job left in a deleted place, past its end: {gateway.job(left).state.value}")
