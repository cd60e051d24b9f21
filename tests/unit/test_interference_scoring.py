"""Scoring a saved model on another file, throughput units, and Gavel's own JSON: real files from the bundled data."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_elastico.cli import main
from slurm_elastico.interference import measurements
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.gavel import import_gavel, import_gavel_json
from slurm_elastico.interference.predictor import TrainConfig, train
from slurm_elastico.interference.scoring import score

GAVEL = Path(__file__).parent.parent / "data" / "gavel"


@pytest.fixture(scope="module")
def obs():
    return import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations


def _gavel_json(path: Path, models: set[str]) -> None:
    """Gavel's JSON layout rebuilt from the bundled flattened CSVs, for the jobs of `models` only."""
    def job(model, bs, scale):
        return f"('{model} (batch size {bs})', {scale})" if bs else f"('{model}', {scale})"

    data: dict = {}
    for row in csv.DictReader((GAVEL / "throughputs_isolated.csv").open()):
        if row["model"] in models:
            key = job(row["model"], row["batch_size"], row["scale_factor"])
            data.setdefault(row["gpu_type"], {})[key] = {"null": float(row["iso_tput_steps_per_s"])}
    for row in csv.DictReader((GAVEL / "throughputs_pairs.csv").open()):
        if row["model1"] in models and row["model2"] in models:
            key1 = job(row["model1"], row["bs1"], row["scale1"])
            key2 = job(row["model2"], row["bs2"], row["scale2"])
            data[row["gpu_type"]][key1][key2] = [float(row["colo_tput1"]), float(row["colo_tput2"])]
    path.write_text(json.dumps(data))


def test_gavel_json_gives_what_the_flattened_csv_gives(tmp_path, obs):
    models = {"ResNet-18", "A3C", "LM"}
    _gavel_json(tmp_path / "t.json", models)
    from_json = import_gavel_json(tmp_path / "t.json")
    expected = [o for o in obs if {o.a.model_family, o.b.model_family} <= models]
    assert len(from_json.observations) == len(expected) > 20
    assert from_json.did_not_fit == sum(not o.fits for o in expected)
    key = {(o.gpu_type, o.a.model_family, o.a.batch, o.b.model_family, o.b.batch): o for o in expected}
    for o in from_json.observations:
        mine = key.get((o.gpu_type, o.a.model_family, o.a.batch, o.b.model_family, o.b.batch))
        assert mine is not None and mine.fits == o.fits
        if o.fits:
            assert o.norm_a == pytest.approx(mine.norm_a) and o.norm_b == pytest.approx(mine.norm_b)
    assert {o.gpu_type for o in from_json.observations} == {"k80", "p100"}


def test_gavel_json_errors_name_the_job(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"v100": {"ResNet-18 bs 16": {"null": 3.0}}}))
    with pytest.raises(MeasurementError, match="not written as Gavel writes one"):
        import_gavel_json(bad)
    bad.write_text(json.dumps({"v100": {"('A3C', 1)": {"null": 3.0, "('LM (batch size 5)', 1)": [1.0]}}}))
    with pytest.raises(MeasurementError, match=r"expected \[steps/s of the job"):
        import_gavel_json(bad)
    bad.write_text("{not json")
    with pytest.raises(MeasurementError, match="not JSON"):
        import_gavel_json(bad)


