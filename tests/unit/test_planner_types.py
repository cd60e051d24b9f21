"""Mixed GPU types in the planner: a typed shape runs only on its type, the types' prices send each job where it
gains most, a running job moves to another type only when the gain pays the restart, and a cluster of one type
plans as before."""

from __future__ import annotations

import dataclasses

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import ActionKind, Family, GpuUse, GresRequest, JobState, JobView, Resources, Shape, Snapshot
from slurm_elastico.planner import allot, run_epoch
from slurm_elastico.planner.type_prices import priced_allotment
from tests.synthetic import cluster

NOW = 1_000_000.0


def typed_cluster(**per_type: int):
    """One node of 4 GPUs per type, named after it (`t4=1, a100=1` → nodes t4-0, a100-0)."""
    nodes = []
    for t, count in per_type.items():
        for k in range(count):
            (n,) = cluster(4, gpus_per_node=4)
            name = f"{t}-{k}"
            gpus = tuple(dataclasses.replace(g, node=name) for g in n.gpus)
            nodes.append(dataclasses.replace(n, name=name, gpus=gpus, gpu_type=t))
    return tuple(nodes)


def typed_family(speed: dict[str, float], work: float = 100000.0, gpus: tuple[int, ...] = (1, 2, 4)) -> Family:
    """Data-parallel shapes on each type, `speed[type]` steps/s per GPU, near-linear in the GPU count."""
    shapes = []
    for t, v in speed.items():
        for n in gpus:
            res = Resources(100, 8000, 2, 4096) if n == 1 else Resources(0, 8000, 2 * n, 4096 * n, gpus=n)
            shapes.append(Shape(f"gpus{n}@{t}", res, v * n ** 0.95, gpu_type=t))
    return Family("train", tuple(shapes), work, default=f"gpus{gpus[-1]}@{next(iter(speed))}")


def pend(job_id: int, submit: float = NOW - 60) -> JobView:
    return JobView(job_id, f"j{job_id}", "u", "gpu", JobState.PENDING, gres=GresRequest("mps", 100),
                   submit_time=int(submit), requeue=True)


def plan(nodes, jobs, families):
    return run_epoch(Snapshot(NOW, "24.11.5", nodes, tuple(jobs)), families, Settings(), ContentionModel(), NOW)


def starts(p) -> dict[int, tuple[str, tuple[str, ...]]]:
    return {a.job_id: (a.gpu_type, a.nodes) for a in p.actions if a.kind is ActionKind.SET_GPUS}


def test_a_typed_shape_starts_only_on_nodes_of_its_type_and_the_action_names_the_type():
    p = plan(typed_cluster(t4=1, a100=1), [pend(1)], {1: typed_family({"t4": 1.0, "a100": 3.0})})
    assert starts(p) == {1: ("a100", ("a100-0",))}
    # A family limited to t4 goes to the t4 node, even with the a100 idle.
    p = plan(typed_cluster(t4=1, a100=1), [pend(1)], {1: typed_family({"t4": 1.0})})
    assert starts(p) == {1: ("t4", ("t4-0",))}


def test_a_type_whose_nodes_are_all_drained_or_in_another_partition_is_priced_out_not_a_crash():
    # The families list every type the nodes have; the board only the usable nodes of the partition.
    drained = tuple(dataclasses.replace(n, state="drained") if n.gpu_type == "v100" else n
                    for n in typed_cluster(t4=1, a100=1, v100=1))
    fam = typed_family({"t4": 1.0, "a100": 3.0, "v100": 2.0})
    assert starts(plan(drained, [pend(1)], {1: fam})) == {1: ("a100", ("a100-0",))}
    other = tuple(dataclasses.replace(n, partitions=("other",)) if n.gpu_type == "a100" else n
                  for n in typed_cluster(t4=1, a100=1, v100=1))
    p = run_epoch(Snapshot(NOW, "24.11.5", other, (pend(1),)), {1: fam},
                  dataclasses.replace(Settings(), slurm=dataclasses.replace(Settings().slurm, partition="gpu")),
                  ContentionModel(), NOW)
    assert starts(p) == {1: ("v100", ("v100-0",))}


def test_a_shape_of_a_type_the_cluster_lacks_is_never_chosen():
    p = plan(typed_cluster(t4=1), [pend(1)], {1: typed_family({"h100": 9.0, "t4": 1.0})})
    assert starts(p) == {1: ("t4", ("t4-0",))}
    p = plan(typed_cluster(t4=1), [pend(1)], {1: typed_family({"h100": 9.0})})
    assert not p.placements


def test_the_types_prices_give_the_fast_type_to_the_job_that_gains_most_there():
    # Two equal jobs but for what an a100 does for them: 4x for job 1, 1.2x for job 2. Job 2 is first in line
    # (submitted earlier, so it weighs more); at zero prices it would take the a100 node.
    fams = {1: typed_family({"t4": 1.0, "a100": 4.0}, gpus=(4,)), 2: typed_family({"t4": 1.0, "a100": 1.2}, gpus=(4,))}
    jobs = [pend(1, submit=NOW - 60), pend(2, submit=NOW - 6000)]
    p = plan(typed_cluster(t4=1, a100=1), jobs, fams)
    assert starts(p) == {1: ("a100", ("a100-0",)), 2: ("t4", ("t4-0",))}


