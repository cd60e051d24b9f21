"""Pollux: goodput from statistical efficiency that changes with training progress, GPU counts and batch sizes
chosen together, the p = −1 power-mean allocation with its restart penalty, and the simulator running it to the
end without moving any fixed-batch policy's completion point."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

from slurm_elastico.config import Settings
from slurm_elastico.errors import InvalidActionError
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import (Action, ActionKind, Family, GpuUse, GresRequest, JobState, JobView, Resources,
                                  Shape)
from slurm_elastico.planner import policies
from slurm_elastico.planner.narrowers import whole_gpu_any_batch
from slurm_elastico.planner.pollux import (FLOOR, PolluxPolicy, Room, allocate, best_by_gpus, pollux_comment,
                                           place, pollux_state, PolluxState, power_mean, restart_factor)
from slurm_elastico.sim import engine, trace_pollux
from slurm_elastico.sim.cluster import SimCluster
from slurm_elastico.sim.families import _epoch_bounds, at_epoch, efficiency_segment, family_of
from slurm_elastico.sim.job import SimJob
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth
from tests.synthetic import cluster, snapshot, with_users

NOW = 1_000_000.0
POLLUX = PolluxPolicy("pollux", "under test")


@pytest.fixture(scope="module")
def truth() -> GroundTruth:
    return GroundTruth()


def cifar(truth: GroundTruth, batch: int = 512, gpus: int = 1) -> TraceJob:
    return TraceJob(1, 0.0, "train", "cifar10", gpus, float(truth.iterations_to_end("cifar10", batch)), batch)


def goodput_family(truth: GroundTruth, job: TraceJob, epoch: int) -> Family:
    fam = family_of(job, truth, (25, 50, 100), 16384, adaptive=True, max_gpus=16, gpus_per_node=4)
    return at_epoch(fam, job, truth, epoch)


def toy_family(speed, counts=range(1, 9), work: float = 1000.0) -> Family:
    """Shapes at 1..8 whole GPUs, throughput `speed(n)`, the batch 64·n (one GPU: a full share)."""
    shapes = []
    for n in counts:
        res = Resources(100, 1000, 1, 1024) if n == 1 else Resources(0, 1000, n, 1024 * n, gpus=n)
        shapes.append(Shape(f"gb{64 * n}-gpus{n}", res, float(speed(n)), (("global_batch", 64 * n),)))
    return Family("train", tuple(shapes), work, default=shapes[0].name)


def waiting(jid: int, top: int = 0, gpus: int = 1, cpus: int = 1, mem: int = 1024, age: float = 600.0) -> JobView:
    gres = GresRequest("gpus", gpus) if gpus > 1 else GresRequest("mps", 100)
    comment = f"pollux:top={top}" if top else ""
    return JobView(jid, f"j{jid}", "u", "gpu", JobState.PENDING, reason="BeginTime", gres=gres, cpus=cpus,
                   memory_mib=mem, submit_time=int(NOW - age), admin_comment=comment)


def running(jid: int, gpus: list[tuple[str, int]], shape: str, top: int, age: float, restarts: int = 0) -> JobView:
    gres = GresRequest("gpus", len(gpus)) if len(gpus) > 1 else GresRequest("mps", 100)
    return JobView(jid, f"j{jid}", "u", "gpu", JobState.RUNNING, gres=gres, nodes=tuple(dict.fromkeys(n for n, _ in gpus)),
                   cpus=1, memory_mib=1024, submit_time=int(NOW - age), start_time=int(NOW - 60), restarts=restarts,
                   requeue=True, admin_comment=pollux_comment("", shape, PolluxState(top)),
                   gpu_alloc=tuple((n, g, 0 if len(gpus) > 1 else 100) for n, g in gpus))


def plan(n_gpus: int, jobs: list[JobView], fams: dict[int, Family], policy=POLLUX, progress=None):
    uses = {(n, g): (GpuUse(j.job_id, share, whole=share == 0),) for j in jobs for n, g, share in j.gpu_alloc}
    nodes = with_users(cluster(n_gpus, 4, cpus_per_gpu=16), uses)
    return policy.plan(snapshot(nodes, jobs, NOW), fams, Settings(), None, NOW, progress)


def given(p, jid: int) -> int:
    """GPUs the plan starts (or restarts) job `jid` on; 0 when it starts nothing for it."""
    for a in p.actions:
        if a.job_id == jid and a.kind in (ActionKind.SET_GPUS, ActionKind.RESHAPE_RUNNING):
            return a.gpus or 1
        if a.job_id == jid and a.kind is ActionKind.SET_NODES:
            return 1
    return 0


def started_shape(p, jid: int) -> str:
    return next(a.shape for a in p.actions if a.job_id == jid and a.kind is not ActionKind.SET_ADMIN_COMMENT)


# -- statistical efficiency and goodput ------------------------------------------------------------------------


def test_a_large_batch_gains_statistical_efficiency_as_training_goes_on(truth):
    # Pollux's gradient statistics: early on a 4096 batch is worth little more than a 256 one per step; later,
    # with more gradient noise, it is worth many more steps of 256.
    ratio = [truth.efficiency_ratio("cifar10", 256, 4096, e) for e in (1, 5, 20, 50, 99)]
    assert ratio == sorted(ratio) and ratio[-1] > 3 * ratio[0]
    assert 1.0 < ratio[0] < 4096 / 256  # never more than the samples it takes
    assert truth.efficiency_ratio("cifar10", 256, 256, 50) == 1.0


def test_a_job_keeping_its_batch_finishes_where_it_always_did(truth):
    job = cifar(truth)
    for done in (0.0, 0.3 * job.work, job.work):
        assert efficiency_segment(truth, job, job.global_batch, done) == (1.0, job.work)
    # Another batch changes worth at every epoch end of the job's own batch, and those ends cover the work.
    factor, until = efficiency_segment(truth, job, 2048, 0.0)
    bounds = _epoch_bounds(truth, "cifar10", 512, job.work)
    assert until == bounds[0] < job.work and bounds[-1] == job.work and factor != 1.0
    assert efficiency_segment(truth, job, 2048, until)[1] == bounds[1]


def test_the_goodput_optimal_batch_grows_with_the_gpus(truth):
    job = cifar(truth)
    best = best_by_gpus(whole_gpu_any_batch(goodput_family(truth, job, 40)))
    batches = [best[n].knob("global_batch") for n in (1, 2, 4, 8, 16)]
    assert batches == sorted(batches) and batches[-1] > batches[0]
    assert all(best[n].throughput > best[1].throughput for n in (2, 4, 8, 16))


def test_a_fixed_batch_policy_runs_the_same_with_or_without_goodput_shapes(truth):
    jobs = trace_pollux.pollux(1, truth)[:20]
    base = dict(gpus=64, gpus_per_node=4, epoch_s=60.0, placement_window_s=-1.0, restart_cost_s=30.0)
    plain = engine.run(jobs, "static", Settings(), SimSettings(**base), ContentionModel(), truth)
    wide = engine.run(jobs, "static", Settings(), SimSettings(**base, adaptive_batch=True), ContentionModel(), truth)
    assert plain.unfinished == wide.unfinished == 0
    assert [(j.job_id, j.end, j.restarts) for j in plain.jobs] == [(j.job_id, j.end, j.restarts) for j in wide.jobs]


def test_a_job_at_another_batch_finishes_when_its_goodput_adds_up_to_its_work(truth):
    # One GPU, the job at global batch 2048 instead of its own 512: its rate changes at each epoch end of its
    # own batch, and it ends exactly where the sum of each epoch's work over that epoch's rate says.
    tj = cifar(truth, 512)
    tj = TraceJob(1, 0.0, "train", "cifar10", 1, tj.work / 20, 512)  # a shorter job: the same epochs, scaled
    sim = SimSettings(gpus=1, gpus_per_node=1, epoch_s=1e9, placement_window_s=0, profile_noise=0.0,
                      colocation="none", adaptive_batch=True, max_gpus_per_job=0, audit=True, wrapper_start_s=0.0)
    e = engine.Engine([tj], "no-shapes", Settings(), sim, ContentionModel(), truth)
    e._arrive(tj)
    shape = next(s for s in e.families[1].shapes if s.knob("global_batch") == 2048 and s.resources.mps == 100)
    e.cluster.apply(Action(ActionKind.SET_ADMIN_COMMENT, 1, "t", text=f"elastico:shape={shape.name}"))
    e._settle()
    job = e.cluster.jobs[1]
    assert job.shape == shape.name and 1 in e.until
    while e.heap:
        t, kind, _, jid, version = heapq.heappop(e.heap)
        e.cluster.now = t
        if kind == engine.COMPLETE and jid in e.cluster.jobs and e.cluster.jobs[jid].version == version:
            e._reached(e.cluster.jobs[jid])
    speed = truth.train_speed("cifar10", 2048, int(shape.knob("micro_batch")), 100)
    bounds = (0.0,) + _epoch_bounds(truth, "cifar10", 512, tj.work)
    expect = sum((bounds[k + 1] - bounds[k]) / (speed * truth.efficiency_ratio("cifar10", 512, 2048, k))
                 for k in range(len(bounds) - 1))
    (r,) = e.results
    assert r.done == tj.work and r.end == pytest.approx(expect, rel=1e-9)
    assert r.end != pytest.approx(tj.work / (speed * truth.efficiency_ratio("cifar10", 512, 2048, 0)), rel=0.01)


# -- the allocation ------------------------------------------------------------------------------------------


def test_allocate_finds_the_cheapest_counts_within_the_capacity():
    # Two jobs with 1/(speedup) costs: sqrt speedups split 8 GPUs evenly; counts a job may not take are skipped.
    cost = lambda s: np.array([1 / FLOOR] + [1 / (s(n) + FLOOR) for n in range(1, 9)])  # noqa: E731
    assert allocate([cost(math.sqrt), cost(math.sqrt)], 8) == [4, 4]
    odd = cost(math.sqrt)
    odd[4] = np.inf
    got = allocate([odd, cost(math.sqrt)], 8)
    assert got[0] != 4 and sum(got) <= 8
    assert allocate([cost(math.sqrt)] * 3, 2).count(0) == 1  # more jobs than GPUs: one waits
    with pytest.raises(ValueError, match="finite cost at 0 GPUs"):
        allocate([np.array([np.inf, 1.0])], 1)


def test_the_power_mean_objective_spreads_gpus_when_speedups_are_sublinear():
    fams = {1: toy_family(math.sqrt), 2: toy_family(math.sqrt)}
    p = plan(8, [waiting(1, top=8), waiting(2, top=8)], fams)
    assert (given(p, 1), given(p, 2)) == (4, 4)
    # A job whose goodput stops growing at 2 GPUs leaves the rest to one that keeps scaling; its 6 would be
    # 3 + 3 (Slurm asks the same count per node) beside the first job's 2 on one node: it gets the 4 that fit.
    fams = {1: toy_family(lambda n: min(n, 2)), 2: toy_family(lambda n: n)}
    p = plan(8, [waiting(1, top=8), waiting(2, top=8)], fams)
    assert (given(p, 1), given(p, 2)) == (2, 4)
    # p = -1: an even split beats the same total on one job, and a job with no GPU all but zeroes the mean.
    assert power_mean([1.0, 1.0]) > power_mean([1.5, 0.5]) > power_mean([2.0, 0.0])
    assert power_mean([1.0, 0.0]) < 2.1 * FLOOR


def test_an_idle_cluster_gives_a_proven_job_more_gpus_than_it_asked_for_and_a_new_one_one():
    fams = {1: toy_family(lambda n: n)}
    p = plan(16, [waiting(1, top=4, gpus=2)], fams)
    assert given(p, 1) == 8  # twice the most it has held, above the 2 it asked for
    assert pollux_state(next(a.text for a in p.actions if a.kind is ActionKind.SET_ADMIN_COMMENT)).top == 8
    p = plan(16, [waiting(1, gpus=2)], fams)
    assert given(p, 1) == 1  # never run yet: one GPU first


def test_a_job_given_more_gpus_is_given_a_larger_batch(truth):
    job = cifar(truth)
    fam = goodput_family(truth, job, 40)
    small = plan(1, [waiting(1, top=8, cpus=4, mem=16384)], {1: fam})
    large = plan(16, [waiting(1, top=8, cpus=4, mem=16384)], {1: fam})
    assert (given(small, 1), given(large, 1)) == (1, 16)
    b1, b16 = (fam.shape(started_shape(p, 1)).knob("global_batch") for p in (small, large))
    assert b16 > b1


def test_a_job_holding_a_nodes_cpus_gets_at_least_that_nodes_gpus():
    # Slurm keeps a job's CPUs as submitted: 64 CPUs on nodes of 4 GPUs × 16 CPUs is a node's worth, so fewer
    # than 4 GPUs would strand the rest of its node.
    fams = {1: toy_family(lambda n: n)}
    p = plan(16, [waiting(1, gpus=16, cpus=64, mem=4 * 65536)], fams)
    assert given(p, 1) == 4 and len(next(a for a in p.actions if a.kind is ActionKind.SET_GPUS).nodes) == 1


def test_restarts_are_penalised_so_a_young_job_keeps_its_gpus_and_an_old_one_grows():
    assert restart_factor(600.0, 2, 30.0) == pytest.approx(540.0 / 630.0)
    assert restart_factor(60.0, 1, 60.0) == 0.0
    fams = {1: toy_family(lambda n: n ** 0.9)}
    on_two = [("n0000", 0), ("n0000", 1)]
    young = plan(8, [running(1, on_two, "gb128-gpus2", top=2, age=60.0, restarts=1)], fams)
    assert [a.kind for a in young.actions] == []
    old = plan(8, [running(1, on_two, "gb128-gpus2", top=2, age=20000.0)], fams)
    reshape = [a for a in old.actions if a.kind is ActionKind.RESHAPE_RUNNING]
    assert [a.gpus for a in reshape] == [4]


def test_the_plan_is_deterministic(truth):
    fams = {1: toy_family(math.sqrt), 2: toy_family(lambda n: n), 3: goodput_family(truth, cifar(truth), 10)}
    jobs = [running(1, [("n0000", 0), ("n0000", 1)], "gb128-gpus2", top=2, age=5000.0),
            waiting(2, top=2), waiting(3, top=4, cpus=4, mem=16384)]
    a, b = plan(8, jobs, fams), plan(8, jobs, fams)
    assert a == b and a.actions


def test_a_gang_is_placed_with_the_same_count_on_each_node_and_slurm_starts_it_so():
    sim = SimCluster(8, gpus_per_node=4, cpus_per_gpu=16)
    other = SimJob(trace=TraceJob(9, 0.0, "train", "cifar10", 1, 10.0, 64), family=None,
                   gres=GresRequest("gpus", 1), cpus=4, mem_mib=16384, pin=("n0001",))
    sim.submit(other)
    sim.schedule()
    room = Room({"n0000": [0, 1, 2, 3], "n0001": [1, 2, 3]}, {"n0000": 64, "n0001": 60},
                {"n0000": 4 * 65536, "n0001": 3 * 65536}, {"n0000": 0, "n0001": 1})
    want = place(6, room, 24, 6 * 16384)
    assert want == {"n0000": 3, "n0001": 3}  # 3 + 3, never the 4 + 2 a fill would give: Gres= is per node
    job = SimJob(trace=TraceJob(1, 1.0, "train", "cifar10", 6, 10.0, 64), family=None,
                 gres=GresRequest("gpus", 1), cpus=24, mem_mib=6 * 16384)
    sim.submit(job)
    sim.apply(Action(ActionKind.SET_GPUS, 1, "test", gpus=6, nodes=("n0000", "n0001")))
    assert sim.argv_for(Action(ActionKind.SET_GPUS, 1, "test", gpus=6, nodes=("n0000", "n0001")))[0][3:5] == [
        "Gres=gpu:3", "NumNodes=2-2"]
    sim.schedule()
    got = {sim.nodes[ni].name: k for ni, k in zip(*np.unique([ni for ni, _ in job.alloc], return_counts=True))}
    assert got == want
    assert place(8, room, 24, 6 * 16384) is None  # 7 idle GPUs: no room for 8
    assert place(5, room, 24, 6 * 16384) is None  # 5 splits only as 5 × 1: two nodes cannot hold it
    with pytest.raises(InvalidActionError, match="do not split evenly"):
        sim.apply(Action(ActionKind.SET_GPUS, 1, "test", gpus=5, nodes=("n0000", "n0001")))


# -- the simulator running it ---------------------------------------------------------------------------------


def test_a_pollux_workload_slice_runs_to_the_end_with_batches_and_gpu_counts_of_its_choice(truth, monkeypatch):
    assert isinstance(policies.get("pollux"), PolluxPolicy)
    jobs = trace_pollux.pollux(1, truth)[:40]
    shapes: dict[int, set[tuple[int, str]]] = {}
    start = engine.SimCluster.start

    def watch(self, job, alloc):
        start(self, job, alloc)
        shapes.setdefault(job.job_id, set()).add((len(job.alloc), job.shape))

    monkeypatch.setattr(engine.SimCluster, "start", watch)
    sim = SimSettings(gpus=32, gpus_per_node=4, epoch_s=60.0, placement_window_s=-1.0, restart_cost_s=30.0, audit=True)
    r = engine.run(jobs, "pollux", Settings(), sim, ContentionModel(), truth)
    assert r.unfinished == 0 and r.counters["refused_actions"] == 0
    assert all(j.done == j.work for j in r.jobs)
    submitted = {j.job_id: j for j in jobs}
    assert any(n != submitted[jid].gpus for jid, seen in shapes.items() for n, _ in seen)  # GPU counts it chose
    assert any(name.startswith("gb") for seen in shapes.values() for _, name in seen)  # batches other than submitted


def test_under_the_peers_rule_a_gang_is_placed_unevenly_and_the_simulator_starts_it_so():
    sim = SimCluster(8, gpus_per_node=4, cpus_per_gpu=16, even_gangs=False)
    room = Room({"n0000": [0, 1, 2, 3], "n0001": [1, 2, 3]}, {"n0000": 64, "n0001": 60},
                {"n0000": 4 * 65536, "n0001": 3 * 65536}, {"n0000": 0, "n0001": 1})
    assert place(5, room, 20, 5 * 16384) is None  # Slurm-expressible gangs: 5 splits only as 5 x 1
    want = place(5, room, 20, 5 * 16384, even=sim.snapshot().even_gangs)
    assert place(8, room, 20, 5 * 16384, even=False) is None  # 7 idle GPUs: no room for 8 whatever the split
    assert want == {"n0000": 4, "n0001": 1}  # the peer's fill: the node with most room first
    assert SimCluster(8, gpus_per_node=4).snapshot().even_gangs  # what Slurm can be asked for, by default
    other = SimJob(trace=TraceJob(9, 0.0, "train", "cifar10", 1, 10.0, 64), family=None,
                   gres=GresRequest("gpus", 1), cpus=4, mem_mib=16384, pin=("n0001",))
    sim.submit(other)
    sim.schedule()
    job = SimJob(trace=TraceJob(1, 1.0, "train", "cifar10", 5, 10.0, 64), family=None,
                 gres=GresRequest("gpus", 1), cpus=20, mem_mib=5 * 16384)
    sim.submit(job)
    sim.apply(Action(ActionKind.SET_GPUS, 1, "test", gpus=5, nodes=("n0000", "n0001")))
    sim.schedule()
    sim.check()
    got = {sim.nodes[ni].name: int(k) for ni, k in zip(*np.unique([ni for ni, _ in job.alloc], return_counts=True))}
    assert got == want and job.placement == (4, 1)


def test_recovery_settles_a_simulated_reshape_left_open():
    # A simulated reshape that failed leaves its row open, as a live one does; the next epoch's recovery must
    # settle it against the simulated cluster too (it asks the gateway to forget the job's kept place).
    from slurm_elastico.helper.journal import MemoryJournal
    from slurm_elastico.helper.recovery import recover

    sim = SimCluster(8, gpus_per_node=4)
    journal = MemoryJournal()
    journal.plan(0.0, Action(ActionKind.RESHAPE_RUNNING, 99, "t", share=50, nodes=("n0000",)))
    notes = recover(sim, journal, sim.snapshot(), 60.0)
    assert notes and not journal.unsettled()  # job 99 is not in the cluster: the row is closed, with a note
