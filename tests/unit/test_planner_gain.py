"""The gain rule: a GPU is shared only when the co-runners' fractions of solo speed sum to at least 1 + margin.

f_i = job i's predicted co-located throughput ÷ its throughput alone at its
family's best single-GPU shape (`Seat.best_solo`). Each case sits where only
the gain rule decides: the floors alone would admit it (checked with
`admissible`), and the same placement with the rule not binding is admitted.
Last, `find`'s shortcuts (the rule's cheap bound, remembered refusals) are
checked against a plain search on random GPU states.
"""

from __future__ import annotations

import numpy as np
import pytest

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import MIN_GAIN, SoloProfile, admissible
from slurm_elastico.model import JobState
from slurm_elastico.planner import exact, run_epoch
from slurm_elastico.planner.packing import GpuState
from slurm_elastico.planner.seats import Row, Seat, best_solo
from slurm_elastico.planner.slowdown import PairCache
from slurm_elastico.planner.weights import weight_of
from tests.synthetic import cluster, family, pending, snapshot

NOW = 100_000.0
FLOOR = 0.6


class Even:
    """Every co-located job runs at 1/slow of its solo speed; one `admission_margin` for all pairs."""

    def __init__(self, slow: float, margin: float = 0.0):
        self.slow, self.admission_margin = slow, margin

    def predict(self, a, b):
        return np.full(len(a), self.slow)


class Table:
    """Slowdown and margin per pair of model families (`SoloProfile.model_family`); unlisted pairs: 1.0 and 0.0."""

    def __init__(self, slow: dict[tuple[str, str], float], margin: dict[tuple[str, str], float]):
        self.slow, self.margin = slow, margin

    def predict(self, a, b):
        return np.array([self.slow.get((x.model_family, y.model_family), 1.0) for x, y in zip(a, b)])

    def admission_margins(self, a, b):
        return np.array([self.margin.get((x.model_family, y.model_family), 0.0) for x, y in zip(a, b)])


def gpu(model, floor: float = FLOOR) -> GpuState:
    """One GPU of 100 shares with room for anything but shares."""
    return GpuState([0], [100], [1e9], [1e9], [1e9], PairCache(model), floor)


def seat_row(state: GpuState, job: int, share: int, tput: float, best: float, name: str = ""):
    """A seat and its row: `tput` alone at `share`, `best` alone at the family's best single-GPU shape."""
    prof = SoloProfile(kind="train", model_family=name, mps_share=share)
    return Seat(job, 0.0, best_solo=best), Row(0, state.cache.add(prof), tput, share, 0.0, 0.0, 0.0)


def pair_admitted(model, tput: float, best: float = 1.0, floor: float = FLOOR) -> bool:
    """Two half-GPU jobs each at `tput` alone, `best` alone at their best shape: whether the second may join."""
    state = gpu(model, floor)
    a, ra = seat_row(state, 1, 50, tput, best)
    b, rb = seat_row(state, 2, 50, tput, best)
    assert state.fits(a, ra, 0) > 0
    state.place(a, ra, 0)
    return state.fits(b, rb, 0) > 0


def floors_admit(model, floor: float = FLOOR) -> bool:
    p = SoloProfile(kind="train", mps_share=50)
    return bool(admissible(model, [p], [p], floor)[0])


def test_a_pair_summing_to_0_95_is_refused_though_both_hold_their_floors():
    model = Even(1.25)  # each runs at 0.8 of its own solo speed: above the floor 0.6
    assert floors_admit(model)
    assert not pair_admitted(model, 0.475 * 1.25)  # f = 0.475 each: 0.95 in all
    assert pair_admitted(model, 0.6 * 1.25)  # f = 0.6 each: 1.2, a gain


def test_an_unknown_reference_keeps_the_old_rule():
    # best_solo 0: the row's own solo speed is the reference, f = 1/1.25 = 0.8 each, as the floors already imply.
    assert pair_admitted(Even(1.25), 0.475 * 1.25, best=0.0)


def test_a_pair_summing_to_1_3_needs_a_margin_under_0_3():
    # No slowdown: f = 0.65 each, 1.3 in all; the floors hold at both margins (1 >= 0.6 × 1.4).
    for margin, admitted in ((0.1, True), (0.4, False)):
        model = Even(1.0, margin)
        assert floors_admit(model)
        assert pair_admitted(model, 0.65) is admitted, margin


def test_a_pair_exactly_at_one_plus_the_margin_is_admitted():
    # No slowdown: 0.625 + 0.625 = 1.25 >= 1 + 0.25 (exact in binary).
    assert pair_admitted(Even(1.0, 0.25), 0.625, floor=0.0)
    assert not pair_admitted(Even(1.0, 0.25), 0.62, floor=0.0)


