"""Few-shot adaptation: recovers a known scale, offset and per-class corrections on synthetic pairs, draws its
adaptation pairs per GPU type, gives the trivial predictor exactly those pairs, and refuses what it cannot do."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_elastico.cli import main
from slurm_elastico.interference import adapt as adapt_mod
from slurm_elastico.interference import measurements
from slurm_elastico.interference.adapt import Adapted, AdaptedView, adapt, class_of, fit_type
from slurm_elastico.interference.adapt_score import draw, interval, score_adaptation, score_draw, trivial_norm
from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.gavel import import_gavel
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.interference.probe import pair_key

GAVEL = Path(__file__).parent.parent / "data" / "gavel"
FAMILIES = {"ResNet-18", "LM", "A3C", "Transformer"}


class Stub:
    """A 'trained model': slowdown from the jobs' batches, and on GPU type 'old' only (any other type: the same)."""

    training_mean_norm = 0.7

    def predict(self, a, b):
        return np.array([1.0 + 0.4 * x.batch / 64 + 0.3 * y.batch / 64 for x, y in zip(a, b)])

    def on_gpu(self, gpu_type):
        return self

    def seen_gpu(self, gpu_type):
        return gpu_type == "old"


def _jobs(n_families=4, per_family=4):
    return [SoloProfile("train", throughput=1.0 + i, batch=float(8 * (1 + j)), model_family=f"fam{i}")
            for i in range(n_families) for j in range(per_family)]


def _pairs(truth, gpu="new", n=120, seed=0, noise=0.0, jobs=None):
    """`n` random pairs of `jobs` on `gpu` whose true log slowdown is truth(a, b) (+ Gaussian noise)."""
    rng = np.random.default_rng(seed)
    jobs = jobs or _jobs()
    out = []
    for _ in range(n):
        i, j = rng.integers(len(jobs), size=2)
        a, b = jobs[i], jobs[j]
        za, zb = truth(a, b) + noise * rng.normal(), truth(b, a) + noise * rng.normal()
        out.append(Colocation(gpu, a, b, float(np.exp(-max(za, 0.0))), float(np.exp(-max(zb, 0.0)))))
    return out


def _base_log(a, b):
    return float(np.log(Stub().predict([a], [b])[0]))


def test_recovers_a_known_scale_and_offset():
    for scale, offset in ((1.8, 0.05), (0.6, 0.2)):
        pairs = _pairs(lambda a, b: offset + scale * _base_log(a, b), n=60, noise=0.005)
        fit = fit_type(Stub(), pairs, "new")
        assert fit.scale == pytest.approx(scale, abs=0.05)
        assert fit.offset == pytest.approx(offset, abs=0.03)
        assert fit.cv_mape < 0.02 < fit.model_cv_mape
        new = _pairs(lambda a, b: offset + scale * _base_log(a, b), n=20, seed=1)
        view = adapt(Stub(), pairs).on_gpu("new")
        truth = np.array([o.norm_a for o in new])
        assert np.allclose(1.0 / view.predict([o.a for o in new], [o.b for o in new]), truth, rtol=0.02)


def test_recovers_per_class_corrections_and_keeps_the_scale():
    shift = {"fam0": 0.3, "fam1": 0.0, "fam2": -0.1, "fam3": 0.1}
    pairs = _pairs(lambda a, b: _base_log(a, b) + 0.1 + shift[a.model_family], n=150, noise=0.01)
    fit = fit_type(Stub(), pairs, "new")
    own = {f: fit.own["family"].get(f, 0.0) + fit.offset for f in shift}  # the offset and the classes trade a constant
    for f, s in shift.items():
        assert own[f] - own["fam1"] == pytest.approx(s - shift["fam1"], abs=0.04)
    assert fit.scale == pytest.approx(1.0, abs=0.1)
    assert math.isfinite(fit.class_penalties["family"]) or math.isfinite(fit.class_penalties["job"])


