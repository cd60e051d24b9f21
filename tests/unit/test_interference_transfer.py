"""The prior-corrected predictor: falls back to the contention prior away from its training data, carries its
held-out error, derives its margins from it, and round-trips through its file. Trained on the bundled Gavel pairs."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_elastico.cli import main
from slurm_elastico.interference import load_model, measurements
from slurm_elastico.interference.base import ContentionModel, SoloProfile
from slurm_elastico.interference.errors import ModelFileError
from slurm_elastico.interference.gavel import import_gavel
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.interference.specs import spec_of
from slurm_elastico.interference.admission import FLOORS, margins
from slurm_elastico.interference.transfer.calibration import (
    ADMISSION_KINDS, FALSE_ADMISSION_TARGET, admission_tables, heldout_error, margins_from_heldout,
)
from slurm_elastico.interference.transfer.encoding import shift_direction
from slurm_elastico.interference.transfer.fit import fit_transfer
from slurm_elastico.interference.transfer.kernel import gpu_kernel
from slurm_elastico.interference.transfer.model import PriorCorrected
from slurm_elastico.interference.transfer.training import samples_of

GAVEL = Path(__file__).parent.parent / "data" / "gavel"
FAMILIES = {"ResNet-18", "LM", "A3C", "Transformer"}


@pytest.fixture(scope="module")
def k80():
    obs = import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations
    return [o for o in obs if o.gpu_type == "k80" and {o.a.model_family, o.b.model_family} <= FAMILIES]


@pytest.fixture(scope="module")
def model(k80):
    return fit_transfer(k80)


def test_gpu_specs_by_name_and_alias():
    assert spec_of("NVIDIA A100-SXM4-80GB") == spec_of("a100-80g") and spec_of("a100-80g").mem_gib == 80
    assert spec_of("Tesla K80").sms == 13 and spec_of("H100").mem_bw_gbs > spec_of("p100").mem_bw_gbs
    assert spec_of("mi300x") is None


def test_model_carries_its_heldout_error_and_margins_derive_from_it(model, k80):
    assert set(model.heldout) == {"kfold", "leave-one-model-out"}  # one GPU type: no leave-one-GPU-out
    for e in model.heldout.values():
        assert e["n_pairs"] > 0 and 0 < e["mape_norm"] < 1
    m = model.margins
    assert m == margins_from_heldout(model.heldout)
    assert m["gain_seen"] == pytest.approx(max(0.0, model.heldout["kfold"]["over_sum_q"] - 1))
    t = model.admission  # thresholds per floor: nondecreasing, and more cautious the larger the shift
    for kind in ("seen", "family", "gpu"):
        assert len(t[kind]) == len(FLOORS) and np.all(t[kind][1:] >= t[kind][:-1])
    assert np.all(t["family"] >= t["seen"]) and np.all(t["gpu"] >= t["family"])
    assert np.any(t["gpu"] > t["family"])  # one GPU type: the worst family fold, not the pooled ones
    # The in-distribution error is the smaller one: a model that fits its families transfers worse to new ones.
    assert model.heldout["kfold"]["mape_norm"] < model.heldout["leave-one-model-out"]["mape_norm"]


def test_margins_from_heldout_rules():
    h = {"kfold": {"over_q": 1.05, "over_sum_q": 1.02}, "leave-one-model-out": {"over_q": 1.3, "over_sum_q": 1.1},
         "leave-one-gpu-out": {"over_q": 1.2, "over_sum_q": 1.15}}
    assert margins_from_heldout(h) == pytest.approx({"gain_seen": 0.02, "gain_family": 0.1, "gain_gpu": 0.15})
    m = margins_from_heldout({"kfold": {"over_sum_q": 0.9}})
    assert m["gain_seen"] == m["gain_family"] == m["gain_gpu"] == 0.0  # no figure: no margin
    assert margins_from_heldout({"kfold": {"over_sum_q": 1.1},
                                 "leave-one-model-out": {"over_sum_q": math.nan}})["gain_gpu"] == pytest.approx(0.1)


def test_heldout_error_over_quantile():
    truth = np.array([[0.5, 0.6]] * 10)
    pred = truth.copy()
    pred[:2] *= 1.5  # two of ten pairs over-predicted by half
    e = heldout_error(pred, truth)
    assert e["n_pairs"] == 10 and e["mape_norm"] == pytest.approx(0.1)
    assert e["over_q"] == pytest.approx(np.quantile([1.5] * 2 + [1.0] * 8, 1 - FALSE_ADMISSION_TARGET))


def test_in_distribution_it_corrects_the_prior(model, k80):
    fit = [o for o in k80 if o.fits]
    a, b = [o.a for o in fit], [o.b for o in fit]
    truth = np.array([o.norm_a for o in fit])
    mine = np.mean(np.abs(1 / model.predict(a, b) - truth) / truth)
    prior = np.mean(np.abs(1 / model.prior.predict(a, b) - truth) / truth)
    assert mine < 0.5 * prior  # training pairs: the correction does the work


def test_far_from_training_it_falls_back_to_the_prior(model, k80):
    """An inference job of an unseen family with measured counters, on a GPU type with no listed spec."""
    far = [SoloProfile(kind="infer", throughput=3000.0, batch=1.0, precision="bf16", model_family="llama",
                       sm_util=0.4 + 0.1 * i, membw_util=0.7, mem_used_mib=30000.0) for i in range(4)]
    view = model.on_gpu("mi300x")
    s = view.predict(far, far[::-1])
    untrained = ContentionModel().predict(far, far[::-1])
    # with its counters measured the prior is the untrained model; the correction has faded
    assert np.allclose(model.prior.predict(far, far[::-1]), untrained)
    assert np.all(np.abs(np.log(s) - np.log(untrained)) < 0.03)
    seen = [o for o in k80 if o.fits][:50]
    corr = np.abs(np.log(model.predict([o.a for o in seen], [o.b for o in seen]))
                  - np.log(model.prior.predict([o.a for o in seen], [o.b for o in seen])))
    assert corr.max() > 0.1  # the same model does correct the prior where it has data
    # an unseen GPU type: every pair's margin from the unseen-GPU thresholds, by its predicted worst speed
    worst = 1 / np.maximum(s, view.predict(far[::-1], far))
    assert np.allclose(view.admission_margins(far, far[::-1]), margins(worst, model.admission["gpu"]))
    # trained on the K80 alone: a bigger listed type's level errs on the safe side, the family thresholds apply
    h100 = model.on_gpu("h100")
    worst = 1 / np.maximum(h100.predict(far, far[::-1]), h100.predict(far[::-1], far))
    assert np.allclose(h100.admission_margins(far, far[::-1]), margins(worst, model.admission["family"]))
    assert np.array_equal(model.admission["gpu_up"], model.admission["family"])
    h = model.heldout  # one GPU type in training: the unseen-GPU figure is the larger of k-fold and family shift
    assert view.gain_margin == model.margins["gain_gpu"] == pytest.approx(
        max(0.0, h["leave-one-model-out"]["over_sum_q"] - 1, h["kfold"]["over_sum_q"] - 1))


def test_unseen_family_gets_the_family_margin_on_a_seen_gpu(model, k80):
    o = next(x for x in k80 if x.fits)
    stranger = SoloProfile(kind="train", throughput=2.0, batch=32.0, model_family="ResNet-50")

    view = model.on_gpu("k80")
    m = view.admission_margins([o.a, o.a], [o.b, stranger])
    worst = [1 / max(view.predict([x], [y])[0], view.predict([y], [x])[0]) for x, y in ((o.a, o.b), (o.a, stranger))]
    assert m[0] == pytest.approx(margins(worst[:1], model.admission["seen"])[0])
    assert m[1] == pytest.approx(margins(worst[1:], model.admission["family"])[0])
    # an unseen family's thresholds are the more cautious ones: here they give it the larger margin
    assert margins(worst[1:], model.admission["family"])[0] >= margins(worst[1:], model.admission["seen"])[0]


def test_speedups_train_as_no_slowdown_and_predictions_never_promise_one():
    a = SoloProfile(kind="train", throughput=1.0, batch=8.0, model_family="x")
    b = SoloProfile(kind="train", throughput=2.0, batch=8.0, model_family="y")
    smp = samples_of([Colocation("t4", a, b, 1.2, 0.5)])
    assert smp.log_s.tolist() == pytest.approx([0.0, math.log(2.0)])
    obs = [Colocation("t4", a, b, 1.1 + 0.01 * i, 1.05) for i in range(6)]
    assert np.all(fit_transfer(obs).predict([a, b], [b, a]) >= 1.0)


def test_file_round_trip_and_load_model_dispatch(model, k80, tmp_path):
    path = tmp_path / "m.json"
    model.save(path)
    again = load_model(path)
    assert isinstance(again, PriorCorrected)
    a, b = [o.a for o in k80[:40]], [o.b for o in k80[:40]]
    assert np.array_equal(again.on_gpu("p100").predict(a, b), model.on_gpu("p100").predict(a, b))
    assert again.margins == model.margins and again.heldout == model.heldout
    assert all(np.array_equal(again.admission[k], model.admission[k]) for k in ADMISSION_KINDS)
    assert np.array_equal(again.on_gpu("p100").admission_margins(a, b), model.on_gpu("p100").admission_margins(a, b))
    blob = json.loads(path.read_text())
    assert blob["version"] == 4 and {"batch", "linear"} <= set(blob["config"])
    # a version-3 file (no batch weight, no linear part) reads as written: batch compared, no linear part
    v3 = {**blob, "version": 3, "config": {k: v for k, v in blob["config"].items() if k not in ("batch", "linear")}}
    path.write_text(json.dumps(v3))
    old = load_model(path)
    assert (old.config.batch, old.config.linear) == (1.0, 0.0) and np.all(old.on_gpu("p100").predict(a, b) >= 1.0)
    path.write_text(json.dumps({**v3, "config": blob["config"]}))  # version 3 never held these settings
    with pytest.raises(ModelFileError, match="version-3 file with version-4 settings"):
        load_model(path)
    # a file of an older version (raw steps/s, no directed GPU thresholds) is refused, saying what to do
    path.write_text(json.dumps({**blob, "version": 2}))
    with pytest.raises(ModelFileError, match=r"file version 2, this slurm-elastico reads version 4 or 3; retrain with"):
        load_model(path)
    # the batch weight and the linear part read the features' columns by name: a file of other features is refused
    enc = blob["encoder"]
    path.write_text(json.dumps({**blob, "encoder": {**enc, "numeric": enc["numeric"][:-1]}}))
    with pytest.raises(ModelFileError, match="this slurm-elastico's are"):
        load_model(path)
    blob["train"]["self"] = blob["train"]["self"][:-1]
    path.write_text(json.dumps(blob))
    with pytest.raises(ModelFileError, match="different lengths"):
        load_model(path)
    path.write_text('{"format": "something else"}')
    with pytest.raises(ModelFileError, match="not a slurm-elastico predictor file"):
        load_model(path)
    with pytest.raises(ModelFileError, match="no such model file"):
        load_model(tmp_path / "absent.json")


def test_the_numeric_features_are_read_from_each_profile_as_documented():
    """Speed per unit of the GPU type's bandwidth (a type without a spec: the reference; no reference: raw), batch
    in logs (NaN where not positive), counters as they are, memory in GiB, the share clipped to [1, 100] %."""
    from slurm_elastico.interference.transfer.encoding import NUMERIC, _raw_matrix, log_bandwidth

    nan = math.nan
    a = SoloProfile("train", throughput=4.0, batch=32.0, sm_util=0.6, membw_util=0.3, mem_used_mib=2048.0,
                    mps_share=250)
    b = SoloProfile("infer", throughput=0.0, batch=-1.0, mem_used_mib=512.0, mps_share=0)
    c = SoloProfile("train", throughput=2.0, batch=nan, mps_share=40)
    ref = 6.0
    x = _raw_matrix([a, b, c], ["v100", "v100", "mi-none"], ref)
    assert x.shape == (3, len(NUMERIC))
    v100 = log_bandwidth("v100")
    assert not math.isnan(v100) and math.isnan(log_bandwidth("mi-none"))
    want = [[math.log(4.0) - v100, math.log(32.0), 0.6, 0.3, 2.0, 1.0],
            [nan, nan, nan, nan, 0.5, 0.01],
            [math.log(2.0) - ref, nan, nan, nan, nan, 0.4]]
    assert np.array_equal(x, np.array(want), equal_nan=True)
    assert np.array_equal(_raw_matrix([a, c], "v100", nan)[:, 0], [math.log(4.0), math.log(2.0)])  # no reference
    assert np.array_equal(_raw_matrix([a, c], None, ref)[:, 0], [math.log(4.0) - ref, math.log(2.0) - ref])
    with pytest.raises(ValueError, match="2 GPU types for 3 profiles"):
        _raw_matrix([a, b, c], ["v100", "v100"], ref)


def test_predict_matches_predict_matrix(model, k80):
    jobs = list({id(p): p for o in k80[:30] for p in (o.a, o.b)}.values())
    n = len(jobs)
    a = [jobs[i] for i in range(n) for _ in range(n)]
    b = [jobs[j] for _ in range(n) for j in range(n)]
    view = model.on_gpu("h100")
    assert np.allclose(view.predict(a, b).reshape(n, n), view.predict_matrix(jobs))
    assert np.allclose(view.predict(a[:7], b[:7]), view.predict_matrix(jobs).ravel()[:7])
    with pytest.raises(ValueError, match="as many partners"):
        view.predict(a[:3], b[:2])


def test_the_table_of_every_pair_is_each_pair_predicted_alone(k80):
    """`predict_matrix` works through the table a block of rows at a time (`_ROWS`): over several blocks and a
    partial last one, with the linear part on and jobs of distinct demands (so that the prior differs from pair
    to pair), every entry is its pair predicted alone (the pair-by-pair path, another computation)."""
    from dataclasses import replace

    from slurm_elastico.interference.transfer.kernel import KernelConfig
    from slurm_elastico.interference.transfer.model import _ROWS

    cfg = KernelConfig(lam=0.2, num_scale=1.5, family_sim=0.5, batch=0.0, linear=0.3)
    view = fit_transfer(k80, grid=(cfg,)).on_gpu("p100")
    rng = np.random.default_rng(3)
    base = [o.a for o in k80]
    jobs = [replace(base[i % len(base)], sm_util=float(rng.uniform(0.05, 0.95)),
                    membw_util=float(rng.uniform(0.05, 0.95)), mps_share=int(rng.choice([20, 50, 100])))
            for i in range(2 * _ROWS + 7)]
    table = view.predict_matrix(jobs)
    n = len(jobs)
    i, j = rng.integers(0, n, size=(2, n * n // 8))  # few pairs of many jobs: predicted pair by pair
    assert np.allclose(view.predict([jobs[x] for x in i], [jobs[y] for y in j]), table[i, j], rtol=1e-12)
    assert np.ptp(table[i, j]) > 0.1 and set(range(n)) == set(i) | set(j)
    # the correction alone, every row: the kernel part plus the linear one, as `_parts` has them
    k, own, partner, near = view._parts(jobs)
    f = view._table(jobs)
    assert np.allclose(f, k @ view._pair_weights @ k.T + np.outer(near, near) * (own[:, None] + partner[None, :]))
    assert np.abs(np.outer(near, near) * (own[:, None] + partner[None, :])).max() > 1e-3


def test_cli_train_then_score_on_another_gpu(tmp_path, k80):
    obs = import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations
    measurements.write_csv(tmp_path / "k80.csv", k80)
    measurements.write_csv(tmp_path / "p100.csv", [o for o in obs if o.gpu_type == "p100"
                                                   and {o.a.model_family, o.b.model_family} <= FAMILIES])
    r = CliRunner().invoke(main, ["iac", "train", "--data", str(tmp_path / "k80.csv"), "--out", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    assert "leave-one-model-out" in r.output and "admission at floor 0.6" in r.output
    r = CliRunner().invoke(main, ["iac", "evaluate", "--model", str(tmp_path / "m"), "--data",
                                  str(tmp_path / "p100.csv"), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["unseen_gpu_types"] == ["p100"] and 0 < out["metrics"]["model"]["mape_norm"] < 1


def test_online_refinement_learns_the_cluster_gpu_and_rolls_back_poison(k80):
    from slurm_elastico.interference.online import OnlineLearner, holdout_error

    obs = import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations
    p100 = [o for o in obs if o.gpu_type == "p100" and o.fits and {o.a.model_family, o.b.model_family} <= FAMILIES]
    order = np.random.default_rng(0).permutation(len(p100))
    p100 = [p100[i] for i in order]
    seen, rest = p100[:40], p100[40:]
    model = fit_transfer(k80)
    margins = dict(model.margins)
    before = holdout_error(model.on_gpu("p100"), rest)
    learner = OnlineLearner(model, k80)
    accepted = [learner.observe(seen[i:i + 10]).accepted for i in range(0, 40, 10)]
    after = holdout_error(model.on_gpu("p100"), rest)
    assert any(accepted) and after < 0.8 * before
    assert model.margins == margins and not model.seen_gpu("p100")  # coverage and margins stay as trained
    kept = model.state()
    poison = [Colocation("k80", o.a, o.b, 0.05, 0.05) for o in k80 if o.fits][:60]
    assert not learner.observe(poison).accepted and model.state() is kept


def test_the_planner_cache_reads_the_views_as_they_answer(model, k80):
    from slurm_elastico.planner.slowdown import PairCache, for_gpu

    jobs = list({id(p): p for o in k80[:20] for p in (o.a, o.b)}.values())
    pairs = [(i, j) for i in range(len(jobs)) for j in range(len(jobs))][::7]
    for gpu in ("k80", "h100"):
        view = for_gpu(model, gpu)
        cache = PairCache(view)
        ids = [cache.add(p) for p in jobs]
        got = cache.get([(ids[i], ids[j]) for i, j in pairs])
        want = view.predict([jobs[i] for i, _ in pairs], [jobs[j] for _, j in pairs])
        assert np.allclose(got, want)
        # margins per pair (they follow each pair's prediction), the same through the cache as asked directly
        assert cache.per_pair
        assert np.allclose(cache.margins([(ids[i], ids[j]) for i, j in pairs]),
                           view.admission_margins([jobs[i] for i, _ in pairs], [jobs[j] for _, j in pairs]))


def test_speed_is_read_per_unit_of_the_gpus_memory_bandwidth(model, k80):
    """A job as fast for its GPU's bandwidth on a P100 as on a K80 encodes the same; raw steps/s would not."""
    job = next(o.a for o in k80)
    ratio = spec_of("p100").mem_bw_gbs / spec_of("k80").mem_bw_gbs
    faster = SoloProfile(kind=job.kind, throughput=job.throughput * ratio, batch=job.batch,
                         model_family=job.model_family)
    enc = model.encoder
    assert np.allclose(enc.encode([faster], "p100").x, enc.encode([job], "k80").x, equal_nan=True)
    assert not np.allclose(enc.encode([job], "p100").x, enc.encode([job], "k80").x, equal_nan=True)
    # a type with no listed spec (or no type) reads the speed against the training types' bandwidth
    assert np.allclose(enc.encode([job], "mi300x").x, enc.encode([job], "k80").x, equal_nan=True)
    assert np.allclose(enc.encode([job], None).x, enc.encode([job], "k80").x, equal_nan=True)
    # the views read it: trained on K80 only, the P100 view's correction of the faster pair is the K80 view's
    # correction of the pair, discounted by how unlike the two types are (k_gpu)
    partner = next(o.b for o in k80)
    partner_p100 = SoloProfile(kind=partner.kind, throughput=partner.throughput * ratio, batch=partner.batch,
                               model_family=partner.model_family)
    c = gpu_kernel(["p100"], ["k80"], model.config)[0, 0]
    assert 0 < c < 1
    on_k80 = model.on_gpu("k80")._table([job, partner])
    assert np.abs(on_k80).max() > 0.01
    assert np.allclose(model.on_gpu("p100")._table([faster, partner_p100]), c * on_k80)


