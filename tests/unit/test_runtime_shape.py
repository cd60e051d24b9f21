"""The environment contract between elastico-run and the job: round trips, and clear errors naming the variable."""

from __future__ import annotations

import os
import signal

import pytest

from slurm_elastico.errors import ConfigError
from slurm_elastico.runtime import signals
from slurm_elastico.runtime.shape import (
    InferShape,
    TrainShape,
    checkpoint_dir,
    current_infer_shape,
    current_shape,
    current_train_shape,
    shape_env,
)

TRAIN_ENV = {
    "ELASTICO_KIND": "train",
    "ELASTICO_SHAPE": "mb16",
    "ELASTICO_GLOBAL_BATCH": "32",
    "ELASTICO_MICRO_BATCH": "16",
    "ELASTICO_ACCUMULATION": "2",
    "ELASTICO_PRECISION": "bf16",
    "ELASTICO_CHECKPOINTING": "true",
    "ELASTICO_STEPS": "100",
}


def test_training_shape_is_read_typed_and_frozen():
    shape = current_shape(TRAIN_ENV)
    assert shape == TrainShape(32, 16, 2, "bf16", True, 100, name="mb16")
    with pytest.raises(AttributeError):
        shape.micro_batch = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    "shape",
    [
        TrainShape(32, 8, 4, "fp16", False, 7, name="a"),
        InferShape(16, 0.45, "fp8", engine_args=(("max_model_len", 512),), name="b"),
        InferShape(4),
    ],
)
def test_shape_env_round_trips(shape):
    env = shape_env(shape)
    assert all(isinstance(v, str) for v in env.values())
    assert current_shape(env) == shape


def test_inference_engine_kwargs_merge_knobs_and_pass_through():
    env = {
        "ELASTICO_KIND": "infer",
        "ELASTICO_MAX_NUM_SEQS": "8",
        "ELASTICO_GPU_MEMORY_UTILIZATION": "0.5",
        "ELASTICO_ENGINE_ARGS": '{"max_model_len": 256, "enforce_eager": true}',
    }
    shape = current_infer_shape(env)
    assert shape.engine_kwargs() == {
        "max_num_seqs": 8,
        "gpu_memory_utilization": 0.5,
        "kv_cache_dtype": "auto",
        "max_model_len": 256,
        "enforce_eager": True,
    }


def test_every_bad_variable_is_named_at_once():
    env = dict(TRAIN_ENV, ELASTICO_MICRO_BATCH="sixteen", ELASTICO_PRECISION="fp8", ELASTICO_CHECKPOINTING="maybe")
    del env["ELASTICO_STEPS"]
    with pytest.raises(ConfigError) as err:
        current_shape(env)
    text = str(err.value)
    for name in ("ELASTICO_MICRO_BATCH='sixteen'", "ELASTICO_PRECISION='fp8'", "ELASTICO_CHECKPOINTING='maybe'", "ELASTICO_STEPS is not set"):
        assert name in text
    assert "fp32, bf16, fp16" in text  # says what is allowed


def test_a_shape_that_changes_the_global_batch_is_refused():
    with pytest.raises(ConfigError, match="must keep the global batch"):
        current_shape(dict(TRAIN_ENV, ELASTICO_ACCUMULATION="3"))
    with pytest.raises(ConfigError, match="does not split global_batch 32"):
        TrainShape(32, 16, 3)


def test_missing_kind_and_wrong_kind_are_explained():
    with pytest.raises(ConfigError, match="ELASTICO_KIND is not set"):
        current_shape({})
    with pytest.raises(ConfigError, match="this program runs inference"):
        current_infer_shape(TRAIN_ENV)
    with pytest.raises(ConfigError, match="this program trains"):
        current_train_shape({"ELASTICO_KIND": "infer", "ELASTICO_MAX_NUM_SEQS": "2"})


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("ELASTICO_GPU_MEMORY_UTILIZATION", "1.5", "outside (0, 1]"),
        ("ELASTICO_KV_CACHE_DTYPE", "int4", "not one of auto"),
        ("ELASTICO_ENGINE_ARGS", "[1]", "expected a JSON object"),
        ("ELASTICO_ENGINE_ARGS", "{bad", "not valid JSON"),
        ("ELASTICO_ENGINE_ARGS", '{"max_num_seqs": 3}', "which the shape owns"),
        ("ELASTICO_MAX_NUM_SEQS", "0", "below 1"),
    ],
)
def test_bad_inference_variables(var, value, message):
    env = {"ELASTICO_KIND": "infer", "ELASTICO_MAX_NUM_SEQS": "4", var: value}
    with pytest.raises(ConfigError, match=var) as err:
        current_shape(env)
    assert message in str(err.value)


