from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from slurm_elastico.interference.gavel import import_gavel
from slurm_elastico.interference.measurements import samples
from slurm_elastico.interference.online import OnlineLearner, holdout_error
from slurm_elastico.interference.predictor import TrainConfig, train

GAVEL = Path(__file__).parent.parent / "data" / "gavel"
CFG = TrainConfig(hidden=16, weight_decay=1e-3, epochs=150, use_family=False)


@pytest.fixture(scope="module")
def gavel():
    obs = [o for o in import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations
           if o.fits and o.gpu_type == "p100"]
    new = [o for o in obs if "LM" in (o.a.model_family, o.b.model_family)]
    old = [o for o in obs if "LM" not in (o.a.model_family, o.b.model_family)]
    return old, new


def test_corrupted_observations_are_rolled_back(gavel):
    old, new = gavel
    model = train(old, CFG, seed=0)
    learner = OnlineLearner(model, old)
    s, p, _, _ = samples(old[:60])
    before = model.predict(s, p)
    # A broken monitor reports every co-located job at 98 % of solo speed: no interference at all.
    corrupted = [replace(o, norm_a=0.98, norm_b=0.98) for o in old] * 2
    result = learner.observe(corrupted)
    assert not result.accepted and result.error_after > result.error_before
    assert np.array_equal(model.predict(s, p), before)


def test_consistent_observations_are_learned(gavel):
    old, new = gavel
    model = train(old, CFG, seed=0)
    learner = OnlineLearner(model, old, replay_size=400)
    seen, unseen = new[::2], new[1::2]  # judge on LM pairs the learner never gets
    error_before = holdout_error(model, unseen)
    results = [learner.observe(seen[i:i + 25]) for i in range(0, len(seen), 25)]
    assert all(r.accepted for r in results)
    assert holdout_error(model, unseen) < 0.8 * error_before
    assert results[-1].replay_size <= 400  # bounded replay


def test_holdout_every_must_leave_some_replay(gavel):
    with pytest.raises(ValueError, match="holdout_every"):
        OnlineLearner(train(gavel[0][:40], CFG), gavel[0], holdout_every=1)


def test_a_failure_while_keeping_an_update_restores_the_weights(gavel):
    old, new = gavel
    model = train(old, CFG, seed=0)
    s, p, _, _ = samples(new[:40])
    before = model.predict(s, p)

    def full_disk():
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space"):
        OnlineLearner(model, old).observe(new[:25], on_accept=full_disk)
    assert np.array_equal(model.predict(s, p), before)


def test_held_out_rows_are_chosen_by_key_the_same_in_every_epoch(gavel):
    old, new = gavel
    learner = OnlineLearner(train(old[:40], CFG), old[:10], holdout_every=5)
    learner.remember(new[:10], keys=list(range(100, 110)))
    assert list(learner.recent) == [new[0], new[5]]  # keys 100 and 105