def test_prices_rise_only_on_the_type_wanted_beyond_what_it_has():
    # Slots: 0 = 4 GPUs of type 0 (slow), 1 = 4 GPUs of type 1 (fast); both jobs want type 1.
    def claim(key, fast):
        return allot.Claim(key, [4.0, 4.0], [1.0, fast], [True, True], 4.0, types=[0, 1])
    picks, lam = priced_allotment([claim(1.0, 1.2), claim(2.0, 4.0)], [4.0, 4.0], hysteresis=0.1)
    assert lam[1] > lam[0] == 0.0
    assert picks == [0, 1]  # the one that gains 1.2x yields the fast type to the one that gains 4x
    # At zero prices (the allotment alone), the first in line takes the fast type.
    assert allot.allot([claim(1.0, 1.2), claim(2.0, 4.0)], [4.0, 4.0], hysteresis=0.1) == [1, 0]
    # One job: nothing is contended, prices stay 0 and it takes its fastest.
    picks, lam = priced_allotment([claim(1.0, 1.2)], [4.0, 4.0], hysteresis=0.1)
    assert lam == [0.0, 0.0] and picks == [1]


def test_a_running_job_moves_to_a_faster_type_only_when_the_gain_pays_the_restart():
    fam = typed_family({"t4": 1.0, "a100": 3.0}, gpus=(4,))
    nodes = typed_cluster(t4=1, a100=1)
    held = tuple((("t4-0", g, 0)) for g in range(4))
    nodes = tuple(dataclasses.replace(n, gpus=tuple(dataclasses.replace(g, users=(GpuUse(1, 100, whole=True),))
                                                    for g in n.gpus)) if n.gpu_type == "t4" else n for n in nodes)

    def running(done: float):
        return JobView(1, "j1", "u", "gpu", JobState.RUNNING, gres=GresRequest("gpus", 4), nodes=("t4-0",),
                       gpu_indices=(0,), cpus=8, memory_mib=4 * 4096, submit_time=int(NOW - 7200),
                       start_time=int(NOW - 7200), requeue=True, admin_comment="elastico:shape=gpus4@t4", gpu_alloc=held)

    # Much work left: 3x faster on the idle a100 node pays a 60 s restart many times over.
    p = run_epoch(Snapshot(NOW, "24.11.5", nodes, (running(0),)), {1: fam}, Settings(), ContentionModel(), NOW,
                  progress={1: 1000.0})
    moves = [a for a in p.actions if a.kind is ActionKind.RESHAPE_RUNNING]
    assert [(a.gpu_type, a.nodes) for a in moves] == [("a100", ("a100-0",))]
    # Nearly done: the restart costs more than it saves; it stays.
    p = run_epoch(Snapshot(NOW, "24.11.5", nodes, (running(0),)), {1: fam}, Settings(), ContentionModel(), NOW,
                  progress={1: fam.total_work - 50.0})
    assert not [a for a in p.actions if a.kind is ActionKind.RESHAPE_RUNNING]


def test_a_cluster_of_one_type_plans_as_an_untyped_one():
    fam = typed_family({"a100": 2.0})
    untyped = dataclasses.replace(fam, shapes=tuple(dataclasses.replace(s, gpu_type="") for s in fam.shapes))
    jobs = [pend(i, submit=NOW - 100 * i) for i in range(1, 5)]
    a = plan(typed_cluster(a100=2), jobs, {i: fam for i in range(1, 5)})
    nodes = tuple(dataclasses.replace(n, gpu_type="") for n in typed_cluster(a100=2))
    b = plan(nodes, jobs, {i: untyped for i in range(1, 5)})
    assert [(x.job_id, x.node, x.gpu, x.share) for x in a.placements] == [
        (x.job_id, x.node, x.gpu, x.share) for x in b.placements]
    assert {x.job_id for x in a.placements}


def test_static_is_type_blind_on_a_family_of_several_types_and_keeps_a_type_the_user_asked_for():
    from slurm_elastico.planner.narrowers import whole_gpu
    both = typed_family({"t4": 1.0, "a100": 3.0}, gpus=(4,))
    assert [s.gpu_type for s in whole_gpu(both).shapes] == [""]
    only = typed_family({"a100": 3.0}, gpus=(4,))
    assert [s.gpu_type for s in whole_gpu(only).shapes] == ["a100"]


def test_an_estimate_carried_over_from_another_type_counts_at_a_conservative_quantile():
    # Measured on t4 at 1.0; estimated 1.1 on the a100 with a wide uncertainty: the measured type wins the near tie.
    fam = typed_family({"t4": 1.0, "a100": 1.1}, gpus=(4,))
    guessed = dataclasses.replace(fam, shapes=tuple(dataclasses.replace(s, throughput_sigma=0.5 if s.gpu_type == "a100"
                                                                        else 0.0) for s in fam.shapes))
    assert starts(plan(typed_cluster(t4=1, a100=1), [pend(1)], {1: fam}))[1][0] == "a100"
    assert starts(plan(typed_cluster(t4=1, a100=1), [pend(1)], {1: guessed}))[1][0] == "t4"


def test_the_queue_head_asking_a_type_keeps_gpus_of_that_type_free():
    """A family-less head asks Slurm for `gpu:a100:2`; the a100 node has 3 idle GPUs (one is held), the t4 node 4.
    The GPUs kept for it were the t4 node's (the most empty), and a job took the a100s the head waits for."""
    nodes = typed_cluster(a100=1, t4=1)
    nodes = tuple(dataclasses.replace(n, gpus=(dataclasses.replace(n.gpus[0], users=(GpuUse(98, 100, whole=True),)),)
                                      + n.gpus[1:]) if n.gpu_type == "a100" else n for n in nodes)
    head = JobView(50, "head", "u", "gpu", JobState.PENDING, gres=GresRequest("gpu", 2, "a100"),
                   submit_time=int(NOW - 9000), priority=100)
    p = plan(nodes, [head, pend(1)], {1: typed_family({"a100": 3.0}, gpus=(1, 2))})
    assert any("job 50 heads the queue: 2 whole GPU(s) kept for it" in n for n in p.notes), p.notes
    assert all(pl.node != "a100-0" for pl in p.placements), p.placements
