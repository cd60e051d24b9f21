"""The planner's fast path with a trained predictor answers what the model answers pair by pair.

The pair cache takes a scorer's all-pairs tables (`scorer.matrices()`); the prior-corrected scorer gives the
margins pair by pair from its table (`margin`), others the margins of the whole table at once. The model's own
per-pair calls (`predict`, `admission_margins` on a few pairs) compute each pair on its own. Both must give the
same slowdowns and margins, on every kind of pair (families seen and unseen, seen and unseen GPU types), and a
planner epoch must plan the same through either.
"""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from slurm_elastico.config import Settings
from slurm_elastico.interference.admission import margins
from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.gavel import import_gavel
from slurm_elastico.interference.predictor import TrainConfig, train
from slurm_elastico.interference.transfer.encoding import shift_direction
from slurm_elastico.interference.transfer.fit import fit_transfer
from slurm_elastico.planner import policies
from slurm_elastico.planner.slowdown import PairCache, for_gpu
from tests import synthetic

GAVEL = Path(__file__).parent.parent / "data" / "gavel"
FAMILIES = ("ResNet-18", "LM", "A3C", "Transformer")
GPUS = ("", "k80", "h100", "t4", "no-such-gpu")  # none, seen, unseen bigger, unseen smaller, no listed spec


@pytest.fixture(scope="module")
def observations():
    obs = import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations
    return [o for o in obs if {o.a.model_family, o.b.model_family} <= set(FAMILIES)]  # k80 and p100


@pytest.fixture(scope="module")
def models(observations):
    return {"prior-corrected": fit_transfer(observations, seed=0),
            "mlp": train(observations, TrainConfig(hidden=8, epochs=30, use_family=True), seed=0)}


def _profiles(observations, families):
    """Training jobs, and planner-like jobs of the given families (`families` names seen and unseen ones)."""
    seen = list({id(p): p for o in observations[:12] for p in (o.a, o.b)}.values())
    made = [SoloProfile(kind=kind, throughput=tput, batch=16.0, precision="fp16" if share == 50 else "fp32",
                        model_family=fam, sm_util=0.4 + 0.04 * i, membw_util=0.3 + 0.04 * i, mem_used_mib=8000.0,
                        mps_share=share)
            for i, (kind, tput, share, fam) in enumerate(
                (k, t, s, f) for k in ("train", "infer") for t in (0.7, 3.0) for s in (50, 100) for f in families)]
    return seen + made if all(f in FAMILIES for f in families) else made


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("families", [FAMILIES[:2], ("novel", "other"), ("LM", "novel")],
                         ids=["seen-families", "unseen-families", "mixed"])