def test_a_model_without_a_gain_margin_still_asks_the_least_gain():
    # Margin 0: 0.5 + 0.5 = 1.0 gains nothing and 1.09 too little (MIN_GAIN 0.1); 0.5625 + 0.5625 = 1.125 passes.
    assert MIN_GAIN == 0.1 and PairCache(Even(1.0, 0.0)).gain_margin == MIN_GAIN
    assert not pair_admitted(Even(1.0, 0.0), 0.5, floor=0.0)
    assert not pair_admitted(Even(1.0, 0.0), 0.545, floor=0.0)
    assert pair_admitted(Even(1.0, 0.0), 0.5625, floor=0.0)


def test_a_job_alone_is_admitted_whatever_its_fraction_or_margin():
    model = Even(1.0, margin=5.0)  # with anyone else, nothing would pass
    state = gpu(model)
    a, ra = seat_row(state, 1, 10, 0.01, 1.0)
    assert state.fits(a, ra, 0) == 1.0
    state.place(a, ra, 0)
    b, rb = seat_row(state, 2, 10, 0.01, 1.0)
    assert state.fits(b, rb, 0) == 0.0


def test_per_pair_the_larger_direction_counts():
    # f = 0.65 each, 1.3 in all; the margin of the pair is the larger of its two directions.
    for m_ab, m_ba, admitted in ((0.1, 0.0, True), (0.4, 0.0, False), (0.0, 0.4, False)):
        model = Table({}, {("a", "b"): m_ab, ("b", "a"): m_ba})
        state = gpu(model)
        a, ra = seat_row(state, 1, 50, 0.65, 1.0, "a")
        b, rb = seat_row(state, 2, 50, 0.65, 1.0, "b")
        state.place(a, ra, 0)
        assert (state.fits(b, rb, 0) > 0) is admitted, (m_ab, m_ba)


def three(m_ab: float) -> bool:
    """A and B share a GPU (margin `m_ab` between them); whether C may join, its own pairs at margin 0.

    Alone: f_A = f_B = 0.7, f_C = 1. C halves A's and B's speed and is slowed 1.25× by each:
    the pair C+A alone gives 1/1.25 + 0.7/2 = 1.15, the three together 0.35 + 0.35 + 1/1.5 = 1.37.
    """
    model = Table({("a", "c"): 2.0, ("b", "c"): 2.0, ("c", "a"): 1.25, ("c", "b"): 1.25},
                  {("a", "b"): m_ab, ("b", "a"): m_ab})
    state = gpu(model, floor=0.3)
    a, ra = seat_row(state, 1, 40, 0.7, 1.0, "a")
    b, rb = seat_row(state, 2, 40, 0.7, 1.0, "b")
    c, rc = seat_row(state, 3, 20, 1.0, 1.0, "c")
    state.place(a, ra, 0)
    assert state.fits(b, rb, 0) > 0  # 1.4 >= 1 + m_ab
    state.place(b, rb, 0)
    return state.fits(c, rc, 0) > 0


def test_per_pair_the_largest_margin_of_the_gpu_counts():
    assert three(0.0)  # 1.37 >= 1.1 (MIN_GAIN)
    assert not three(0.38)  # 1.37 < 1.38: the margin of A and B, a pair C is not in, counts


def test_each_pair_of_the_newcomer_must_gain_on_its_own():
    # No slowdown, margin 0.1: A (0.9) and B (0.3) gain together (1.2); C (0.3) with them gives 1.5, but C and B
    # alone only 0.6: refused, since either may be left with the other when A goes.
    def joins(f_c: float) -> bool:
        state = gpu(Even(1.0, margin=0.1))
        a, ra = seat_row(state, 1, 50, 0.9, 1.0)
        b, rb = seat_row(state, 2, 25, 0.3, 1.0)
        c, rc = seat_row(state, 3, 25, f_c, 1.0)
        state.place(a, ra, 0)
        assert state.fits(b, rb, 0) > 0
        state.place(b, rb, 0)
        return state.fits(c, rc, 0) > 0

    assert not joins(0.3)
    assert joins(0.9)  # 1.2 with B alone, 1.8 with A alone, 2.1 in all