def test_no_class_corrections_where_there_are_none(monkeypatch):
    """Noise around the model and no class effect: cross-validation penalises the corrections that an
    unpenalised fit would learn from the noise."""
    pairs = _pairs(lambda a, b: 0.1 + _base_log(a, b), n=30, noise=0.1)

    def largest(fit):
        return max((abs(v) for kind in fit.own.values() for v in kind.values()), default=0.0)

    chosen = fit_type(Stub(), pairs, "new")
    monkeypatch.setattr(adapt_mod, "CLASS_PENALTIES", (1e-4,))
    loose = fit_type(Stub(), pairs, "new")
    assert largest(chosen) < 0.05 < 0.1 < largest(loose)
    assert chosen.offset == pytest.approx(0.1, abs=0.05)


def test_class_of_family_job_and_unnamed_jobs():
    p = SoloProfile("train", throughput=2.0, batch=32.0, model_family="LM")
    assert class_of(p, "family") == "LM" and class_of(p, "job") == "LM|train|fp32|32"
    q = SoloProfile("infer", throughput=123.456, batch=8.0)
    assert class_of(q, "family") == "" and class_of(q, "job") == "|infer|fp32|8|123.5"
    assert class_of(SoloProfile("infer"), "job") == ""


def test_adapted_model_answers_other_types_with_the_base_view():
    pairs = _pairs(lambda a, b: 0.2 + _base_log(a, b), n=30)
    model = adapt(Stub(), pairs)
    assert isinstance(model.on_gpu("new"), AdaptedView) and model.on_gpu("other") is not None
    assert not isinstance(model.on_gpu("other"), AdaptedView)
    assert model.seen_gpu("new") and model.seen_gpu("old") and not model.seen_gpu("other")
    a, b = _jobs()[:2]
    assert np.all(model.on_gpu("new").predict([a, b], [b, a]) >= 1.0)
    assert model.on_gpu("new").admission_margins([a], [b]).shape == (1,)


def test_too_few_pairs_refused_naming_the_type():
    pairs = _pairs(lambda a, b: _base_log(a, b), n=adapt_mod.MIN_PAIRS - 1)
    with pytest.raises(MeasurementError, match=rf"GPU type new: {adapt_mod.MIN_PAIRS - 1} ran together.*at least "
                                               rf"{adapt_mod.MIN_PAIRS}"):
        adapt(Stub(), pairs)
    with pytest.raises(MeasurementError, match="no measured pairs"):
        adapt(Stub(), [])


def test_draw_is_per_gpu_type_disjoint_and_by_seed():
    # Random pairs of 16 jobs, some drawn twice (the same pair measured again, either way round): a pair is
    # adapted on or scored, never both, and the fraction is of each type's distinct pairs.
    obs = _pairs(lambda a, b: 0.3, gpu="x", n=40) + _pairs(lambda a, b: 0.3, gpu="y", n=60, seed=3)
    head, tail, skipped = draw(obs, 0.25, seed=7)
    assert sorted(head + tail) == list(range(100)) and not set(head) & set(tail) and not skipped
    keys = [(o.gpu_type, pair_key(o)) for o in obs]
    assert not {keys[i] for i in head} & {keys[i] for i in tail}
    distinct = {t: len({k for k in keys if k[0] == t}) for t in ("x", "y")}
    assert distinct["x"] < 40 and distinct["y"] < 60  # the data does repeat pairs
    for t in ("x", "y"):
        assert len({keys[i] for i in head if keys[i][0] == t}) == round(0.25 * distinct[t])
    assert draw(obs, 0.25, seed=7) == (head, tail, {}) and draw(obs, 0.25, seed=8)[0] != head


