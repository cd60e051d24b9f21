"""The running job's shape, read from the environment: the contract between `elastico-run` and the user's program.

`elastico-run` exports the shape the scheduler chose
(`shape_env(runtime_shape(family, planned_shape))` builds the variables); the program reads it with `current_shape()` on every (re)start,
because a reshape relaunches it with new values. Every variable is a plain
string so shell scripts can read them too.

Common to both kinds:

  ELASTICO_KIND              "train" or "infer" (required)
  ELASTICO_SHAPE             shape name, for logs (optional, default "")
  ELASTICO_CKPT_DIR          where checkpoints / the inference journal live
                             (optional; `checkpoint_dir()` falls back to a default)
  ELASTICO_PROGRESS_FILE     where the job reports its progress to the helper
                             (optional; see `slurm_elastico.runtime.progress`)

Training (`kind=train`), all required:

  ELASTICO_GLOBAL_BATCH      samples per optimizer step; fixed for the whole job
                             unless the family adapts its batch (below)
  ELASTICO_MICRO_BATCH       samples per forward/backward pass (at most)
  ELASTICO_ACCUMULATION      micro-batches per optimizer step and rank: rank r computes its part
                             of the global batch (`TrainShape.rank_part`: GLOBAL_BATCH // RANKS
                             samples, one more for each of the first GLOBAL_BATCH % RANKS ranks)
                             in pieces of MICRO_BATCH, the last one shorter where it does not
                             divide; ACCUMULATION must be `accumulation_for` (the largest part's
                             pieces), MICRO_BATCH * ACCUMULATION * RANKS = GLOBAL_BATCH when
                             everything divides. Each piece's mean loss is weighted by its
                             samples / GLOBAL_BATCH and the ranks' gradients summed, so any
                             split computes the same step
  ELASTICO_PRECISION         fp32 | bf16 | fp16  (autocast dtype; fp32 = no autocast)
  ELASTICO_CHECKPOINTING     1/0 (also true/false, yes/no, on/off): activation checkpointing
  ELASTICO_STEPS             total optimizer steps of the job (not of this run)
  ELASTICO_RANKS             optional (absent = 1): data-parallel degree, one process
                             per rank; every rank gets the same ELASTICO_* variables
                             and learns its own rank from torch's env:// variables
                             (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
                             which `elastico-run` sets; WORLD_SIZE must equal RANKS
  ELASTICO_LR_SCALING        optional (absent = fixed global batch): the learning-rate rule of a
                             family with `batch: {adaptive: true}`: adascale | sqrt | linear.
                             Then GLOBAL_BATCH may differ from run to run, STEPS counts steps of
                             BASE_BATCH, and the job ends when its statistical progress
                             reaches them (`runtime.goodput`)
  ELASTICO_BASE_BATCH        with ELASTICO_LR_SCALING: the submitted global batch (required);
                             without it, absent or equal to GLOBAL_BATCH

Inference (`kind=infer`):

  ELASTICO_MAX_NUM_SEQS            required; sequences per engine batch (vLLM `max_num_seqs`)
  ELASTICO_GPU_MEMORY_UTILIZATION  optional; float in (0, 1] (vLLM `gpu_memory_utilization`)
  ELASTICO_KV_CACHE_DTYPE          optional; auto | fp8 | fp8_e4m3 | fp8_e5m2 (vLLM `kv_cache_dtype`)
  ELASTICO_ENGINE_ARGS             optional; JSON object of further engine keyword
                                   arguments passed through unchanged (e.g. max_model_len,
                                   tensor_parallel_size: an integer >= 1, the GPUs of one engine)
  ELASTICO_REPLICAS                optional (absent = 1); data-parallel engine replicas
                                   sharing the request list (see `runtime.infer`)

Exit protocol: a program that saw `checkpoint_requested()` saves a durable
checkpoint (or journal) and exits with `EXIT_CHECKPOINTED` (75, EX_TEMPFAIL),
meaning "my state is on disk, relaunch me (with whatever shape)". Exit 0 means
the work is complete; anything else is a failure.

Bad values raise `ConfigError` naming every bad variable at once, with what is allowed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import Family
from slurm_elastico.model import Shape as PlannedShape
from slurm_elastico.runtime.env_reader import EnvReader
from slurm_elastico.runtime.goodput import LR_RULES
from slurm_elastico.runtime.split import accumulation_for, rank_part, split_problem

EXIT_CHECKPOINTED = 75
"""Exit status of a program that checkpointed on request and wants to be relaunched (EX_TEMPFAIL)."""

PRECISIONS = ("fp32", "bf16", "fp16")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
KINDS = ("train", "infer")
_SOURCE = "job environment (ELASTICO_* variables)"
DEFAULT_CKPT_DIR = "elastico-ckpt"


@dataclass(frozen=True)
class TrainShape:
    """A training shape: how one optimizer step of `global_batch` samples is computed; `steps` is the job's total."""

    global_batch: int
    micro_batch: int
    accumulation: int
    precision: str = "fp32"
    checkpointing: bool = False
    steps: int = 1
    ranks: int = 1
    """Data-parallel degree: each rank computes its `rank_part` of `global_batch` in `accumulation` micro-batches."""
    name: str = ""
    lr_scaling: str = ""
    """Goodput mode's learning-rate rule (`runtime.goodput.LR_RULES`); "" = a fixed global batch."""
    base_batch: int = 0
    """The submitted global batch, in whose steps `steps` counts; 0 = `global_batch`."""
    kind: ClassVar[str] = "train"

    def __post_init__(self) -> None:
        if self.base_batch == 0:
            object.__setattr__(self, "base_batch", self.global_batch)
        problems = _train_problems(self)
        if problems:
            raise ConfigError("training shape", problems)

    def to_env(self) -> dict[str, str]:
        """The ELASTICO_* variables that make `current_shape()` return this shape."""
        return {
            "ELASTICO_KIND": "train",
            "ELASTICO_SHAPE": self.name,
            "ELASTICO_GLOBAL_BATCH": str(self.global_batch),
            "ELASTICO_MICRO_BATCH": str(self.micro_batch),
            "ELASTICO_ACCUMULATION": str(self.accumulation),
            "ELASTICO_PRECISION": self.precision,
            "ELASTICO_CHECKPOINTING": "1" if self.checkpointing else "0",
            "ELASTICO_STEPS": str(self.steps),
            "ELASTICO_RANKS": str(self.ranks),
        } | ({"ELASTICO_LR_SCALING": self.lr_scaling, "ELASTICO_BASE_BATCH": str(self.base_batch)}
             if self.adaptive else {})

    @property
    def adaptive(self) -> bool:
        """Goodput mode: the global batch may change between runs, the LR follows it, progress is statistical."""
        return bool(self.lr_scaling)

    def rank_part(self, rank: int) -> tuple[int, int]:
        """(first sample, samples) of `rank`'s part of each optimizer step's global batch (`rank_part`)."""
        return rank_part(self.global_batch, self.ranks, rank)

    def micro_parts(self, rank: int) -> list[tuple[int, int]]:
        """(first, samples) of each micro-batch of `rank`'s part, relative to its first sample: pieces of
        `micro_batch`, the last one shorter where it does not divide the part."""
        _, n = self.rank_part(rank)
        return [(k, min(self.micro_batch, n - k)) for k in range(0, n, self.micro_batch)]

    @property
    def micro_count(self) -> int:
        """Micro-batches a step computes over all ranks."""
        return sum(len(self.micro_parts(r)) for r in range(self.ranks))


