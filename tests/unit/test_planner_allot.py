"""GPU counts of data-parallel jobs by weighted shortest remaining time (`planner.allot`), and what the epoch
makes of it: whole requests before partial ones, shrinks and preemptions of longer running jobs, resumes."""

from __future__ import annotations

import dataclasses

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import ActionKind, GpuUse, GresRequest, Snapshot
from slurm_elastico.planner import allot, run_epoch
from slurm_elastico.planner.allot import NONE, Claim
from slurm_elastico.shapes.current import PREEMPTED_MARK, preempted_by_us
from tests.synthetic import cluster, with_users
from tests.unit.test_planner_gangs import NOW, gang_family, gang_running, pend

SIZES = (1.0, 2.0, 4.0, 8.0)
TPUT = (1.0, 1.9, 3.6, 6.4)


def claim(key: float, cap: float = 8.0, current: int | None = None, work: float = 1e5) -> Claim:
    return Claim(key, SIZES, TPUT, (True,) * 4, cap, work, current, 60.0)


def test_the_shortest_job_gets_its_whole_request_first_and_a_longer_one_waits():
    picks = allot.allot([claim(5000.0), claim(100.0)], budget=8.0, hysteresis=0.1)
    assert picks == [NONE, 3]  # the short one (second) takes all 8; the long one does not start on nothing


def test_a_job_whose_whole_request_does_not_fit_waits_while_a_later_one_that_fits_starts():
    # 6 GPUs: the first (8 asked) does not fit, the second (4 asked) does; what is left (2) then starts the first.
    picks = allot.allot([claim(100.0, cap=8.0), claim(200.0, cap=4.0)], budget=6.0, hysteresis=0.1)
    assert picks == [1, 2]


def test_a_lone_job_takes_its_fastest_shape_whatever_it_asked():
    # heSRPT's split with nobody behind it: all of the budget, so its fastest shape that fits (8 GPUs, 6.4x).
    assert allot.allot([claim(100.0, cap=2.0)], budget=8.0, hysteresis=0.1) == [3]


def test_with_a_queue_the_shortest_jobs_get_more_gpus_only_where_their_speedup_earns_it():
    # Eight one-GPU jobs, eight GPUs. Near-linear speedups (1.9x on 2, 3.6x on 4): heSRPT gives the shortest 4
    # GPUs, the next 2, then one each while the budget lasts; the longest four wait (one after the other, the
    # short ones end sooner than all side by side, and the ones behind them no later on average).
    near = allot.allot([claim(100.0 * (k + 1), cap=1.0) for k in range(8)], budget=8.0, hysteresis=0.1)
    assert near == [2, 1, 0, 0, NONE, NONE, NONE, NONE]
    # Poor speedups (1.2x on 2 GPUs): nobody is worth more than its one GPU, and all eight start.
    poor = [Claim(100.0 * (k + 1), SIZES, (1.0, 1.2, 1.3, 1.3), (True,) * 4, 1.0, 1e5, None, 60.0) for k in range(8)]
    assert allot.allot(poor, budget=8.0, hysteresis=0.1) == [0] * 8
    assert allot.share_limit(poor[0], 8.0, 8) == 1.0 and allot.share_limit(claim(100.0, cap=1.0), 8.0, 8) == 4.0


def test_a_running_job_keeps_its_shape_unless_moving_up_pays_the_restart():
    assert allot.allot([claim(100.0, current=1, work=1e5)], budget=8.0, hysteresis=0.1) == [3]  # grows: pays
    assert allot.allot([claim(100.0, current=1, work=10.0)], budget=8.0, hysteresis=0.1) == [1]  # nearly done: keeps


def test_a_longer_running_job_shrinks_then_is_preempted_as_shorter_jobs_take_its_gpus():
    running = claim(9000.0, current=3)
    assert allot.allot([running, claim(10.0, cap=4.0)], budget=8.0, hysteresis=0.1) == [2, 2]  # shrinks to 4
    assert allot.allot([running, claim(10.0, cap=8.0)], budget=8.0, hysteresis=0.1) == [NONE, 3]  # preempted
    # Without preemption it keeps its smallest shape (the budget is then overdrawn: packing decides).
    assert allot.allot([running, claim(10.0, cap=8.0)], budget=8.0, hysteresis=0.1, preempt=False) == [0, 3]


def test_the_fairness_weight_is_in_the_key_so_a_long_wait_puts_a_long_job_first():
    # Keys are remaining time ÷ weight: a 10-hour job that waited enough (weight 20) goes before a 1-hour one.
    picks = allot.allot([claim(36000.0 / 20.0), claim(3600.0)], budget=8.0, hysteresis=0.1)
    assert picks == [3, NONE]


# -- through the epoch -------------------------------------------------------------------------------------


def plan(nodes, jobs, families):
    return run_epoch(Snapshot(NOW, "24.11.5", nodes, tuple(jobs)), families, Settings(), ContentionModel(), NOW)