def test_a_type_too_small_to_adapt_is_skipped_and_said_so():
    obs = _pairs(lambda a, b: 0.3, gpu="x", n=12) + _pairs(lambda a, b: 0.1 + _base_log(a, b), gpu="y", n=60, seed=3)
    head, tail, skipped = draw(obs, 0.2, seed=0)
    n = len({pair_key(o) for o in obs if o.gpu_type == "x"})
    assert set(skipped) == {"x"} and f"GPU type x: 0.2 of its {n} pairs is 2" in skipped["x"]
    assert {obs[i].gpu_type for i in head + tail} == {"y"}
    result = score_draw(Stub(), obs, 0.2, seed=0)
    assert result["skipped"] == skipped and set(result["trivial_norm"]) == set(result["adaptation"]) == {"y"}
    assert result["n_test_pairs"] == len(tail)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_fraction_outside_the_open_interval_refused(fraction):
    with pytest.raises(MeasurementError, match=r"outside \(0, 1\)"):
        draw(_pairs(lambda a, b: 0.3, n=40), fraction, 0)


def test_too_small_a_fraction_refused_naming_what_to_change():
    obs = _pairs(lambda a, b: 0.3, n=40)
    n = len({pair_key(o) for o in obs})
    with pytest.raises(MeasurementError, match=rf"too few pairs to adapt on GPU type new: 0.05 of its {n} pairs is 2"):
        draw(obs, 0.05, 0)


def test_trivial_predictor_sees_exactly_the_adaptation_pairs():
    obs = _pairs(lambda a, b: 0.1 + 0.5 * _base_log(a, b), n=120, noise=0.05)
    result = score_draw(Stub(), obs, 0.2, seed=4)
    head, tail, _ = draw(obs, 0.2, seed=4)
    expected = 1.0 / np.mean([1.0 / v for i in head for v in (obs[i].norm_a, obs[i].norm_b)])
    assert result["trivial_norm"]["new"] == pytest.approx(expected)
    assert result["trivial_norm"]["new"] == pytest.approx(trivial_norm([obs[i] for i in head]))
    assert result["adaptation"]["new"]["mean_norm"] == pytest.approx(expected)  # the adaptation saw the same pairs
    assert result["trivial_norm"]["new"] != pytest.approx(trivial_norm([obs[i] for i in tail]), rel=1e-6)
    assert (result["n_adapt_pairs"], result["n_test_pairs"]) == (len(head), len(tail))
    # Adapting to a different scale beats both the unadapted stub and the constant.
    m = result["metrics"]
    assert m["adapted"]["mape_norm"] < m["trivial"]["mape_norm"] and m["adapted"]["mape_norm"] < m["unadapted"]["mape_norm"]


def test_interval_mean_bounds_and_clipping():
    assert interval([0.1, 0.2, 0.3])["mean"] == pytest.approx(0.2)
    half = interval([0.1, 0.2, 0.3])["high"] - 0.2
    assert half == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-5)
    assert interval([0.0, 0.0, 0.3], high=1.0)["low"] == 0.0
    one = interval([0.4])
    assert one["mean"] == 0.4 and math.isnan(one["low"]) and one["n"] == 1


def test_seeds_repeat_the_draw_and_report_intervals():
    obs = _pairs(lambda a, b: 0.1 + 0.5 * _base_log(a, b), n=80, noise=0.05)
    s = score_adaptation(Stub(), obs, 0.2, seed=2, seeds=3)
    assert s.seeds == [2, 3, 4] and [d["seed"] for d in s.draws] == [2, 3, 4]
    d = s.to_dict()
    assert d["mape"] == pytest.approx(np.mean([x["metrics"]["adapted"]["mape_norm"] for x in s.draws]))
    assert d["trivial_mape"] == pytest.approx(np.mean([x["metrics"]["trivial"]["mape_norm"] for x in s.draws]))
    assert d["methods"]["adapted"]["mape_norm"]["n"] == 3


