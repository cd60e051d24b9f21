"""Probe and revert: pairings judged on observed progress, and refused pairs the planner's cache never admits."""

import dataclasses
import math

import numpy as np
import pytest

from slurm_elastico.interference.base import ContentionModel, SoloProfile
from slurm_elastico.interference.probe import MIN_GAIN, Refusals, judge_pairings
from slurm_elastico.planner.slowdown import PairCache


def _beside(rate_a, rate_b, seconds=60.0):
    """Accumulated (work, seconds) per direction for jobs 1 (shape s1) and 2 (shape s2)."""
    return {(1, "s1", 2, "s2"): (rate_a * seconds, seconds), (2, "s2", 1, "s1"): (rate_b * seconds, seconds)}


SOLO = {(1, "s1"): 10.0, (2, "s2"): 4.0}


def test_a_pairing_that_gains_is_kept():
    (v,) = judge_pairings(_beside(8.0, 2.8), SOLO, floors=0.6, margin=0.1)
    assert v.norms == pytest.approx((0.8, 0.7)) and v.combined == pytest.approx(1.5)
    assert not v.revert and "kept" in v.reason


def test_a_pairing_that_breaks_even_is_reverted():
    (v,) = judge_pairings(_beside(6.2, 2.6), SOLO, floors=0.6, margin=0.3)  # 0.62 + 0.65 = 1.27 < 1.3
    assert v.revert and "does not gain" in v.reason and v.combined == pytest.approx(1.27)
    (v,) = judge_pairings(_beside(6.2, 2.6), SOLO, floors=0.6, margin=0.2)
    assert not v.revert


def test_a_pairing_must_gain_more_than_measurement_noise_whatever_the_model_margin():
    (v,) = judge_pairings(_beside(5.2, 2.1), SOLO, floors=0.0, margin=0.0)  # 0.52 + 0.525: time-sliced, measured
    assert v.revert and "below 1 + margin 0.1" in v.reason and MIN_GAIN == 0.1
    (v,) = judge_pairings(_beside(5.8, 2.2), SOLO, floors=0.0, margin=0.0)  # 0.58 + 0.55 = 1.13
    assert not v.revert


def test_a_job_below_its_floor_reverts_even_when_the_gpu_gains():
    (v,) = judge_pairings(_beside(9.5, 1.6), SOLO, floors={1: 0.5, 2: 0.5}, margin=0.1)  # 0.95 + 0.40
    assert v.revert and "job 2 runs at 0.40" in v.reason and "floor 0.5" in v.reason
    (v,) = judge_pairings(_beside(9.5, 1.6), SOLO, floors={1: 0.5}, margin=0.1)  # job 2 has no floor
    assert not v.revert


def test_a_floor_per_job_and_shape_wins_over_the_jobs_and_an_estimated_solo_speed_is_named():
    floors = {(2, "s2"): 0.5, 2: 0.3}  # the shape's floor, not the job's
    (v,) = judge_pairings(_beside(9.5, 1.6), SOLO, floors=floors, margin=0.1, estimated={(2, "s2")})
    assert v.revert and "job 2 runs at 0.40" in v.reason and "floor 0.5" in v.reason
    assert v.reason.endswith("(solo speed job 2's at s2: its family's figure, never measured alone)")
    (v,) = judge_pairings(_beside(9.5, 1.6), SOLO, floors={(2, "other"): 0.5, 2: 0.3}, margin=0.1)
    assert not v.revert and "figure" not in v.reason  # another shape's floor; the job's holds; nothing estimated


def test_no_verdict_before_enough_evidence():
    assert judge_pairings(_beside(1.0, 1.0, seconds=10.0), SOLO, floors=0.6, margin=0.1, min_seconds=30) == []
    one_way = {(1, "s1", 2, "s2"): (600.0, 60.0)}
    assert judge_pairings(one_way, SOLO, floors=0.6, margin=0.1) == []
    assert judge_pairings(_beside(1.0, 1.0), {(1, "s1"): 10.0}, floors=0.6, margin=0.1) == []  # no solo rate for 2
    with pytest.raises(ValueError, match="margin"):
        judge_pairings(_beside(1.0, 1.0), SOLO, floors=0.6, margin=-0.1)


def _jobs():
    return [SoloProfile(kind="train", throughput=10.0, batch=32.0, model_family="a"),
            SoloProfile(kind="infer", throughput=4.0, batch=math.nan, model_family="b", sm_util=math.nan),
            SoloProfile(kind="train", throughput=2.0, batch=8.0, model_family="c")]