@dataclass(frozen=True)
class InferShape:
    """An inference shape: engine arguments. `engine_args` holds extra pass-through arguments as sorted pairs (hashable)."""

    max_num_seqs: int
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str = "auto"
    engine_args: tuple[tuple[str, object], ...] = ()
    replicas: int = 1
    """Data-parallel engine replicas, each answering its share of the request list."""
    name: str = ""
    kind: ClassVar[str] = "infer"

    def __post_init__(self) -> None:
        problems = _infer_problems(self)
        if problems:
            raise ConfigError("inference shape", problems)

    def engine_kwargs(self) -> dict[str, object]:
        """Keyword arguments for `vllm.LLM(model, **kwargs)`: the knobs plus the pass-through arguments."""
        kwargs: dict[str, object] = dict(self.engine_args)
        kwargs["max_num_seqs"] = self.max_num_seqs
        kwargs["kv_cache_dtype"] = self.kv_cache_dtype
        if self.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        return kwargs

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs one engine spans (the `tensor_parallel_size` engine argument; 1 when not given)."""
        return int(dict(self.engine_args).get("tensor_parallel_size", 1))  # type: ignore[call-overload]

    def to_env(self) -> dict[str, str]:
        """The ELASTICO_* variables that make `current_shape()` return this shape."""
        env = {
            "ELASTICO_KIND": "infer",
            "ELASTICO_SHAPE": self.name,
            "ELASTICO_MAX_NUM_SEQS": str(self.max_num_seqs),
            "ELASTICO_KV_CACHE_DTYPE": self.kv_cache_dtype,
            "ELASTICO_REPLICAS": str(self.replicas),
        }
        if self.gpu_memory_utilization is not None:
            env["ELASTICO_GPU_MEMORY_UTILIZATION"] = repr(self.gpu_memory_utilization)
        if self.engine_args:
            env["ELASTICO_ENGINE_ARGS"] = json.dumps(dict(self.engine_args), sort_keys=True)
        return env


Shape = TrainShape | InferShape


def shape_env(shape: Shape) -> dict[str, str]:
    """Variables to export for `shape` (for `elastico-run`); the inverse of `current_shape()`."""
    return shape.to_env()


def runtime_shape(family: Family, shape: PlannedShape) -> Shape:
    """The runtime shape of one planned shape of `family` (its knobs, and for training the family's steps).

    What `elastico-run` exports is `shape_env(runtime_shape(family, shape))`.
    Inference knobs other than the four the shape owns pass through as engine arguments.

    Ranks of a training shape: the `ranks` knob, else the planned shape's
    whole GPUs (`Resources.gpus`, one rank per GPU), else 1 (a share of one GPU).
    Replicas of an inference shape: the `replicas` knob, else `Resources.gpus`
    divided by the `tensor_parallel_size` knob (default 1), else 1. A knob
    that disagrees with `Resources.gpus` is a ConfigError.
    """
    knobs = dict(shape.knobs)
    gpus = shape.resources.gpus
    try:
        if family.kind == "train":
            micro, global_batch = int(knobs["micro_batch"]), int(knobs["global_batch"])
            ranks = int(knobs.get("ranks", gpus or 1))
            if gpus and ranks != gpus:
                raise ConfigError(f"shape {shape.name}", [f"knob ranks={ranks} but the shape holds {gpus} whole GPUs (one rank per GPU)"])
            rule, base = _batch_rule(family, shape)
            return TrainShape(
                global_batch=global_batch,
                micro_batch=micro,
                accumulation=int(knobs.get("accumulation", accumulation_for(global_batch, micro, ranks))),
                precision=str(knobs.get("precision", "fp32")),
                checkpointing=bool(knobs.get("checkpointing", False)),
                steps=int(family.total_work),
                ranks=ranks,
                name=shape.name,
                lr_scaling=rule,
                base_batch=base,
            )
        if family.kind == "infer":
            gmu = knobs.pop("gpu_memory_utilization", None)
            tp = int(knobs.get("tensor_parallel_size", 1))
            replicas = int(knobs.pop("replicas", (gpus // tp if tp >= 1 else 0) or 1))
            if gpus and replicas * tp != gpus:
                raise ConfigError(
                    f"shape {shape.name}",
                    [f"replicas {replicas} x tensor_parallel_size {tp} = {replicas * tp} but the shape holds {gpus} whole GPUs"],
                )
            return InferShape(
                max_num_seqs=int(knobs.pop("max_num_seqs")),
                gpu_memory_utilization=None if gmu is None else float(gmu),
                kv_cache_dtype=str(knobs.pop("kv_cache_dtype", "auto")),
                engine_args=tuple(sorted(knobs.items())),
                replicas=replicas,
                name=shape.name,
            )
    except KeyError as exc:
        raise ConfigError(f"shape {shape.name}", [f"knob {exc.args[0]} is missing; it has {', '.join(sorted(dict(shape.knobs)))}"]) from None
    raise ConfigError(f"shape {shape.name}", [f"family kind {family.kind!r} is not one of {', '.join(KINDS)}"])


def _batch_rule(family: Family, shape: PlannedShape) -> tuple[str, int]:
    """(learning-rate rule, submitted global batch) of a training shape: ("", 0) for a fixed-batch family.

    Every shape of an adaptive family runs in goodput mode, those at the submitted batch too (they measure
    the noise scale and count progress, at gain exactly 1). A family from a spec says so on each shape
    (`shapes.enumerate`): `lr_scaling` on the shapes at another batch, `batch_rule` on those at the submitted
    one, and `base_batch` (the submitted batch) on all. Without those knobs (the simulator's families mark only
    the other batches) the family adapts when any of its shapes carries `lr_scaling`, and the submitted batch
    is the default shape's `global_batch`."""
    own = shape.knob("lr_scaling") or shape.knob("batch_rule")
    rules = {str(own)} if own else {str(s.knob("lr_scaling")) for s in family.shapes if s.knob("lr_scaling")}
    if not rules:
        return "", 0
    if len(rules) > 1:
        raise ConfigError(f"shape {shape.name}", [f"the family's shapes name several lr_scaling rules {sorted(rules)}; "
                                                  "allowed: one rule a family"])
    base = shape.knob("base_batch") or family.default_shape.knob("global_batch")
    if base is None:
        raise ConfigError(f"shape {shape.name}", ["the family adapts its batch but its default shape has no "
                                                  "global_batch knob (the submitted batch)"])
    return rules.pop(), int(base)


def current_shape(env: Mapping[str, str] | None = None) -> Shape:
    """The shape this run must use, from `env` (default `os.environ`); raises ConfigError naming each bad variable."""
    env = os.environ if env is None else env
    kind = env.get("ELASTICO_KIND")
    if kind is None:
        raise ConfigError(_SOURCE, [f"ELASTICO_KIND is not set (allowed: {', '.join(KINDS)}); is this running under elastico-run?"])
    if kind not in KINDS:
        raise ConfigError(_SOURCE, [f"ELASTICO_KIND={kind!r} is not one of {', '.join(KINDS)}"])
    return _read_train(env) if kind == "train" else _read_infer(env)


def current_train_shape(env: Mapping[str, str] | None = None) -> TrainShape:
    """`current_shape()` for a program that only trains: refuses an inference shape."""
    shape = current_shape(env)
    if not isinstance(shape, TrainShape):
        raise ConfigError(_SOURCE, ["ELASTICO_KIND is 'infer' but this program trains (needs 'train')"])
    return shape


def current_infer_shape(env: Mapping[str, str] | None = None) -> InferShape:
    """`current_shape()` for a program that only infers: refuses a training shape."""
    shape = current_shape(env)
    if not isinstance(shape, InferShape):
        raise ConfigError(_SOURCE, ["ELASTICO_KIND is 'train' but this program runs inference (needs 'infer')"])
    return shape


def checkpoint_dir(env: Mapping[str, str] | None = None, default: str | os.PathLike[str] = DEFAULT_CKPT_DIR) -> Path:
    """ELASTICO_CKPT_DIR, or `default` (relative to the working directory) when unset."""
    env = os.environ if env is None else env
    return Path(env.get("ELASTICO_CKPT_DIR") or default)


# --------------------------------------------------------------------------
# parsing: collect every problem (`env_reader.EnvReader`), then raise once


def _read_train(env: Mapping[str, str]) -> TrainShape:
    r = EnvReader(env, _SOURCE)
    global_batch = r.integer("ELASTICO_GLOBAL_BATCH")
    micro = r.integer("ELASTICO_MICRO_BATCH")
    accumulation = r.integer("ELASTICO_ACCUMULATION")
    precision = r.choice("ELASTICO_PRECISION", PRECISIONS)
    checkpointing = r.flag("ELASTICO_CHECKPOINTING")
    steps = r.integer("ELASTICO_STEPS")
    ranks = r.integer("ELASTICO_RANKS", required=False) or 1
    rule = r.choice("ELASTICO_LR_SCALING", LR_RULES, default="")
    base = r.integer("ELASTICO_BASE_BATCH", required=bool(rule))
    if not rule and base is not None and global_batch is not None and base != global_batch:
        r.problems.append(f"ELASTICO_BASE_BATCH={base} differs from ELASTICO_GLOBAL_BATCH={global_batch} but "
                          f"ELASTICO_LR_SCALING is not set; allowed: a rule ({', '.join(LR_RULES)}) or equal batches")
    if None not in (global_batch, micro, accumulation) and min(global_batch, micro, ranks) >= 1:  # type: ignore[type-var]
        problem = split_problem(global_batch, micro, accumulation, ranks)  # type: ignore[arg-type]
        if problem:
            r.problems.append(
                f"ELASTICO_MICRO_BATCH={micro} x ELASTICO_ACCUMULATION={accumulation} x ELASTICO_RANKS={ranks}"
                f" does not split ELASTICO_GLOBAL_BATCH={global_batch}: {problem}; a shape must keep the global batch"
            )
    r.raise_if_any()
    return TrainShape(
        global_batch=global_batch,  # type: ignore[arg-type]
        micro_batch=micro,  # type: ignore[arg-type]
        accumulation=accumulation,  # type: ignore[arg-type]
        precision=precision,  # type: ignore[arg-type]
        checkpointing=checkpointing,  # type: ignore[arg-type]
        steps=steps,  # type: ignore[arg-type]
        ranks=ranks,
        name=env.get("ELASTICO_SHAPE", ""),
        lr_scaling=rule or "",
        base_batch=base or 0,
    )


def _read_infer(env: Mapping[str, str]) -> InferShape:
    r = EnvReader(env, _SOURCE)
    max_num_seqs = r.integer("ELASTICO_MAX_NUM_SEQS")
    gmu = r.fraction("ELASTICO_GPU_MEMORY_UTILIZATION")
    if gmu is not None and not 0.0 < gmu <= 1.0:
        r.problems.append(f"ELASTICO_GPU_MEMORY_UTILIZATION={gmu!r} is outside (0, 1]")
    kv = r.choice("ELASTICO_KV_CACHE_DTYPE", KV_CACHE_DTYPES, default="auto")
    replicas = r.integer("ELASTICO_REPLICAS", required=False) or 1
    extra = r.json_object("ELASTICO_ENGINE_ARGS")
    tp = extra.get("tensor_parallel_size", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        r.problems.append(f"ELASTICO_ENGINE_ARGS sets tensor_parallel_size={tp!r}; it must be an integer >= 1")
    clash = sorted(set(extra) & {"max_num_seqs", "gpu_memory_utilization", "kv_cache_dtype", "replicas"})
    if clash:
        r.problems.append(f"ELASTICO_ENGINE_ARGS sets {', '.join(clash)}, which the shape owns; use the ELASTICO_* variable instead")
    r.raise_if_any()
    return InferShape(
        max_num_seqs=max_num_seqs,  # type: ignore[arg-type]
        gpu_memory_utilization=gmu,
        kv_cache_dtype=kv,  # type: ignore[arg-type]
        engine_args=tuple(sorted(extra.items())),
        replicas=replicas,
        name=env.get("ELASTICO_SHAPE", ""),
    )


def _train_problems(s: TrainShape) -> list[str]:
    problems = []
    for field in ("global_batch", "micro_batch", "accumulation", "steps", "ranks"):
        value = getattr(s, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{field}={value!r} must be an integer >= 1")
    problem = "" if problems else split_problem(s.global_batch, s.micro_batch, s.accumulation, s.ranks)
    if problem:
        problems.append(f"micro_batch {s.micro_batch} x accumulation {s.accumulation} x ranks {s.ranks} does not "
                        f"split global_batch {s.global_batch}: {problem}")
    if s.precision not in PRECISIONS:
        problems.append(f"precision={s.precision!r} is not one of {', '.join(PRECISIONS)}")
    if s.lr_scaling and s.lr_scaling not in LR_RULES:
        problems.append(f"lr_scaling={s.lr_scaling!r} is not one of {', '.join(LR_RULES)} ('' = a fixed global batch)")
    if not isinstance(s.base_batch, int) or isinstance(s.base_batch, bool) or s.base_batch < 1:
        problems.append(f"base_batch={s.base_batch!r} must be an integer >= 1")
    elif not s.lr_scaling and s.base_batch != s.global_batch:
        problems.append(f"base_batch {s.base_batch} differs from global_batch {s.global_batch} without an lr_scaling "
                        "rule; a fixed-batch job keeps its global batch")
    if not isinstance(s.checkpointing, bool):
        problems.append(f"checkpointing={s.checkpointing!r} must be true or false")
    return problems


def _infer_problems(s: InferShape) -> list[str]:
    problems = []
    if not isinstance(s.max_num_seqs, int) or isinstance(s.max_num_seqs, bool) or s.max_num_seqs < 1:
        problems.append(f"max_num_seqs={s.max_num_seqs!r} must be an integer >= 1")
    if s.gpu_memory_utilization is not None and not 0.0 < s.gpu_memory_utilization <= 1.0:
        problems.append(f"gpu_memory_utilization={s.gpu_memory_utilization!r} must be in (0, 1]")
    if s.kv_cache_dtype not in KV_CACHE_DTYPES:
        problems.append(f"kv_cache_dtype={s.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    if not isinstance(s.replicas, int) or isinstance(s.replicas, bool) or s.replicas < 1:
        problems.append(f"replicas={s.replicas!r} must be an integer >= 1")
    tp = dict(s.engine_args).get("tensor_parallel_size", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        problems.append(f"engine argument tensor_parallel_size={tp!r} must be an integer >= 1")
    return problems
