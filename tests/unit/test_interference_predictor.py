from pathlib import Path

import numpy as np
import pytest
import torch

from slurm_elastico.interference.base import ContentionModel, SoloProfile, admissible
from slurm_elastico.interference.errors import ModelFileError
from slurm_elastico.interference.gavel import import_gavel
from slurm_elastico.interference.measurements import samples
from slurm_elastico.interference import load_model
from slurm_elastico.interference.predictor import MlpPredictor, TrainConfig, train

GAVEL = Path(__file__).parent.parent / "data" / "gavel"
SMALL = TrainConfig(hidden=16, weight_decay=1e-3, epochs=150, use_family=True)


@pytest.fixture(scope="module")
def data():
    obs = [o for o in import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(obs))
    return [obs[i] for i in order[: len(obs) // 2]], [obs[i] for i in order[len(obs) // 2:]]


@pytest.fixture(scope="module")
def model(data):
    return train(data[0], SMALL, seed=1)


def _mape(model_or_fn, obs):
    s, p, n, _ = samples(obs)
    pred = 1.0 / model_or_fn(s, p)
    n = np.array(n)
    return float(np.mean(np.abs(pred - n) / n))


def test_beats_baselines_on_held_out_pairs(model, data):
    train_obs, test_obs = data
    err = _mape(model.predict, test_obs)
    no_interference = _mape(lambda s, p: np.ones(len(s)), test_obs)
    _, _, norms, _ = samples(train_obs)
    mean_s = np.mean(1.0 / np.array(norms))
    mean_baseline = _mape(lambda s, p: np.full(len(s), mean_s), test_obs)
    assert err < 0.10 and err < mean_baseline / 2 and err < no_interference / 5


def test_outputs_are_slowdowns_never_speedups(model):
    rng = np.random.default_rng(3)
    profiles = [SoloProfile(kind=rng.choice(["train", "infer"]), throughput=float(10 ** rng.uniform(-3, 4)),
                            batch=float(rng.choice([np.nan, 1, 4096])), precision=str(rng.choice(["", "fp16"])),
                            model_family=str(rng.choice(["", "ResNet-50", "never-seen"])),
                            sm_util=float(rng.uniform(0, 1))) for _ in range(200)]
    s = model.predict(profiles, profiles[::-1])
    assert s.shape == (200,) and np.all(s >= 1.0) and np.all(np.isfinite(s))


def test_training_is_deterministic_and_leaves_torch_state_alone(data):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    m1 = train(data[0][:80], SMALL, seed=5)
    assert torch.rand(1) == before and torch.get_num_threads() == threads
    m2 = train(data[0][:80], SMALL, seed=5)
    m3 = train(data[0][:80], SMALL, seed=6)
    s, p, _, _ = samples(data[1][:50])
    assert np.array_equal(m1.predict(s, p), m2.predict(s, p))
    assert not np.array_equal(m1.predict(s, p), m3.predict(s, p))


def test_save_load_round_trip_and_load_model(model, data, tmp_path):
    path = tmp_path / "iac.pt"
    model.admission_margin = 0.07
    model.save(path)
    back = load_model(path)
    s, p, _, _ = samples(data[1])
    assert isinstance(back, MlpPredictor) and back.admission_margin == 0.07
    assert np.array_equal(back.predict(s, p), model.predict(s, p))
    assert isinstance(load_model(""), ContentionModel) and isinstance(load_model(None), ContentionModel)


@pytest.mark.parametrize("tamper, words", [
    (lambda b: b["schema"].__setitem__("version", 99), "feature schema version 99"),
    (lambda b: b["schema"]["names"].reverse(), "differ from the features"),
    (lambda b: b["schema"].__setitem__("numeric", ["gpu_temperature"]), "gpu_temperature"),
    (lambda b: b.__setitem__("version", 7), "file version 7"),
    (lambda b: b.__setitem__("format", "someone-else"), "not a slurm-elastico predictor"),
])
def test_foreign_schema_is_refused(model, tmp_path, tamper, words):
    path = tmp_path / "iac.pt"
    model.save(path)
    blob = torch.load(path, weights_only=True)
    tamper(blob)
    torch.save(blob, path)
    with pytest.raises(ModelFileError, match=words):
        MlpPredictor.load(path)


def test_garbage_and_missing_files_are_refused(tmp_path):
    (tmp_path / "x.pt").write_text("not a model")
    with pytest.raises(ModelFileError, match="not a slurm-elastico predictor"):
        MlpPredictor.load(tmp_path / "x.pt")
    with pytest.raises(ModelFileError, match="no such model file"):
        load_model(tmp_path / "missing.pt")


def test_pair_features_are_symmetric_where_they_should_be(model, data):
    s, p, _, _ = samples(data[1][:40])
    x_ab = model.features(s, p)
    x_ba = model.features(p, s)
    d = len(model.schema.job_names())
    assert np.array_equal(x_ab[:, :d], x_ba[:, d:2 * d])  # self and partner swap roles
    assert np.array_equal(x_ab[:, 2 * d:], x_ba[:, 2 * d:])  # the pair context is identical
    # A job next to its own twin: both roles are the same job, so the two slowdowns agree.
    twin = model.predict(s, s)
    assert np.allclose(twin, model.predict(list(s), [SoloProfile(**vars(x)) for x in s]))


def test_batch_order_and_matrix_agree_with_pairwise_predict(model, data):
    s, p, _, _ = samples(data[1][:30])
    full = model.predict(s, p)
    perm = np.random.default_rng(0).permutation(len(s))
    assert np.allclose(model.predict([s[i] for i in perm], [p[i] for i in perm]), full[perm], rtol=1e-6)
    jobs = s[:6]
    mat = model.predict_matrix(jobs)
    i, j = 2, 4
    assert mat.shape == (6, 6) and mat[i, j] == pytest.approx(model.predict([jobs[i]], [jobs[j]])[0], rel=1e-6)


def test_admissible_uses_the_margin():
    light = SoloProfile(kind="infer", sm_util=0.2, membw_util=0.1)
    heavy = SoloProfile(kind="train", sm_util=0.95, membw_util=0.9)
    cm = ContentionModel()
    assert admissible(cm, [light, heavy], [light, heavy], floor=0.6).tolist() == [True, False]

    class Fixed:
        admission_margin = 0.2

        def predict(self, a, b):
            return np.full(len(a), 1 / 0.65)  # 0.65 of solo speed: above 0.6, below 0.6 * 1.2

    assert admissible(Fixed(), [light], [light], floor=0.6).tolist() == [False]


def test_fast_path_equals_plain_pair_features(model, data):
    s, p, _, _ = samples(data[1][:200])
    plain = model.predict_features(model.features(s, p))
    assert np.allclose(model.predict(s, p), plain, rtol=1e-5)


def test_the_scorer_table_equals_pair_by_pair_prediction(model):
    # Equal numbers under two unknown family names: the same encoding, but "same family" differs between pairs.
    a1 = SoloProfile(kind="train", throughput=3.0, batch=32, model_family="unknown-a")
    a2 = SoloProfile(kind="train", throughput=3.0, batch=32, model_family="unknown-a")
    b = SoloProfile(kind="train", throughput=3.0, batch=32, model_family="unknown-b")
    c = SoloProfile(kind="infer", throughput=40.0, batch=8, precision="bf16", model_family="ResNet-50")
    profiles = [a1, a2, b, c, c]
    ia, ib = np.divmod(np.arange(25), 5)
    scorer = model.scorer(profiles)
    direct = scorer.slowdown(ia, ib)
    assert scorer.tabulate() and len(scorer._kinds) == 3  # a1 = a2, b, c
    assert np.allclose(scorer.slowdown(ia, ib), direct, rtol=1e-6)
    plain = model.predict_features(model.features([profiles[i] for i in ia], [profiles[j] for j in ib]))
    assert np.allclose(direct, plain, rtol=1e-5)
    assert direct[1] != direct[2]  # a1 next to a2 (same family) is not a1 next to b
    assert not model.scorer(profiles).tabulate(limit=8)  # 9 distinct pairs: over the limit, stays direct


def test_no_pairs_give_empty_answers_and_unequal_lists_are_refused(model):
    assert model.predict([], []).shape == (0,) and model.predict_matrix([]).shape == (0, 0)
    assert model.admission_margins([], []).shape == (0,) and model.on_gpu("never-seen").predict([], []).shape == (0,)
    one = SoloProfile(kind="train", throughput=1.0, batch=8)
    with pytest.raises(ValueError, match="as many partners as jobs"):
        model.predict([one], [])
