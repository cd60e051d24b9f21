"""Shadow pricing: choice at given prices, price dynamics, invariants (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastico.pricing import NONE, PriceProblem, choose, costs, load, solve


def problem(value, demand, weight, capacity, allowed=None, penalty=None, optional=None) -> PriceProblem:
    value = np.asarray(value, dtype=float)
    j, c = value.shape
    return PriceProblem(
        value=value, demand=np.asarray(demand, dtype=float).reshape(j, c, -1),
        penalty=np.zeros((j, c)) if penalty is None else np.asarray(penalty, dtype=float),
        allowed=np.ones((j, c), dtype=bool) if allowed is None else np.asarray(allowed),
        weight=np.asarray(weight, dtype=float), capacity=np.asarray(capacity, dtype=float),
        optional=np.ones(j, dtype=bool) if optional is None else np.asarray(optional))


# Two shapes per job: slot 0 = whole GPU at full speed, slot 1 = a quarter GPU at 40 %.
TWO = dict(value=[[1.0, 0.4]] * 4, demand=[[[1.0], [0.25]]] * 4, weight=[1.0] * 4)


def test_without_scarcity_prices_stay_zero_and_everyone_gets_the_fastest_shape():
    res = solve(problem(**TWO, capacity=[4.0]), rounds=30, step=0.5)
    assert res.prices.tolist() == [0.0]
    assert res.choice.tolist() == [0, 0, 0, 0]
    assert res.rounds == 1


def test_scarcity_raises_the_price_until_demand_fits():
    res = solve(problem(**TWO, capacity=[1.0]), rounds=50, step=0.5)
    assert res.prices[0] > 0
    assert load(problem(**TWO, capacity=[1.0]), res.choice)[0] <= 1.0 + 1e-9
    assert (res.choice != NONE).sum() >= 1


def test_choice_at_prices_trades_value_against_cost():
    p = problem(**TWO, capacity=[1.0])
    assert choose(p, np.array([0.0])).tolist() == [0, 0, 0, 0]
    # At price 1 per GPU: whole GPU costs 0 + 1, quarter costs 0.6 + 0.25 -> quarter.
    assert choose(p, np.array([1.0])).tolist() == [1, 1, 1, 1]
    # At price 5: quarter costs 0.6 + 1.25 > none's 1.0 -> nobody.
    assert choose(p, np.array([5.0])).tolist() == [NONE] * 4


def test_interference_penalty_moves_the_choice():
    p = problem(value=[[1.0, 0.9]], demand=[[[1.0], [0.5]]], weight=[1.0], capacity=[4.0],
                penalty=[[0.0, 0.0]])
    q = problem(value=[[1.0, 0.9]], demand=[[[1.0], [0.5]]], weight=[1.0], capacity=[4.0],
                penalty=[[0.0, 0.5]])
    prices = np.array([0.3])
    assert choose(p, prices).tolist() == [1]
    assert choose(q, prices).tolist() == [0]


def test_forbidden_shapes_are_never_chosen_and_mandatory_jobs_never_choose_none():
    p = problem(value=[[1.0, 0.4]], demand=[[[1.0], [0.25]]], weight=[1.0], capacity=[1.0],
                allowed=[[False, True]], optional=[False])
    assert choose(p, np.array([100.0])).tolist() == [1]
    nothing = problem(value=[[1.0]], demand=[[[1.0]]], weight=[1.0], capacity=[1.0], allowed=[[False]])
    assert choose(nothing, np.array([0.0])).tolist() == [NONE]


@st.composite
def random_problem(draw):
    j = draw(st.integers(1, 8))
    c = draw(st.integers(1, 5))
    r = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    value = rng.uniform(0.05, 1.0, (j, c))
    value[:, 0] = 1.0
    return problem(value=value, demand=rng.uniform(0.0, 1.0, (j, c, r)), weight=rng.uniform(1.0, 5.0, j),
                   capacity=rng.uniform(0.0, 3.0, r), allowed=rng.random((j, c)) < 0.8,
                   penalty=rng.uniform(0.0, 0.2, (j, c)))


@settings(max_examples=80, deadline=None)
@given(random_problem(), st.integers(1, 40), st.floats(0.01, 5.0))
def test_prices_stay_non_negative_and_choices_are_valid(p, rounds, step):
    res = solve(p, rounds, step)
    assert np.all(res.prices >= 0)
    assert 1 <= res.rounds <= rounds
    for k, c in enumerate(res.choice):
        assert c == NONE or p.allowed[k, c]


@settings(max_examples=80, deadline=None)
@given(random_problem(), st.integers(0, 7), st.floats(1.0, 10.0), st.lists(st.floats(0, 5), min_size=4, max_size=4))
def test_raising_a_weight_never_lowers_that_jobs_value_at_given_prices(p, k, factor, prices):
    k = k % p.weight.size
    prices = np.asarray(prices[: p.capacity.size])
    before = choose(p, prices)[k]
    w = p.weight.copy()
    w[k] *= factor
    after = choose(PriceProblem(p.value, p.demand, p.penalty, p.allowed, w, p.capacity, p.optional), prices)[k]

    def val(c):
        return 0.0 if c == NONE else p.value[k, c]

    assert val(after) >= val(before) - 1e-12


@settings(max_examples=200, deadline=None)
@given(random_problem(), st.integers(1, 40), st.floats(0.05, 2.0))
def test_the_prices_returned_go_with_the_choice_returned(p, rounds, step):
    """Packing uses the prices as the price of what was chosen: they must be the round's that chose it."""
    result = solve(p, rounds, step)
    assert np.array_equal(choose(p, result.prices), result.choice) or not np.all(
        load(p, result.choice) <= p.capacity + 1e-9)  # no feasible round: the last round's pair


