"""Scorers of wrapping models: a table of every pair equals the pairs asked one by one, and a planner epoch's pair
cache asks the wrapper's scorer, not a Python step per pair."""

import functools
import math

import numpy as np
import pytest

from slurm_elastico.interference.adapt import adapt
from slurm_elastico.interference.adapt_online import OnlineAdapted
from slurm_elastico.interference.base import ContentionModel, SoloProfile
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.interference.probe import Refusals
from slurm_elastico.interference.scorers import PairValues, Plain, scorer_of
from slurm_elastico.planner.slowdown import PairCache


class Stub:
    """A 'trained model' without a scorer: slowdown from the jobs' batches, one margin per pair from the partner."""

    def predict(self, a, b):
        return np.array([1.0 + 0.4 * x.batch / 64 + 0.3 * y.batch / 64 for x, y in zip(a, b)])

    def admission_margins(self, a, b):
        return np.array([0.01 * y.batch / 8 for y in b])

    def on_gpu(self, gpu_type):
        return self


def _jobs(n=12):
    return [SoloProfile("train", throughput=1.0 + i, batch=float(8 * (1 + i % 4)), model_family=f"fam{i % 3}")
            for i in range(n)]


def _measured(jobs, pairs, gpu="new"):
    """Pairs (i, j) of `jobs` measured on `gpu`: normalized throughputs from a rule the stub does not know."""
    return [Colocation(gpu, jobs[i], jobs[j], 0.9 - 0.02 * i, 0.8 - 0.01 * j) for i, j in pairs]


def _wrappers(base, jobs) -> tuple[dict, Refusals]:
    """Every wrapper over `base`, adapted on pairs of `jobs`: few-shot, online at each stage with and without
    probing, refusals over the online one; and the refusals, for more."""
    seen = _measured(jobs, [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (1, 4), (3, 8)])
    out = {"adapted": adapt(base, seen).on_gpu("new")}
    for n in (0, 2, len(seen)):
        for probing in (False, True):
            m = OnlineAdapted(base, "new", untrained_margin=0.4, probe_optimism=0.3)
            m.observe(seen[:n])
            m.probing = probing
            out[f"online {m.stage} probing={probing}"] = m
    refusals = Refusals()
    refusals.add(jobs[0], jobs[1], 0.0)
    refusals.add(jobs[5], jobs[5], 0.0)
    out["refusing online"] = refusals.model(out["online adapted probing=False"], 1.0)
    return out, refusals


def _models():
    jobs = _jobs()
    out, refusals = _wrappers(Stub(), jobs)
    out["refusing contention"] = refusals.model(ContentionModel(), 1.0)
    return jobs, out


@pytest.mark.parametrize("name", list(_models()[1]))
def test_a_table_equals_the_pairs_asked_one_by_one(name):
    jobs, models = _models()
    model = models[name]
    n = len(jobs)
    table = scorer_of(model, jobs)
    assert table.tabulate()
    slow, margin = table.matrices()
    for i in range(n):
        for j in range(n):
            one = model.scorer([jobs[i], jobs[j]] if i != j else [jobs[i]])
            a, b = (0, 1) if i != j else (0, 0)
            assert one.slowdown(np.array([a]), np.array([b]))[0] == pytest.approx(slow[i, j], rel=1e-12)
            assert one.margins(np.array([a]), np.array([b]))[0] == pytest.approx(margin[i, j], rel=1e-12, abs=1e-12)
    assert np.allclose(model.predict([jobs[i] for i in range(n) for _ in range(n)], jobs * n), slow.ravel())


@pytest.mark.parametrize("name", list(_models()[1]))
def test_against_profiles_outside_the_scorer_answers_as_predict(name):
    jobs, models = _models()
    model = models[name]
    twin = SoloProfile(**vars(jobs[1]))  # another object, the same key: measured or refused pairs are its too
    stand_in = SoloProfile(kind="train", batch=24.0, mps_share=50)  # a planner stand-in (its batch for the stub)
    partners = [twin, stand_in, twin, jobs[2], stand_in, twin]
    ia = np.array([0, 0, 5, 3, 7, 1])
    got = scorer_of(model, jobs[:8]).against(ia, partners)
    assert np.allclose(got, model.predict([jobs[i] for i in ia], partners), equal_nan=True)
    if "refusing" in name:
        assert math.isinf(got[0]) and math.isfinite(got[3])