def test_checkpoint_dir_default_and_override(tmp_path):
    assert checkpoint_dir({}, default=tmp_path) == tmp_path
    assert checkpoint_dir({"ELASTICO_CKPT_DIR": str(tmp_path / "x")}) == tmp_path / "x"


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_sets_the_checkpoint_flag_and_does_not_kill(sig):
    old = {s: signal.getsignal(s) for s in signals.DEFAULT_SIGNALS}
    signals.clear_checkpoint_request()
    try:
        signals.install_signal_handlers()
        assert not signals.checkpoint_requested()
        os.kill(os.getpid(), sig)  # delivered to the main thread before the next bytecode
        assert signals.checkpoint_requested()
        assert signals.requested_by() == sig.name
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        signals.clear_checkpoint_request()
    assert not signals.checkpoint_requested()


# --------------------------------------------------------------------------
# data-parallel ranks and inference replicas


def test_ranks_are_read_round_trip_and_default_to_one():
    two = TrainShape(32, 4, 4, steps=5, ranks=2, name="r2")
    env = shape_env(two)
    assert env["ELASTICO_RANKS"] == "2"
    assert current_shape(env) == two
    assert [two.rank_part(r) for r in range(2)] == [(0, 16), (16, 16)]
    assert two.micro_parts(1) == [(0, 4), (4, 4), (8, 4), (12, 4)] and two.micro_count == 8
    absent = dict(TRAIN_ENV)
    assert current_train_shape(absent).ranks == 1  # no ELASTICO_RANKS: one rank, as before


def test_ranks_must_keep_the_global_batch_and_every_problem_is_named():
    with pytest.raises(ConfigError) as err:
        current_shape(dict(TRAIN_ENV, ELASTICO_RANKS="2"))  # 16 x 2 x 2 = 64 != 32
    assert ("does not split ELASTICO_GLOBAL_BATCH=32: a rank's part of 16 samples takes 1 micro-batches of at most "
            "16, not 2") in str(err.value)
    assert current_train_shape(dict(TRAIN_ENV, ELASTICO_RANKS="2", ELASTICO_ACCUMULATION="1")).ranks == 2
    with pytest.raises(ConfigError) as err:
        current_shape(dict(TRAIN_ENV, ELASTICO_RANKS="zero", ELASTICO_PRECISION="fp4"))
    assert "ELASTICO_RANKS='zero' is not an integer" in str(err.value)
    assert "ELASTICO_PRECISION='fp4'" in str(err.value)
    with pytest.raises(ConfigError, match="ranks=0 must be an integer >= 1"):
        TrainShape(32, 16, 2, ranks=0)
    with pytest.raises(ConfigError, match=r"micro_batch 16 is larger than a rank's part \(8\); allowed: at most 8"):
        TrainShape(32, 16, 2, ranks=4)
    with pytest.raises(ConfigError, match="leave a rank without any; allowed: at most 32 ranks"):
        TrainShape(32, 1, 1, ranks=33)