def test_refused_pairs_get_infinite_slowdown_until_the_refusal_ends():
    jobs = _jobs()
    refusals = Refusals()
    # The profile the helper rebuilds next epoch is another object, equal in value (NaN fields included).
    again = SoloProfile(kind="infer", throughput=4.0, batch=float("nan"), model_family="b")
    refusals.add(jobs[0], again, now=100.0, seconds=50.0)
    model = refusals.model(ContentionModel(), now=120.0)
    s = model.predict([jobs[0], jobs[1], jobs[0]], [jobs[1], jobs[0], jobs[2]])
    base = ContentionModel().predict([jobs[0]], [jobs[2]])
    assert np.isinf(s[0]) and np.isinf(s[1]) and s[2] == pytest.approx(base[0])
    m = model.predict_matrix(jobs)
    assert np.isinf(m[0, 1]) and np.isinf(m[1, 0]) and np.isfinite(m[0, 2]) and np.isfinite(m[2, 2])
    assert np.all(np.isfinite(refusals.model(ContentionModel(), now=151.0).predict_matrix(jobs)))
    refusals.expire(151.0)
    assert len(refusals) == 0
    plain = ContentionModel()
    assert refusals.model(plain, now=200.0) is plain  # nothing refused: the model itself, unwrapped


def test_a_refusal_holds_when_the_jobs_counters_are_measured_again():
    jobs = _jobs()
    refusals = Refusals()
    refusals.add(jobs[0], jobs[1], now=0.0)
    remeasured = dataclasses.replace(jobs[0], sm_util=0.61, membw_util=0.33, mem_used_mib=2345.0, power_w=180.0)
    assert refusals.refused(remeasured, jobs[1], now=1.0)  # each solo interval on a GPU gives new counters
    other = dataclasses.replace(jobs[0], model_family="another")
    assert not refusals.refused(other, jobs[1], now=1.0)  # another model is another pair


def test_the_planner_cache_never_admits_a_refused_pair():
    jobs = _jobs()
    refusals = Refusals()
    refusals.add(jobs[0], jobs[2], now=0.0)
    cache = PairCache(refusals.model(ContentionModel(), now=1.0).on_gpu("a100-80g"))
    ids = [cache.add(p) for p in jobs]
    s = cache.get([(ids[0], ids[2]), (ids[2], ids[0]), (ids[0], ids[1])])
    assert np.isinf(s[0]) and np.isinf(s[1]) and np.isfinite(s[2])


def test_refusals_survive_a_round_trip_through_json():
    import json

    jobs = _jobs()
    refusals = Refusals()
    refusals.add(jobs[0], jobs[1], now=0.0, seconds=100.0)
    refusals.add(jobs[2], jobs[2], now=0.0, seconds=50.0)
    again = Refusals.from_list(json.loads(json.dumps(refusals.to_list())))
    assert again.refused(jobs[1], jobs[0], now=99.0) and again.refused(jobs[2], jobs[2], now=49.0)
    assert not again.refused(jobs[0], jobs[2], now=1.0) and not again.refused(jobs[2], jobs[2], now=51.0)
    with pytest.raises(ValueError, match="refusal 0"):
        Refusals.from_list([{"a": [1, 2], "b": [], "until": 3}])
    # A row written before refusals were keyed without counters holds every field of each profile.
    full = [None if isinstance(v, float) and math.isnan(v) else v for v in vars(jobs[0]).values()]
    old = Refusals.from_list([{"a": full, "b": full, "until": 10.0}])
    assert old.refused(jobs[0], dataclasses.replace(jobs[0], sm_util=0.5), now=5.0)
    # One written while refusals were keyed with the throughput: every field but the counters. A solo speed
    # measured since (the throughput moves) keeps the pair refused.
    keyed = [None if isinstance(v, float) and math.isnan(v) else v for k, v in vars(jobs[0]).items()
             if k not in ("sm_util", "membw_util", "mem_used_mib", "power_w")]
    kept = Refusals.from_list([{"a": keyed, "b": keyed, "until": 10.0}])
    assert kept.refused(jobs[0], dataclasses.replace(jobs[0], throughput=jobs[0].throughput * 0.7), now=5.0)
    assert not kept.refused(jobs[0], dataclasses.replace(jobs[0], mps_share=jobs[0].mps_share // 2), now=5.0)