# -- the command, on a small model trained on part of the bundled Gavel pairs ------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from slurm_elastico.interference.transfer.fit import fit_transfer
    from slurm_elastico.interference.transfer.kernel import KernelConfig

    obs = [o for o in import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations
           if {o.a.model_family, o.b.model_family} <= FAMILIES]
    d = tmp_path_factory.mktemp("adapt")
    fit_transfer([o for o in obs if o.gpu_type == "k80"], grid=(KernelConfig(),)).save(d / "k80.json")
    measurements.write_csv(d / "p100.csv", [o for o in obs if o.gpu_type == "p100"])
    return d


def _strict(text):
    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def test_cli_adapt_fraction_json(files):
    r = CliRunner().invoke(main, ["iac", "evaluate", "--model", str(files / "k80.json"), "--data",
                                  str(files / "p100.csv"), "--adapt-fraction", "0.2", "--seeds", "2", "--json"])
    assert r.exit_code == 0, r.output
    out = _strict(r.output)
    for key in ("mape", "trivial_mape", "unadapted_mape", "false_admit", "good_admitted"):
        assert key in out
    assert out["seeds"] == [0, 1] and len(out["draws"]) == 2
    assert out["mape"] == pytest.approx(out["methods"]["adapted"]["mape_norm"]["mean"])
    assert out["trivial_mape"] == pytest.approx(out["methods"]["trivial"]["mape_norm"]["mean"])
    assert 0.0 <= out["false_admit"] <= 1.0 and out["mape"] > 0.0
    table = CliRunner().invoke(main, ["iac", "evaluate", "--model", str(files / "k80.json"), "--data",
                                      str(files / "p100.csv"), "--adapt-fraction", "0.2"])
    assert table.exit_code == 0 and "adapted / trivial" in table.output and "unadapted" in table.output


@pytest.mark.parametrize("args, message", [
    (["--adapt-fraction", "0.1", "--split", "kfold"], "--adapt-fraction goes with --model"),
    (["--seeds", "3"], "--seeds goes with --adapt-fraction"),
])
def test_cli_adapt_flags_refused_where_they_do_not_apply(files, args, message):
    model = [] if "--split" in args else ["--model", str(files / "k80.json")]
    r = CliRunner().invoke(main, ["iac", "evaluate", *model, "--data", str(files / "p100.csv"), *args])
    assert r.exit_code == 2 and message in r.output


def test_cli_bad_fraction_and_foreign_file(files, tmp_path):
    r = CliRunner().invoke(main, ["iac", "evaluate", "--model", str(files / "k80.json"), "--data",
                                  str(files / "p100.csv"), "--adapt-fraction", "1.5"])
    assert r.exit_code == 2 and "outside (0, 1)" in r.output
    (tmp_path / "gavel.csv").write_text((GAVEL / "throughputs_pairs.csv").read_text()[:2000])
    r = CliRunner().invoke(main, ["iac", "evaluate", "--model", str(files / "k80.json"), "--data",
                                  str(tmp_path / "gavel.csv"), "--adapt-fraction", "0.1"])
    assert r.exit_code == 2 and "missing column(s)" in r.output


def test_pairs_with_a_job_the_adaptation_did_not_hold_get_the_cautious_thresholds():
    from slurm_elastico.interference.admission import margins

    jobs = _jobs()
    effect = {class_of(p, "job"): e for p, e in zip(jobs, np.random.default_rng(5).normal(0.0, 0.3, len(jobs)))}
    pairs = _pairs(lambda a, b: 0.2 + _base_log(a, b) + abs(effect[class_of(a, "job")]), n=60, noise=0.02,
                   jobs=jobs)
    fit = fit_type(Stub(), pairs, "new")
    assert math.isfinite(fit.class_penalties["job"])  # the job corrections carry the data
    assert np.all(fit.thresholds_new >= fit.thresholds) and np.any(fit.thresholds_new > fit.thresholds)
    assert fit.known_jobs == {class_of(p, "job") for o in pairs for p in (o.a, o.b)}
    view = adapt(Stub(), pairs).on_gpu("new")
    stranger = SoloProfile("train", throughput=9.0, batch=20.0, model_family="fam0")  # a batch no pair had
    a, b = [jobs[0], stranger], [jobs[1], jobs[1]]
    worst = np.minimum(1.0 / view.predict(a, b), 1.0 / view.predict(b, a))
    got = view.admission_margins(a, b)
    assert got[0] == pytest.approx(margins(worst[:1], fit.thresholds)[0])
    assert got[1] == pytest.approx(margins(worst[1:], fit.thresholds_new)[0])


