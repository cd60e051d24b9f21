import math
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.gavel import import_gavel
from slurm_elastico.interference.measurements import (COLUMNS, Colocation, load_from_store, read_csv,
                                                      samples, save_to_store, write_csv)
from slurm_elastico.store import Store

GAVEL = Path(__file__).parent.parent / "data" / "gavel"


def _obs():
    a = SoloProfile(kind="train", throughput=3.5, batch=64, precision="bf16", model_family="resnet",
                    sm_util=0.9, mem_used_mib=12000, mps_share=50)
    b = SoloProfile(kind="infer", throughput=120.0, model_family="llama")
    return [Colocation("h100", a, b, 0.71, 0.83, True, "test"), Colocation("h100", b, a, fits=False)]


def test_csv_round_trip_keeps_missing_fields(tmp_path):
    path = tmp_path / "m.csv"
    assert write_csv(path, _obs()) == 2
    assert write_csv(path, _obs()[:1], append=True) == 1
    back = read_csv(path)
    assert back == _obs() + _obs()[:1]
    assert math.isnan(back[0].b.batch) and back[1].fits is False and math.isnan(back[1].norm_a)


def test_equality_takes_unmeasured_fields_as_equal_and_measured_ones_by_value():
    # float("nan") is a NaN object other than math.nan: equal all the same, with the same hash.
    obs = _obs()[0]
    other_nan = replace(obs, b=replace(obs.b, membw_util=float("nan")))
    assert obs == other_nan and hash(obs) == hash(other_nan)
    assert obs != replace(obs, b=replace(obs.b, membw_util=0.4))  # measured vs unmeasured
    assert obs != replace(obs, norm_a=0.72) and obs != replace(obs, source="observed")
    assert obs != obs.swapped() and obs.swapped().swapped() == obs
    assert len({obs, other_nan, obs.swapped()}) == 2


@pytest.mark.parametrize("column, value, words", [
    ("a_kind", "training", "a_kind"),
    ("b_norm", "-0.2", "b_norm"),
    ("a_sm_util", "85", "a_sm_util"),
    ("fits", "yes", "fits"),
    ("a_mps_share", "150", "a_mps_share"),
    ("b_throughput", "fast", "b_throughput"),
])
def test_bad_value_names_row_and_column(tmp_path, column, value, words):
    path = tmp_path / "m.csv"
    write_csv(path, _obs())
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[2].split(",")
    cells[header.index(column)] = value
    lines[2] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(MeasurementError, match=rf"row 3, column {words}"):
        read_csv(path)


def test_missing_column_and_norm_rules(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("gpu_type,fits\nh100,1\n")
    with pytest.raises(MeasurementError, match="missing column"):
        read_csv(path)
    write_csv(path, _obs()[:1])
    text = path.read_text().replace(",0.71,", ",,")
    path.write_text(text)
    with pytest.raises(MeasurementError, match="row 2, column a_norm: empty"):
        read_csv(path)


def test_store_round_trip(tmp_path):
    with Store(tmp_path / "e.db") as s:
        assert save_to_store(s, _obs()) == 2
        back = load_from_store(s)
        assert load_from_store(s, gpu_type="a100") == []
    assert back == _obs()


def test_samples_use_both_directions_of_fitting_pairs_only():
    selves, partners, norms, index = samples(_obs())
    assert norms == [0.71, 0.83] and index == [0, 0]
    assert selves[1] == partners[0]


def test_gavel_import_counts_and_dedup():
    result = import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv")
    assert (len(result.observations), result.did_not_fit, result.multi_gpu_skipped) == (702, 56, 2166)
    keys = [(o.gpu_type, *sorted([(o.a.model_family, o.a.batch), (o.b.model_family, o.b.batch)], key=str))
            for o in result.observations]
    assert len(set(keys)) == len(keys)  # mirrored rows kept once
    first = result.observations[0]
    assert first.a.model_family == "ResNet-18" and first.a.batch == 16 and first.norm_a == pytest.approx(0.5297, abs=1e-4)
    a3c = next(o for o in result.observations if o.b.model_family == "A3C")
    assert math.isnan(a3c.b.batch) and a3c.b.throughput > 0
    assert all(math.isnan(o.a.sm_util) for o in result.observations)  # Gavel has no NVML counters
    assert set(COLUMNS) >= {"a_norm", "b_norm", "gpu_type"}