def test_a_foreign_occupant_counts_as_its_share_of_the_gpu():
    for f, admitted in ((0.75, True), (0.65, False), (0.55, False)):  # next to a foreign 40 %: 1.15, 1.05, 0.95
        state = gpu(Even(1.0))
        foreign = Seat(9, 0.0, Row(-1, state.cache.add(SoloProfile(kind="train", mps_share=40)), float("inf"), 40,
                                   0.0, 0.0, 0.0))
        state.attach(foreign, 0, 0.0)
        a, ra = seat_row(state, 1, 60, f, 1.0)
        assert (state.fits(a, ra, 0) > 0) is admitted, f
    state = gpu(Even(1.25))  # its slowdown counts too: 0.4/1.25 + 0.9/1.25 = 1.04 (1.12 were it ignored)
    state.attach(Seat(9, 0.0, Row(-1, state.cache.add(SoloProfile(kind="train", mps_share=40)), float("inf"), 40,
                                  0.0, 0.0, 0.0)), 0, 0.0)
    a, ra = seat_row(state, 1, 60, 0.9, 1.0)
    assert state.fits(a, ra, 0) == 0.0


def test_best_solo_is_the_fastest_shape_on_one_gpu():
    rows = [Row(0, 0, 0.5, 50, 0, 0, 0), Row(1, 0, 0.9, 100, 0, 0, 0), Row(2, 0, 1.2, 0, 0, 0, 0, gpus=1),
            Row(3, 0, 3.0, 0, 0, 0, 0, gpus=4)]
    assert best_solo(rows) == 1.2  # four GPUs are not one
    assert best_solo(rows[:2]) == 0.9 and best_solo([]) == 0.0


# -- through the epoch and the exact optimum -------------------------------------------------------------------


def two_halves(half: float, model) -> list[tuple[int, int]]:
    fam = family((50, half, 1000), (100, 1.0, 1000))
    snap = snapshot(cluster(1), [pending(1, NOW - 60), pending(2, NOW - 30)])
    return sorted((p.job_id, p.share) for p in run_epoch(snap, {1: fam, 2: fam}, Settings(), model, NOW).placements)


def test_the_epoch_shares_a_gpu_only_when_it_gains():
    # Needs the epoch to set Seat.best_solo (the fastest single-GPU shape, 1.0 here): f = half / 1.1 each.
    model = Even(1.1)
    assert floors_admit(model)
    assert two_halves(0.8, model) == [(1, 50), (2, 50)]  # 1.45
    assert two_halves(0.5, model) == [(1, 100)]  # 0.91: one job alone at its best


def test_the_exact_optimum_applies_the_gain_rule():
    fam = family((50, 0.6, 1000), (100, 1.0, 1000))
    snap = snapshot(cluster(1), [pending(1, NOW - 60), pending(2, NOW - 30)])
    w = {j.job_id: weight_of(j, fam, "waiting", NOW) for j in snap.jobs if j.state is JobState.PENDING}
    shared = 0.6 * (w[1] + w[2])
    assert shared > max(w.values())  # sharing would be worth more, were it admitted

    def best(model):
        return exact.optimum(snap, {1: fam, 2: fam}, "waiting", NOW, model, FLOOR, 81920)

    assert best(Even(1.05)) == pytest.approx(shared)  # 0.6/1.05 × 2 = 1.14 >= 1.1 (MIN_GAIN)
    assert best(Even(1.1)) == pytest.approx(max(w.values()))  # 0.6/1.1 × 2 = 1.09: gains too little
    assert two_halves(0.6, Even(1.1)) == [(1, 100)] and two_halves(0.6, Even(1.05)) == [(1, 50), (2, 50)]  # packing agrees
    assert best(Even(1.35)) == pytest.approx(max(w.values()))  # 0.6/1.35 × 2 = 0.89: one job on the whole GPU
    assert floors_admit(Even(1.35))



# -- the search: the gain rule's bound and `find`'s shortcuts never change an answer ------------------------------


class Random:
    """Slowdowns and margins drawn once per pair of model families."""

    def __init__(self, rng: np.random.Generator, names: list[str], per_pair: bool):
        self.slow = {(a, b): float(rng.choice([1.0, rng.uniform(1.0, 2.0)])) for a in names for b in names}
        self.margin = {(a, b): float(rng.uniform(0.0, 0.3)) for a in names for b in names}
        if per_pair:
            self.admission_margins = lambda a, b: np.array([self.margin[(x.model_family, y.model_family)]
                                                            for x, y in zip(a, b)])
        else:
            self.admission_margin = float(rng.uniform(0.0, 0.3))

    def predict(self, a, b):
        return np.array([self.slow[(x.model_family, y.model_family)] for x, y in zip(a, b)])


def plain_fits(state: GpuState, seat: Seat, row: Row, g: int) -> float:
    """`fits` without the gain rule's cheap bound."""
    need, state.need = state.need, [-np.inf] * len(state.need)
    try:
        return state.fits(seat, row, g)
    finally:
        state.need = need


