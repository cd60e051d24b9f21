"""The family key `batch:` (goodput mode): what it accepts, and each bad input a clear error naming the key."""

from __future__ import annotations

import pytest

from slurm_elastico.errors import ConfigError
from slurm_elastico.runtime.shape import runtime_shape
from slurm_elastico.shapes import build_family, build_typed_family
from slurm_elastico.shapes.spec import parse_spec
from slurm_elastico.shapes.spec_batch import BatchRule


def train_spec(**changes):
    base = {"kind": "train", "global_batch": 64, "micro_batches": [8, 16, 64], "precisions": ["fp32"],
            "checkpointing": [False], "steps": 100, "mps_shares": [100]}
    return {**base, **changes}


def infer_spec(**changes):
    base = {"kind": "infer", "requests": 10, "gpu_memory_utilization": [0.5], "max_num_seqs": [4],
            "kv_cache_dtype": ["auto"], "mps_shares": [100]}
    return {**base, **changes}


def problems(data) -> str:
    with pytest.raises(ConfigError) as err:
        parse_spec(data, "fam.yaml")
    return str(err.value)


def test_without_the_key_or_with_adaptive_false_the_batch_is_fixed():
    assert parse_spec(train_spec()).batch is None
    assert parse_spec(train_spec(batch={"adaptive": False, "min": 8, "max": 512})).batch is None


def test_an_adaptive_family_keeps_its_range_and_rule():
    rule = parse_spec(train_spec(batch={"adaptive": True, "min": 16, "max": 512})).batch
    assert rule == BatchRule(16, 512, "adascale")
    assert rule.batches(64) == (16, 32, 128, 256, 512)
    assert parse_spec(train_spec(batch={"adaptive": True, "min": 64, "max": 64, "lr_scaling": "sqrt"})).batch \
        == BatchRule(64, 64, "sqrt")


@pytest.mark.parametrize(("batch", "words"), [
    ({"adaptive": True, "min": 256, "max": 16}, ["batch.min: 256 is above batch.max 16; allowed: min <= max"]),
    ({"adaptive": True, "min": 128, "max": 256},
     ["batch: the submitted global_batch 64 is outside [batch.min 128, batch.max 256]"]),
    ({"adaptive": True, "min": 0, "max": 2.5}, ["batch.min: 0 is not a positive integer", "batch.max: 2.5 is not"]),
    ({"adaptive": True, "min": True, "max": "big"}, ["batch.min: True is not", "batch.max: 'big' is not"]),
    ({"adaptive": True, "min": 8, "max": 128, "lr_scaling": "cubic"},
     ["batch.lr_scaling: 'cubic' is not allowed; allowed: adascale, sqrt, linear"]),
    ({"adaptive": True}, ["batch.min: required when batch.adaptive is true", "batch.max: required"]),
    ({"adaptive": "yes", "min": 8, "max": 128}, ["batch.adaptive: expected true or false, got 'yes'"]),
    ({"adaptive": True, "min": 8, "max": 128, "step": 2}, ["batch.step: unknown key; allowed: adaptive, min, max"]),
    ([8, 128], ["batch: expected a mapping with adaptive, min, max, lr_scaling"]),
    ({"min": 8, "max": 128, "lr_scaling": "sqrt"},
     ["batch.adaptive: missing: batch.min, batch.max, batch.lr_scaling has no effect without it"]),
])
def test_bad_batch_rules_are_named(batch, words):
    text = problems(train_spec(batch=batch))
    for w in words:
        assert w in text


def test_adaptive_on_an_inference_family_is_refused_by_name():
    text = problems(infer_spec(batch={"adaptive": True, "min": 1, "max": 2}))
    assert "batch: only a training family may adapt its batch, and this one is kind infer" in text
    assert "unknown key" not in text


def test_other_batch_words_still_point_at_the_batch_key():
    assert "opts in with batch: {adaptive: true" in problems(train_spec(batch_size=3))


ADAPTIVE = train_spec(micro_batches=[16, 32, 64], mps_shares=[50, 100], gpus=[1, 2],
                      batch={"adaptive": True, "min": 32, "max": 256, "lr_scaling": "sqrt"},
                      model={"step_time_s": 1.0})


def test_a_fixed_family_is_unchanged_by_goodput_mode():
    fam = build_family(parse_spec(train_spec()), 40000)
    assert all(s.knob("global_batch") == 64 and s.knob("lr_scaling") is None and s.knob("base_batch") is None
               for s in fam.shapes)


def test_an_adaptive_family_offers_other_batches_in_the_shared_vocabulary():
    fam = build_family(parse_spec(ADAPTIVE), 40000)
    batches = {s.knob("global_batch") for s in fam.shapes}
    assert batches == {32, 64, 128, 256}
    for s in fam.shapes:
        b = s.knob("global_batch")
        assert s.knob("base_batch") == 64
        assert s.knob("micro_batch") * s.knob("accumulation") * s.knob("ranks", 1) == b
        if b == 64:
            assert s.knob("lr_scaling") is None and s.knob("batch_rule") == "sqrt" and not s.name.startswith("gb")
        else:
            assert s.knob("lr_scaling") == "sqrt" and s.name.startswith(f"gb{b}-")
    assert fam.default_shape.knob("global_batch") == 64  # unplanned, the job runs its submitted batch
    # Goodput before the noise scale is known: steps/s at B times min(1, B/B0), in steps of the submitted batch.
    own = fam.shape("mb32-fp32-mps100").throughput
    assert fam.shape("gb128-mb32-fp32-mps100").throughput < own
    assert fam.shape("gb32-mb32-fp32-mps100").throughput == pytest.approx(own, rel=0.2)


def test_every_shape_of_an_adaptive_family_runs_in_goodput_mode():
    fam = build_family(parse_spec(ADAPTIVE), 40000)
    for s in fam.shapes:
        shape = runtime_shape(fam, s)
        assert shape.adaptive and shape.lr_scaling == "sqrt" and shape.base_batch == 64
        assert shape.global_batch == s.knob("global_batch")


def test_a_shape_at_another_batch_may_be_declared():
    spec = parse_spec({**ADAPTIVE, "declared": {"gb128-mb32-fp32-mps100": {"throughput": 3.5}}})
    assert build_family(spec, 40000).shape("gb128-mb32-fp32-mps100").throughput == 3.5
    assert "declared.gb512-mb32-fp32-mps100: no such shape" in problems(
        {**ADAPTIVE, "declared": {"gb512-mb32-fp32-mps100": {"throughput": 3.5}}})


def test_typed_families_keep_the_other_batches_and_the_own_default():
    fam = build_typed_family(parse_spec(ADAPTIVE), {"a100": 40960, "v100": 16384})
    assert {s.knob("global_batch") for s in fam.shapes} == {32, 64, 128, 256}
    assert fam.default_shape.knob("global_batch") == 64


def test_the_other_batches_count_towards_the_shape_limit():
    wide = train_spec(global_batch=1024, micro_batches=[1, 2, 4, 8, 16, 32, 64, 128], precisions=["fp32", "bf16"],
                      checkpointing=[False, True], mps_shares=list(range(10, 101, 10)))
    assert parse_spec(wide)  # 8 x 2 x 2 x 10 = 320 shapes
    text = problems({**wide, "batch": {"adaptive": True, "min": 1, "max": 1 << 20}})
    assert "the choices make 6720 shapes; allowed: at most 4096" in text  # 320 x (1 + 10 smaller + 10 larger)