def test_a_correction_learned_without_counters_fades_where_counters_are_measured(model, k80):
    """Trained on Gavel (no NVML counters), the correction is one of the prior fed defaults; a pair whose jobs
    bring their counters gets the prior computed from them, and the correction weighs less."""
    seen = [o for o in k80 if o.fits][:40]
    a, b = [o.a for o in seen], [o.b for o in seen]

    def measured(p):
        return SoloProfile(kind=p.kind, throughput=p.throughput, batch=p.batch, precision=p.precision,
                           model_family=p.model_family, sm_util=0.6, membw_util=0.5, mem_used_mib=4000.0)

    ma, mb = [measured(p) for p in a], [measured(p) for p in b]
    plain = np.abs(np.log(model.predict(a, b)) - np.log(model.prior.predict(a, b)))
    with_counters = np.abs(np.log(model.predict(ma, mb)) - np.log(model.prior.predict(ma, mb)))
    assert "sm_util" in model.encoder.numeric  # kept though training never measured it
    assert plain.max() > 0.1
    # three counters measured on each job of the pair: the product kernel weighs it e^-3 of the same pair unmeasured
    assert np.all(with_counters <= plain * math.exp(-3) + 1e-9)


def test_shift_direction_by_memory_bandwidth():
    assert shift_direction("v100", ["k80", "p100"]) == "up" and shift_direction("k80", ["p100"]) == "down"
    assert shift_direction("t4", ["k80", "p100"]) == ""  # between them
    assert shift_direction("mi300x", ["k80"]) == "" and shift_direction("v100", ["k80", "mi300x"]) == ""


