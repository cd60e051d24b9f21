"""Percent of a GPU (families, shapes) against Slurm's MPS share counts (gpu.shares_per_gpu per GPU).

The planner, the commands it sends and the simulator must give the same plan
whatever shares_per_gpu gres.conf sets, with every share Slurm sees scaled.
"""

from __future__ import annotations

import dataclasses

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import ActionKind, GpuUse, GresRequest
from slurm_elastico.planner import run_epoch
from slurm_elastico.shapes.current import running_shape
from slurm_elastico.shapes.units import ShareUnitError, percent_of, percent_step, shares_of
from slurm_elastico.sim.cluster import SimCluster
from slurm_elastico.sim.job import SimJob
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.slurm import commands
from tests.synthetic import cluster, family, pending, running, snapshot, with_users

NOW = 100_000.0


def settings(shares_per_gpu: int) -> Settings:
    s = Settings()
    return dataclasses.replace(s, gpu=dataclasses.replace(s.gpu, shares_per_gpu=shares_per_gpu))


# -- the conversion -------------------------------------------------------------


@pytest.mark.parametrize("per_gpu, percent, shares", [
    (100, 25, 25), (100, 100, 100), (100, 1, 1),
    (50, 50, 25), (50, 100, 50), (50, 2, 1), (50, 74, 37),
    (48, 25, 12), (48, 50, 24), (48, 75, 36), (48, 100, 48),
    (1, 100, 1),
])
def test_a_percent_is_the_whole_number_of_shares_it_is(per_gpu, percent, shares):
    assert shares_of(percent, per_gpu) == shares
    assert percent_of(shares, per_gpu) == pytest.approx(percent)


@pytest.mark.parametrize("per_gpu, percent, exact", [(50, 25, "12.5"), (50, 75, "37.5"), (48, 10, "4.8"),
                                                      (48, 30, "14.4"), (1, 50, "0.5")])
def test_a_percent_that_is_not_a_whole_number_of_shares_is_refused_naming_both_and_the_step(per_gpu, percent, exact):
    with pytest.raises(ShareUnitError) as err:
        shares_of(percent, per_gpu)
    text = str(err.value)
    assert f"{percent} %" in text and f"gpu.shares_per_gpu={per_gpu}" in text and exact in text
    assert f"multiples of {percent_step(per_gpu)} %" in text


def test_the_step_is_the_smallest_percent_that_maps_exactly():
    for per_gpu in (1, 2, 4, 7, 25, 48, 50, 64, 100):
        step = percent_step(per_gpu)
        ok = [p for p in range(1, 101) if p * per_gpu % 100 == 0]
        assert ok == list(range(step, 101, step))


@pytest.mark.parametrize("percent", [0, 101, -5, 2.5, "50", True, None])
def test_a_percent_outside_1_to_100_is_refused(percent):
    with pytest.raises(ShareUnitError, match="whole percent of one GPU from 1 to 100"):
        shares_of(percent, 100)


@pytest.mark.parametrize("per_gpu", [0, -1, 2.0, True])
def test_a_bad_shares_per_gpu_is_refused(per_gpu):
    with pytest.raises(ShareUnitError, match="gpu.shares_per_gpu must be a positive integer"):
        shares_of(50, per_gpu)
    with pytest.raises(ShareUnitError, match="gpu.shares_per_gpu must be a positive integer"):
        percent_of(1, per_gpu)


def test_shares_beyond_the_gpu_are_refused():
    with pytest.raises(ShareUnitError, match="from 0 to gpu.shares_per_gpu=50, not 51"):
        percent_of(51, 50)


# -- the running job's held share ------------------------------------------------


def test_the_held_share_is_read_back_in_slurms_counts():
    fam = family((50, 0.8, 1000), (100, 1.0, 1000))
    half, whole = fam.shapes
    for per_gpu in (100, 50, 48):
        assert running_shape(fam.shapes, None, "", shares_of(50, per_gpu), per_gpu)[0] is half
        assert running_shape(fam.shapes, None, "", per_gpu, per_gpu)[0] is whole
    # at 50 shares per GPU, holding 50 is the whole GPU, never the 50 % shape the comment names
    shape, origin = running_shape(fam.shapes, half, f"elastico:shape={half.name}", 50, 50)
    assert shape is whole and "needs share 50 % of a GPU, not 50 of 50 shares" in origin


# -- the planner and the commands ---------------------------------------------


def plan_at(per_gpu: int, fam, jobs, n_gpus: int = 2, uses=None):
    nodes = cluster(n_gpus, shares=per_gpu)
    if uses:
        nodes = with_users(nodes, uses)
    return run_epoch(snapshot(nodes, jobs), {j.job_id: fam for j in jobs}, settings(per_gpu), ContentionModel(), NOW)


def summary(plan):
    """What a plan decides, in units that do not depend on shares_per_gpu."""
    return (sorted((p.job_id, p.node, p.gpu, p.shape) for p in plan.placements),
            sorted((a.job_id, a.kind.value, a.shape) for a in plan.actions))


