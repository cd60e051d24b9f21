import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_elastico.cli import main
from slurm_elastico.interference import evaluation, splits
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.gavel import import_gavel
from slurm_elastico.interference.predictor import TrainConfig

GAVEL = Path(__file__).parent.parent / "data" / "gavel"
TINY = (TrainConfig(hidden=8, weight_decay=1e-3, epochs=40, use_family=True),
        TrainConfig(hidden=8, weight_decay=1e-2, epochs=40, use_family=False))


@pytest.fixture(scope="module")
def obs():
    return import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations


@pytest.mark.parametrize("kind", splits.SPLITS)
def test_splits_partition_pairs_without_leaks(obs, kind):
    folds = splits.split(obs, kind, k=5, seed=0)
    assert len(folds) >= 2
    for name, train, test in folds:
        assert test and not set(train) & set(test)
        if kind == "leave-one-model-out":
            assert all(name in (obs[i].a.model_family, obs[i].b.model_family) for i in test)
            assert not any(name in (obs[i].a.model_family, obs[i].b.model_family) for i in train)
        if kind == "leave-one-gpu-out":
            assert {obs[i].gpu_type for i in train}.isdisjoint({obs[i].gpu_type for i in test})
    if kind == "kfold":
        assert sorted(i for _, _, t in folds for i in t) == list(range(len(obs)))
    with pytest.raises(MeasurementError, match="unknown split"):
        splits.split(obs, "random", k=5)


def test_calibrated_margin_meets_the_false_admission_target():
    rng = np.random.default_rng(0)
    truth = rng.uniform(0.55, 0.8, size=(400, 2))
    pred = truth * rng.normal(1.0, 0.1, size=truth.shape)
    m = evaluation.calibrate_margin(pred, truth, floor=0.6, target=0.05)
    bad = truth.min(axis=1) < 0.6
    assert 0 < m and np.mean(pred.min(axis=1)[bad] >= 0.6 * (1 + m)) <= 0.05
    assert np.mean(pred.min(axis=1)[bad] >= 0.6) > 0.05  # without a margin the target would be missed


def test_evaluate_reports_model_and_baselines(obs):
    subset = [o for o in obs if o.gpu_type == "k80"][::3]
    report = evaluation.evaluate(subset, "kfold", k=3, grid=TINY)
    m = report.metrics
    assert set(m) == set(evaluation.METHODS)
    assert m["model"]["mape"] < m["mean-slowdown"]["mape"] < m["no-interference"]["mape"]
    assert m["no-interference"]["false_admission"] == 1.0  # it admits every pair
    assert report.n_bad_pairs == m["model"]["bad_pairs"] > 0
    assert "no-interference" in evaluation.format_report(report)


def test_cli_import_then_evaluate_json(tmp_path, monkeypatch, obs):
    monkeypatch.setattr(evaluation, "GRID", TINY)
    runner = CliRunner()
    out = tmp_path / "gavel.csv"
    r = runner.invoke(main, ["iac", "import-gavel", "--pairs", str(GAVEL / "throughputs_pairs.csv"),
                             "--isolated", str(GAVEL / "throughputs_isolated.csv"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "56 did not fit" in r.output
    small = tmp_path / "small.csv"
    lines = out.read_text().splitlines()
    small.write_text("\n".join([lines[0]] + lines[1:400:4]) + "\n")
    r = runner.invoke(main, ["iac", "evaluate", "--data", str(small), "--split", "kfold", "--folds", "2", "--json",
                             "--predictor", "mlp"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["split"] == "kfold" and report["metrics"]["model"]["mape"] < 0.5
    r = runner.invoke(main, ["iac", "evaluate", "--data", str(small), "--split", "leave-one-gpu-out", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)  # the default predictor, scored beside the trivial ones on each held-out GPU type
    assert report["split"] == "leave-one-gpu-out" and report["unseen_gpu_types"] == ["k80", "p100"]
    m = report["metrics"]
    assert m["model"]["mape_norm"] < m["no-slowdown"]["mape_norm"] and report["n_pairs"] == len(lines[1:400:4])
    model_path = tmp_path / "iac.pt"
    r = runner.invoke(main, ["iac", "train", "--data", str(small), "--out", str(model_path), "--predictor", "mlp",
                             "--select", "kfold"])
    assert r.exit_code == 0 and model_path.exists(), r.output
    r = runner.invoke(main, ["iac", "train", "--data", str(small), "--out", str(tmp_path / "x"), "--select", "kfold"])
    assert r.exit_code == 2 and "apply to --predictor mlp only" in r.output and not (tmp_path / "x").exists()


def test_cli_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("gpu_type\nk80\n")
    r = CliRunner().invoke(main, ["iac", "evaluate", "--data", str(bad), "--split", "kfold"])
    assert r.exit_code == 2 and "missing column" in r.output
    r = CliRunner().invoke(main, ["iac", "measure", "--a", "true", "--b", "true", "--gpu-type", "h100",
                                  "--out", str(tmp_path / "m.csv")])
    assert r.exit_code == 4 and "needs an NVIDIA GPU" in r.output
