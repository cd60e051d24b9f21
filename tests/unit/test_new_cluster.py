"""A simulated new cluster (`sim.new_cluster`), online adaptation's margins (`interference.adapt_online`) and the
simulator's useful work per GPU-second."""

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from slurm_elastico.config import Settings
from slurm_elastico.interference.adapt import MIN_PAIRS
from slurm_elastico.interference.adapt_online import OnlineAdapted
from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.sim import engine, new_cluster, settings as sim_settings
from slurm_elastico.sim.trace import TraceJob, default_micro
from slurm_elastico.sim.truth import GroundTruth

GAVEL = Path(__file__).parent.parent / "data" / "gavel"
TRUTH = GroundTruth()
SETTINGS = dataclasses.replace(Settings(), gpu=dataclasses.replace(Settings().gpu, memory_mib=16384))


def _sim(gpus=1, **kw):
    return sim_settings.from_mapping({"gpus": gpus, "gpus_per_node": 4, "placement_window_s": 0, "profile_noise": 0.0,
                                      "max_gpus_per_job": 0, "epoch_s": 60, "start_cost_s": 0, "restart_cost_s": 0,
                                      "audit": True, **kw})


def _two_jobs(share=50):
    return [TraceJob(i, 0.0, "train", "cifar10", 1, 2000.0, 128, share=share) for i in (1, 2)]


def test_useful_work_is_one_per_gpu_for_jobs_alone_on_whole_gpus():
    r = engine.run(_two_jobs(share=100), "static", SETTINGS, _sim(), None, TRUTH)
    assert r.unfinished == 0
    assert r.useful_per_gpu_s == pytest.approx(1.0, rel=1e-9)


def test_useful_work_of_two_jobs_on_one_gpu_is_the_sum_of_their_fractions_of_solo_speed():
    r = engine.run(_two_jobs(), "static-mps", SETTINGS, _sim(), None, TRUTH)
    assert r.unfinished == 0
    m = default_micro(TRUTH, "cifar10", 128)
    whole, half = TRUTH.train_speed("cifar10", 128, m, 100), TRUTH.train_speed("cifar10", 128, m, 50)
    me = TRUTH.identity("train", "cifar10", m)
    each = min(half, whole * TRUTH.norm[(me, me)]) / whole
    assert r.useful_per_gpu_s == pytest.approx(2 * each, rel=1e-6)
    assert r.useful_per_gpu_s != pytest.approx(1.0, abs=1e-3)