def _by_the_column(p: PriceProblem, prices: np.ndarray) -> np.ndarray:
    """The choice rule as `costs` writes it: the cheapest of the shapes and "none" (one more column), ties to the
    lowest slot, NONE where "none" wins or the cheapest is not finite."""
    c = costs(p, prices)
    pick = c.argmin(axis=1)
    stuck = ~np.isfinite(c[np.arange(c.shape[0]), pick])
    return np.where((pick == p.value.shape[1]) | stuck, NONE, pick)


@settings(max_examples=200, deadline=None)
@given(random_problem(), st.lists(st.floats(0, 5), min_size=4, max_size=4), st.integers(0, 2**32 - 1))
def test_choose_is_the_cheapest_of_the_shapes_and_none_as_one_more_column(p, prices, seed):
    """`choose` compares "none" with the shapes apart (the rounds' fast path); it must pick as the [J, C + 1] costs
    do, on ties (a shape costing exactly its weight), forbidden rows, mandatory jobs and a NaN or inf cost."""
    rng = np.random.default_rng(seed)
    prices = np.asarray(prices[: p.capacity.size])
    j, c = p.value.shape
    penalty, allowed, weight = p.penalty.copy(), p.allowed.copy(), p.weight.copy()
    tie = rng.integers(0, c, j)  # a shape whose cost is exactly "none"'s at these prices
    rows = rng.random(j) < 0.3
    at = (rows, tie[rows])
    penalty[at] = weight[rows] - (weight[rows] * (1.0 - p.value[at]) + (p.demand @ prices)[at])
    allowed[rng.random(j) < 0.15] = False  # nothing allowed
    penalty[rng.random((j, c)) < 0.1] = np.nan
    penalty[rng.random((j, c)) < 0.1] = np.inf
    optional = rng.random(j) < 0.7
    q = PriceProblem(p.value, p.demand, penalty, allowed, weight, p.capacity, optional)
    expected = _by_the_column(q, prices)
    assert choose(q, prices).tolist() == expected.tolist()
    on = expected != NONE  # `load` sums the chosen shapes' demands in job order, as the masked sum did
    picked = q.demand[np.arange(j), np.maximum(expected, 0)]
    assert load(q, expected).tolist() == (picked * on[:, None]).sum(axis=0).tolist()
