"""The predictor outside its training data: recorded coverage, cautious view on unseen GPU types, family margins."""

import numpy as np
import pytest
import torch

from slurm_elastico.interference import evaluation
from slurm_elastico.interference.base import SoloProfile, admissible
from slurm_elastico.interference.errors import ModelFileError
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.interference.predictor import Coverage, MlpPredictor, TrainConfig, UnseenGpu, train

TINY = (TrainConfig(hidden=8, weight_decay=1e-3, epochs=60, use_family=True),
        TrainConfig(hidden=8, weight_decay=1e-2, epochs=60, use_family=False))
FAMILIES = ("alpha", "beta", "gamma", "delta")


def _job(rng, family: str) -> SoloProfile:
    return SoloProfile(kind="train", throughput=float(10 ** rng.uniform(0, 2)), batch=float(rng.choice([16, 64])),
                       model_family=family)


def _crafted(gpus=("g1",), n=60, seed=0) -> list[Colocation]:
    """Pairs whose normalized throughput falls with both jobs' load: a tiny, learnable world."""
    rng = np.random.default_rng(seed)
    out = []
    for gpu in gpus:
        for _ in range(n):
            a, b = (_job(rng, str(rng.choice(FAMILIES))) for _ in range(2))
            load = np.log10(a.throughput * b.throughput) / 4  # in [0, 1]
            out.append(Colocation(gpu, a, b, norm_a=0.9 - 0.4 * load, norm_b=0.85 - 0.4 * load))
    return out


@pytest.fixture(scope="module")
def fitted():
    model, _ = evaluation.fit_model(_crafted(), "leave-one-model-out", floor=0.6, seed=0, grid=TINY)
    return model


def test_fit_model_records_coverage_and_calibrates_caution(fitted):
    cov = fitted.coverage
    assert cov.gpu_types == ("g1",) and cov.families == tuple(sorted(FAMILIES))
    assert cov.family_margin >= fitted.admission_margin and cov.gpu_margin >= fitted.admission_margin
    assert 0.0 <= cov.shrink <= 1.0 and 0.4 < cov.prior_norm < 0.9
    transfer = fitted.transfer if fitted.transfer is not None else fitted
    assert not transfer.config.use_family  # family effects are per GPU: never used on an unseen one


def test_seen_inputs_keep_the_plain_model_and_margin(fitted):
    obs = _crafted(seed=1)[:20]
    a, b = [o.a for o in obs], [o.b for o in obs]
    assert fitted.on_gpu("g1") is fitted
    assert np.all(fitted.admission_margins(a, b) == fitted.admission_margin)
    bar = 0.6 * (1 + fitted.admission_margin)
    plain = (1 / fitted.predict(a, b) >= bar) & (1 / fitted.predict(b, a) >= bar)
    assert np.array_equal(admissible(fitted, a, b, floor=0.6), plain)


def _cautious(margin=0.0) -> MlpPredictor:
    obs = _crafted(seed=2)
    cov = Coverage(("g1",), FAMILIES, family_margin=0.15, gpu_margin=0.3, prior_norm=0.5, shrink=0.5)
    return train(obs, TINY[1], seed=0, admission_margin=margin, coverage=cov)


def test_unseen_gpu_gets_the_cautious_margin_and_shrunk_predictions():
    model = _cautious()
    view = model.on_gpu("h100")
    assert isinstance(view, UnseenGpu)
    light = SoloProfile(kind="train", throughput=1.0, batch=16, model_family="alpha")
    new = SoloProfile(kind="train", throughput=1.0, batch=16, model_family="never-seen")
    assert view.admission_margins([light, light], [light, new]).tolist() == [0.3, 0.3]
    seen_norm = 1 / model.predict([light], [light])[0]
    shrunk_norm = 1 / view.predict([light], [light])[0]
    assert shrunk_norm == pytest.approx(0.5 * seen_norm + 0.5 * 0.5)
    assert np.allclose(view.predict_matrix([light, new]).ravel(),
                       view.predict([light, light, new, new], [light, new, light, new]))
    # A light pair the model admits on its own GPU is refused on one it never saw.
    assert seen_norm >= 0.6 and admissible(model, [light], [light], 0.6).tolist() == [True]
    assert admissible(view, [light], [light], 0.6).tolist() == [False]


def test_unseen_family_gets_the_family_margin_on_a_seen_gpu():
    model = _cautious(margin=0.05)
    seen = SoloProfile(kind="train", throughput=1.0, batch=16, model_family="beta")
    new = SoloProfile(kind="train", throughput=1.0, batch=16, model_family="never-seen")
    nameless = SoloProfile(kind="train", throughput=1.0, batch=16)
    assert model.admission_margins([seen, seen, new], [seen, nameless, seen]).tolist() == [0.05, 0.15, 0.15]


def test_coverage_and_transfer_nets_survive_save_and_load(tmp_path):
    obs = _crafted(gpus=("g1", "g2"), n=30, seed=3)
    transfer = train(obs, TINY[1], seed=1)
    cov = Coverage(("g1", "g2"), FAMILIES, 0.1, 0.2, 0.6, 0.75)
    model = train(obs, TINY[0], seed=0, admission_margin=0.05, coverage=cov, transfer=transfer)
    model.save(tmp_path / "m.pt")
    back = MlpPredictor.load(tmp_path / "m.pt")
    assert back.coverage == cov and back.on_gpu("g2") is back
    a, b = [o.a for o in obs], [o.b for o in obs]
    assert np.array_equal(back.on_gpu("a100").predict(a, b), model.on_gpu("a100").predict(a, b))
    assert np.array_equal(back.transfer.predict(a, b), transfer.predict(a, b))


def test_plain_train_records_what_it_saw_without_extra_caution():
    model = train(_crafted(gpus=("g1", "g2"), n=20), TINY[1], seed=0, admission_margin=0.04)
    cov = model.coverage
    assert cov.gpu_types == ("g1", "g2") and cov.family_margin == cov.gpu_margin == 0.04 and cov.shrink == 1.0


def test_a_file_without_coverage_is_refused(tmp_path):
    model = _cautious()
    model.save(tmp_path / "m.pt")
    blob = torch.load(tmp_path / "m.pt", weights_only=True)
    del blob["coverage"]["gpu_types"]
    torch.save(blob, tmp_path / "m.pt")
    with pytest.raises(ModelFileError, match="coverage"):
        MlpPredictor.load(tmp_path / "m.pt")


def test_cross_gpu_evaluation_uses_the_cautious_view():
    obs = _crafted(gpus=("g1", "g2"), n=40, seed=4)
    report = evaluation.evaluate(obs, "leave-one-gpu-out", grid=TINY)
    assert [f.unseen_gpu for f in report.folds] == [True, True]
    assert all(f.caution["gpu_margin"] >= f.margin for f in report.folds)
    assert "unseen GPU: cautious view" in evaluation.format_report(report)