@pytest.mark.parametrize("per_gpu", [50, 48])
def test_the_same_jobs_get_the_same_plan_at_any_shares_per_gpu_with_shares_scaled(per_gpu):
    fam = family((50, 0.8, 1000), (100, 1.0, 1000))
    jobs = [pending(j, NOW - 60 * j, share=shares_of(100, per_gpu)) for j in (1, 2, 3, 4)]
    base, other = plan_at(100, fam, [pending(j, NOW - 60 * j) for j in (1, 2, 3, 4)]), plan_at(per_gpu, fam, jobs)
    assert summary(base) == summary(other)
    assert {p.shape for p in base.placements} == {"mps50-0"}  # four jobs on two GPUs: halves
    assert sorted(p.share for p in other.placements) == [shares_of(50, per_gpu)] * 4
    sets = [a for a in other.actions if a.kind is ActionKind.SET_SHARE]
    assert sets and all(a.share == shares_of(50, per_gpu) for a in sets)
    for a in sets:  # what scontrol is told: a half of the GPU in Slurm's counts
        assert commands.argv_for(a, per_gpu) == [["scontrol", "update", f"JobId={a.job_id}",
                                                  f"Gres=mps:{shares_of(50, per_gpu)}"]]


def test_a_whole_gpu_shape_fits_an_idle_gpu_at_50_shares_per_gpu():
    """The issue's case: at 50 shares per GPU a 100 % shape must fit, and a 50 % shape must take half."""
    fam = family((100, 1.0, 1000))
    plan = plan_at(50, fam, [pending(1, NOW - 60, share=50)], n_gpus=1)
    assert [(p.job_id, p.share, p.shape) for p in plan.placements] == [(1, 50, "mps100-0")]
    half = family((50, 1.0, 1000))
    plan = plan_at(50, half, [pending(1, NOW - 60, share=25), pending(2, NOW - 60, share=25)], n_gpus=1)
    assert sorted((p.job_id, p.gpu, p.share) for p in plan.placements) == [(1, 0, 25), (2, 0, 25)]


def test_a_running_job_is_seen_at_its_shape_and_the_rest_of_its_gpu_is_used(per_gpu=48):
    # 0.7 + 0.95 of solo speed: the pair gains clearly enough for the contention stand-in's gain margin
    fam = family((25, 0.7, 1000), (75, 0.95, 1000), (100, 1.0, 1000))
    out = []
    for spg in (100, per_gpu):
        q = shares_of(25, spg)
        job = running(1, "n0000", 0, q, start=NOW - 600, shape="mps25-0")
        plan = plan_at(spg, fam, [job, pending(2, NOW - 60, share=shares_of(100, spg))], n_gpus=1,
                       uses={("n0000", 0): (GpuUse(1, q),)})
        out.append(summary(plan))
        placed = {p.job_id: p for p in plan.placements}
        assert placed[2].share == shares_of(75, spg) and placed[2].shape == "mps75-1"
    assert out[0] == out[1]


def test_a_family_share_the_site_cannot_express_stops_the_epoch_with_a_clear_error():
    fam = family((25, 0.5, 1000), (100, 1.0, 1000))
    with pytest.raises(ShareUnitError, match=r"25 % is 12.5 of gpu.shares_per_gpu=50"):
        plan_at(50, fam, [pending(1, NOW - 60, share=50)])


# -- the simulator: SimCluster as Slurm, the planner acting on it ----------------


def sim_plan(per_gpu: int, epochs: int = 3):
    """Submit five family jobs to a 2-GPU SimCluster, then plan, apply and schedule `epochs` times."""
    half, either = family((50, 1.0, 1000)), family((50, 0.9, 1000), (100, 1.0, 1000))
    fams = {1: half, 2: either, 3: half, 4: either, 5: either}
    c = SimCluster(2, gpus_per_node=2, shares_per_gpu=per_gpu)
    for j, fam in fams.items():
        tj = TraceJob(j, float(j), "train", "cifar10", 1, 100.0, global_batch=64)
        share = shares_of(fam.default_shape.resources.mps, per_gpu)
        c.submit(SimJob(trace=tj, family=fam, gres=GresRequest("mps", share), cpus=1, mem_mib=1024,
                        begin=3600.0))  # waits out a placement window: the planner places it first
    seen = []
    for _ in range(epochs):
        plan = run_epoch(c.snapshot(), fams, settings(per_gpu), ContentionModel(), NOW)
        for a in plan.actions:
            c.apply(a)
        c.schedule()
        c.check()
        seen.append(summary(plan))
    held = sorted((j.job_id, j.state.value, j.shape, j.alloc, j.share * 100 // per_gpu) for j in c.jobs.values())
    return seen, held


def test_the_simulator_gives_the_same_plans_and_placements_at_50_shares_per_gpu_as_at_100():
    plans_100, jobs_100 = sim_plan(100)
    plans_50, jobs_50 = sim_plan(50)
    assert plans_50 == plans_100
    assert jobs_50 == jobs_100
    # two halves share GPU 0 (25 of 50 shares each), a whole-GPU shape holds GPU 1 (50 of 50), two wait
    assert jobs_50 == [(1, "RUNNING", "mps50-0", ((0, 0),), 50), (2, "RUNNING", "mps100-1", ((0, 1),), 100),
                       (3, "RUNNING", "mps50-0", ((0, 0),), 50), (4, "PENDING", "", (), 0), (5, "PENDING", "", (), 0)]
    assert plans_50[1][1] == plans_50[2][1] == []  # the running jobs are read back at the shapes they run as