def test_trivial_predictor_is_per_gpu_type_like_the_adaptation():
    obs = _pairs(lambda a, b: 0.2, gpu="x", n=40) + _pairs(lambda a, b: 0.6, gpu="y", n=40, seed=3)
    result = score_draw(Stub(), obs, 0.25, seed=1)
    assert result["trivial_norm"]["x"] == pytest.approx(math.exp(-0.2))
    assert result["trivial_norm"]["y"] == pytest.approx(math.exp(-0.6))
    assert result["metrics"]["trivial"]["mape_norm"] == pytest.approx(0.0, abs=1e-12)


def test_a_pair_measured_twice_is_one_pair_to_cross_validation():
    """A helper's store holds a pair once per epoch it ran together. Left out one measurement at a time, the
    adaptation's cross-validation kept the other in training: the job corrections remembered the pair, and the
    held-out error (which sets the admission margins) fell to half. Counted as one pair, it stays near the
    error of the pairs measured once."""
    rng = np.random.default_rng(1)
    obs = [o for o in import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations
           if o.gpu_type == "k80" and o.fits]
    once = [obs[i] for i in np.random.default_rng(0).permutation(len(obs))[:60]]
    again = [Colocation(o.gpu_type, o.b, o.a, min(2.0, o.norm_b * math.exp(0.02 * rng.normal())),
                        min(2.0, o.norm_a * math.exp(0.02 * rng.normal())), True, o.source) for o in once]
    class Batches(Stub):  # Gavel's jobs without a batch count as 32
        def predict(self, a, b):
            return np.array([1.0 + (0.4 * np.nan_to_num(x.batch, nan=32.0) + 0.3 * np.nan_to_num(y.batch, nan=32.0))
                             / 64 for x, y in zip(a, b)])

    f1, f2 = fit_type(Batches(), once, "k80"), fit_type(Batches(), once + again, "k80")
    assert f2.n_pairs == f1.n_pairs == 60
    assert f2.cv_mape > 0.8 * f1.cv_mape, (f1.cv_mape, f2.cv_mape)


def test_a_job_of_no_class_is_no_known_job():
    """A job with neither a family nor a measured speed has no job class (""): it must not make every other such
    job count as one the adaptation saw (they would get the looser thresholds)."""
    rng = np.random.default_rng(0)
    named = _jobs()
    anon = SoloProfile("train", batch=32.0)
    pairs = [Colocation("new", named[i], named[j], float(rng.uniform(0.4, 0.9)), float(rng.uniform(0.4, 0.9)))
             for i, j in (rng.choice(len(named), 2, replace=False) for _ in range(40))]
    fit = fit_type(Stub(), pairs + [Colocation("new", anon, named[0], 0.5, 0.7)], "new")
    assert "" not in fit.known_jobs and class_of(named[0], "job") in fit.known_jobs


@pytest.mark.parametrize("norm", [float("nan"), float("inf"), 0.0, -0.5, 3.0])
def test_a_pair_that_ran_together_with_no_speed_is_refused_by_name(norm):
    pairs = _pairs(lambda a, b: 0.3, n=20)
    bad = Colocation("new", pairs[0].a, pairs[0].b, norm, 0.7)
    with pytest.raises(MeasurementError, match="normalized throughput that is not a number in \\(0, 2\\]"):
        fit_type(Stub(), pairs + [bad], "new")
