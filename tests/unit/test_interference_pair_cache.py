"""The planner's PairCache: one batched model call fills every pair; misses are batched otherwise."""

import math

import numpy as np

from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.planner.slowdown import PairCache, for_gpu


class Pairwise:
    """Counts calls; slowdown of a next to b is 1 + a.sm_util * b.sm_util (NaN sm → NaN)."""

    def __init__(self):
        self.calls = []

    def predict(self, a, b):
        self.calls.append(("predict", len(a)))
        return 1.0 + np.array([x.sm_util * y.sm_util for x, y in zip(a, b, strict=True)])


class WithMatrix(Pairwise):
    def predict_matrix(self, profiles):
        self.calls.append(("matrix", len(profiles)))
        sm = np.array([p.sm_util for p in profiles])
        return 1.0 + np.outer(sm, sm)


def _cache(model, n, **kw):
    cache = PairCache(model, **kw)
    ids = [cache.add(SoloProfile(kind="train", sm_util=0.1 * (i + 1))) for i in range(n)]
    return cache, ids


def test_a_matrix_model_is_called_once_for_all_pairs_and_again_only_for_new_profiles():
    model = WithMatrix()
    cache, ids = _cache(model, 5)
    first = cache.get([(0, 1), (1, 0), (2, 4)])
    again = cache.get([(3, 4), (4, 3), (0, 0)] * 50)
    assert model.calls == [("matrix", 5)]
    assert first == [1.02, 1.02, 1.15] and again[:3] == [1.2, 1.2, 1.01]
    late = cache.add(SoloProfile(kind="train", sm_util=1.0))
    assert cache.get([(late, 0), (1, late), (2, 3)]) == [1.1, 1.2, 1.12]
    # One more call for the new row and column only: 6 (late, all) + 5 (old, late) pairs.
    assert model.calls == [("matrix", 5), ("predict", 11)] and cache.model_calls == 2


def test_without_a_matrix_one_predict_covers_all_pairs():
    model = Pairwise()
    cache, _ = _cache(model, 4)
    assert cache.get([(0, 1), (3, 2)]) == [1.02, 1.12] and cache.get([(1, 1)]) == [1.04]
    assert model.calls == [("predict", 16)]


def test_past_the_dense_limit_only_misses_are_asked_in_one_call():
    for model in (WithMatrix(), Pairwise()):
        cache, _ = _cache(model, 5, max_dense_pairs=1)  # 25 pairs: past the limit, x16 for a matrix model too
        assert cache.get([(0, 1), (0, 1), (2, 4)]) == [1.02, 1.02, 1.15]
        assert cache.get([(0, 1), (2, 4)]) == [1.02, 1.15]
        assert model.calls == [("predict", 2)]


def test_slowdowns_are_clipped_at_one_and_nan_refuses():
    cache = PairCache(WithMatrix())
    a = cache.add(SoloProfile(kind="train", sm_util=-0.5))  # a model's nonsense speed-up
    b = cache.add(SoloProfile(kind="train", sm_util=0.5))
    c = cache.add(SoloProfile(kind="train"))  # NaN: unknown must never look harmless
    got = cache.get([(a, b), (b, b), (c, b)])
    assert got[0] == 1.0 and got[1] == 1.25 and math.isinf(got[2])
    assert cache.vs_partners([a, b], [SoloProfile(kind="train", sm_util=1.0)] * 2).tolist() == [1.0, 1.5]


class Scored(WithMatrix):
    """Answers through a scorer of every pair (as the trained predictor does), the table `predict_matrix`'s."""

    def scorer(self, profiles):
        model = self

        class TableScorer:
            table = model.predict_matrix(profiles)

            def tabulate(self, limit=0):
                return True

            def matrices(self, with_margins=True):
                return self.table, None

        self.last = TableScorer()
        return self.last


