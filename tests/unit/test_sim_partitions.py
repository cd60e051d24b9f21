"""Partitions in the simulator and in the what-if on a cluster's history: each job starts only on nodes of the
partitions it was submitted to, a gang within one of them, as Slurm starts it (pure: constructed clusters and
histories)."""

from __future__ import annotations

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError
from slurm_elastico.history.past import PastJob
from slurm_elastico.history.replay import TOO_BIG, replay
from slurm_elastico.history.shape import ClusterShape, NodeShape
from slurm_elastico.history.whatif import SKIP_TOO_BIG, measured, what_if
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import Action, ActionKind, GresRequest, JobState
from slurm_elastico.sim import engine
from slurm_elastico.sim.cluster import SimCluster
from slurm_elastico.sim.gpu_types import NodeGroup
from slurm_elastico.sim.job import SimJob
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth

A_B = (NodeGroup("", 1, 4, 16384, ("a",)), NodeGroup("", 1, 4, 16384, ("b",)))
"""n0000 in partition a, n0001 in partition b, 4 GPUs each."""


def job_of(jid: int, partition: str, gres: GresRequest) -> SimJob:
    return SimJob(trace=TraceJob(jid, float(jid), "train", "cifar10", 1, 100.0, global_batch=64, partition=partition),
                  family=None, gres=gres, cpus=4, mem_mib=1024)


def test_slurm_starts_each_job_on_its_partitions_nodes_only():
    c = SimCluster(0, groups=A_B)
    c.submit(job_of(1, "a", GresRequest("gpus", 4)))
    c.submit(job_of(2, "a", GresRequest("mps", 50)))  # a is full: it waits, though b is idle
    c.submit(job_of(3, "a,b", GresRequest("mps", 50)))  # either: it starts on b
    c.submit(job_of(4, "", GresRequest("mps", 50)))  # names none: any node
    c.schedule()
    c.check()
    jobs = c.jobs
    assert {ni for ni, _ in jobs[1].alloc} == {0}
    assert jobs[2].state is JobState.PENDING
    assert jobs[3].alloc == ((1, 0),) and jobs[4].alloc == ((1, 0),)


def test_a_gang_runs_within_one_of_its_partitions():
    """Six GPUs of `a,b`: the two partitions hold eight idle GPUs together, but Slurm starts a job in one
    partition, which has four: it waits. Four start, on one node."""
    c = SimCluster(0, groups=A_B)
    c.submit(job_of(1, "a,b", GresRequest("gpus", 6)))
    c.submit(job_of(2, "a,b", GresRequest("gpus", 4)))
    c.schedule()
    c.check()
    assert c.jobs[1].state is JobState.PENDING
    assert c.jobs[2].placement == (4,)
    whole = SimCluster(0, groups=(NodeGroup("", 2, 4, 16384, ("a", "b")),))  # both nodes in both: it starts
    whole.submit(job_of(1, "a,b", GresRequest("gpus", 6)))
    whole.schedule()
    assert whole.jobs[1].placement == (4, 2)


def test_a_blocked_gang_holds_back_only_its_own_partitions_nodes():
    c = SimCluster(0, groups=(NodeGroup("", 2, 4, 16384, ("a",)), NodeGroup("", 1, 4, 16384, ("b",))))
    c.submit(job_of(1, "a", GresRequest("mps", 50)))
    c.schedule()
    c.submit(job_of(2, "a", GresRequest("gpus", 8)))  # blocked by job 1: keeps a's two nodes
    c.submit(job_of(3, "", GresRequest("mps", 50)))  # backfill: only b's node is left to it
    c.submit(job_of(4, "a", GresRequest("mps", 50)))  # a's nodes are kept for job 2
    c.schedule()
    c.check()
    assert c.jobs[2].state is JobState.PENDING and c.jobs[4].state is JobState.PENDING
    assert c.jobs[3].alloc == ((2, 0),)


def test_each_partitions_blocked_head_keeps_its_own_nodes():
    """A job of a and one of b each hold half of their partition's node; a whole-node gang of each then waits.
    Both gangs keep their node: a later share of b does not pass b's gang because a's came first in the queue."""
    c = SimCluster(0, groups=A_B)
    c.submit(job_of(1, "a", GresRequest("mps", 50)))
    c.submit(job_of(2, "b", GresRequest("mps", 50)))
    c.schedule()
    for jid, part in ((3, "a"), (4, "b")):
        c.submit(job_of(jid, part, GresRequest("gpus", 4)))
    c.submit(job_of(5, "a", GresRequest("mps", 50)))
    c.submit(job_of(6, "b", GresRequest("mps", 50)))
    c.schedule()
    c.check()
    assert [c.jobs[j].state for j in (3, 4, 5, 6)] == [JobState.PENDING] * 4
    c.submit(job_of(7, "", GresRequest("mps", 50)))  # a job of either partition: both nodes are kept
    c.schedule()
    assert c.jobs[7].state is JobState.PENDING


