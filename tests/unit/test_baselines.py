"""The `tiresias` baseline: Tiresias' two-queue discretised least attained service with preemption, as the
Pollux artifact runs it; and the PREEMPT / RESUME actions it needs (simulator, commands, gateway)."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.errors import JobNotPendingError
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import (Action, ActionKind, Family, GpuUse, GresRequest, JobState, JobView, Resources,
                                  Shape)
from slurm_elastico.planner import policies
from slurm_elastico.planner.baselines import QUEUE_LIMIT_GPU_S, LasState, las_comment, las_state
from slurm_elastico.sim import engine, metrics, trace_pollux
from slurm_elastico.sim.results import JobResult, RunResult
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth
from slurm_elastico.slurm import commands
from slurm_elastico.slurm.gateway import REVOKE_GAP_S, SlurmGateway
from slurm_elastico.slurm.runner import Completed
from tests.synthetic import cluster, snapshot, with_users
from tests.unit.test_sim import DATA

NOW = 1_000_000.0
H = 3600.0
TIRESIAS = policies.get("tiresias")


def one_gpu() -> Family:
    s = Shape("whole", Resources(100, 1000, 1, 1024), 1.0)
    return Family("train", (s,), 1000.0, default="whole")


def gang(n: int) -> Family:
    s = Shape(f"gpus{n}", Resources(0, 1000, n, 1024 * n, gpus=n), float(n))
    return Family("train", (s,), 1000.0, default=s.name)


def run_view(jid: int, gpus: list[tuple[str, int]], start: float, submit: float, comment: str = "") -> JobView:
    gres = GresRequest("gpus", len(gpus)) if len(gpus) > 1 else GresRequest("mps", 100)
    return JobView(jid, f"j{jid}", "u", "gpu", JobState.RUNNING, gres=gres, nodes=tuple(dict.fromkeys(n for n, _ in gpus)),
                   submit_time=int(submit), start_time=int(start), requeue=True, admin_comment=comment,
                   gpu_alloc=tuple((n, g, 0 if len(gpus) > 1 else 100) for n, g in gpus))


def wait_view(jid: int, submit: float, n: int = 1, comment: str = "", held: bool = False) -> JobView:
    gres = GresRequest("gpus", n) if n > 1 else GresRequest("mps", 100)
    return JobView(jid, f"j{jid}", "u", "gpu", JobState.PENDING, reason="BeginTime", held=held, gres=gres,
                   submit_time=int(submit), admin_comment=comment)


def plan(n_gpus: int, jobs: list[JobView], fams: dict[int, Family], per_node: int = 8):
    uses: dict = {}
    for j in jobs:
        for node, g, share in j.gpu_alloc:
            uses[(node, g)] = (GpuUse(j.job_id, share, whole=share == 0),)
    snap = snapshot(with_users(cluster(n_gpus, per_node), uses), jobs, NOW)
    return TIRESIAS.plan(snap, fams, Settings(), None, NOW)


def kinds(p, jid: int) -> list[ActionKind]:
    return [a.kind for a in p.actions if a.job_id == jid and a.kind is not ActionKind.SET_ADMIN_COMMENT]


def test_queues_are_discretised_a_job_below_the_limit_keeps_its_place_by_arrival():
    # A has run 15.9 GPU-hours (still Q0, arrived first); B (0 attained) arrived later. Continuous LAS would
    # put B first; Tiresias' queue keeps A ahead (arrival order within Q0), so B waits on a 1-GPU cluster.
    a = run_view(1, [("n0000", 0)], start=NOW - 15.9 * H, submit=NOW - 16 * H)
    b = wait_view(2, submit=NOW - 60)
    p = plan(1, [a, b], {1: one_gpu(), 2: one_gpu()})
    assert kinds(p, 1) == [] and kinds(p, 2) == []
    # Past 16 GPU-hours A is in Q1, behind B: A is preempted and B starts on its GPU.
    a = dataclasses.replace(a, start_time=int(NOW - 16.1 * H))
    p = plan(1, [a, b], {1: one_gpu(), 2: one_gpu()})
    assert kinds(p, 1) == [ActionKind.PREEMPT]
    assert kinds(p, 2) == [ActionKind.SET_NODES, ActionKind.START_NOW]
    st = las_state(next(a_.text for a_ in p.actions if a_.job_id == 1 and a_.kind is ActionKind.SET_ADMIN_COMMENT))
    assert st.held and st.gpu_s == pytest.approx(16.1 * H, abs=1) and st.q1_at == pytest.approx(NOW - 0.1 * H, abs=1)


def test_attained_service_is_gpus_times_time_and_q1_runs_in_order_of_demotion():
    # 4 GPUs. Job 1, a 4-GPU gang, has run 4.1 h: 16.4 GPU-hours, Q1 since 4 h after its start (NOW - 0.1 h).
    # Job 2 (held by us, 1 GPU) reached Q1 earlier (q1_at NOW - 2 h): it runs before job 1, which no longer fits.
    # Job 3 (Q0, 1 GPU, 3 GPU-hours banked) goes first of all.
    g1 = run_view(1, [("n0000", i) for i in range(4)], start=NOW - 4.1 * H, submit=NOW - 5 * H)
    held = las_comment("", "whole", LasState(17 * H, NOW - 2 * H, True))
    j2 = wait_view(2, submit=NOW - 30 * H, comment=held, held=True)
    j3 = wait_view(3, submit=NOW - 40 * H, comment=las_comment("", "whole", LasState(3 * H, None, True)), held=True)
    p = plan(4, [g1, j2, j3], {1: gang(4), 2: one_gpu(), 3: one_gpu()}, per_node=4)
    assert kinds(p, 1) == [ActionKind.PREEMPT]
    assert kinds(p, 2) == [ActionKind.RESUME] and kinds(p, 3) == [ActionKind.RESUME]
    st = las_state(next(a.text for a in p.actions if a.job_id == 1 and a.kind is ActionKind.SET_ADMIN_COMMENT))
    assert st.gpu_s == pytest.approx(4 * 4.1 * H, abs=4) and st.q1_at == pytest.approx(NOW - 0.1 * H, abs=1)
    resumed = las_state(next(a.text for a in p.actions if a.job_id == 2 and a.kind is ActionKind.SET_ADMIN_COMMENT))
    assert not resumed.held and resumed.gpu_s == 17 * H  # its history kept, the hold mark dropped
    # A job someone else held is never resumed, even with room.
    other = wait_view(4, submit=NOW - 50 * H, held=True)
    p = plan(4, [other], {4: one_gpu()}, per_node=4)
    assert p.actions == ()


def test_jobs_start_at_their_submitted_count_on_the_nodes_with_most_free_gpus():
    # Two nodes of 4: node 0 has 1 GPU busy (job 9, Q0, keeps it). A 4-GPU gang takes node 1 whole (most free),
    # then a 2-GPU gang takes 2 of node 0's 3 free, and a 3-GPU one waits (1 GPU left) while a 1-GPU one runs.
    busy = run_view(9, [("n0000", 0)], start=NOW - 60, submit=NOW - 60)
    jobs = [busy, wait_view(1, NOW - 50, 4), wait_view(2, NOW - 40, 2), wait_view(3, NOW - 30, 3), wait_view(4, NOW - 20)]
    p = plan(8, jobs, {9: one_gpu(), 1: gang(4), 2: gang(2), 3: gang(3), 4: one_gpu()}, per_node=4)
    by = {a.job_id: a for a in p.actions if a.kind in (ActionKind.SET_GPUS, ActionKind.SET_NODES)}
    assert (by[1].gpus, by[1].nodes) == (4, ("n0001",))
    assert (by[2].gpus, by[2].nodes) == (2, ("n0000",))
    assert 3 not in by and by[4].nodes == ("n0000",)
    assert kinds(p, 9) == []


def test_preempt_and_resume_commands():
    assert commands.argv_for(Action(ActionKind.PREEMPT, 7, "t")) == [["scontrol", "requeuehold", "7"]]
    assert commands.argv_for(Action(ActionKind.RESUME, 7, "t", nodes=("n1", "n2"))) == [
        ["scontrol", "update", "JobId=7", "NodeList=n1,n2"], ["scontrol", "update", "JobId=7", "StartTime=now"],
        ["scontrol", "release", "7"]]
    assert commands.argv_for(Action(ActionKind.RESUME, 7, "t"))[0] == ["scontrol", "update", "JobId=7", "StartTime=now"]


def test_the_gateway_preempts_and_resumes_with_the_revocation_gap():
    ran, clock, slept, waited = [], [100.0], [], []

    def runner(argv):
        ran.append(list(argv))
        return Completed(tuple(argv), 0, "", "")

    gw = SlurmGateway(runner, sleep=lambda s: (slept.append(s), clock.__setitem__(0, clock[0] + s)),
                      clock=lambda: clock[0])
    gw.wait_state = lambda jid, states, timeout_s: waited.append((jid, states))  # type: ignore[method-assign]
    gw.apply(Action(ActionKind.PREEMPT, 7, "t"))
    assert ran == [["scontrol", "requeuehold", "7"]] and waited == [(7, (JobState.PENDING,))]  # GPUs freed first
    ran.clear()
    gw.apply(Action(ActionKind.RESUME, 7, "t", nodes=("n1",)))
    assert ran == [["scontrol", "update", "JobId=7", "NodeList=n1"], ["scontrol", "update", "JobId=7", "StartTime=now"],
                   ["scontrol", "release", "7"]]
    assert sum(slept) == pytest.approx(REVOKE_GAP_S)  # released no sooner than 2 s after its hold


@pytest.fixture(scope="module")
def toy() -> GroundTruth:
    return GroundTruth(DATA / "toy_profiles.csv", DATA / "toy_iterations.csv", DATA / "toy_pairs.csv")


def test_a_preempted_job_keeps_its_work_stays_held_and_resumes_paying_its_restart(toy):
    sim = SimSettings(gpus=1, gpus_per_node=1, epoch_s=1000, placement_window_s=0, profile_noise=0.0, audit=True,
                      restart_cost_s=7.0, requeue_overhead_s=0.0, colocation="none")
    e = engine.Engine([TraceJob(1, 0, "train", "toy", 1, 100, 16)], "static", Settings(), sim, ContentionModel(), toy)
    e.cluster.now = 0.0
    e._arrive(e.trace[0])
    e._settle()
    job = e.cluster.jobs[1]
    e.cluster.now = 40.0
    with pytest.raises(JobNotPendingError):
        e.cluster.apply(Action(ActionKind.RESUME, 1, "t"))  # only a pending job can be released
    e.cluster.apply(Action(ActionKind.PREEMPT, 1, "t"))
    assert job.state is JobState.PENDING and job.held and job.gres == GresRequest("mps", 100)
    assert job.done == pytest.approx(40.0, rel=1e-6)
    e.cluster.now = 100.0
    e._settle()  # Slurm never starts a held job
    assert job.state is JobState.PENDING
    e.cluster.apply(Action(ActionKind.RESUME, 1, "t", nodes=("n0000",)))
    e._settle()
    assert job.state is JobState.RUNNING and job.pin == ("n0000",) and job.ready_at == 107.0
    assert e._done_at(job, 107.0) == pytest.approx(40.0, rel=1e-6)
    assert e._done_at(job, 167.0) == pytest.approx(100.0, rel=1e-6)
    e.cluster.check()


def test_a_high_priority_arrival_preempts_the_lowest_priority_running_job(toy, monkeypatch):
    # One GPU; queue limit 50 GPU-s. A (1,000 s of work) runs from 0 and is in Q1 by 50. B (30 s) arrives at 100
    # in Q0: A is preempted at the next epoch (every 10 s), B runs, then A resumes, paying its 5 s restart.
    monkeypatch.setitem(policies.REGISTRY, "tiresias", dataclasses.replace(TIRESIAS, threshold_gpu_s=50.0))
    jobs = [TraceJob(1, 0, "train", "toy", 1, 1000, 16), TraceJob(2, 100, "train", "toy", 1, 30, 16)]
    sim = SimSettings(gpus=1, gpus_per_node=1, epoch_s=10, placement_window_s=-1, profile_noise=0.0, audit=True,
                      restart_cost_s=5.0, requeue_overhead_s=0.0, colocation="none")
    r = engine.run(jobs, "tiresias", Settings(), sim, ContentionModel(), toy)
    a, b = sorted(r.jobs, key=lambda j: j.job_id)
    assert r.unfinished == 0 and r.counters["requeues"] == 1 and r.counters["actions"]["preempt"] == 1
    assert b.first_start == 100.0 and b.end == pytest.approx(130.0)  # B's first start pays no restart
    assert a.restarts == 1 and a.done == a.work
    assert a.end == pytest.approx(1000.0 + 30.0 + 5.0 + 10.0, abs=1e-6)  # + B, the restart, and 10 s of idle epoch


def test_a_pollux_workload_runs_to_the_end_every_job_at_its_submitted_gpu_count(monkeypatch):
    truth = GroundTruth()
    jobs = trace_pollux.pollux(1, truth)
    submitted = {j.job_id: j.gpus for j in jobs}
    seen: dict[int, set[int]] = {}
    start = engine.SimCluster.start

    def watch(self, job, alloc):
        start(self, job, alloc)
        seen.setdefault(job.job_id, set()).add(len(job.alloc))

    monkeypatch.setattr(engine.SimCluster, "start", watch)
    sim = SimSettings(gpus=64, gpus_per_node=4, epoch_s=60, profile_noise=0.0, placement_window_s=-1,
                      restart_cost_s=30.0, audit=True)
    r = engine.run(jobs, "tiresias", Settings(), sim, ContentionModel(), truth)
    assert r.unfinished == 0 and len(r.jobs) == len(jobs)
    assert r.counters["actions"].get("preempt", 0) > 0 and r.counters["refused_actions"] == 0
    assert seen == {j: {n} for j, n in submitted.items()}
    assert all(j.done == j.work for j in r.jobs)


def test_tiresias_is_static_fifo_when_no_job_reaches_its_queue_limit_and_preempts_when_one_does(toy, monkeypatch):
    # One GPU, single-GPU jobs: A (1,000 s) from 0, B and C (30 s each) at 100 and 110. Under the 16 GPU-hour
    # limit A never leaves Q0, so Q0's arrival order is static's FIFO: the same order, each start later only by
    # the epochs it waited (plain Slurm starts a job the moment it fits, Policy.plain), and no preemption.
    jobs = [TraceJob(1, 0, "train", "toy", 1, 1000, 16), TraceJob(2, 100, "train", "toy", 1, 30, 16),
            TraceJob(3, 110, "train", "toy", 1, 30, 16)]
    sim = SimSettings(gpus=1, gpus_per_node=1, epoch_s=10, placement_window_s=-1, profile_noise=0.0, audit=True,
                      restart_cost_s=5.0, colocation="none")
    runs = {p: engine.run(jobs, p, Settings(), sim, ContentionModel(), toy) for p in ("static", "tiresias")}
    starts = {p: [j.first_start for j in sorted(r.jobs, key=lambda j: j.job_id)] for p, r in runs.items()}
    assert starts["static"] == pytest.approx([0.0, 1000.0, 1030.0]) and not metrics.same_schedule(*runs.values())
    assert starts["tiresias"] == sorted(starts["tiresias"])  # the same order, each start late by the epochs before it
    assert all(0 <= t - s <= k * sim.epoch_s for k, (s, t) in enumerate(zip(starts["static"], starts["tiresias"])))
    assert runs["tiresias"].counters["actions"].get("preempt", 0) == 0
    assert metrics.longest_service_gpu_s(runs["tiresias"]) == pytest.approx(1000.0)  # far under QUEUE_LIMIT_GPU_S
    # A limit A passes (50 GPU-s): A drops to Q1 and is preempted for B and C, which end sooner.
    monkeypatch.setitem(policies.REGISTRY, "tiresias", dataclasses.replace(TIRESIAS, threshold_gpu_s=50.0))
    las = engine.run(jobs, "tiresias", Settings(), sim, ContentionModel(), toy)
    assert not metrics.same_schedule(runs["static"], las)
    assert las.counters["actions"]["preempt"] >= 1 and las.unfinished == 0
    ends = {j.job_id: j.end for j in las.jobs}
    assert ends[2] < ends[1] and ends[3] < ends[1]


def test_same_schedule_and_the_longest_service_bound():
    def run(*jobs, unfinished=0):
        return RunResult("p", 0, 4, [JobResult(i, "train", "a", g, 0.0, s, e, 0, 1.0, 1.0, 1.0, 1.0, 0.0)
                                     for i, g, s, e in jobs], [], 1.0, 1.0, 1, 1, 1, 0.1, 0.0,
                         unfinished=unfinished)

    a = run((1, 1, 0.0, 10.0), (2, 4, 5.0, 8.0))
    assert metrics.same_schedule(a, run((2, 4, 5.0, 8.0), (1, 1, 0.0, 10.0)))  # order of the list does not count
    assert not metrics.same_schedule(a, run((1, 1, 0.0, 10.0), (2, 4, 5.0, 9.0)))
    assert not metrics.same_schedule(a, run((1, 1, 0.0, 10.0), (2, 4, 5.0, 8.0), unfinished=1))
    assert metrics.longest_service_gpu_s(a) == 12.0  # 4 GPUs x 3 s beats 1 GPU x 10 s
    assert metrics.longest_service_gpu_s(run((1, 1, 0.0, 10.0), unfinished=2)) == float("inf")