def test_a_scorers_table_is_clipped_at_one_and_nan_refuses_and_the_scorers_own_stays_as_it_is():
    model = Scored()
    cache = PairCache(model)
    a, b, c = (cache.add(SoloProfile(kind="train", sm_util=x)) for x in (-0.5, 0.5, math.nan))
    got = cache.get([(a, b), (b, b), (c, b), (b, a)])
    assert got[:2] == [1.0, 1.25] and math.isinf(got[2]) and got[3] == 1.0
    assert model.last.table[a, b] == 0.75 and math.isnan(model.last.table[c, b])  # cleaned in a copy
    below = PairCache(model)  # below 1 and nothing else to clean
    ids = [below.add(SoloProfile(kind="train", sm_util=x)) for x in (-0.5, 0.5)]
    assert below.get([(ids[0], ids[1]), (ids[1], ids[1])]) == [1.0, 1.25]
    clean = PairCache(model)
    ids = [clean.add(SoloProfile(kind="train", sm_util=x)) for x in (0.5, 0.25)]
    assert clean.get([(ids[0], ids[1]), (ids[1], ids[1])]) == [1.125, 1.0625]


def test_without_a_model_nothing_slows_down():
    cache = PairCache(None)
    x = cache.add(SoloProfile(kind="train"))
    assert not cache.enabled and cache.get([(x, x)]) == [1.0] and cache.vs_partners([x], []).tolist() == [1.0]


class WithMargins(WithMatrix):
    """Per-pair admission margins: a.sm_util + b.sm_util (NaN → NaN); counts calls."""

    def admission_margins(self, a, b):
        self.calls.append(("margins", len(a)))
        return np.array([x.sm_util + y.sm_util for x, y in zip(a, b, strict=True)])


def test_per_pair_margins_come_in_one_call_beside_the_slowdowns():
    model = WithMargins()
    cache, _ = _cache(model, 3)
    assert cache.per_pair
    assert np.allclose(cache.margins([(0, 1), (2, 2)]), [0.3, 0.6]) and cache.get([(0, 1)]) == [1.02]
    assert model.calls == [("matrix", 3), ("margins", 9)]
    late = cache.add(SoloProfile(kind="train"))  # unknown margin: never harmless
    assert math.isinf(cache.margins([(late, 0)])[0]) and np.isclose(cache.margins([(1, 2)])[0], 0.5)
    assert model.calls[2:] == [("predict", 7), ("margins", 7)] and (cache.model_calls, cache.margin_calls) == (2, 2)


def test_past_the_dense_limit_margins_ride_with_the_misses():
    model = WithMargins()
    cache, _ = _cache(model, 5, max_dense_pairs=10)
    assert np.allclose(cache.margins([(0, 1), (2, 4)]), [0.3, 0.8]) and cache.get([(2, 4), (0, 1)]) == [1.15, 1.02]
    assert model.calls == [("predict", 2), ("margins", 2)]


def test_a_scalar_margin_is_one_for_all_pairs_and_costs_no_call():
    model = WithMatrix()
    model.admission_margin = 0.2
    cache, _ = _cache(model, 2)
    assert not cache.per_pair and cache.margin == 0.2 and cache.margins([(0, 1), (1, 0)]) == [0.2, 0.2]
    assert model.calls == [] and PairCache(Pairwise()).margin == 0.0 and PairCache(None).margin == 0.0


def test_the_model_is_viewed_for_a_gpu_type_only_when_it_can_be_and_one_is_set():
    class Travelling(Pairwise):
        def on_gpu(self, gpu_type):
            return ("view", gpu_type)

    model, plain = Travelling(), Pairwise()
    assert for_gpu(model, "k80") == ("view", "k80") and for_gpu(model, "") is model
    assert for_gpu(plain, "k80") is plain and for_gpu(None, "k80") is None


def test_a_model_with_an_all_pairs_call_gets_a_larger_dense_block():
    model = WithMatrix()
    cache, _ = _cache(model, 5, max_dense_pairs=10)  # 25 pairs: over 10, under 16 x 10
    cache.get([(0, 1), (2, 4)])
    assert [c[0] for c in model.calls] == ["matrix"]