def test_an_unseen_gpu_type_is_calibrated_on_the_folds_that_shifted_the_same_way():
    """Trained on K80 and P100: the P100 fold (trained on the K80, a bigger type) calibrates a bigger unseen type,
    the K80 fold a smaller one; a type between them, or without a spec, gets the worst fold of both."""
    obs = import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations
    both = [o for o in obs if {o.a.model_family, o.b.model_family} <= FAMILIES]
    model = fit_transfer(both)
    cal = model.calibration
    assert len(cal["gpu-up"]) == len(cal["gpu-down"]) == 1 and len(cal["leave-one-gpu-out"]) == 2
    assert np.array_equal(cal["gpu-up"][0][1], cal["leave-one-gpu-out"][1][1])  # the fold "test p100"
    t = model.admission
    again = admission_tables({"kfold": cal["kfold"], "leave-one-model-out": cal["leave-one-model-out"],
                              "leave-one-gpu-out": cal["leave-one-gpu-out"]})
    assert np.array_equal(t["gpu"], again["gpu"])
    # without directed folds: a bigger type gets the family thresholds, a smaller one the gpu thresholds
    assert np.array_equal(again["gpu_up"], t["family"]) and np.array_equal(again["gpu_down"], t["gpu"])
    assert not np.array_equal(t["gpu_up"], t["gpu_down"])
    a, b = [o.a for o in both[:60]], [o.b for o in both[:60]]
    for gpu, kind in (("v100", "gpu_up"), ("t4", "gpu"), ("mi300x", "gpu")):
        view = model.on_gpu(gpu)
        worst = 1 / np.maximum(view.predict(a, b), view.predict(b, a))
        assert np.allclose(view.admission_margins(a, b), margins(worst, t[kind]), equal_nan=True)


