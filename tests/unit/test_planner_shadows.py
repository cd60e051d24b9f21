"""The share search's open lists (`planner.shadows`): a GPU it skips unseen is one Slurm never gives a share, and
the search finds what a scan of every GPU in every bucket finds, with no interference model and with the
contention model's floors and gain rule (its bounds on whole buckets included)."""

from __future__ import annotations

import random

import pytest

from slurm_elastico.interference.base import ContentionModel, SoloProfile
from slurm_elastico.planner.packing import GpuState
from slurm_elastico.planner.seats import Row, Seat
from slurm_elastico.planner.shadows import GPU_MASK
from slurm_elastico.planner.slowdown import PairCache


def _state(lowest_unused: bool, cache: PairCache) -> tuple[GpuState, list[Seat]]:
    """Three nodes of four GPUs of two types, the last with two GPUs of 50 shares (nothing is shadowed there: on
    24.11 a `gpu:1` job takes a 50-share GPU above a larger one that a running `mps` job uses), and the running
    jobs: an `mps:50` on that node's first GPU and an `mps:30` on the first node's."""
    totals = [100] * 8 + [100, 50, 100, 50]
    nodes = [g // 4 for g in range(12)]
    free = list(totals)
    free[0], free[8] = 70, 50
    state = GpuState(nodes, free, [1e9] * 12, [1e3] * 3, [1e9] * 3, cache, 0.0,
                     total_share=totals, lowest_unused=lowest_unused, gpu_type=[n % 2 for n in nodes])
    running = [Seat(-1, 0.0, _row(30)), Seat(-2, 0.0, _row(50))]
    state.attach(running[0], 0, 1.0)
    state.attach(running[1], 8, 1.0)
    return state, running


def _row(share: int, gtype: int = -1, gpus: int = 0, uid: int = 0, tput: float = 1.0) -> Row:
    return Row(0, uid, tput, share, 1.0, 1.0, 1.0, gpus=gpus, gtype=gtype)


def _cache(model: str) -> PairCache:
    """No interference model (every GPU may be shared), or the contention model over a few training and
    inference profiles (the floors and the gain rule decide who shares)."""
    if model == "none":
        return PairCache(None)
    cache = PairCache(ContentionModel())
    for kind in ("train", "infer"):
        for share in (10, 25, 50, 100):
            cache.add(SoloProfile(kind=kind, mps_share=share))
    return cache


def _scan_everything(state: GpuState, seat: Seat, row: Row) -> int:
    """The best-fit GPU by brute force: every bucket from the row's share up, every GPU in the bucket's order."""
    for level in range(row.share, state.top + 1):
        for g in state.buckets[level]:
            if state.fits(seat, row, g):
                return g
    return -1


def _check(state: GpuState) -> None:
    for level in range(state.top + 1):
        assert [e & GPU_MASK for e in state.open[level]] == [g for g in state.buckets[level] if not state.shadowed(g)]
        for t, lists in state.type_open.items():
            assert [e & GPU_MASK for e in lists[level]] == [g for g in state.type_buckets[t][level] if not state.shadowed(g)]
    for g, free in enumerate(state.free_share):
        node = state.gpu_node[g]
        for share in range(1, free + 1):
            gives = state.given(node, share) == g  # the rule itself (`gpu_choice.mps_gpu` on the node's GPUs)
            assert state.slurm_gives(g, share) == gives
            assert not (state.shadowed(g) and gives), f"GPU {g} is shadowed but Slurm gives it mps:{share}"
        if free >= state.total_share[g]:
            whole = state.slurm_gives(g, free, True)
            assert not (state.shadowed(g) and whole), f"GPU {g} is shadowed but Slurm gives it gpu:1"


@pytest.mark.parametrize("model", ["none", "contention"])
@pytest.mark.parametrize("lowest_unused", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_the_search_skips_only_gpus_slurm_never_gives_and_finds_what_a_full_scan_finds(seed, lowest_unused, model):
    rng = random.Random(seed)
    state, placed = _state(lowest_unused, _cache(model))
    _check(state)
    shadowed_seen = shared = 0
    for step in range(120):
        op = rng.random()
        if op < 0.55:
            whole = rng.random() < 0.15
            row = _row(rng.choice([50, 100]) if whole else rng.choice([10, 20, 25, 30, 50, 60, 100]),
                       gtype=rng.choice([-1, 0, 1]), uid=rng.randrange(8), tput=rng.uniform(0.3, 1.0))
            seat = Seat(step, rng.choice([0.0, 0.4]), best_solo=1.0, whole=whole)
            expected = _scan_everything(state, seat, row)
            g, _ = state.find(seat, row)
            assert g == expected
            if g >= 0:
                state.place(seat, row, g)
                placed.append(seat)
                shared += len(state.occ[g]) > 1
        elif op < 0.7:
            row = _row(0, gpus=rng.choice([1, 2, 4]))
            gang = state.find_gang(row)
            if gang:
                seat = Seat(step, 0.0)
                state.place_gang(seat, row, gang)
                placed.append(seat)
        elif op < 0.9 and placed:
            state.remove(placed.pop(rng.randrange(len(placed))))
        else:
            g = rng.randrange(12)
            state.block(g, rng.choice([10, 40, 100]))
        _check(state)
        shadowed_seen += sum(map(state.shadowed, range(12)))
    assert shadowed_seen > 0  # the case the lists are for came up
    if model == "contention":
        assert shared > 0  # and GPUs were shared under the floors and the gain rule
