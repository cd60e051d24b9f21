"""Admission thresholds per floor from held-out pairs, and the per-pair margins the planner reads from them."""

import math

import numpy as np
import pytest

from slurm_elastico.interference.admission import (
    FLOORS, TARGET, from_json, margin_of, margins, thresholds, to_json,
)


def _at(t, floor):
    return t[FLOORS.index(floor)]


def test_threshold_admits_at_most_the_target_share_of_bad_pairs():
    rng = np.random.default_rng(0)
    truth = rng.uniform(0.2, 0.9, 400)
    pred = 0.5 + 0.3 * (truth - 0.55) + rng.normal(0, 0.03, 400)  # ranks well, pulled toward the mean
    t = thresholds([(pred, truth)])
    assert np.all(t[1:] >= t[:-1])
    for f in (0.4, 0.6, 0.8):
        bad = truth < f
        assert np.mean(pred[bad] >= _at(t, f)) <= TARGET
        assert np.mean(pred[bad] >= _at(t, f) - 0.02) > TARGET / 2  # not far more cautious than it needs to be
    # predictions pulled toward the mean: the bar at 0.6 is below 0.6, so good pairs pass
    assert _at(t, 0.6) < 0.6 and np.mean(pred[truth >= 0.6] >= _at(t, 0.6)) > 0.5


def test_margins_reproduce_the_thresholds_at_every_floor():
    rng = np.random.default_rng(1)
    truth = rng.uniform(0.2, 0.9, 300)
    pred = truth * rng.uniform(0.8, 1.2, 300)
    t = thresholds([(pred, truth)])
    query = rng.uniform(0.1, 1.0, 200)
    m = margins(query, t)
    for f in FLOORS[::7]:
        assert np.array_equal(query >= f * (1 + m), query >= _at(t, f))


def test_one_pairs_margin_is_the_tables_to_the_bit():
    # The planner asks `margin_of` pair by pair; it must answer what `margins` gives the same pair in a table:
    # below every threshold, between them, on one, above all, not finite, under -inf and inf thresholds.
    rng = np.random.default_rng(2)
    truth = rng.uniform(0.2, 0.9, 300)
    t = thresholds([(truth * rng.uniform(0.8, 1.2, 300), truth)])
    t[:5], t[-3:] = -math.inf, math.inf
    query = np.concatenate([rng.uniform(0.0, 1.2, 500), t[np.isfinite(t)][::9], [math.nan, math.inf, 0.0, 1e-9]])
    for thresholds_ in (t, thresholds([])):
        table = margins(query, thresholds_)
        one = np.array([margin_of(q, thresholds_.tolist()) for q in query.tolist()])
        assert np.array_equal(table, one)
    assert np.isfinite(table).sum() == 0 and np.isfinite(margins(query, t)).sum() > 400


def test_no_evidence_and_no_bound():
    assert np.all(np.isinf(thresholds([])))  # no held-out pair: every floor refuses
    assert math.isinf(margins(np.array([0.9]), thresholds([]))[0])
    t = thresholds([(np.array([0.5, 0.6]), np.array([0.5, 0.6]))])
    assert _at(t, 0.3) == -math.inf  # nothing held out below 0.3: nothing to refuse for
    assert 0.5 < _at(t, 0.55) < 0.5 + 1e-9  # one bad pair: just above its prediction, so it is refused
    assert math.isinf(margins(np.array([math.nan]), t)[0])


def test_worst_group_is_never_below_the_pooled_threshold():
    rng = np.random.default_rng(2)
    groups = []
    for shift in (0.0, 0.05, 0.15):  # the last group's predictions run high: a shift the others do not show
        truth = rng.uniform(0.2, 0.9, 150)
        groups.append((truth + shift + rng.normal(0, 0.05, 150), truth))
    pooled, worst = thresholds(groups), thresholds(groups, by_group="worst")
    assert np.all(worst >= pooled) and _at(worst, 0.6) > _at(pooled, 0.6)
    p, y = groups[2]
    assert np.mean(p[y < 0.6] >= _at(worst, 0.6)) <= TARGET  # the worst group is held to the target


def test_json_round_trip_and_wrong_length():
    t = np.array([-math.inf] * 10 + [0.5] * (len(FLOORS) - 11) + [math.inf])
    assert np.array_equal(from_json(to_json(t)), t)
    with pytest.raises(ValueError, match="one per floor"):
        from_json([0.5])


def test_worst_group_ignores_a_group_too_small_to_show_the_rate():
    rng = np.random.default_rng(3)
    truth = rng.uniform(0.2, 0.9, 300)
    big = (truth + rng.normal(0, 0.05, 300), truth)
    tiny = (np.array([0.95, 0.3]), np.array([0.4, 0.3]))  # two bad pairs, one predicted far too high
    assert np.array_equal(thresholds([big, tiny], by_group="worst"),
                          np.maximum(thresholds([big, tiny]), thresholds([big], by_group="worst")))
    assert _at(thresholds([big, tiny], by_group="worst"), 0.6) < 0.9


def test_group_mean_holds_the_mean_of_the_groups_rates_to_the_target():
    rng = np.random.default_rng(4)
    big_t = rng.uniform(0.2, 0.9, 400)
    big = (big_t + rng.normal(0, 0.03, 400), big_t)  # many pairs, well predicted
    small_t = rng.uniform(0.3, 0.59, 12)
    small = (small_t + 0.2, small_t)  # a few bad pairs, all predicted far too high
    pooled, mean = _at(thresholds([big, small]), 0.6), _at(thresholds([big, small], by_group="mean"), 0.6)
    assert mean > pooled
    rates = [np.mean(p[y < 0.6] >= mean) for p, y in (big, small)]
    assert np.mean(rates) <= TARGET
    with pytest.raises(ValueError, match="pooled, mean or worst"):
        thresholds([big], by_group="max")


def test_another_target_draws_the_trade_off_curve():
    rng = np.random.default_rng(3)
    truth = rng.uniform(0.2, 0.9, 400)
    pred = truth + rng.normal(0, 0.08, 400)
    strict, loose = thresholds([(pred, truth)], target=0.05), thresholds([(pred, truth)], target=0.20)
    assert np.all(loose <= strict) and np.any(loose < strict)
    bad = truth < 0.6
    assert 0.10 < np.mean(pred[bad] >= _at(loose, 0.6)) <= 0.20
    assert np.mean(pred[bad] >= _at(strict, 0.6)) <= 0.05
    for rule in ("pooled", "mean", "worst"):
        with pytest.raises(ValueError, match="target"):
            thresholds([(pred, truth)], by_group=rule, target=1.0)


def test_a_low_floors_outlier_does_not_raise_the_floors_above_it():
    rng = np.random.default_rng(5)
    truth = rng.uniform(0.25, 0.9, 400)
    pred = truth + rng.normal(0, 0.03, 400)
    clean = thresholds([(pred, truth)])
    # one bad pair far below every floor the planner uses, predicted far too high: at floor 0.21 it is the only bad
    # pair, so that floor's own quantile is just above its prediction
    t = thresholds([(np.append(pred, 0.95), np.append(truth, 0.2))])
    assert np.all(t[1:] >= t[:-1])
    assert _at(t, 0.6) < 0.65 and abs(_at(t, 0.6) - _at(clean, 0.6)) < 0.02
    assert _at(t, 0.21) < 0.9  # taken from above, not its own quantile (just above the outlier's 0.95)
    bad = truth < 0.6
    assert np.mean(pred[bad] >= _at(t, 0.6)) <= TARGET and np.mean(pred[~bad] >= _at(t, 0.6)) > 0.5