def test_contention_model_matrix_equals_its_pairs():
    from slurm_elastico.interference.base import ContentionModel

    profs = [SoloProfile(kind="train", sm_util=s, membw_util=b, mps_share=m)
             for s, b, m in [(0.3, 0.8, 50), (0.9, 0.4, 100), (float("nan"), float("nan"), 25)]]
    cm = ContentionModel()
    mat = cm.predict_matrix(profs)
    pairs = cm.predict([p for p in profs for _ in profs], profs * 3).reshape(3, 3)
    assert np.allclose(mat, pairs) and mat.shape == (3, 3)
    # by index (each profile's demand once): the same numbers, bit for bit
    ia, ib = np.array([2, 0, 1, 2, 0]), np.array([1, 0, 3, 3, 2])
    others = [*profs, SoloProfile(kind="infer", sm_util=0.5, mps_share=100)]
    want = cm.predict([profs[i] for i in ia], [others[j] for j in ib])
    assert cm.predict_indexed(profs, ia, others, ib).tolist() == want.tolist() and len(set(want.tolist())) == 5


def test_the_contention_models_blocks_answer_as_its_matrix_before_and_after_more_profiles():
    from slurm_elastico.interference.base import ContentionModel

    profs = [SoloProfile(kind=k, sm_util=s, membw_util=b, mps_share=m)
             for k, s, b, m in [("train", 0.3, 0.8, 50), ("infer", 0.9, 0.4, 100), ("train", float("nan"), 0.5, 25),
                                ("train", 0.3, 0.8, 50), ("infer", 2.0, float("inf"), 75)]]
    cm = ContentionModel()
    cache = PairCache(cm)
    for p in profs[:4]:
        cache.add(p)
    pairs = [(i, j) for i in range(4) for j in range(4)]
    want = np.maximum(cm.predict_matrix(profs[:4]), 1.0)
    assert cache.get(pairs) == [want[i, j] for i, j in pairs] and cache.model_calls == 1
    cache.add(profs[4])  # one more after a lookup: its row and column, the others as they were
    pairs = [(i, j) for i in range(5) for j in range(5)]
    got = cache.get(pairs)
    want = cm.predict([profs[i] for i, _ in pairs], [profs[j] for _, j in pairs])
    assert np.allclose(got, np.where(np.isfinite(want), np.maximum(want, 1.0), np.inf)) and cache.model_calls == 2


def test_a_trained_model_answers_lookups_from_its_scorer_past_the_dense_limit():
    from pathlib import Path

    from slurm_elastico.interference.gavel import import_gavel
    from slurm_elastico.interference.predictor import TrainConfig, train

    data = Path(__file__).parent.parent / "data" / "gavel"
    obs = [o for o in import_gavel(data / "throughputs_pairs.csv", data / "throughputs_isolated.csv").observations
           if o.gpu_type == "p100"][:80]
    model = train(obs, TrainConfig(hidden=8, epochs=30, use_family=False), seed=0)
    profiles = [SoloProfile(kind="train", throughput=t, batch=16, mps_share=s) for t in (1.0, 2.0, 4.0)
                for s in (25, 50, 100)]
    pairs = [(0, 1), (4, 8), (8, 4)]
    for dense_limit in (4, 1_000_000):  # 9 profiles: past a tiny block (lookups), or all at once
        cache = PairCache(model, max_dense_pairs=dense_limit)
        for p in profiles:
            cache.add(p)
        want = model.predict([profiles[i] for i, _ in pairs], [profiles[j] for _, j in pairs])
        assert np.allclose(cache.get(pairs), want, rtol=1e-5)
        assert cache.margins(pairs) == model.admission_margins([profiles[i] for i, _ in pairs],
                                                               [profiles[j] for _, j in pairs]).tolist()
        assert cache.model_calls == 1  # one table, then lookups or the dense block