def test_without_a_listed_training_type_speeds_are_read_raw_on_every_type(k80, tmp_path):
    """Trained on a type with no listed spec, a listed type's bandwidth would compare it with nothing."""
    mystery = [Colocation("mystery", o.a, o.b, o.norm_a, o.norm_b, o.fits, o.source) for o in k80]
    model = fit_transfer(mystery)
    assert math.isnan(model.encoder.ref_log_bw)
    job = k80[0].a
    raw = model.encoder.encode([job], "mystery").x
    assert np.allclose(model.encoder.encode([job], "h100").x, raw, equal_nan=True)
    assert np.allclose(model.encoder.encode([job], None).x, raw, equal_nan=True)
    model.save(tmp_path / "m.json")
    again = load_model(tmp_path / "m.json")
    assert math.isnan(again.encoder.ref_log_bw)
    a, b = [o.a for o in k80[:20]], [o.b for o in k80[:20]]
    assert np.array_equal(again.on_gpu("h100").predict(a, b), model.on_gpu("h100").predict(a, b))


def test_the_linear_part_carries_a_trend_to_an_unseen_family_and_fades_away_from_the_data(k80):
    """With family_sim ~ 0 the product part says nothing about a job of an unseen family; the linear part on its
    demand features (steps/s per GB/s) still corrects the prior, and fades for jobs unlike every training job."""
    from dataclasses import replace

    from slurm_elastico.interference.transfer.kernel import KernelConfig

    cfg = KernelConfig(lam=0.2, num_scale=1.5, family_sim=1e-9, batch=0.0, linear=0.3)
    with_linear, without = fit_transfer(k80, grid=(cfg,)), fit_transfer(k80, grid=(replace(cfg, linear=0.0),))
    pairs = [o for o in k80 if o.fits][:60]
    a = [replace(o.a, model_family="unseen") for o in pairs]
    b = [replace(o.b, model_family="unseen") for o in pairs]

    def correction(m, x, y):
        return np.log(m.predict(x, y)) - np.log(m.prior.predict(x, y))

    assert np.abs(correction(without, a, b)).max() < 1e-6
    trend = correction(with_linear, a, b)
    assert np.abs(trend).max() > 0.05
    # the pair-by-pair path (many distinct jobs, few pairs) equals the all-pairs table
    jobs = a + b
    table = with_linear.predict_matrix(jobs)
    idx = np.arange(len(a))
    assert np.allclose(with_linear.predict(a, b), table[idx, idx + len(a)])
    # an inference job with three counters training never measured: each job of the pair e^-2.5 near, e^-5 in all
    far_a = [replace(p, kind="infer", sm_util=0.6, membw_util=0.5, mem_used_mib=4000.0) for p in a]
    far_b = [replace(p, kind="infer", sm_util=0.6, membw_util=0.5, mem_used_mib=4000.0) for p in b]
    assert np.all(np.abs(correction(with_linear, far_a, far_b)) <= np.abs(trend) * math.exp(-5) + 1e-9)