@pytest.mark.parametrize("name", ["prior-corrected", "mlp"])
def test_the_pair_cache_tables_equal_the_models_answers_pair_by_pair(models, observations, name, families, gpu):
    model = for_gpu(models[name], gpu)
    profiles = _profiles(observations, families)
    n = len(profiles)
    cache = PairCache(model)
    ids = [cache.add(p) for p in profiles]
    assert ids == list(range(n)) and cache.per_pair
    every = [(i, j) for i in range(n) for j in range(n)]
    slow, margin = np.array(cache.get(every)), np.array(cache.margins(every))
    assert cache.model_calls == 1 and cache.margin_calls == 1  # one table for all pairs
    # A few pairs at a time: the scorer computes just those (no table), as admission_margins of a pair list does.
    rng = np.random.default_rng(n)
    tol = 1e-12 if name == "prior-corrected" else 1e-5  # the MLP computes in float32, its table in another order
    for ia, ib in (rng.integers(0, n, (2, 7)), np.array([[0, n - 1, n // 2], [n - 1, 0, n // 2]])):
        a, b = [profiles[i] for i in ia], [profiles[j] for j in ib]
        scorer = model.scorer(profiles)
        assert np.allclose(slow.reshape(n, n)[ia, ib], model.predict(a, b), rtol=tol, atol=0)
        assert np.allclose(margin.reshape(n, n)[ia, ib], scorer.margins(ia, ib), rtol=1e-12, atol=0)
        assert np.allclose(margin.reshape(n, n)[ia, ib], model.admission_margins(a, b), rtol=1e-12, atol=0)
    assert np.isfinite(slow).all() and (slow >= 1).all()
    # Pricing's Γ: each profile next to a stand-in neighbour the cache does not hold, from the epoch's scorer.
    stand_ins = [SoloProfile(kind="train", mps_share=share) for share in (50, 75)]
    some = list(range(0, n, 3))
    partners = [stand_ins[i % 2] for i in range(len(some))]
    assert np.allclose(cache.vs_partners(some, partners), model.predict([profiles[i] for i in some], partners),
                       rtol=tol, atol=0)
    if name != "prior-corrected":
        return
    # Every pair's margin from the thresholds of its kind (an unseen GPU type by its direction; else an unseen
    # family in the pair; else seen), at the pair's predicted worst normalized throughput.
    trained, s = models[name], slow.reshape(n, n)
    worst = 1.0 / np.maximum(s, s.T)
    if gpu and not trained.seen_gpu(gpu):
        direction = shift_direction(gpu, trained.gpu_types)
        kinds = np.full((n, n), f"gpu_{direction}" if direction else "gpu")
    else:
        unseen = np.array([p.model_family not in FAMILIES for p in profiles])
        kinds = np.where(unseen[:, None] | unseen[None, :], "family", "seen")
    for kind in set(kinds.ravel().tolist()):
        at = kinds == kind
        assert np.array_equal(margin.reshape(n, n)[at], margins(worst[at], trained.admission[kind])), kind


class PlainCalls:
    """A model seen only through `predict` and `admission_margins`: the pair cache's path for a model without a
    scorer (all pairs in one `predict` and one `admission_margins` call)."""

    def __init__(self, model):
        self.model, self.gain_margin = model, model.gain_margin

    def predict(self, a, b):
        return self.model.predict(a, b)

    def admission_margins(self, a, b):
        return self.model.admission_margins(a, b)


@pytest.mark.parametrize("gpu", ["", "k80", "h100"])
def test_an_epoch_plans_the_same_through_the_scorer_as_through_plain_calls(models, gpu):
    model = models["prior-corrected"]
    snap, fams = synthetic.instance(np.random.default_rng(3), 80, 16, templates=12, running_frac=0.2)
    # Half the templates named after training families, so pairs of seen, unseen and mixed families all occur.
    named = {id(f): dataclasses.replace(f, name=FAMILIES[i % 4] if i % 2 else f"novel{i}")
             for i, f in enumerate({id(f): f for f in fams.values()}.values())}
    fams = {j: named[id(f)] for j, f in fams.items()}
    settings = Settings()
    settings = dataclasses.replace(settings, gpu=dataclasses.replace(settings.gpu, type=gpu))
    policy = policies.REGISTRY["elastico"]
    fast = policy.plan(snap, fams, settings, model, 1_000_000.0)
    plain = policy.plan(snap, fams, settings, PlainCalls(for_gpu(model, gpu)), 1_000_000.0)
    assert fast.actions == plain.actions
    key = [(p.job_id, p.node, p.gpu, p.shape, p.share) for p in fast.placements]
    assert key == [(p.job_id, p.node, p.gpu, p.shape, p.share) for p in plain.placements]
    assert np.allclose([p.throughput for p in fast.placements], [p.throughput for p in plain.placements], rtol=1e-12)
    # The instance shares GPUs: the slowdowns and per-pair margins decided something.
    on_gpu = [(p.node, p.gpu) for p in fast.placements]
    assert len(set(on_gpu)) < len(on_gpu)


@pytest.mark.parametrize("gpu", ["", "h100"])
def test_one_pairs_margin_is_the_margin_tables_even_where_a_slowdown_is_not_finite(models, observations, gpu):
    # The pair cache asks the prior-corrected scorer for margins pair by pair (`margin`), not as a table; both must
    # agree to the bit, also where a slowdown is NaN or inf (a model that could not say: refused, margin inf).
    model = for_gpu(models["prior-corrected"], gpu)
    profiles = _profiles(observations, ("LM", "novel"))
    n = len(profiles)
    scorer = model.scorer(profiles)
    assert scorer.tabulate()
    scorer.table[1, 2], scorer.table[3, 1], scorer.table[2, 4] = np.nan, np.inf, 1e300
    table = scorer.matrices()[1]
    one = np.array([[scorer.margin(i, j) for j in range(n)] for i in range(n)])
    assert np.array_equal(one, table)
    assert np.isinf(one[1, 2]) and np.isinf(one[2, 1]) and np.isfinite(one).sum() > n  # NaN: refused both ways
