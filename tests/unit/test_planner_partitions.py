"""Each job on its own partitions' nodes when the helper manages several partitions (`slurm.partition` empty): a
job's shares, gangs, moves and queue-head reservation stay there, and its family's shapes of other GPU types are
not its to take (`planner.partitions`)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import ActionKind, GpuUse, GresRequest, JobState, JobView, Snapshot, partition_names
from slurm_elastico.planner import partitions, run_epoch
from tests.synthetic import cluster, family, pending, running, snapshot, with_users
from tests.unit.test_planner_types import pend, starts, typed_cluster, typed_family

NOW = 1_000_000.0


def split(nodes, parts: dict[str, str]):
    """`nodes` with the partitions `parts` gives by node name ("a,b": both)."""
    return tuple(dataclasses.replace(n, partitions=tuple(parts[n.name].split(","))) for n in nodes)


def on(job: JobView, partition: str) -> JobView:
    return dataclasses.replace(job, partition=partition)


def plan(nodes, jobs, families, progress=None):
    snap = Snapshot(NOW, "24.11.5", nodes, tuple(jobs))
    return run_epoch(snap, families, Settings(), ContentionModel(), NOW, progress)


def per_type(nodes):
    """One partition per GPU type, as many sites have: t4p, a100p."""
    return split(nodes, {n.name: f"{n.gpu_type}p" for n in nodes})


def test_a_jobs_partitions_are_named_and_give_its_nodes():
    assert partition_names("a100, t4") == {"a100", "t4"} and partition_names("") == frozenset()
    job = pending(1)
    assert partitions.managed(on(job, "a,b"), "b") and not partitions.managed(on(job, "a"), "b")
    assert partitions.managed(on(job, "a"), "")
    nodes = split(cluster(3, gpus_per_node=1), {"n0000": "a", "n0001": "b", "n0002": "a,b"})
    assert partitions.allowed_nodes(on(job, "a"), nodes) == {0, 2}
    assert partitions.allowed_nodes(on(job, "b"), nodes) == {1, 2}
    assert partitions.allowed_nodes(on(job, "a,b"), nodes) is None  # every node: no limit to check
    assert partitions.allowed_nodes(on(job, ""), nodes) is None
    assert partitions.allowed_nodes(on(job, "c"), nodes) == frozenset()
    # each partition's nodes apart (a job runs within one), in name order; a partition without nodes left out
    assert partitions.node_sets("b,c,a", [n.partitions for n in nodes]) == [{0, 2}, {1, 2}]
    assert partitions.node_sets("", [n.partitions for n in nodes]) == []
    by_name = {n.name: n for n in nodes}
    assert partitions.outside(on(job, "a"), ("n0000", "n0001", "n0002", "n9"), by_name) == ["n0001"]
    assert partitions.outside(on(job, ""), ("n0001",), by_name) == []
    assert partitions.outside(None, ("n0001",), by_name) == []


def test_a_job_starts_on_its_partitions_type_though_a_faster_type_is_idle_elsewhere():
    nodes = per_type(typed_cluster(t4=1, a100=1))
    fam = typed_family({"t4": 1.0, "a100": 3.0})
    assert starts(plan(nodes, [on(pend(1), "t4p")], {1: fam})) == {1: ("t4", ("t4-0",))}
    # Submitted to both: the a100 is its to take, and it is 3x faster.
    assert starts(plan(nodes, [on(pend(1), "t4p,a100p")], {1: fam})) == {1: ("a100", ("a100-0",))}
    # Its family runs on no type its partition has: not planned (Slurm runs it as submitted), no crash.
    p = plan(nodes, [on(pend(1), "t4p")], {1: typed_family({"a100": 3.0})})
    assert not p.actions and not p.placements
    assert ("job 1 not planned: its family has no shape for the GPU types of its partitions t4p (t4); Slurm runs it "
            "as submitted") in p.notes


def test_shares_and_gangs_go_only_on_the_jobs_partition_though_another_has_idle_gpus():
    # n0000 is a's, n0001 and n0002 b's (one GPU each). Three share jobs of a: the first takes a's GPU, the others
    # wait; b's GPUs stay idle for b's job.
    nodes = split(cluster(3, gpus_per_node=1), {"n0000": "a", "n0001": "b", "n0002": "b"})
    whole = family((100, 1.0, 1000))
    jobs = [on(pending(k, NOW - 600 + k), "a") for k in (1, 2, 3)] + [on(pending(4, NOW - 60), "b")]
    p = run_epoch(snapshot(nodes, jobs), {k: whole for k in (1, 2, 3, 4)}, Settings(), ContentionModel(), NOW)
    where = {(pl.job_id, pl.node) for pl in p.placements}
    assert {j for j, _ in where} == {1, 4} and (1, "n0000") in where and dict(where)[4] in ("n0001", "n0002")
    # A gang of 2: b has two idle GPUs on two nodes, a has one. As a's job it waits; as b's it takes b's two.
    nodes4 = split(cluster(4, gpus_per_node=2), {"n0000": "a", "n0001": "b"})
    gang = typed_family({"": 1.0}, gpus=(2,))  # of no type: a gang of 2 whole GPUs
    busy = with_users(nodes4, {("n0000", 0): (GpuUse(9, 100, whole=True),)})
    assert not starts(plan(busy, [on(pend(1), "a")], {1: gang}))
    assert starts(plan(busy, [on(pend(1), "b")], {1: gang})) == {1: ("", ("n0001",))}


def test_a_running_job_is_not_moved_to_another_partitions_faster_type():
    fam = typed_family({"t4": 1.0, "a100": 3.0}, gpus=(4,))
    held = tuple(("t4-0", g, 0) for g in range(4))
    nodes = with_users(per_type(typed_cluster(t4=1, a100=1)),
                       {("t4-0", g): (GpuUse(1, 100, whole=True),) for g in range(4)})

    def job(partition: str) -> JobView:
        return JobView(1, "j1", "u", partition, JobState.RUNNING, gres=GresRequest("gpus", 4), nodes=("t4-0",),
                       gpu_indices=(0,), cpus=8, memory_mib=4 * 4096, submit_time=int(NOW - 7200),
                       start_time=int(NOW - 7200), requeue=True, admin_comment="elastico:shape=gpus4@t4",
                       gpu_alloc=held)

    def moves(partition: str):
        p = plan(nodes, [job(partition)], {1: fam}, progress={1: 1000.0})
        return [(a.gpu_type, a.nodes) for a in p.actions if a.kind is ActionKind.RESHAPE_RUNNING]

    assert moves("t4p,a100p") == [("a100", ("a100-0",))]  # 3x faster there, much work left: the move pays
    assert moves("t4p") == []


def test_a_running_share_moves_to_a_gpu_of_its_own_only_on_its_partition():
    # A job on a quarter of n0000's GPU (a's), beside a long co-runner; n0001 (b's) is idle. Moving to a whole GPU
    # pays, but n0001 is not its partition's.
    fam = family((25, 0.3, 1000), (100, 1.0, 1000), work=10000.0)
    nodes = with_users(split(cluster(2, gpus_per_node=1), {"n0000": "a", "n0001": "b"}),
                       {("n0000", 0): (GpuUse(1, 25), GpuUse(9, 75))})
    job = running(1, "n0000", 0, 25, start=NOW - 100, shape="mps25-0")

    def moved(partition: str) -> set[str]:
        p = run_epoch(snapshot(nodes, [on(job, partition)]), {1: fam}, Settings(), ContentionModel(), NOW, {1: 0.0})
        return {n for a in p.actions if a.kind is ActionKind.RESHAPE_RUNNING for n in a.nodes}

    assert moved("a,b") == {"n0001"}
    assert moved("a") == set()


def test_the_queue_head_keeps_gpus_free_only_on_its_partition():
    # A family-less head asking mps:100 on partition b: the GPU held back is b's, not the first GPU with room.
    nodes = split(cluster(2, gpus_per_node=1), {"n0000": "a", "n0001": "b"})
    head = on(JobView(50, "big", "u", "b", JobState.PENDING, gres=GresRequest("mps", 100), submit_time=0,
                      priority=10), "b")
    fam = family((50, 0.6, 1000), (100, 1.0, 1000))
    jobs = [head] + [on(pending(k, NOW), "a,b") for k in (1, 2)]
    p = run_epoch(snapshot(nodes, jobs), {1: fam, 2: fam}, Settings(), ContentionModel(), NOW)
    assert any("job 50 heads the queue: 100 shares of GPU 1 kept for it" in n for n in p.notes), p.notes
    assert {pl.node for pl in p.placements} == {"n0000"}
    # A head with a family that fits nowhere yet: the GPU kept free for it is on its partition (n0000 is a's and
    # emptier, but not the head's).
    nodes = with_users(split(cluster(2, gpus_per_node=1), {"n0000": "a", "n0001": "b"}),
                       {("n0001", 0): (GpuUse(9, 60),)})
    big = family((100, 1.0, 1000))
    p = run_epoch(snapshot(nodes, [on(pending(1, NOW - 60, priority=9), "b")]), {1: big}, Settings(),
                  ContentionModel(), NOW)
    assert [n for n in p.notes if "kept free" in n] == [
        "job 1 heads the queue and fits nowhere yet: GPU n0001:0 kept free for it"], p.notes


def test_the_allotment_counts_a_job_only_on_the_types_its_partitions_have():
    # Job 1 (t4p) is short and 4x faster on an a100, job 2 (a100p) long. Were job 1's a100 shapes left in, the
    # allotment would give it the a100 node first and job 2 would wait; job 1 can run on the t4 node only.
    nodes = per_type(typed_cluster(t4=1, a100=1))
    fams = {1: typed_family({"t4": 1.0, "a100": 4.0}, gpus=(4,), work=1000.0),
            2: typed_family({"t4": 1.0, "a100": 1.5}, gpus=(4,), work=100000.0)}
    p = plan(nodes, [on(pend(1), "t4p"), on(pend(2), "a100p")], fams)
    assert starts(p) == {1: ("t4", ("t4-0",)), 2: ("a100", ("a100-0",))}


def test_a_typed_queue_head_keeps_free_a_gpu_of_its_type_not_the_emptiest_of_another():
    # One partition, two types. The head's family runs on t4 only, every t4 GPU is 60 % taken: it fits nowhere.
    # The idle a100 GPUs are emptier, but keeping one free would idle it for nothing.
    nodes = with_users(typed_cluster(t4=1, a100=1), {("t4-0", g): (GpuUse(9, 60),) for g in range(4)})
    head = dataclasses.replace(pend(1), priority=9)
    p = plan(nodes, [head], {1: typed_family({"t4": 1.0}, gpus=(1,))})
    kept = [n for n in p.notes if "kept free" in n]
    assert kept == ["job 1 heads the queue and fits nowhere yet: GPU t4-0:3 kept free for it"], p.notes


def test_on_nested_partitions_a_job_of_the_small_one_is_not_allotted_gpus_only_the_large_one_has():
    """`small` is n0000, `all` both nodes (4 GPUs each). Jobs 1 and 2 of small are the shortest, job 3 of all the
    longest. Job 1 takes small's node; job 2 has nowhere to go. Counting the cluster's GPUs alone, the allotment
    gave job 2 the other four, which it can never be placed on, and job 3 waited beside an idle node."""
    nodes = split(cluster(8, gpus_per_node=4), {"n0000": "small,all", "n0001": "all"})
    fams = {k: typed_family({"": 1.0}, work=w, gpus=(1, 2, 4, 8)) for k, w in ((1, 5e4), (2, 6e4), (3, 2e5))}
    jobs = [on(pend(1, NOW - 90), "small"), on(pend(2, NOW - 60), "small"), on(pend(3, NOW - 30), "all")]
    assert starts(plan(nodes, jobs, fams)) == {1: ("", ("n0000",)), 3: ("", ("n0001",))}


def test_a_job_of_every_partition_on_a_fast_type_leaves_the_room_of_another_types_partition_alone():
    """A partition per type and one of all nodes (a common layout): job 1 (all) is short and 4x faster on the
    a100, job 2 can run on the t4 node only. Job 1's a100 GPUs were taken from the room of the region the
    fewest claims use, the t4 node's; job 2 then saw no room there and waited beside its idle node."""
    nodes = split(typed_cluster(t4=1, a100=1), {"t4-0": "t4p,all", "a100-0": "a100p,all"})
    fams = {1: typed_family({"t4": 1.0, "a100": 4.0}, gpus=(4,), work=1000.0),
            2: typed_family({"t4": 1.0}, gpus=(4,), work=5000.0),
            3: typed_family({"a100": 1.0}, gpus=(4,), work=100000.0)}
    jobs = [on(pend(1), "all"), on(pend(2), "t4p"), on(pend(3), "a100p")]
    assert starts(plan(nodes, jobs, fams)) == {1: ("a100", ("a100-0",)), 2: ("t4", ("t4-0",))}