def test_a_job_pinned_outside_its_partitions_is_taken_and_never_starts():
    """Slurm accepts a NodeList= outside the job's partitions and leaves the job pending: so does the simulator
    (the helper's epoch drops such an action, `partitions.outside`)."""
    c = SimCluster(0, groups=A_B)
    c.submit(job_of(1, "a", GresRequest("mps", 50)))
    c.jobs[1].held = True
    c.apply(Action(ActionKind.SET_GPUS, 1, "t", gpus=2, nodes=("n0001",)))
    c.jobs[1].held = False
    c.submit(job_of(2, "b", GresRequest("mps", 50)))
    c.schedule()
    assert c.jobs[1].state is JobState.PENDING
    assert c.jobs[2].alloc == ((1, 0),)  # the stranded job holds nothing back for itself: it can never start
    c.apply(Action(ActionKind.SET_GPUS, 1, "t", gpus=2, nodes=("n0000",)))
    c.schedule()
    assert c.jobs[1].alloc == ((0, 0), (0, 1))


def test_jobs_of_two_partitions_run_each_gang_within_one_of_them():
    """Two DeepSpeech2 jobs of a and b (4 GPUs each), each able to take 1 to 8 GPUs: elastico plans each gang
    within one partition, so every start passes the audit and every job ends. Planned across both (8 GPUs, which
    Slurm never starts), the second job was asked again every epoch and never ran."""
    truth = GroundTruth()
    trace = [TraceJob(i, 60.0 * i, "train", "deepspeech2", 4, 2000.0, global_batch=320, partition="a,b")
             for i in range(1, 3)]
    e = engine.Engine(trace, "elastico", Settings(), SimSettings(gpus=8, gpus_per_node=4, placement_window_s=0.0,
                                                                 max_gpus_per_job=8),
                      ContentionModel(), truth, nodes=A_B)
    start, spans = e.cluster.start, []

    def audited(job, alloc):
        start(job, alloc)
        e.cluster.check()
        spans.append(len({ni for ni, _ in alloc}))

    e.cluster.start = audited
    r = e.run()
    assert r.unfinished == 0 and len(r.jobs) == 2 and spans and max(spans) == 1, (r.unfinished, spans)


def test_the_snapshot_shows_the_partitions_and_a_partition_no_node_is_in_is_refused():
    c = SimCluster(0, groups=A_B)
    c.submit(job_of(1, "b", GresRequest("mps", 50)))
    c.submit(job_of(2, "", GresRequest("mps", 50)))
    snap = c.snapshot()
    assert [n.partitions for n in snap.nodes] == [("a",), ("b",)]
    assert [(p.name, p.nodes) for p in snap.partitions] == [("a", ("n0000",)), ("b", ("n0001",))]
    assert snap.job(1).partition == "b" and snap.job(2).partition == "a,b"
    with pytest.raises(ValueError, match="no node of the simulated cluster is in partition 'c'; partitions: a, b"):
        c.submit(job_of(3, "c", GresRequest("mps", 50)))
    assert 3 not in c.jobs
    plain = SimCluster(8, gpus_per_node=4)  # the one-partition cluster, as before
    assert {p.name for p in plain.snapshot().partitions} == {"gpu"}


@pytest.mark.parametrize("policy", ["elastico", "static", "tiresias"])
def test_every_policy_keeps_each_job_on_its_partitions_in_a_run(policy):
    """Jobs of partition a only, on a cluster whose partition b is idle: whatever the policy plans, every job runs
    on a's node (the audit checks each start: `SimCluster.check`), so the run takes as long as a's GPUs make it."""
    truth = GroundTruth()
    trace = [TraceJob(i, 30.0 * i, "train", "cifar10", 1, 3000.0, global_batch=128, share=50, partition="a")
             for i in range(1, 9)]
    e = engine.Engine(trace, policy, Settings(), SimSettings(gpus=8, gpus_per_node=4, placement_window_s=0.0),
                      ContentionModel(), truth, nodes=A_B)
    starts = []
    start = e.cluster.start

    def audited(job, alloc):
        start(job, alloc)
        e.cluster.check()
        starts.append({ni for ni, _ in alloc})

    e.cluster.start = audited
    r = e.run()
    assert r.unfinished == 0 and len(r.jobs) == 8
    assert starts and all(nodes == {0} for nodes in starts)