def test_measured_pairs_refusals_and_optimism_are_where_they_belong():
    jobs, models = _models()
    s = Stub().predict
    online = models["online measured probing=False"]  # two pairs measured: (0, 1) and (2, 3)
    got = online.predict([jobs[0], jobs[1], jobs[0]], [jobs[1], jobs[0], jobs[2]])
    assert got[0] == pytest.approx(1 / 0.9) and got[1] == pytest.approx(1 / 0.79)  # each job its own measurement
    assert got[2] == pytest.approx(s([jobs[0]], [jobs[2]])[0])  # never measured: the model's word
    assert list(online.admission_margins([jobs[0]], [jobs[1]])) == [0.0]
    probing = models["online measured probing=True"]
    fresh = probing.predict([jobs[0]], [jobs[2]])[0]
    assert fresh == pytest.approx(max(1.0, s([jobs[0]], [jobs[2]])[0] / (1 + probing.optimism)))
    refusing = models["refusing contention"]
    assert math.isinf(refusing.predict([jobs[1]], [jobs[0]])[0])
    assert math.isinf(refusing.predict([jobs[5]], [jobs[5]])[0])
    assert math.isfinite(refusing.predict([jobs[0]], [jobs[2]])[0])
    assert isinstance(scorer_of(ContentionModel(), jobs), Plain)


def test_the_planners_pair_cache_tabulates_a_wrapper_through_its_scorer(monkeypatch):
    jobs, models = _models()
    jobs = [SoloProfile("train", throughput=1.0 + i, batch=float(8 * (1 + i % 4)), model_family=f"fam{i % 3}")
            for i in range(300)]  # 90,000 pairs
    model = models["online adapted probing=False"]
    cache = PairCache(model)
    for p in jobs:
        cache.add(p)
    pairs = [(i, (7 * i + 3) % 300) for i in range(300)]

    def per_pair(*_):
        raise AssertionError("the cache asked the wrapper pair by pair")

    for name in ("predict", "predict_matrix", "admission_margins"):  # the per-pair ways, a Python step a pair
        monkeypatch.setattr(model, name, per_pair)
    got, margins = cache.get(pairs), cache.margins(pairs)
    assert cache.model_calls == 1 and cache.margin_calls == 1
    monkeypatch.undo()
    assert np.allclose(got, model.predict([jobs[i] for i, _ in pairs], [jobs[j] for _, j in pairs]))
    assert np.allclose(margins, model.admission_margins([jobs[i] for i, _ in pairs], [jobs[j] for _, j in pairs]))


@functools.lru_cache(maxsize=1)
def _prior_corrected():
    from pathlib import Path

    from slurm_elastico.interference.gavel import import_gavel
    from slurm_elastico.interference.transfer.fit import fit_transfer

    data = Path(__file__).parent.parent / "data" / "gavel"
    obs = import_gavel(data / "throughputs_pairs.csv", data / "throughputs_isolated.csv").observations
    return fit_transfer([o for o in obs if o.gpu_type == "k80"][:120], seed=0)


def _on_prior_corrected():
    """The wrappers over the trained predictor, whose scorer answers one pair's margin (`margin(i, j)`); jobs of
    classes the adaptation pairs hold and of others."""
    jobs = _jobs() + [SoloProfile("train", throughput=0.5 + i, batch=float(8 * (1 + i)), model_family="fam9")
                      for i in range(4)]
    out, refusals = _wrappers(_prior_corrected(), jobs)
    out["refusing adapted"] = refusals.model(out["adapted"], 1.0)
    return jobs, out