def plain_find(state: GpuState, seat: Seat, row: Row) -> int:
    """Best fit in `find`'s order, every GPU asked, no shortcut."""
    for level in range(row.share, state.top + 1):
        for g in state.buckets[level]:
            if plain_fits(state, seat, row, g):
                return g
    return -1


@pytest.mark.parametrize("per_pair", [False, True])
def test_the_search_shortcuts_give_the_plain_answer(per_pair):
    rng = np.random.default_rng(11 if per_pair else 7)
    names = ["a", "b", "c", "d"]
    asked = refused_by_bound = 0
    for _ in range(30):
        model = Random(rng, names, per_pair)
        gpus = 6
        state = GpuState([g // 3 for g in range(gpus)], [100] * gpus, [1e9] * gpus, [12.0, 12.0], [1e9, 1e9],
                         PairCache(model), float(rng.uniform(0.0, 0.6)), max_tries=10**9)
        kinds = []
        for name in names:
            for share in (25, 50, 75):
                best = float(rng.uniform(1.0, 2.0))
                tput = best * float(rng.uniform(0.2, 1.0))
                prof = SoloProfile(kind="train", model_family=name, mps_share=share)
                cpus = float(rng.choice([0, 0, 2, 5]))  # few CPUs per node: refusals for CPUs, freed by others leaving
                kinds.append((best, Row(0, state.cache.add(prof), tput, share, 0.0, cpus, 0.0)))
        placed: list[Seat] = []
        for step in range(40):
            if placed and rng.random() < 0.25:
                state.remove(placed.pop(int(rng.integers(0, len(placed)))))
                continue
            best, row = kinds[int(rng.integers(0, len(kinds)))]
            seat = Seat(100 + step, 0.0, best_solo=best)
            for g in range(gpus):
                asked += 1
                refused_by_bound += bool(state.occ[g]) and state.alone(seat, row) < state.need[g]
                assert state.fits(seat, row, g) == plain_fits(state, seat, row, g)
            g, _ = state.find(seat, row)
            assert g == plain_find(state, seat, row)
            if g >= 0:
                state.place(seat, row, g)
                placed.append(seat)
    assert asked > 1000 and refused_by_bound > 100  # the bound does refuse, not only on empty GPUs


def test_the_gain_bound_learnt_on_one_gpu_type_does_not_skip_another_types_gpus():
    # Two GPUs of two types at the same free share: type 0's occupant gains little beside a newcomer (need 0.8),
    # type 1's much (need 0.2). A refusal on type 0 must not bar a type 1 row from type 1's GPU.
    state = GpuState([0, 1], [100, 100], [1e9] * 2, [1e9] * 2, [1e9] * 2, PairCache(Even(1.0, 0.0)), 0.0,
                     gpu_type=[0, 1])

    def seat_row_of(job: int, tput: float, gtype: int):
        prof = SoloProfile(kind="train", mps_share=50)
        return Seat(job, 0.0, best_solo=1.0), Row(0, state.cache.add(prof), tput, 50, 0.0, 0.0, 0.0, gtype=gtype)

    for job, (tput, g) in enumerate(((0.3, 0), (0.9, 1)), start=1):
        seat, row = seat_row_of(job, tput, g)
        state.place(seat, row, g)
    assert state.find(*seat_row_of(3, 0.5, 0)) == (-1, 0.0)  # 0.3 + 0.5 < 1 + MIN_GAIN on type 0's GPU
    assert state.find(*seat_row_of(4, 0.5, 1))[0] == 1  # 0.9 + 0.5 gains on type 1's


def test_the_gain_rules_bounds_are_kept_while_the_ledger_stands_and_follow_its_changes():
    # `bounds` keeps its answer while nothing changes (jobs of one family ask it again and again); a placement must
    # give a new one (the GPU's free share moves to another level), and so must a search that learnt what a
    # newcomer needs there once something else changes.
    state = gpu(Even(1.0))
    before = state.bounds(-1)
    assert state.bounds(-1) is before and before == ([100], [-np.inf])
    seat, row = seat_row(state, 1, 50, 0.9, 1.0)
    state.place(seat, row, 0)
    assert state.bounds(-1) == ([50], [-np.inf])  # nothing learnt of level 50 yet
    assert state.find(*seat_row(state, 2, 25, 0.1, 1.0)) == (-1, 0.0)  # 0.9 + 0.1 does not gain: bucket scanned
    assert state.bounds(-1)[1] == [-np.inf]  # kept: the ledger has not changed, and a lower bound still holds
    state.block(0, 5)
    levels, least = state.bounds(-1)
    assert levels == [45] and least == [-np.inf]  # a new level, nothing learnt of it
