"""Slurm's GPU choice within a node (`planner.gpu_choice`), on the sequences measured live, and the packing's use of it."""

from __future__ import annotations

import pytest

from slurm_elastico.planner.gpu_choice import mps_gpu, whole_gpus
from slurm_elastico.planner.packing import GpuState
from slurm_elastico.planner.seats import Row, Seat
from slurm_elastico.planner.slowdown import PairCache


def place_in_turn(shares: list[int], gpus: int = 4, total: int = 100) -> list[int]:
    """Each request's GPU when Slurm starts them one after the other on one node."""
    free, out = [total] * gpus, []
    for s in shares:
        g = mps_gpu(free, s)
        out.append(g)
        if g >= 0:
            free[g] -= s
    return out


def test_mps_is_first_fit_by_index():
    # Measured on 22.05 (test_placement_live): 50 -> 0, 70 -> 1, then 30 goes to GPU 0 (50 free), not to the
    # fuller GPU 1 (30 free, best fit) nor to an empty one (spread); 40 then finds room first on GPU 2.
    assert place_in_turn([50, 70, 30, 40]) == [0, 1, 0, 2]
    # One scheduling pass over four released jobs: 30, 90, 60, 10 -> 0, 1, 0, 0.
    assert place_in_turn([30, 90, 60, 10]) == [0, 1, 0, 0]


def test_mps_after_a_lower_gpu_frees():
    # GPU 0 back to 100 free, GPU 1 at 20 free: an mps:20 goes to GPU 0 (best fit would pick GPU 1).
    assert mps_gpu([100, 20, 100, 100], 20) == 0


def test_mps_skips_gpus_held_whole_and_full_ones():
    assert mps_gpu([100, 100], 20, whole=[True, False]) == 1
    assert mps_gpu([10, 5], 20) == -1
    assert mps_gpu([], 1) == -1
    with pytest.raises(ValueError, match="at least 1 share"):
        mps_gpu([100], 0)


def test_whole_gpus_lowest_not_held_whole_and_idle():
    assert whole_gpus([True, True, True, True], 2) == (0, 1)
    # GPU 0 held whole: the next two.
    assert whole_gpus([False, True, True, True], 2, whole=[True, False, False, False]) == (1, 2)
    # 22.05 would put gpu:1 on GPU 0 beside its MPS user: the node does not qualify, even with GPU 3 idle.
    assert whole_gpus([False, True, True, True], 1) == ()
    assert whole_gpus([True, True], 3) == ()
    with pytest.raises(ValueError, match="at least 1 GPU"):
        whole_gpus([True], 0)


def _state(nodes: int = 1, gpus: int = 4) -> GpuState:
    n = nodes * gpus
    return GpuState([g // gpus for g in range(n)], [100] * n, [1e9] * n, [64.0] * nodes, [1e9] * nodes,
                    PairCache(None), 0.0)


def _row(share: int, gpus: int = 0) -> Row:
    return Row(0, 0, 1.0, share, 1.0, 1.0, 1.0, gpus=gpus)


def test_packing_takes_the_gpu_slurm_would_take():
    state = _state()
    placed = []
    for k, s in enumerate([50, 70, 30, 40]):
        seat = Seat(k, 0.0)
        g, _ = state.find(seat, _row(s))
        state.place(seat, _row(s), g)
        placed.append(g)
    assert placed == [0, 1, 0, 2]  # best fit would have put the 30 on GPU 1


def test_packing_never_plans_a_gpu_slurm_would_not_give():
    state = _state()
    state.place(Seat(1, 0.0), _row(50), 0)
    # GPU 0 has 50 free, so Slurm gives an mps:40 GPU 0; GPU 1..3 are not Slurm's choice on this node.
    assert state.fits(Seat(2, 0.0), _row(40), 1) == 0.0
    assert state.fits(Seat(2, 0.0), _row(40), 0) > 0.0
    # ... unless the share is one Slurm could not fit on GPU 0.
    assert state.fits(Seat(3, 0.0), _row(60), 1) > 0.0


def test_packing_head_reservation_is_not_slurms():
    # The planner keeps GPU 0 for the queue's head (`block`); Slurm does not know and would give GPU 0 to an
    # mps:30 on this node, so the planner must not plan that job on GPU 1 of the node.
    state = _state()
    state.block(0, 100)
    assert state.find(Seat(1, 0.0), _row(30))[0] == -1


def test_packing_gang_only_where_slurm_takes_idle_gpus():
    state = _state(nodes=2)
    state.place(Seat(1, 0.0), _row(20), 0)  # an MPS user on node 0's GPU 0
    gang = state.find_gang(_row(0, gpus=2))
    assert gang == (4, 5)  # node 1's GPUs 0 and 1; node 0 has three idle GPUs but Slurm would take GPU 0


def test_a_gang_found_no_room_in_a_trial_is_not_refused_after_another_give_back():
    # find_gang remembers a gang with no room until something is given back; a trial (take a job off, put it
    # back where it was, put_back) must not leave what it learnt believed of a later, different state.
    state = _state(nodes=2, gpus=2)
    a, x, b = Seat(1, 0.0), Seat(2, 0.0), Seat(3, 0.0)
    state.place(a, _row(50), 0)
    state.place(x, _row(50), 0)
    state.place(b, _row(100), 2)
    mark = state.gained
    state.remove(a)  # GPU 0 keeps x: still no node with two idle GPUs
    assert state.find_gang(_row(0, gpus=2)) == ()
    state.place(a, _row(50), 0)
    state.put_back(mark)
    state.remove(b)  # node 1 is idle now
    assert state.find_gang(_row(0, gpus=2)) == (2, 3)