def test_jobs_the_prices_place_take_their_partitions_room_before_the_allotment():
    """Jobs 1 and 2 (small, shares only: the prices' choice) fill n0000, small's node. Counting them in the
    budget alone, the allotment still saw n0000's GPUs as small's room and gave them to job 3 (small), which
    could not be placed; job 4 (all) waited beside the idle n0001."""
    nodes = split(cluster(4, gpus_per_node=2), {"n0000": "small,all", "n0001": "all"})
    share = family((100, 1.0, 1000))
    jobs = [on(pend(1, 0), "small"), on(pend(2, 1), "small"), on(pend(3, 2), "small"), on(pend(4, 3), "all")]
    fams = {1: share, 2: share, 3: typed_family({"": 1.0}, work=5e4, gpus=(1, 2)),
            4: typed_family({"": 1.0}, work=2e5, gpus=(1, 2))}
    p = plan(nodes, jobs, fams)
    assert sorted((pl.job_id, pl.node) for pl in p.placements) == [(1, "n0000"), (2, "n0000"), (4, "n0001")]


@pytest.mark.parametrize("parts, asked", [({"n0000": "a", "n0001": "b", "n0002": "c"}, "a,b"),
                                          ({"n0000": "a", "n0001": "b"}, "a,b")])
def test_a_gang_of_a_job_of_several_partitions_stays_within_one(parts, asked):
    """Slurm allocates a job in one of its partitions: a job of a and b (a node of 4 GPUs each) starts on 4 GPUs
    of one of them, never an 8-GPU gang across both, which Slurm would leave pending (also where a and b together
    are the whole cluster, so that the job's nodes are no limit)."""
    nodes = split(cluster(4 * len(parts), gpus_per_node=4), parts)
    got = starts(plan(nodes, [on(pend(1), asked)], {1: typed_family({"": 1.0}, gpus=(1, 2, 4, 8))}))
    assert got == {1: ("", ("n0000",))}, got
    a = plan(nodes, [on(pend(1), asked)], {1: typed_family({"": 1.0}, gpus=(1, 2, 4, 8))})
    assert [pl.job_id for pl in a.placements] == [1]