def test_held_out_predictions_weigh_the_linear_part_by_nearness_as_the_model_does(k80):
    """The held-out folds the config, the held-out error and the admission thresholds come from predict each
    test pair as the model trained on the fold's other pairs would: the linear part weighed by the test jobs'
    nearness to that fold's training jobs (without it, folds scored a model that is never used)."""
    from slurm_elastico.interference.transfer import encoding, fit, kernel, training

    cfg = kernel.KernelConfig(lam=0.2, num_scale=1.5, family_sim=0.5, batch=0.0, linear=0.3)
    smp = samples_of(k80)
    prior = training.fit_prior(smp)
    prior_log = np.log(prior.predict(smp.selves, smp.partners))
    enc = encoding.Encoder.fit([*smp.selves, *smp.partners], [*smp.gpus, *smp.gpus])
    folds = fit._folds(k80, "leave-one-model-out", 0)
    cross = fit._cross(k80, smp, prior_log, fit._kernels(smp, enc, cfg), cfg, folds)
    jobs, idx = encoding.distinct_jobs(enc.encode([*smp.selves, *smp.partners], [*smp.gpus, *smp.gpus]))
    n, far = len(smp.selves), 0
    for (tr_pairs, te_pairs), (held_out, _) in zip(folds, cross, strict=True):
        tr, te = np.flatnonzero(np.isin(smp.pair, tr_pairs)), np.flatnonzero(np.isin(smp.pair, te_pairs))
        used = np.unique(np.concatenate([idx[:n][tr], idx[n:][tr]]))  # the fold's training jobs only
        where = np.searchsorted(used, np.arange(len(jobs.family)))
        kernels = kernel.sample_kernels(jobs, idx[:n][tr], idx[n:][tr], [smp.gpus[i] for i in tr], cfg)
        alpha = kernel.solve(kernels.job * kernels.gpu, smp.log_s[tr] - prior_log[tr], cfg.lam)
        fitted = training.Fitted(jobs.take(used), where[idx[:n][tr]], where[idx[n:][tr]], [smp.gpus[i] for i in tr],
                                 alpha, smp.log_s[tr] - prior_log[tr])
        fold_model = PriorCorrected(prior, enc, cfg, fitted, 1.0, {}, ["k80"], {})
        a, b = [smp.selves[i] for i in te], [smp.partners[i] for i in te]
        assert np.allclose(held_out.ravel(), 1.0 / fold_model.predict(a, b), rtol=1e-9, atol=0)
        far += int((fold_model._parts(a)[3] < 0.95).sum())
    assert far  # some test jobs lie away from their fold's training jobs: the weight mattered