def test_a_rank_count_that_does_not_divide_the_batch_splits_it_exactly():
    # 2,048 on 6 ranks (as Pollux's and Sia's traces submit jobs): parts of 342, 342, 341, 341, 341, 341, in
    # micro-batches of at most 128: three each, the last 86 or 85 samples.
    six = TrainShape(2048, 128, 3, steps=5, ranks=6, name="r6")
    parts = [six.rank_part(r) for r in range(6)]
    assert [n for _, n in parts] == [342, 342, 341, 341, 341, 341]
    assert [f for f, _ in parts] == [0, 342, 684, 1025, 1366, 1707] and parts[-1][0] + parts[-1][1] == 2048
    assert six.micro_parts(0) == [(0, 128), (128, 128), (256, 86)] and six.micro_parts(5)[-1] == (256, 85)
    assert six.micro_count == 18
    assert current_shape(shape_env(six)) == six  # the environment carries it as it is
    with pytest.raises(ConfigError, match="a rank's part of 342 samples takes 3 micro-batches of at most 128, not 2"):
        TrainShape(2048, 128, 2, ranks=6)
    with pytest.raises(ConfigError) as err:
        current_shape({**shape_env(six), "ELASTICO_ACCUMULATION": "4"})
    assert "does not split ELASTICO_GLOBAL_BATCH=2048: a rank's part of 342 samples takes 3" in str(err.value)


def test_replicas_and_tensor_parallel_size_round_trip_and_are_checked():
    shape = InferShape(8, engine_args=(("tensor_parallel_size", 2),), replicas=3, name="tp2x3")
    env = shape_env(shape)
    assert env["ELASTICO_REPLICAS"] == "3"
    assert current_shape(env) == shape
    assert shape.tensor_parallel_size == 2 and shape.engine_kwargs()["tensor_parallel_size"] == 2
    assert InferShape(4).replicas == 1 and InferShape(4).tensor_parallel_size == 1
    assert current_infer_shape({"ELASTICO_KIND": "infer", "ELASTICO_MAX_NUM_SEQS": "4"}).replicas == 1
    bad = {"ELASTICO_KIND": "infer", "ELASTICO_MAX_NUM_SEQS": "4", "ELASTICO_REPLICAS": "0",
           "ELASTICO_ENGINE_ARGS": '{"tensor_parallel_size": "two"}'}
    with pytest.raises(ConfigError) as err:
        current_shape(bad)
    assert "ELASTICO_REPLICAS='0' is below 1" in str(err.value)
    assert "tensor_parallel_size='two'; it must be an integer >= 1" in str(err.value)
    with pytest.raises(ConfigError, match="which the shape owns"):
        current_shape({"ELASTICO_KIND": "infer", "ELASTICO_MAX_NUM_SEQS": "4", "ELASTICO_ENGINE_ARGS": '{"replicas": 2}'})
    with pytest.raises(ConfigError, match="replicas=0 must be"):
        InferShape(4, replicas=0)


def _planned(kind, gpus, knobs):
    from slurm_elastico.model import Family, Resources
    from slurm_elastico.model import Shape as Planned

    planned = Planned(name="s", resources=Resources(mps=0 if gpus else 50, gpus=gpus), throughput=1.0, knobs=tuple(sorted(knobs.items())))
    return Family(name="f", kind=kind, shapes=(planned,), total_work=10), planned


def test_runtime_shape_takes_ranks_and_replicas_from_the_planned_gpus():
    from slurm_elastico.runtime.shape import runtime_shape

    fam, planned = _planned("train", 4, {"global_batch": 32, "micro_batch": 4})
    shape = runtime_shape(fam, planned)
    assert (shape.ranks, shape.accumulation) == (4, 2)
    fam, planned = _planned("train", 0, {"global_batch": 32, "micro_batch": 4})
    assert runtime_shape(fam, planned).ranks == 1  # a share of one GPU is one rank
    fam, planned = _planned("train", 2, {"global_batch": 32, "micro_batch": 4, "ranks": 4})
    with pytest.raises(ConfigError, match="ranks=4 but the shape holds 2 whole GPUs"):
        runtime_shape(fam, planned)
    fam, planned = _planned("infer", 4, {"max_num_seqs": 8, "tensor_parallel_size": 2})
    shape = runtime_shape(fam, planned)
    assert (shape.replicas, shape.tensor_parallel_size) == (2, 2)
    fam, planned = _planned("infer", 4, {"max_num_seqs": 8, "replicas": 3})
    with pytest.raises(ConfigError, match="replicas 3 x tensor_parallel_size 1 = 3"):
        runtime_shape(fam, planned)