def test_import_gavel_cli_json_any_gpu_type(tmp_path):
    _gavel_json(tmp_path / "t.json", {"ResNet-50", "Transformer"})
    out = tmp_path / "p100.csv"
    result = CliRunner().invoke(main, ["iac", "import-gavel", "--json", str(tmp_path / "t.json"),
                                       "--gpu-type", "p100", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = measurements.read_csv(out)
    assert rows and {o.gpu_type for o in rows} == {"p100"}
    result = CliRunner().invoke(main, ["iac", "import-gavel", "--json", str(tmp_path / "t.json"),
                                       "--gpu-type", "h100", "--out", str(out)])
    assert result.exit_code != 0 and "h100" in result.output and "k80, p100" in result.output


def _row(**over) -> dict[str, str]:
    row = {c: "" for c in measurements.COLUMNS}
    row.update({"gpu_type": "a100", "fits": "1", "a_kind": "train", "b_kind": "infer", "a_throughput": "640",
                "a_batch": "64", "b_throughput": "5", "a_norm": "0.8", "b_norm": "0.9"})
    row.update(over)
    return row


def test_samples_per_s_is_converted_with_the_batch_or_refused(tmp_path):
    path = tmp_path / "m.csv"
    columns = list(measurements.COLUMNS) + ["a_throughput_unit", "b_throughput_unit"]
    rows = [_row(a_throughput_unit="samples/s"), _row(b_throughput_unit="samples/s"), _row(a_throughput_unit="tok/s")]
    for i, expect in enumerate([None, "needs the batch", "not a throughput unit"]):
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns)
            w.writeheader()
            w.writerow({**{c: "" for c in columns}, **rows[i]})
        if expect is None:
            (o,) = measurements.read_csv(path)
            assert o.a.throughput == pytest.approx(10.0) and o.b.throughput == 5.0  # 640 samples/s / 64 per step
        else:
            with pytest.raises(MeasurementError, match=expect):
                measurements.read_csv(path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, obs):
    d = tmp_path_factory.mktemp("iac")
    k80 = [o for o in obs if o.gpu_type == "k80"]
    p100 = [o for o in obs if o.gpu_type == "p100"]
    model = train(k80, TrainConfig(hidden=8, weight_decay=1e-3, epochs=60, use_family=True), seed=0)
    model.save(d / "m.pt")
    measurements.write_csv(d / "p100.csv", p100)
    return d, model, p100


def test_score_on_an_unseen_gpu_type_beside_trivial_predictors(saved):
    _, model, p100 = saved
    s = score(model, p100, floor=0.6)
    truth = np.array([v for o in p100 if o.fits for v in (o.norm_a, o.norm_b)])
    assert s.unseen_gpu_types == ["p100"] and s.n_samples == truth.size
    assert s.metrics["no-slowdown"]["mape_norm"] == pytest.approx(np.mean(np.abs(1 - truth) / truth))
    assert s.metrics["no-slowdown"]["mape_slowdown"] == pytest.approx(np.mean(np.abs(1 - truth)))  # |S - S_true| / S_true at S = 1
    assert s.metrics["no-slowdown"]["false_admission"] == 1.0 and s.metrics["no-slowdown"]["good_admitted"] == 1.0
    # "no slowdown" admits every pair: the share of admitted pairs that were bad is the share of bad pairs
    assert s.metrics["no-slowdown"]["bad_of_admitted"] == pytest.approx(s.n_bad_pairs / s.n_pairs)
    mean = model.training_mean_norm
    assert s.metrics["training-mean"]["mape_norm"] == pytest.approx(np.mean(np.abs(mean - truth) / truth))
    med = np.median(truth)
    assert s.metrics["test-median"]["mape_norm"] == pytest.approx(np.mean(np.abs(med - truth) / truth))
    assert 0 <= s.metrics["model"]["false_admission"] <= 1 and s.n_bad_pairs > 0


def test_cli_evaluate_saved_model_json_and_table(saved):
    d, model, p100 = saved
    r = CliRunner().invoke(main, ["iac", "evaluate", "--model", str(d / "m.pt"), "--data", str(d / "p100.csv"),
                                  "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["unseen_gpu_types"] == ["p100"]
    assert out["metrics"]["model"]["mape_norm"] == pytest.approx(score(model, p100).metrics["model"]["mape_norm"])
    r = CliRunner().invoke(main, ["iac", "evaluate", "--model", str(d / "m.pt"), "--data", str(d / "p100.csv")])
    assert r.exit_code == 0 and "MAPE slowdown" in r.output and "test-median" in r.output
    r = CliRunner().invoke(main, ["iac", "evaluate", "--model", str(d / "m.pt"), "--split", "kfold",
                                  "--data", str(d / "p100.csv")])
    assert r.exit_code != 0 and "exactly one of --model" in r.output


def test_score_refuses_data_with_nothing_that_ran(saved):
    _, model, p100 = saved
    with pytest.raises(MeasurementError, match="no pair that ran together"):
        score(model, [o for o in p100 if not o.fits])