def _gavel(gpu):
    return new_cluster.gavel_pairs(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv", gpu)


def test_the_truth_of_a_new_cluster_is_its_gpu_types_pairs_and_the_true_model_predicts_them():
    pairs = _gavel("k80")
    truth = new_cluster.truth_of(pairs)
    o = next(p for p in pairs if p.fits and p.a.model_family != p.b.model_family)
    ia, ib = (o.a.model_family, int(o.a.batch)), (o.b.model_family, int(o.b.batch))
    assert truth.norm[(ia, ib)] == o.norm_a and truth.norm[(ib, ia)] == o.norm_b
    assert truth.norm != GroundTruth().norm  # not the bundled P100 pairs
    model = new_cluster.TruthPairs(truth)
    assert model.predict([o.a], [o.b])[0] == pytest.approx(1.0 / o.norm_a)
    # A simulated job stands for its Gavel job: the translated model asks about that job's profile.
    profiles = new_cluster.solo_profiles(pairs)
    t = new_cluster.Translated(model, truth, profiles)
    sim_job = SoloProfile("train", throughput=3.0, batch=32.0, model_family="cifar10")
    assert t.gavel(sim_job) is profiles[truth.identity("train", "cifar10", 32)]
    assert t.gavel(sim_job).model_family == "ResNet-18"


def _pair(a, b, na, nb, gpu="new", fits=True):
    return Colocation(gpu, a, b, na, nb, fits)


class Flat:
    """A trained model's stand-in: every pair slowed 1.5x, no margins of its own."""

    def predict(self, a, b):
        return np.full(len(a), 1.5)


def _jobs(n):
    return [SoloProfile("train", throughput=1.0 + i, batch=16.0, model_family=f"f{i % 3}") for i in range(n)]


def test_margins_are_the_untrained_constant_only_before_the_first_measurement_then_the_models_own_error():
    jobs = _jobs(8)
    m = OnlineAdapted(Flat(), "new", untrained_margin=0.4)
    assert m.stage == "untrained" and m.gain_margin == 0.4
    assert not m.observe([_pair(jobs[0], jobs[1], 0.5, 0.5, gpu="other")])  # another type's pair: nothing learnt
    # One pair that agrees with the model (1 / 1.5 each): margins 0.
    assert m.observe([_pair(jobs[0], jobs[1], 1 / 1.5, 1 / 1.5)])
    assert m.stage == "measured"
    assert m.gain_margin == pytest.approx(0.0, abs=1e-12)
    assert m.admission_margins(jobs[4:6], jobs[6:8]) == pytest.approx([0.0, 0.0], abs=1e-12)
    # One that the model over-predicts: worst 0.5 measured for 2/3 predicted, summed 1.1 for 4/3.
    m.observe([_pair(jobs[2], jobs[3], 0.5, 0.6)])
    assert m.admission_margins(jobs[4:5], jobs[5:6])[0] == pytest.approx((2 / 3) / 0.5 - 1)
    # A measured pair is predicted at its measurement (both directions), with margin 0; the others as the model.
    assert m.predict([jobs[2], jobs[3], jobs[4]], [jobs[3], jobs[2], jobs[5]]) == pytest.approx([2.0, 1 / 0.6, 1.5])
    assert m.admission_margins(jobs[3:4], jobs[2:3])[0] == 0.0
    assert m.gain_margin == pytest.approx((4 / 3) / 1.1 - 1)
    # The same pair measured again replaces its earlier measurement: the margin shrinks as it agrees.
    m.observe([_pair(jobs[2], jobs[3], 1 / 1.5, 1 / 1.5)])
    assert m.gain_margin == pytest.approx(0.0, abs=1e-12) and len(m.measured) == 2


def test_from_min_pairs_on_the_model_is_adapted_and_its_margins_come_from_its_held_out_error():
    jobs = _jobs(12)
    rng = np.random.default_rng(0)
    m = OnlineAdapted(Flat(), "new")
    pairs = []
    for k in range(MIN_PAIRS * 4):
        i, j = rng.choice(len(jobs), 2, replace=False)
        # the truth: every pair slowed 2x (the model said 1.5x), a little noise
        pairs.append(_pair(jobs[i], jobs[j], 0.5 * math.exp(0.02 * rng.normal()), 0.5 * math.exp(0.02 * rng.normal())))
    m.observe(pairs[:MIN_PAIRS - 1])
    assert m.stage == "measured"
    m.observe(pairs)
    assert m.stage == "adapted" and m.fit is not None
    assert m.predict(jobs[:1], jobs[1:2])[0] == pytest.approx(2.0, rel=0.05)  # the offset was learnt
    # Measured pairs that agree with the adapted model: a small gain margin, from its held-out error (the untrained
    # model's error here, 2x against 1.5x, would be a margin of 0.33).
    assert m.gain_margin < 0.1
    assert m.gain_margin == m.fit.gain_margin


def test_probing_is_optimistic_only_about_pairs_never_measured():
    jobs = _jobs(6)
    m = OnlineAdapted(Flat(), "new", untrained_margin=0.4, probe_optimism=0.25)
    m.probing = True
    assert m.predict(jobs[2:3], jobs[3:4])[0] == pytest.approx(1.5 / 1.25)  # nothing measured: the caller's optimism
    m.probing = False
    m.observe([_pair(jobs[0], jobs[1], 0.5, 0.5)])  # worse than the model said (2 / 3 each)
    before = m.admission_margins(jobs[2:3], jobs[3:4])[0]
    assert before == pytest.approx((2 / 3) / 0.5 - 1)
    m.probing = True
    assert m.optimism == 0.0  # its own error on this type: it under-predicted no pair
    assert m.predict([jobs[2], jobs[0]], [jobs[3], jobs[1]]) == pytest.approx([1.5, 2.0])
    assert m.admission_margins(jobs[2:3], jobs[3:4])[0] == 0.0 and m.gain_margin == 0.0
    m.observe([_pair(jobs[4], jobs[5], 0.9, 0.9)])  # better than it said: 1.8 summed where it predicted 4 / 3
    assert m.optimism == pytest.approx(1.8 / (4 / 3) - 1)
    assert m.predict(jobs[2:3], jobs[3:4])[0] == pytest.approx(1.5 / (1.8 / (4 / 3)))
    m.probing = False
    assert m.predict(jobs[2:3], jobs[3:4])[0] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="probe_optimism"):
        OnlineAdapted(Flat(), "new", probe_optimism=-0.1)


@pytest.mark.parametrize("mode", ["off", "true"])
def test_a_new_cluster_run_finishes_and_sharing_off_pairs_nothing(mode):
    pairs = _gavel("p100")
    truth, profiles = new_cluster.truth_of(pairs), new_cluster.solo_profiles(pairs)
    from slurm_elastico.sim.trace_synthetic import MixSpec, synthetic

    trace = synthetic(MixSpec(n_jobs=12, gpus=4, load=2.0), 0, truth)
    r = new_cluster.run_mode(mode, trace, Settings(), _sim(gpus=4, placement_window_s=60), truth, profiles,
                             None, "p100", 0)
    assert r.result.unfinished == 0
    assert 0 < r.result.useful_per_gpu_s <= 2.0
    if mode == "off":
        assert r.probes.measured == 0


def test_a_mode_that_needs_a_model_says_so():
    with pytest.raises(ValueError, match="trained model"):
        new_cluster.model_for("adapted", GroundTruth(), {})
    with pytest.raises(ValueError, match="allowed"):
        new_cluster.model_for("sometimes", GroundTruth(), {}, base=Flat())
