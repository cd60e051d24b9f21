"""Shape families: spec validation, enumeration, memory fit, Pareto front, estimate, solo profile."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import Resources, Shape
from slurm_elastico.shapes import (build_family, enumerate_shapes, estimate, load_directory, load_family, pareto,
                                   parse_family, parse_spec, solo_profile)

EXAMPLES = Path(__file__).resolve().parents[2] / "etc" / "examples" / "families"
GPU = 81920


def train_spec(**over):
    base = {"kind": "train", "global_batch": 64, "micro_batches": [8, 16, 64], "precisions": ["fp32", "bf16"],
            "checkpointing": [False, True], "steps": 100, "mps_shares": [50, 100]}
    base.update(over)
    return base


def infer_spec(**over):
    base = {"kind": "infer", "requests": 1000, "gpu_memory_utilization": [0.5, 0.9], "max_num_seqs": [32, 256],
            "kv_cache_dtype": ["auto", "fp8"], "mps_shares": [50, 100]}
    base.update(over)
    return base


def test_examples_load_and_training_keeps_the_global_batch():
    train = load_family(EXAMPLES / "train-resnet50.yaml", GPU)
    infer = load_family(EXAMPLES / "infer-llama8b.yaml", GPU)
    assert train.kind == "train" and infer.kind == "infer"
    assert train.total_work == 5000 and infer.total_work == 20000
    assert len(train.shapes) >= 4 and len(infer.shapes) >= 3
    for s in train.shapes:
        assert s.knob("micro_batch") * s.knob("accumulation") == 256 == s.knob("global_batch")
    assert train.default_shape.name == "mb64-fp32-mps100"
    # The declared number overrides the estimate.
    assert train.shape("mb64-bf16-mps50").throughput == pytest.approx(1.6)
    assert train.shape("mb64-bf16-mps50").resources.gpu_mem_mib == 4200


def test_every_problem_is_reported_at_once_with_key_and_allowed_values():
    bad = train_spec(micro_batches=[8, 24], precisions=["fp32", "int8"], steps=0, mps_shares=[0, 50],
                     batch_size=3, model={"params": -1, "flops": 2}, declared={"nope": {"throughput": 1}})
    with pytest.raises(ConfigError) as err:
        parse_spec(bad, "job.yaml")
    text = str(err.value)
    assert text.startswith("job.yaml:")
    for needle in ("micro_batches: [24] do not divide global_batch 64; allowed: divisors of it (1, 2, 4, 8, 16, 32, 64)",
                   "precisions[1]: 'int8' is not allowed; allowed: fp32, bf16, fp16",
                   "steps: 0 is out of range", "mps_shares[0]: 0 is out of range",
                   "batch_size: unknown key for kind train (a family keeps the global batch fixed",
                   "model.params: -1 is out of range; allowed: > 0", "model.flops: unknown hint"):
        assert needle in text, needle
    assert len(err.value.problems) == 7


def test_declared_numbers_must_name_a_shape_and_be_positive():
    with pytest.raises(ConfigError) as err:
        parse_spec(train_spec(declared={"nope": {"throughput": 1}, "mb8-fp32-mps50": {"throughput": -2, "power": 1}}),
                   "t.yaml")
    text = str(err.value)
    assert "declared.nope: no such shape; allowed: mb16-bf16-ckpt-mps100" in text
    assert "declared.mb8-fp32-mps50.throughput: -2 is out of range" in text
    assert "declared.mb8-fp32-mps50.power: unknown key; allowed: throughput, gpu_mem_mib" in text


def test_wrong_kind_and_non_mapping_are_clear():
    with pytest.raises(ConfigError, match="kind: 'serve' is not allowed; allowed: train, infer"):
        parse_spec({"kind": "serve"}, "x.yaml")
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_spec([1, 2], "x.yaml")


def test_infer_spec_errors_name_the_allowed_choices():
    with pytest.raises(ConfigError) as err:
        parse_spec(infer_spec(gpu_memory_utilization=[0, 1.5], kv_cache_dtype=["fp16"], max_num_seqs=[]), "i.yaml")
    text = str(err.value)
    assert "gpu_memory_utilization[0]: 0 is out of range; allowed: > 0 and <= 1" in text
    assert "gpu_memory_utilization[1]" in text
    assert "kv_cache_dtype[0]: 'fp16' is not allowed; allowed: auto, fp8" in text
    assert "max_num_seqs: expected a non-empty list" in text


def test_unreadable_and_invalid_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_family(tmp_path / "missing.yaml", GPU)
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [train\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_family(bad, GPU)


def test_shapes_that_do_not_fit_the_gpu_are_dropped_and_none_fitting_is_an_error():
    spec = parse_spec(train_spec(model={"params": 1.2e9, "activation_mib_per_sample": 100}), "t.yaml")
    shapes = enumerate_shapes(spec, 24000)
    assert shapes and all(s.resources.gpu_mem_mib <= 24000 for s in shapes)
    assert len(shapes) < len(enumerate_shapes(spec, 10**7))
    with pytest.raises(ConfigError, match="none fits a GPU of 1000 MiB"):
        build_family(spec, 1000)


def test_inference_shapes_without_kv_room_are_dropped():
    fam = parse_family(infer_spec(gpu_memory_utilization=[0.1, 0.9], model={"weights_mib": 16000}), "i.yaml", GPU)
    assert all(s.knob("gpu_memory_utilization") == 0.9 for s in fam.shapes)


def test_fp8_kv_and_checkpointing_trade_as_documented():
    # fp8 doubles the sequences a small cache holds: faster at the same memory.
    auto, _ = estimate.infer({"weights_mib": 16000}, GPU, 0.3, 256, "auto", 100)
    fp8, _ = estimate.infer({"weights_mib": 16000}, GPU, 0.3, 256, "fp8", 100)
    assert fp8 > auto
    t0, m0 = estimate.train({}, 64, 64, "fp32", False, 100)
    t1, m1 = estimate.train({}, 64, 64, "fp32", True, 100)
    assert m1 < m0 and t1 < t0
    small, _ = estimate.train({}, 64, 8, "fp32", False, 100)
    assert small < t0  # small micro-batches pay the per-launch cost more often
    assert estimate.train({}, 64, 64, "fp32", False, 50)[0] < t0


def test_pareto_drops_dominated_and_keeps_the_default():
    a = Shape("a", Resources(50, 1000, 1, 1), 1.0)
    b = Shape("b", Resources(50, 2000, 1, 1), 0.9)  # slower and hungrier than a
    c = Shape("c", Resources(100, 1000, 1, 1), 2.0)
    twin = Shape("a2", Resources(50, 1000, 1, 1), 1.0)
    assert [s.name for s in pareto([a, b, c, twin])] == ["a", "c"]
    assert [s.name for s in pareto([a, b, c], keep="b")] == ["a", "b", "c"]


def test_declared_default_is_kept_even_if_dominated():
    fam = parse_family(train_spec(default="mb8-fp32-mps100"), "t.yaml", GPU)
    assert fam.default == "mb8-fp32-mps100"
    assert fam.default_shape.name == "mb8-fp32-mps100"


def test_default_must_name_a_shape():
    with pytest.raises(ConfigError, match="default: 'mb3-fp32-mps100' is not a shape"):
        parse_spec(train_spec(default="mb3-fp32-mps100"), "t.yaml")


shape_st = st.builds(lambda i, s, m, t: Shape(f"s{i}", Resources(s, m, 1, 1), t),
                     st.integers(0, 10**6), st.sampled_from([25, 50, 100]), st.integers(1, 5) .map(lambda x: x * 1000),
                     st.sampled_from([0.5, 1.0, 1.5, 2.0]))


@settings(max_examples=60, deadline=None)
@given(st.lists(shape_st, min_size=1, max_size=12))
def test_pareto_front_has_no_dominated_shape_and_covers_every_shape(shapes):
    front = pareto(shapes)
    assert front
    for a in front:
        for b in front:
            if a is not b:
                assert not (b.throughput >= a.throughput and all(
                    x <= y for x, y in zip(b.resources.as_tuple(), a.resources.as_tuple())))
    for s in shapes:  # everything dropped is beaten by something kept
        assert any(f.throughput >= s.throughput and all(
            x <= y for x, y in zip(f.resources.as_tuple(), s.resources.as_tuple())) for f in front)


def test_solo_profile_follows_kind_and_share():
    fam = load_family(EXAMPLES / "infer-llama8b.yaml", GPU)
    s = fam.shapes[0]
    p = solo_profile(s, fam.kind, fam.name)
    assert p.kind == "infer" and p.mps_share == s.resources.mps and p.model_family == "llama-3-8b"
    assert p.batch == s.knob("max_num_seqs") and p.mem_used_mib == s.resources.gpu_mem_mib
    t = load_family(EXAMPLES / "train-resnet50.yaml", GPU)
    small = solo_profile(t.shape("mb64-bf16-mps25"), "train")
    big = solo_profile(t.shape("mb64-bf16-mps100"), "train")
    assert small.sm_util < big.sm_util and small.precision == "bf16"


def test_load_directory_keys_by_job_id_and_returns_bad_files_as_errors(tmp_path):
    (tmp_path / "41.yaml").write_text((EXAMPLES / "train-resnet50.yaml").read_text())
    (tmp_path / "42.yaml").write_text("kind: train\nsteps: 0\n")
    (tmp_path / "notes.yaml").write_text("kind: nonsense\n")
    fams, errors = load_directory(tmp_path, GPU)
    assert list(fams) == [41] and fams[41].kind == "train"
    assert len(errors) == 1 and errors[0].source.endswith("42.yaml")
