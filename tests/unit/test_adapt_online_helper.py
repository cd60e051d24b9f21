"""The helper with `interference.adapt_online`: every co-located pair it observes adapts the model, and a helper that
starts again is given the pairs its store kept."""

import numpy as np
import pytest

from slurm_elastico.config import Settings, from_mapping
from slurm_elastico.helper.observer import ProgressObserver
from slurm_elastico.interference.adapt_online import OnlineAdapted
from slurm_elastico.store import Store
from test_observe import alone_then_shared


class Flat:
    """A trained model's stand-in: every pair slowed 1.5x."""

    def predict(self, a, b):
        return np.full(len(a), 1.5)


def test_observed_pairs_adapt_the_model_and_a_restarted_helper_gets_them_from_the_store(tmp_path):
    model = OnlineAdapted(Flat(), "p100", untrained_margin=0.4)
    assert model.stage == "untrained" and model.gain_margin == 0.4
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", model)
        alone_then_shared(observer, tmp_path)
        assert model.stage == "measured"
        (pair,) = model.measured.values()
        assert (pair.norm_a, pair.norm_b) == pytest.approx((0.6, 0.5))
        # predicted 1/1.5 each, measured 0.6 and 0.5: the margins are the model's own error, not the constant
        assert model.gain_margin == pytest.approx((4 / 3) / 1.1 - 1)
        again = OnlineAdapted(Flat(), "p100", untrained_margin=0.4)
        ProgressObserver(store, "p100", again)
        assert len(again.measured) == 1 and again.gain_margin == pytest.approx(model.gain_margin)
        other = OnlineAdapted(Flat(), "k80", untrained_margin=0.4)
        ProgressObserver(store, "k80", other)  # another GPU type's pairs are not this one's
        assert other.stage == "untrained"


def test_the_setting_is_off_unless_asked_for():
    assert Settings().interference.adapt_online is False
    assert from_mapping({"interference": {"adapt_online": True}}).interference.adapt_online is True