def test_a_historys_typed_nodes_need_a_truth_per_type_and_no_cluster_spec_beside_them():
    jobs = [TraceJob(1, 0.0, "train", "cifar10", 1, 10.0, global_batch=64)]
    with pytest.raises(ConfigError, match="a ground truth per type"):
        engine.Engine(jobs, "static", Settings(), SimSettings(gpus=4), ContentionModel(), GroundTruth(),
                      nodes=(NodeGroup("a100", 1, 4, 40960),))
    with pytest.raises(ConfigError, match="not both"):
        engine.Engine(jobs, "static", Settings(), SimSettings(gpus=4, cluster="aws:1x4"), ContentionModel(),
                      GroundTruth(), nodes=(NodeGroup("", 1, 4, 40960),))


# ---------------------------------------------------------------------------------------- the cluster's history

TWO_PARTITIONS = ClusterShape((NodeShape("n1", 4, "", 16, 64000, ("a",)), NodeShape("n2", 4, "", 16, 64000, ("b",))),
                              slurm_version="22.05.8")


def past(i, submit, start, end, partition, gpus=1):
    return PastJob(str(i), submit, start, end, "COMPLETED", gpus, 0, "", 1, 512, 1, None, 0, "u", "acc", partition,
                   "", "", f"job{i}")


def fifo_on_four(n: int, run: int, partition: str, t0: int = 1000) -> list[PastJob]:
    """n one-GPU jobs of `run` seconds arriving a second apart on a partition of four GPUs, FIFO."""
    free = [t0] * 4
    out = []
    for i in range(n):
        submit = t0 + i
        k = min(range(4), key=lambda g: free[g])
        start = max(submit, free[k])
        free[k] = start + run
        out.append(past(100 + i, submit, start, start + run, partition))
    return out


def test_the_replay_queues_a_partitions_jobs_on_its_own_nodes():
    """Twelve jobs of partition a queued on its four GPUs while b's four were idle: the replay reproduces every
    wait. Replayed on the whole cluster it would start eight at once."""
    assert TWO_PARTITIONS.describe() == "2 nodes x 4 GPUs; partitions a (4 GPUs), b (4)"
    jobs = fifo_on_four(12, 100, "a")
    assert sum(j.wait_s > 0 for j in jobs) == 8
    stats = replay(jobs, TWO_PARTITIONS).stats()
    assert stats["compared"] == 12 and stats["max_start_error_s"] == 0
    blind = ClusterShape(tuple(NodeShape(n.name, n.gpus, "", n.cpus, n.mem_mib) for n in TWO_PARTITIONS.nodes))
    assert replay(jobs, blind).stats()["max_start_error_s"] > 0  # nodes that name no partition take any job
    big = [past(1, 1000, 1000, 1100, "a", gpus=6), past(2, 1000, 1000, 1100, "a,b", gpus=4)]
    r = replay(big, TWO_PARTITIONS)
    assert r.not_compared[TOO_BIG] == 1 and r.stats()["compared"] == 1  # six GPUs: no partition has them


def test_the_whatif_runs_each_job_in_its_own_partition():
    """Plain Slurm in the what-if holds each GPU as long as Slurm did, so on the history's own partition it lands
    on the measured JCT (on all eight GPUs, about 400 s against 596 s). elastico may give a's jobs more GPUs, but
    only a's four: twelve jobs of 300 GPU-seconds there, even at a perfect speed-up and one at a time on all four,
    end 75 s apart, a mean JCT of 75 x 6.5 s less their arrivals' spread (5.5 s)."""
    jobs = fifo_on_four(12, 300, "a")
    w = what_if(jobs + [past(200, 1000, 1000, 1100, "b", gpus=8)], TWO_PARTITIONS, Settings(), assume="none")
    assert w.skipped[SKIP_TOO_BIG] == 1  # eight GPUs of b, which has four
    run = next(iter(w.runs.values()))
    assert run["static"]["mean_jct_s"] == pytest.approx(measured(jobs, TWO_PARTITIONS)["mean_jct_s"], rel=0.02)
    w_gpu = what_if(jobs, TWO_PARTITIONS, Settings(), assume="gpu-count")
    for v in w_gpu.runs.values():
        assert v["static"]["mean_jct_s"] == pytest.approx(run["static"]["mean_jct_s"], rel=0.02)
        assert v["elastico"]["mean_jct_s"] >= 75 * 6.5 - 5.5
    assert sum(w_gpu.unfinished.values()) == 0