@pytest.mark.parametrize("name", list(_on_prior_corrected()[1]))
def test_one_pairs_margin_is_the_tables_and_the_pair_cache_asks_it_pair_by_pair(name):
    """Over a scorer that answers one pair's margin, a wrapper's scorer does too (`margin(i, j)`), each equal to its
    table of every pair's margins, refused pairs (slowdown inf) and measured ones included; the planner's pair
    cache then asks it pair by pair and gets what the model's `admission_margins` gives."""
    jobs, models = _on_prior_corrected()
    model = models[name]
    scorer = scorer_of(model, jobs)
    assert scorer.tabulate() and scorer.margin is not None
    slow, table = scorer.matrices()
    n = len(jobs)
    one = np.array([[scorer.margin(i, j) for j in range(n)] for i in range(n)])
    assert np.array_equal(one, table)
    if "probing=True" not in name and "measured" not in name:  # (those: one margin for every pair, or 0)
        assert len(np.unique(table)) > 2
    if "refusing" in name:
        assert math.isinf(slow[0, 1]) and math.isinf(slow[1, 0]) and math.isfinite(one[0, 1])
    cache = PairCache(model)
    for p in jobs:
        cache.add(p)
    pairs = [(i, (5 * i + 1) % n) for i in range(n)] + [(0, 1), (1, 0), (2, 3)]
    want = model.admission_margins([jobs[i] for i, _ in pairs], [jobs[j] for _, j in pairs])  # (other arithmetic)
    assert np.allclose(cache.margins(pairs), want, rtol=1e-12, atol=1e-12)
    assert cache._pair_margin is not None  # pair by pair, not a table


def test_pair_values_by_key_later_entries_win_and_nan_elsewhere():
    values = PairValues(["x", "y", "x", "z"], [("x", "y", 1.0), ("y", "x", 2.0), ("x", "y", 3.0), ("z", "z", 4.0)])
    got = values.lookup(np.array([0, 2, 1, 1, 3, 0, 3]), np.array([1, 1, 0, 2, 3, 2, 0]))
    assert got[:5].tolist() == [3.0, 3.0, 2.0, 2.0, 4.0] and np.isnan(got[5:]).all()
    assert len(PairValues(["x"], [])) == 0 and np.isnan(PairValues(["x"], []).lookup(np.array([0]), np.array([0])))


@functools.lru_cache(maxsize=1)
def _tiny_mlp():
    from slurm_elastico.interference.predictor import TrainConfig, train

    from test_interference_coverage import _crafted

    return train(_crafted(), TrainConfig(hidden=8, epochs=20, use_family=True), seed=0)


@pytest.mark.parametrize("wrap", ["refusing", "online", "unseen gpu refusing"])
def test_a_wrapped_trained_mlp_answers_through_the_pair_cache_as_pair_by_pair(wrap):
    """The MLP predictor's scorer (`predictor.PairScorer`) under a wrapper (refusals of probe and revert, the
    online learner): the pair cache's table and its stand-in partners give what the wrapper's `predict` gives
    pair by pair (the wrapper's scorer reads the inner scorer's `profiles` and `against`)."""
    mlp = _tiny_mlp()
    jobs = _jobs(8)
    inner = mlp.on_gpu("unseen-gpu") if wrap.startswith("unseen") else mlp
    refusals = Refusals()
    refusals.add(jobs[0], jobs[1], 0.0)
    model = OnlineAdapted(inner, "g1") if wrap == "online" else refusals.model(inner, 1.0)
    cache = PairCache(model)
    for p in jobs:
        cache.add(p)
    pairs = [(i, j) for i in range(8) for j in range(8)]
    got = np.array(cache.get(pairs))
    one = np.array([model.predict([jobs[i]], [jobs[j]])[0] for i, j in pairs])
    assert np.allclose(got, np.maximum(one, 1.0), rtol=1e-5)
    stand_in = SoloProfile(kind="train", batch=24.0, mps_share=50)
    vs = cache.vs_partners([0, 2, 3], [stand_in, jobs[1], stand_in])
    assert np.allclose(vs, model.predict([jobs[0], jobs[2], jobs[3]], [stand_in, jobs[1], stand_in]), rtol=1e-5)
    if wrap != "online":
        assert math.isinf(got[1]) and np.isfinite(got[2])  # (0, 1) refused; (0, 2) not