def test_the_allotment_keeps_room_per_node_only_for_claims_limited_to_nodes():
    from slurm_elastico.planner.allot import Claim, NodeRoom, allot

    def claim(key, nodes=None):
        return Claim(key, [1.0, 2.0, 4.0], [1.0, 1.9, 3.7], [True] * 3, 4.0, nodes=nodes)

    small, everywhere = claim(1.0, frozenset({0})), claim(2.0)
    # Node 0 is small's, node 1 anyone's: the unlimited claim takes node 1's room first, whatever its order.
    room = NodeRoom([4.0, 4.0], [small, everywhere])
    room.take(everywhere, 4.0)
    assert room.room(small) == 4.0 and room.room(everywhere) == float("inf")
    room.take(everywhere, 2.0)  # then node 0's
    assert room.room(small) == 2.0
    # A second claim of node 0 after the first: nothing left there for it, though the budget has four GPUs.
    assert allot([small, claim(1.5, frozenset({0})), everywhere], 8.0, 0.1, node_room=[4.0, 4.0]) == [2, -1, 2]
    # Claims not limited to nodes are held to the budget alone, whatever the node room says.
    assert allot([claim(1.0), claim(1.5)], 8.0, 0.1, node_room=[0.0, 0.0]) == [2, 2]
    # Per GPU type: node 0 of type 0, node 1 of type 1; a slot of type 1 takes from node 1 only, though node 0's
    # region is the one the fewest claims use; what was booked before the claims is taken first.
    typed = Claim(1.0, [4.0, 4.0], [1.0, 4.0], [True] * 2, 4.0, types=[0, 1])
    room = NodeRoom([4.0, 4.0], [small, typed], [0, 1], booked=[(frozenset({0}), -1, 1.0)])
    assert (room.room(small), room.room(small, 0), room.room(small, 1)) == (3.0, 3.0, 0.0)
    room.take(typed, 4.0, 1)
    assert room.room(small) == 3.0
    assert allot([typed, small], [4.0, 4.0], 0.1, node_room=[4.0, 4.0], node_types=[0, 1]) == [1, 2]
    assert allot([typed, small], [4.0, 4.0], 0.1, node_room=[4.0, 4.0], node_types=[0, 1],
                 booked=[(frozenset({0}), 0, 3.0)]) == [1, 0]
    # A claim of two partitions (node 0, node 1): a gang fits within one of them, a share anywhere.
    both = Claim(1.0, [0.5, 4.0, 8.0], [0.5, 3.7, 7.0], [True] * 3, 8.0, node_sets=(frozenset({0}), frozenset({1})))
    room = NodeRoom([4.0, 4.0], [both])
    assert (room.room(both, -1, 8.0), room.room(both, -1, 4.0), room.room(both, -1, 0.5)) == (4.0, 4.0, math.inf)
    room.take(both, 4.0)  # within node 0, the first with room
    assert room.room(both, -1, 4.0) == 4.0 and room.left[room.regions[frozenset({0})][0]] == 0.0
    assert allot([both], 8.0, 0.1, node_room=[4.0, 4.0]) == [1]
