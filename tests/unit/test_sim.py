"""The simulator: exact JCTs on a hand-computed case, conservation, capacity, determinism, gateway semantics,
and the separation of the ground truth from the model the policy consults."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError, InvalidActionError, JobNotPendingError, SlurmError
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import Action, ActionKind, Family, GresRequest, JobState, Resources, Shape
from slurm_elastico.sim import engine, metrics, trace, trace_pollux, trace_synthetic
from slurm_elastico.sim.cluster import SimCluster
from slurm_elastico.sim.job import SimJob
from slurm_elastico.sim.settings import SimSettings, from_mapping
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth

DATA = Path(__file__).parent.parent / "data" / "sim"


@pytest.fixture(scope="module")
def toy() -> GroundTruth:
    """One app at exactly one step per second (either micro-batch), no co-location data of its own."""
    return GroundTruth(DATA / "toy_profiles.csv", DATA / "toy_iterations.csv", DATA / "toy_pairs.csv")


@pytest.fixture(scope="module")
def truth() -> GroundTruth:
    return GroundTruth()


def toy_job(jid: int, submit: float, steps: float) -> TraceJob:
    return TraceJob(jid, submit, "train", "toy", 1, steps, global_batch=16)


def tiny_run(truth, policy="static", window=-1.0, jobs=None, **sim_kw):
    jobs = jobs or [toy_job(1, 0, 100), toy_job(2, 0, 50), toy_job(3, 10, 30)]
    sim = SimSettings(gpus=2, gpus_per_node=2, epoch_s=4, placement_window_s=window, profile_noise=0.0, audit=True,
                      **{"wrapper_start_s": 0.0, **sim_kw})
    return engine.run(jobs, policy, Settings(), sim, ContentionModel(), truth, seed=0)


@pytest.mark.parametrize("policy,window,c_start", [("static", -1.0, 50.0), ("static", 0.0, 50.0),
                                                   ("no-shapes", -1.0, 52.0), ("no-shapes", 0.0, 50.0)])
def test_two_gpus_three_jobs_static_jcts_are_known_exactly(toy, policy, window, c_start):
    # A (100 steps at 1 step/s) and B (50) start at 0 on one GPU each; C (30, submitted at 10) waits for B (ends
    # at 50). Static is plain Slurm whatever the window: Slurm's own FIFO starts jobs at submission and at B's
    # completion, so C starts at 50. A planned policy with window -1 starts jobs only at epochs every 4 s: C at 52.
    r = tiny_run(toy, policy, window=window)
    jct = {j.job_id: j.jct for j in r.jobs}
    assert jct == pytest.approx({1: 100.0, 2: 50.0, 3: c_start + 30 - 10}, rel=1e-6)
    assert {j.job_id: j.first_start for j in r.jobs} == pytest.approx({1: 0.0, 2: 0.0, 3: c_start})
    s = metrics.summarize(r)
    assert s["mean_jct_h"] * 3600 == pytest.approx((100 + 50 + c_start + 20) / 3, rel=1e-6)
    assert s["lower_bound_h"] * 3600 == pytest.approx(60.0, rel=1e-6)  # each alone from submission
    makespan = max(100.0, c_start + 30)
    assert s["util"] == pytest.approx((100 + 50 + 30) / (2 * makespan), rel=1e-6)


@pytest.mark.parametrize("window", [-1.0, 0.0])
def test_a_trace_whose_first_job_arrives_late_starts_it_no_sooner_than_its_arrival(toy, window):
    # The clock starts at the first arrival (500 s): that job starts there, not at 0 (a JCT of -400 s, once).
    r = tiny_run(toy, "no-shapes", window=window, jobs=[toy_job(1, 500, 100), toy_job(2, 500, 50), toy_job(3, 510, 30)])
    assert min(j.first_start for j in r.jobs) >= 500.0
    assert {j.job_id: j.jct for j in r.jobs} == pytest.approx({1: 100.0, 2: 50.0, 3: (42.0 if window < 0 else 40.0) + 30},
                                                             rel=1e-6)


def test_a_reshape_costs_its_restart_time_and_keeps_the_work(toy):
    sim = SimSettings(gpus=1, gpus_per_node=1, epoch_s=1000, placement_window_s=0, profile_noise=0.0, audit=True,
                      restart_cost_s=7.0, requeue_overhead_s=3.0, relaunch_overhead_s=1.0, wrapper_start_s=0.0,
                      colocation="none")
    e = engine.Engine([toy_job(1, 0, 100)], "elastico", Settings(), sim, ContentionModel(), toy)
    e._push(0.0, engine.ARRIVAL, 1)
    e.cluster.now = 0.0
    e._arrive(e.trace[0])
    e._settle()
    job = e.cluster.jobs[1]
    assert job.state is JobState.RUNNING and job.rate == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(JobNotPendingError):  # Slurm refuses a running job's GRES change
        e.cluster.apply(Action(ActionKind.SET_SHARE, 1, "t", share=50))
    e.cluster.now = 40.0
    e.cluster.apply(Action(ActionKind.RESHAPE_RUNNING, 1, "t", share=50, nodes=("n0000",)))
    assert job.state is JobState.PENDING and job.gres.count == 50 and job.done == pytest.approx(40.0, rel=1e-6)
    e._settle()
    # a requeue costs the job's 7 s restart plus Slurm's 3 s requeue
    assert job.state is JobState.RUNNING and job.share == 50 and job.ready_at == 50.0
    # At share 50 the toy job (demand 1) runs at half speed: 60 steps left take 120 s after the restart.
    assert e._done_at(job, 50.0) == pytest.approx(40.0, rel=1e-6)
    assert e._done_at(job, 170.0) == pytest.approx(100.0, rel=1e-6)
    # In place (USR1): the new AdminComment's shape at the same share, after another restart (7 s plus the
    # wrapper's 1 s relaunch), no requeue.
    e.cluster.now = 70.0  # 10 steps done at share 50
    e.cluster.apply(Action(ActionKind.SET_ADMIN_COMMENT, 1, "t", text="elastico:shape=mb8-fp32-mps50"))
    e.cluster.apply(Action(ActionKind.SIGNAL, 1, "t", signal="USR1"))
    e._settle()
    assert job.state is JobState.RUNNING and job.shape == "mb8-fp32-mps50" and job.ready_at == 78.0
    assert (job.restarts, job.relaunches, job.done) == (1, 1, pytest.approx(50.0, rel=1e-6))
    assert e._done_at(job, 178.0) == pytest.approx(100.0, rel=1e-6)


@pytest.fixture(scope="module")
def mix(truth):
    return trace_synthetic.synthetic(trace_synthetic.MixSpec(n_jobs=40, gpus=4, load=2.0, max_duration_s=3 * 3600), seed=3, truth=truth)


@pytest.mark.parametrize("policy", ["elastico", "tiresias", "static-mps", "pollux"])
def test_conservation_and_capacity_under_every_kind_of_policy(truth, mix, policy):
    sim = SimSettings(gpus=4, gpus_per_node=2, audit=True, placement_window_s=-1 if policy != "static-mps" else 60)
    r = engine.run(mix, policy, Settings(), sim, ContentionModel(), truth, seed=3)  # audit: capacity after every event
    assert r.unfinished == 0
    assert sorted(j.job_id for j in r.jobs) == sorted(j.job_id for j in mix)  # none lost, none twice
    assert all(j.done == j.work and j.end >= j.first_start >= j.submit for j in r.jobs)
    assert sum(j.work for j in r.jobs) == pytest.approx(sum(j.work for j in mix))
    assert r.counters["starts"] == len(mix) + r.counters["requeues"]
    assert sum(j.restarts for j in r.jobs) == r.counters["requeues"] + r.counters["relaunches"]
    assert 0 < r.util_makespan <= 1


def test_same_seed_same_run_and_another_seed_differs(truth, mix):
    sim = SimSettings(gpus=4, gpus_per_node=2, placement_window_s=-1)
    a = engine.run(mix, "elastico", Settings(), sim, ContentionModel(), truth, seed=3)
    b = engine.run(mix, "elastico", Settings(), sim, ContentionModel(), truth, seed=3)
    assert a.jobs == b.jobs and a.timeline == b.timeline
    other = trace_synthetic.synthetic(trace_synthetic.MixSpec(n_jobs=40, gpus=4, load=2.0, max_duration_s=3 * 3600), seed=4, truth=truth)
    assert other != mix


class Spy:
    """A policy-side model that counts its calls and believes co-location is free."""

    def __init__(self):
        self.calls = 0

    def predict(self, a, b):
        self.calls += 1
        return np.ones(len(a))


def test_the_truth_never_asks_the_policys_model(truth, monkeypatch):
    spy = Spy()
    # Small ncf jobs: half a GPU runs one nearly as fast as a whole one, so a model that believes sharing is free
    # pairs them (their summed fractions clear the gain rule's least gain, MIN_GAIN).
    jobs = [TraceJob(i, 10.0 * i, "train", "ncf", 1, 300, global_batch=32) for i in range(1, 7)]
    sim = SimSettings(gpus=2, gpus_per_node=2, placement_window_s=-1)
    e = engine.Engine(jobs, "elastico", Settings(), sim, spy, truth, seed=3)
    rerate = e._rerate
    slowed = []

    def watched(job):
        before = spy.calls
        rerate(job)
        assert spy.calls == before  # rating a job by the ground truth never consulted the policy's model
        slowed.append(job.rate < e._solo(job)[0] - 1e-12)

    monkeypatch.setattr(e, "_rerate", watched)
    e.run()
    assert spy.calls > 0  # the policy did use it ...
    assert any(slowed)  # ... and believing sharing free did not make it free: the Gavel truth slowed someone


def test_colocation_truth_is_a_ceiling_and_none_means_share_only(truth):
    me, other = ("ResNet-18", 32), ("ResNet-50", 64)
    norm = truth.norm[(me, other)]
    assert 0 < norm < 1
    assert truth.colocated(0.5, 1.0, me, [other]) == pytest.approx(min(0.5, norm))
    assert truth.colocated(0.5, 1.0, me, [other], "none") == 0.5
    assert truth.colocated(0.5, 1.0, me, [other], "gavel-residual") == pytest.approx(0.5 * min(1.0, 2 * norm))
    assert truth.colocated(0.5, 1.0, me, []) == 0.5


def test_training_speed_follows_the_measured_profiles(truth):
    p = truth.profile("cifar10")
    step, _ = p.at(float(p.bsz[3]))
    assert step == pytest.approx(float(p.step[3]))  # at a measured batch: the measurement
    whole = truth.train_speed("cifar10", 1024, 1024, 100)
    d = truth.demand("cifar10", 1024)
    assert d > 0.95  # the largest batch nearly fills the GPU ...
    assert truth.train_speed("cifar10", 1024, 1024, 50) == pytest.approx(whole * 0.5 / d, rel=1e-6)  # ... so 50 % bites
    small = truth.train_speed("cifar10", 1024, 32, 100)
    assert truth.train_speed("cifar10", 1024, 32, 60) == pytest.approx(small)  # demand ~0.5: 60 % is enough
    assert small < whole  # 32 micro-steps cost more than one big one


def test_sim_settings_name_every_bad_key():
    with pytest.raises(ConfigError) as err:
        from_mapping({"gpus": 0, "colocation": "magic", "nope": 1, "shares": "a,b"})
    text = str(err.value)
    assert "sim.gpus" in text and "sim.colocation" in text and "sim.nope: unknown key" in text
    assert from_mapping({"shares": "50,100"}).share_levels() == (50, 100)


def test_metrics_interval_and_separation():
    m, h = metrics.ci95([1.0, 2.0, 3.0, 4.0, 5.0])
    assert m == 3.0 and h == pytest.approx(2.776 * np.std([1, 2, 3, 4, 5], ddof=1) / np.sqrt(5), rel=1e-3)
    assert metrics.separated((1.0, 0.1), (2.0, 0.1)) and not metrics.separated((1.0, 0.6), (2.0, 0.6))


def test_load_sweep_plot_is_a_png(tmp_path):
    from slurm_elastico.sim import plots

    out = plots.load_sweep({"elastico": [(1.0, 2.0, 0.1), (2.0, 3.0, 0.2)], "static": [(1.0, 2.5, 0.1)]},
                           tmp_path / "sweep.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class ScriptedPolicy:
    """A policy whose first plan is a fixed action list for job 1 (then nothing): to make Slurm refuse one."""

    name = "scripted"

    def __init__(self, actions):
        self.actions, self.plans = tuple(actions), 0

    def plan(self, snapshot, families, settings, model, now, progress=None):
        from slurm_elastico.model import Plan

        self.plans += 1
        return Plan(actions=self.actions if self.plans == 1 else ())


def test_a_refused_action_stops_that_jobs_later_actions_and_is_counted_as_live(toy, monkeypatch):
    # The simulator acts through the helper's executor: a USR1 to a job still pending is refused (as Slurm
    # refuses it), the job's later action is skipped, the AdminComment set before it is put back, and both
    # are counted. Without the shared executor the sim used to swallow the refusal and go on.
    from slurm_elastico.planner import policies

    actions = [
        Action(ActionKind.SET_ADMIN_COMMENT, 1, "t", text="elastico:shape=mb8-fp32-mps50"),
        Action(ActionKind.SIGNAL, 1, "t", signal="USR1"),
        Action(ActionKind.START_NOW, 1, "t"),
    ]
    monkeypatch.setitem(policies.REGISTRY, "scripted", ScriptedPolicy(actions))
    jobs = [toy_job(1, 0, 10)]
    sim = SimSettings(gpus=1, gpus_per_node=1, epoch_s=4, placement_window_s=8.0, profile_noise=0.0, audit=True)
    e = engine.Engine(jobs, "scripted", Settings(), sim, ContentionModel(), toy, seed=0)
    e._arrive(jobs[0])
    e._epoch(0.0)
    job = e.cluster.jobs[1]
    assert job.comment == ""  # restored: elastico-run must not start a shape whose change never happened
    assert job.begin == 8.0  # START_NOW was skipped
    assert (e.outcomes["done"], e.outcomes["failed"], e.outcomes["skipped"]) == (1, 1, 1)
    assert e.journal.unsettled() == [] and e.journal.settled == {"done": 1, "failed": 1}
    monkeypatch.setitem(policies.REGISTRY, "scripted", ScriptedPolicy(actions))
    r = engine.run(jobs, "scripted", Settings(), sim, ContentionModel(), toy, seed=0)  # a whole run reports them
    assert (r.counters["refused_actions"], r.counters["skipped_actions"]) == (1, 1)
    assert r.unfinished == 0 and r.jobs[0].first_start == pytest.approx(8.0)  # Slurm starts it at its BeginTime


# --------------------------------------------------------------------------- whole GPUs over several nodes (gangs)


def gang_settings(**kw) -> SimSettings:
    base = dict(gpus=8, gpus_per_node=4, epoch_s=1000, placement_window_s=0, profile_noise=0.0, audit=True,
                max_gpus_per_job=0)  # rigid: every job keeps its submitted GPU count
    return SimSettings(**{**base, **kw})


def test_a_six_gpu_rigid_job_spans_two_four_gpu_nodes(truth):
    # Before gangs a rigid job asked for gpu:6 per node, which 4-GPU nodes never have: it never started.
    tj = TraceJob(1, 0.0, "train", "cifar10", 6, 2000.0, global_batch=2048)
    e = engine.Engine([tj], "static", Settings(), gang_settings(), ContentionModel(), truth)
    e._arrive(tj)
    e._settle()
    job = e.cluster.jobs[1]
    assert job.state is JobState.RUNNING and job.gres == GresRequest("gpus", 6)
    assert job.placement == (4, 2) and job.alloc == ((0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1))
    speed = truth.gang_speed("cifar10", 2048, (4, 2))
    assert job.rate == pytest.approx(speed)
    view = e.cluster.snapshot().job(1)
    assert view.gres == GresRequest("gpus", 6) and view.nodes == ("n0000", "n0001") and view.gpu_indices == (0, 1, 2, 3)
    assert view.gpu_alloc == tuple((n, g, 0) for n, g in (("n0000", 0), ("n0000", 1), ("n0000", 2), ("n0000", 3),
                                                           ("n0001", 0), ("n0001", 1)))
    held = [g for g in e.cluster.snapshot().gpus if g.users]
    assert len(held) == 6 and all(g.held_whole and g.job_ids == (1,) for g in held)
    # 4 CPUs and 16 GiB per GPU for the whole job, split 4:2 over its nodes
    assert [(n.cpus_alloc, n.mem_alloc) for n in e.cluster.nodes] == [(16, 4 * 16384), (8, 2 * 16384)]
    r = engine.run([tj], "static", Settings(), gang_settings(), ContentionModel(), truth)
    assert r.unfinished == 0 and r.jobs[0].jct == pytest.approx(2000.0 / speed, rel=1e-6)


def sim_job(jid: int, gres: GresRequest, cpus: int = 4) -> SimJob:
    return SimJob(trace=TraceJob(jid, 0.0, "train", "cifar10", 1, 100.0, global_batch=64), family=None, gres=gres,
                  cpus=cpus, mem_mib=1024)


def test_gangs_take_the_fewest_nodes_best_fit_first():
    c = SimCluster(12, gpus_per_node=4)
    c.submit(sim_job(1, GresRequest("mps", 50)))
    c.submit(sim_job(2, GresRequest("gpus", 3)))
    c.submit(sim_job(3, GresRequest("gpus", 6)))
    c.schedule()
    c.check()
    jobs = c.jobs
    assert jobs[1].alloc == ((0, 0),)  # n0000 keeps 3 idle GPUs next to the MPS job
    assert jobs[2].alloc == ((0, 1), (0, 2), (0, 3))  # best fit: the node with the fewest idle GPUs that has 3
    assert jobs[3].placement == (4, 2) and {ni for ni, _ in jobs[3].alloc} == {1, 2}  # no node has 6: most idle first
    c.submit(sim_job(4, GresRequest("mps", 60)))
    c.schedule()
    c.check()
    assert jobs[4].alloc == ((2, 2),)  # too big for job 1's GPU; never on a GPU a gang holds whole
    assert c.snapshot().job(3).gpu_alloc[0] == ("n0001", 0, 0)


def test_a_pinned_gang_starts_only_on_its_nodes_with_the_same_count_on_each():
    c = SimCluster(12, gpus_per_node=4)
    for jid in (1, 2, 3):
        c.submit(sim_job(jid, GresRequest("mps", 50)))
        c.jobs[jid].held = True  # Slurm must not start them before they are reshaped
    c.apply(Action(ActionKind.SET_GPUS, 1, "t", gpus=3, nodes=("n0002",)))
    c.apply(Action(ActionKind.SET_GPUS, 2, "t", gpus=2, nodes=("n0000", "n0002")))
    c.apply(Action(ActionKind.SET_GPUS, 3, "t", gpus=2, nodes=("n0002",)))
    assert c.jobs[1].gres == GresRequest("gpus", 3) and c.jobs[1].pin == ("n0002",)
    for jid in (1, 2, 3):
        c.jobs[jid].held = False
    c.schedule()
    c.check()
    assert c.jobs[1].alloc == ((2, 0), (2, 1), (2, 2))  # unpinned it would take n0000, the first best fit
    assert c.jobs[2].alloc == ((0, 0), (2, 3))  # Gres=gpu:1 NumNodes=2-2: one on each listed node, no more
    assert c.jobs[3].state is JobState.PENDING  # n0002 is full; n0001 is idle but not its node
    assert c.snapshot().job(2).nodes == ("n0000", "n0002")
    with pytest.raises(InvalidActionError):  # more GPUs than the listed nodes have
        c.apply(Action(ActionKind.SET_GPUS, 3, "t", gpus=5, nodes=("n0001",)))
    with pytest.raises(InvalidActionError):  # fewer GPUs than listed nodes
        c.apply(Action(ActionKind.SET_GPUS, 3, "t", gpus=1, nodes=("n0000", "n0001")))
    with pytest.raises(InvalidActionError, match="do not split evenly"):  # 3 over 2 nodes: Gres= is per node
        c.apply(Action(ActionKind.SET_GPUS, 3, "t", gpus=3, nodes=("n0000", "n0001")))
    with pytest.raises(InvalidActionError):
        c.apply(Action(ActionKind.SET_GPUS, 3, "t", gpus=13))
    with pytest.raises(InvalidActionError):
        c.apply(Action(ActionKind.SET_GPUS, 3, "t", gpus=0, nodes=("n0001",)))
    with pytest.raises(SlurmError, match="Invalid node name"):
        c.apply(Action(ActionKind.SET_GPUS, 3, "t", gpus=2, nodes=("n0009",)))
    assert c.jobs[3].gres == GresRequest("gpus", 2) and c.jobs[3].pin == ("n0002",)  # refusals changed nothing
    c.apply(Action(ActionKind.SET_GPUS, 3, "t", gpus=2, nodes=("n0001",)))
    c.schedule()
    assert c.jobs[3].alloc == ((1, 0), (1, 1))


def test_a_blocked_gang_reserves_whole_nodes_against_backfill():
    c = SimCluster(8, gpus_per_node=4)
    c.submit(sim_job(1, GresRequest("mps", 50)))
    c.schedule()
    c.submit(sim_job(2, GresRequest("gpus", 8)))  # 7 GPUs idle: blocked until job 1 ends
    c.submit(sim_job(3, GresRequest("mps", 50)))
    c.schedule()
    assert c.jobs[2].state is JobState.PENDING
    assert c.jobs[3].state is JobState.PENDING  # both nodes are held for the gang; without that, 3 would start
    c.finish(c.jobs[1])
    c.schedule()
    c.check()
    assert c.jobs[2].placement == (4, 4) and c.jobs[3].state is JobState.PENDING
    # A gang its nodes could not hold even empty (its CPUs) holds nothing back: it would starve the rest for ever.
    c = SimCluster(4, gpus_per_node=4, cpus_per_gpu=16)
    c.submit(sim_job(1, GresRequest("gpus", 2), cpus=2 * 64))
    c.submit(sim_job(2, GresRequest("mps", 50)))
    c.schedule()
    assert c.jobs[1].state is JobState.PENDING and c.jobs[2].state is JobState.RUNNING


def test_a_gangs_speed_is_that_of_the_placement_it_got(truth):
    tj = TraceJob(1, 0.0, "train", "cifar10", 4, 5000.0, global_batch=2048)
    e = engine.Engine([tj], "static", Settings(), gang_settings(), ContentionModel(), truth)
    e._arrive(tj)
    e.cluster.apply(Action(ActionKind.SET_GPUS, 1, "t", gpus=4, nodes=("n0000", "n0001")))
    e._settle()
    job = e.cluster.jobs[1]
    assert job.placement == (2, 2)  # Gres=gpu:2 NumNodes=2-2: two on each listed node
    split, packed = truth.gang_speed("cifar10", 2048, (2, 2)), truth.gang_speed("cifar10", 2048, (4,))
    assert job.rate == pytest.approx(split) and split != pytest.approx(packed)


def test_set_gpus_is_refused_on_a_running_job_and_a_reshape_moves_a_gang_from_two_to_four_gpus(truth):
    tj = TraceJob(1, 0.0, "train", "cifar10", 2, 5000.0, global_batch=2048)
    e = engine.Engine([tj], "static", Settings(), gang_settings(restart_cost_s=30.0, requeue_overhead_s=2.0),
                      ContentionModel(), truth)
    e.cluster.now = 0.0
    e._arrive(tj)
    e._settle()
    job = e.cluster.jobs[1]
    two, four = truth.gang_speed("cifar10", 2048, (2,)), truth.gang_speed("cifar10", 2048, (4,))
    assert job.alloc == ((0, 0), (0, 1)) and job.rate == pytest.approx(two)
    with pytest.raises(JobNotPendingError):  # Slurm refuses a running job's GPU count
        e.cluster.apply(Action(ActionKind.SET_GPUS, 1, "t", gpus=4, nodes=("n0001",)))
    assert job.gres == GresRequest("gpus", 2) and job.pin == ()
    e.cluster.now = 100.0
    reshape = Action(ActionKind.RESHAPE_RUNNING, 1, "t", gpus=4, nodes=("n0001",))
    assert e.cluster.argv_for(reshape) == [
        ["scontrol", "requeuehold", "1"],
        ["scontrol", "update", "JobId=1", "Gres=gpu:4", "NumNodes=1-1", "NodeList=n0001"],
        ["scontrol", "update", "JobId=1", "StartTime=now"], ["scontrol", "release", "1"]]
    e.cluster.apply(reshape)
    assert job.state is JobState.PENDING and job.gres == GresRequest("gpus", 4) and job.pin == ("n0001",)
    assert job.done == pytest.approx(100.0 * two)
    e._settle()
    assert job.state is JobState.RUNNING and job.alloc == ((1, 0), (1, 1), (1, 2), (1, 3))  # its pin, not n0000
    assert job.ready_at == 132.0 and job.restarts == 1 and job.rate == pytest.approx(four) and four > two
    assert e._done_at(job, 132.0) == pytest.approx(100.0 * two)  # the restart makes no progress ...
    assert e._done_at(job, 182.0) == pytest.approx(100.0 * two + 50.0 * four)  # ... and the work done is kept


def test_the_audit_holds_on_a_mixed_run_of_gangs_and_shared_gpus(truth):
    jobs = trace_pollux.pollux(6, truth)[:60]
    assert any(j.gpus > 4 for j in jobs) and any(j.gpus == 1 for j in jobs)
    e = engine.Engine(jobs, "static", Settings(), SimSettings(gpus=64, gpus_per_node=4, audit=True),
                      ContentionModel(), truth)
    placements = []
    start = e.cluster.start

    def watched(job, alloc):
        start(job, alloc)
        placements.append((job.gres.kind, job.placement))

    e.cluster.start = watched
    r = e.run()  # audit: SimCluster.check after every event
    assert r.unfinished == 0 and len(r.jobs) == len(jobs)
    assert any(kind == "gpus" and len(p) > 1 for kind, p in placements)  # gangs over several nodes ...
    assert any(kind == "mps" for kind, p in placements)  # ... next to shared GPUs


def test_pollux_workload_6_finishes_every_job_on_sixteen_four_gpu_nodes(truth):
    # Before gangs a job larger than one node never started: 42 of 160 jobs here (up to 48 GPUs).
    jobs = trace_pollux.pollux(6, truth)
    assert max(j.gpus for j in jobs) > 8
    r = engine.run(jobs, "static", Settings(), SimSettings(gpus=64, gpus_per_node=4), ContentionModel(), truth)
    assert r.unfinished == 0 and len(r.jobs) == 160


def test_a_family_job_at_a_gang_shape_runs_at_the_gang_speed_of_its_knobs(truth):
    knobs = (("accumulation", 2), ("global_batch", 2048), ("micro_batch", 256), ("ranks", 4))
    gang = Shape("mb256-fp32-gpus4", Resources(0, 8000, 16, 65536, gpus=4), 1.0, knobs)
    one = Shape("mb1024-fp32-mps100", Resources(100, 14000, 4, 16384), 1.0,
                (("global_batch", 2048), ("micro_batch", 1024)))
    fam = Family("train", (gang, one), 5000.0, name="cifar10", default=gang.name)
    tj = TraceJob(1, 0.0, "train", "cifar10", 1, 5000.0, global_batch=2048)
    e = engine.Engine([tj], "static", Settings(), gang_settings(), ContentionModel(), truth)
    e.cluster.submit(SimJob(trace=tj, family=fam, gres=GresRequest("gpus", 4), cpus=16, mem_mib=65536))
    e._settle()
    job = e.cluster.jobs[1]
    assert job.shape == gang.name and job.placement == (4,)
    assert job.rate == pytest.approx(truth.gang_speed("cifar10", 2048, (4,), 256))
    assert job.rate != pytest.approx(truth.gang_speed("cifar10", 2048, (4,)))  # its micro-batch, not the default


@pytest.mark.parametrize("policy", ["static-mps", "tiresias", "pollux", "elastico"])
def test_every_policy_runs_the_same_at_4_mps_shares_per_gpu_as_at_100(truth, policy):
    """Shares are Slurm's counts wherever a percent meets Slurm (shapes.units): the baselines' SET_SHARE and
    placements, the simulator's requests and its ground truth's speeds give the same run at 4 shares per GPU."""
    import dataclasses

    sim = SimSettings(gpus=4, gpus_per_node=2, shares="25,50,75,100", max_gpus_per_job=4)
    jobs = [j for j in trace_synthetic.synthetic(trace_synthetic.MixSpec(n_jobs=16, gpus=4, load=1.5), 3, truth)
            if j.share % 25 == 0]
    got = {}
    for per_gpu in (100, 4):
        s = Settings()
        s = dataclasses.replace(s, gpu=dataclasses.replace(s.gpu, shares_per_gpu=per_gpu))
        r = engine.run(jobs, policy, s, sim, ContentionModel(), truth, seed=0)
        assert r.unfinished == 0
        got[per_gpu] = [(j.job_id, round(j.end, 6), j.restarts) for j in r.jobs]
    assert got[4] == got[100] and len(got[4]) == len(jobs) > 8


def test_even_gangs_is_on_by_default_and_a_bad_value_is_refused():
    assert SimSettings().even_gangs is True
    assert from_mapping({"even_gangs": False}).even_gangs is False
    with pytest.raises(ConfigError, match="even_gangs"):
        from_mapping({"even_gangs": "sometimes"})


def test_uneven_split_fills_the_best_ranked_nodes_and_split_follows_the_rule_it_is_given():
    from slurm_elastico.planner.gangs import split, uneven_split
    idle = {"a": 1, "b": 4, "c": 2}
    count = lambda k, p: min(p, idle[k])  # noqa: E731
    rank = lambda k: (-idle[k], k)  # noqa: E731
    assert uneven_split(3, list(idle), count, rank) == {"b": 3}  # one node holds it
    assert uneven_split(6, list(idle), count, rank) == {"b": 4, "c": 2}  # most room first, nodes in their order
    assert uneven_split(8, list(idle), count, rank) is None  # 7 idle
    assert split(6, list(idle), count, rank) is None  # even: 6 x 1, 3 x 2, 2 x 3 do not fit
    assert split(6, list(idle), count, rank, even=False) == {"b": 4, "c": 2}
    assert split(6, list(idle), count, rank, even=True) is None


def test_an_uneven_gpu_count_is_accepted_only_when_the_simulated_cluster_allows_it():
    for even in (True, False):
        c = SimCluster(8, gpus_per_node=4, even_gangs=even)
        c.submit(sim_job(1, GresRequest("mps", 50)))
        c.jobs[1].held = True
        act = Action(ActionKind.SET_GPUS, 1, "t", gpus=3, nodes=("n0000", "n0001"))
        if even:
            with pytest.raises(InvalidActionError, match="do not split evenly"):
                c.apply(act)
            continue
        c.apply(act)
        assert c.argv_for(act)[0][3:] == ["TresPerJob=gres/gpu:3", "NodeList=n0000,n0001"]
        c.jobs[1].held = False
        c.schedule()
        c.check()
        assert c.jobs[1].placement == (2, 1) and c.snapshot().job(1).nodes == ("n0000", "n0001")


def test_runs_on_two_worker_processes_are_the_runs_one_after_another(truth, mix):
    from slurm_elastico.sim import compare, pool

    sim = SimSettings(gpus=4, gpus_per_node=2, placement_window_s=-1)
    names = ["static", "elastico", "pollux"]

    def make(seed):
        return trace.jitter_arrivals(mix, seed, 60.0)

    here = compare.compare(make, names, [0, 1], Settings(), sim, ContentionModel(), truth)
    with pool.Runs(truth, 2) as runs:
        assert not runs.here
        apart = compare.compare(make, names, [0, 1], Settings(), sim, ContentionModel(), truth, runs=runs)
    for n in names:
        assert [r.seed for r in apart.runs[n]] == [0, 1]
        for a, b in zip(here.runs[n], apart.runs[n]):
            assert (a.jobs, a.timeline, a.counters, a.events, a.unfinished) == (b.jobs, b.timeline, b.counters,
                                                                               b.events, b.unfinished)
    assert here.runs["elastico"][0].jobs != here.runs["elastico"][1].jobs  # the seeds differ: a real check


def test_runs_want_a_worker_count_and_the_comparisons_truth(truth, toy, mix):
    from slurm_elastico.sim import compare, pool

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="workers must be an integer of at least 1"):
            pool.Runs(truth, bad)
    with pool.Runs(toy) as runs, pytest.raises(ValueError, match="another ground truth"):
        compare.submit(lambda s: mix, ["static"], [0], Settings(), SimSettings(gpus=4), ContentionModel(), truth,
                       runs=runs)


def test_a_share_no_node_could_ever_hold_keeps_nothing_and_the_rest_start():
    c = SimCluster(2, gpus_per_node=1, cpus_per_gpu=2)  # nodes of 2 CPUs
    c.submit(sim_job(1, GresRequest("mps", 100), cpus=4))  # heads the queue, never fits a node
    c.submit(sim_job(2, GresRequest("mps", 100), cpus=2))
    c.jobs[2].pin = ("n0000",)
    c.schedule()
    assert c.jobs[2].state is JobState.RUNNING and c.jobs[1].state is JobState.PENDING


def test_the_simulated_slurm_gives_gpus_n_the_gpus_its_version_takes():
    # 24.11 gives gpu:1 the lowest GPU with no user: GPU 1 of n0000, beside the MPS job on GPU 0 (best fit: the node
    # with the fewest idle GPUs). 22.05 takes the lowest GPU not held whole, GPU 0 there, an MPS user's: the
    # simulated 22.05 does not start it on n0000 (it would share GPU 0; not modelled) but on n0001's GPU 0; and a
    # GPU held whole is passed over: the next gpu:1 goes on n0001's GPU 1.
    for version, second, third in (("24.11.5", (0, 1), (0, 2)), ("22.05.8", (1, 0), (1, 1))):
        c = SimCluster(8, gpus_per_node=4, slurm_version=version)
        c.submit(sim_job(1, GresRequest("mps", 50)))
        c.schedule()
        c.submit(sim_job(2, GresRequest("gpus", 1)))
        c.schedule()
        c.submit(sim_job(3, GresRequest("gpus", 1)))
        c.schedule()
        c.check()
        assert (c.jobs[1].alloc, c.jobs[2].alloc, c.jobs[3].alloc) == (((0, 0),), (second,), (third,)), version
        assert c.snapshot().slurm_version == version


def test_the_simulated_slurm_version_is_a_setting_the_planner_sees():
    assert SimSettings().slurm_version == "24.11.5"
    e = engine.Engine([sim_job(1, GresRequest("mps", 50)).trace], "elastico", Settings(),
                      from_mapping({"slurm_version": "22.05.8"}), ContentionModel(), GroundTruth())
    assert e.cluster.snapshot().slurm_version == "22.05.8" and not e.cluster.lowest_unused
    with pytest.raises(ConfigError, match="sim.slurm_version: 'latest' is not a Slurm version"):
        from_mapping({"slurm_version": "latest"})