def test_a_long_running_job_is_preempted_for_a_much_shorter_one_and_its_comment_says_so():
    nodes = cluster(8, gpus_per_node=8)
    held = [("n0000", g) for g in range(8)]
    nodes = with_users(nodes, {k: (GpuUse(1, 0, whole=True),) for k in held})
    long_run = gang_running(1, held, start=NOW - 3600)
    fams = {1: gang_family(work=10**7, default_gpus=8), 2: gang_family(work=600.0, default_gpus=8)}
    p = plan(nodes, [long_run, pend(2, submit=NOW - 60)], fams)
    kinds = [(a.job_id, a.kind) for a in p.actions]
    assert (1, ActionKind.PREEMPT) in kinds
    note = next(a for a in p.actions if a.job_id == 1 and a.kind is ActionKind.SET_ADMIN_COMMENT)
    assert preempted_by_us(note.text) and "elastico:shape=gpus8" in note.text
    start = next(a for a in p.actions if a.job_id == 2 and a.kind is ActionKind.SET_GPUS)
    assert start.gpus == 8
    # The same pair the other way round: the running job is the short one, nothing is preempted.
    fams_short = {1: gang_family(work=30000.0, default_gpus=8), 2: gang_family(work=10**7, default_gpus=8)}
    assert not any(a.kind is ActionKind.PREEMPT for a in plan(nodes, [long_run, pend(2, submit=NOW - 60)],
                                                               fams_short).actions)


def test_a_job_we_preempted_is_resumed_when_its_turn_comes_and_one_held_by_anyone_else_is_left_alone():
    base = pend(1, submit=NOW - 7200)
    ours = dataclasses.replace(base, held=True, admin_comment=f"elastico:shape=gpus8,{PREEMPTED_MARK}")
    theirs = dataclasses.replace(base, job_id=2, held=True, admin_comment="elastico:shape=gpus8")
    fams = {1: gang_family(default_gpus=8), 2: gang_family(default_gpus=8)}
    p = plan(cluster(8, gpus_per_node=8), [ours, theirs], fams)
    assert {a.job_id for a in p.actions} == {1}
    resume = next(a for a in p.actions if a.kind is ActionKind.RESUME)
    assert resume.nodes == ("n0000",)
    # The mark stays until it runs (a resume cut short between its steps leaves it held and known as ours) ...
    assert not any(a.kind is ActionKind.SET_ADMIN_COMMENT for a in p.actions)
    # ... and a job held as whole gpu:N per node (as elastico-submit asks) is resumed too.
    gpu = dataclasses.replace(ours, gres=GresRequest("gpu", 8))
    assert any(a.kind is ActionKind.RESUME for a in plan(cluster(8, gpus_per_node=8), [gpu], {1: fams[1]}).actions)


def test_a_resumed_job_running_again_has_its_preemption_mark_lifted_keeping_others_parts():
    held = [("n0000", g) for g in range(8)]
    nodes = with_users(cluster(8, gpus_per_node=8), {k: (GpuUse(1, 0, whole=True),) for k in held})
    job = dataclasses.replace(gang_running(1, held, start=NOW - 5),
                              admin_comment=f"site=a,elastico:shape=gpus8,{PREEMPTED_MARK}")
    p = plan(nodes, [job], {1: gang_family(default_gpus=8)})
    assert [(a.kind, a.text) for a in p.actions] == [(ActionKind.SET_ADMIN_COMMENT, "elastico:shape=gpus8")]
    unmarked = dataclasses.replace(job, admin_comment="elastico:shape=gpus8")
    assert not plan(nodes, [unmarked], {1: gang_family(default_gpus=8)}).actions


def test_gpus_beyond_a_jobs_request_never_come_from_a_running_job_nor_go_to_one_slurm_cannot_requeue():
    # A longer job runs on all 8; four short one-GPU jobs arrive. Their requests (4 GPUs) shrink it to 4, but
    # heSRPT's extra GPUs for the shortest would preempt it, a restart nobody weighed: they get none.
    running = claim(9000.0, current=3)
    queue = [claim(10.0 * (k + 1), cap=1.0) for k in range(4)]
    assert allot.allot([running, *queue], budget=8.0, hysteresis=0.1) == [2, 0, 0, 0, 0]
    # With the same GPUs idle instead, the shortest take extra ones.
    assert allot.allot(queue, budget=8.0, hysteresis=0.1)[0] > 0
    # A job Slurm cannot requeue keeps to what it asked: it could never give the rest back.
    rigid = dataclasses.replace(claim(10.0, cap=1.0), extra=False)
    assert allot.allot([rigid], budget=8.0, hysteresis=0.1) == [0]
    assert allot.share_limit(rigid, 8.0, 1) == 1.0


def test_the_epoch_starts_a_job_that_cannot_be_requeued_on_its_request_only():
    nodes = cluster(8, gpus_per_node=8)
    free = plan(nodes, [pend(1)], {1: gang_family()})
    assert any(a.kind is ActionKind.SET_GPUS and a.gpus > 1 for a in free.actions)  # a lone job takes more
    p = plan(nodes, [dataclasses.replace(pend(1), requeue=False)], {1: gang_family()})
    assert not any(a.kind is ActionKind.SET_GPUS for a in p.actions) and {pl.job_id for pl in p.placements} == {1}


def test_a_job_the_allotment_makes_wait_is_told_so_not_that_no_gpu_has_room():
    """The plan's note names why a job waits: the allotment gave the GPUs to a shorter job (an administrator
    reading "no GPU has room" would look for a full cluster)."""
    fams = {1: gang_family(work=600.0, default_gpus=8), 2: gang_family(work=10**7, default_gpus=8)}
    p = plan(cluster(8, gpus_per_node=8), [pend(1, submit=NOW - 60), pend(2, submit=NOW - 60)], fams)
    assert any(a.job_id == 1 and a.kind is ActionKind.SET_GPUS for a in p.actions)
    waits = [n for n in p.notes if n.startswith("job 2 ")]
    assert len(waits) == 1 and "the allotment gives this epoch's GPUs to jobs with fewer GPU-seconds left" in waits[0]
    assert not any(n.startswith("job 1 ") for n in p.notes)
