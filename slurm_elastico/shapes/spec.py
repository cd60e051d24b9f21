"""Shape-family spec files: parse and validate a YAML mapping into a typed spec.

A family spec sits next to a job script and lists the equivalent ways the job
may run. Every problem is collected and raised together as one `ConfigError`
naming the file, the key and what is allowed, so a user fixes it in one pass.

Training (`kind: train`) — the global batch is fixed; shapes vary how it is
computed, never what is computed::

    kind: train
    name: resnet50              # optional; a feature for interference prediction
    global_batch: 256           # fixed across every shape
    micro_batches: [32, 64, 128, 256]   # each must divide global_batch; accumulation = global / micro
    precisions: [fp32, bf16]    # any of fp32, bf16, fp16
    checkpointing: [false, true]        # activation checkpointing choices
    steps: 5000                 # total optimizer steps (the work)
    mps_shares: [25, 50, 100]   # percent of one GPU (MPS), for the 1-GPU shapes
    gpus: [1, 2, 4, 8]          # optional (default [1]): data-parallel ranks, one whole GPU each;
                                # micro_batch x accumulation x ranks = global_batch, or any count:
                                # each rank its part (`runtime.split`), the same step exactly
    gpus_per_node: 4            # optional: at most this many of a shape's GPUs on one node (default max(gpus))
    max_nodes: 2                # optional: at most this many nodes for one shape (default: no limit)
    gpu_types: [a100, v100]     # optional: only these GPU types (`spec_types`, `typed`; default: any)
    throughput_floor: 0.2       # L_j in steps/s: slower shapes/co-locations are never chosen
    cpus: 4                     # optional, per rank (default 2); a 1-GPU shape has one rank
    host_mem_mib: 16384         # optional, per rank (default 8192)
    default: mb64-fp32-mps100   # optional: the shape the job runs as unplanned
    model:                      # optional hints for the estimate (slurm_elastico.shapes.estimate)
      params: 25.6e6
      activation_mib_per_sample: 60
      step_time_s: 0.8          # one step, whole GPU, fp32, micro = global, no checkpointing
      micro_batch_knee: 8
      allreduce_gib_s: 10       # gradient all-reduce bandwidth between ranks (estimate.train)
    declared:                   # optional measured numbers per shape name; override the estimate
      mb64-bf16-mps50: {throughput: 2.4, gpu_mem_mib: 9000}

Inference (`kind: infer`) — a fixed set of requests::

    kind: infer
    name: llama-8b
    requests: 20000
    gpu_memory_utilization: [0.45, 0.9]   # vLLM fraction of GPU memory, in (0, 1]
    max_num_seqs: [64, 256]
    kv_cache_dtype: [auto, fp8]
    mps_shares: [50, 100]
    gpus: [1, 2]                # optional: GPUs per shape; needs a replica rule:
    parallel: replicas          # replicas (n engine replicas over the request list) or tensor (tensor_parallel_size n)
    throughput_floor: 1.0       # requests/s
    model: {weights_mib: 16000, kv_mib_per_seq: 128, requests_per_s: 12, concurrency_knee: 64}
    declared:
      gmu0.9-seqs256-kvfp8-mps100: {throughput: 14.0}

Shape names: training `mb<micro>-<precision>[-ckpt]-mps<share>` on one GPU and
`mb<micro>-<precision>[-ckpt]-gpus<n>` on n whole GPUs (n data-parallel ranks),
inference `gmu<fraction>-seqs<n>-kv<dtype>-mps<share>`, and `...-dp<n>` (replicas)
or `...-tp<n>` (tensor parallel) on n GPUs (see `shape_name`). A 1-GPU shape is an
MPS share of one GPU; an n-GPU shape holds n whole GPUs, spread evenly over at most
`max_nodes` nodes with at most `gpus_per_node` on each (`layout`).
The global batch is fixed unless the family opts in with `batch: {adaptive: true, min, max, lr_scaling}`
(goodput mode, `spec_batch`): its shapes may then run other global batches, with the learning rate scaled
and the work counted as statistical progress in steps of the submitted batch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_elastico.errors import ConfigError
from slurm_elastico.inputs import shorten
from slurm_elastico.runtime.split import largest_part, offered
from slurm_elastico.shapes.spec_batch import BatchRule, batch_rule_of, other_batch_name
from slurm_elastico.shapes.spec_text import _bound, _divisors, _some, _yaml_float
from slurm_elastico.shapes.spec_types import declared_name_problem, gpu_types_of

PRECISIONS = ("fp32", "bf16", "fp16")
KV_DTYPES = ("auto", "fp8")

PARALLEL_RULES = ("replicas", "tensor")
"""How an inference shape uses n GPUs: n engine replicas over the request list, or tensor_parallel_size n."""
PARALLEL_KNOB = {"replicas": "replicas", "tensor": "tensor_parallel_size"}
PARALLEL_SUFFIX = {"replicas": "dp", "tensor": "tp"}

COMMON_KEYS = ("kind", "name", "mps_shares", "gpus", "gpus_per_node", "max_nodes", "throughput_floor", "cpus",
               "host_mem_mib", "default", "model", "declared", "gpu_types")
TRAIN_KEYS = COMMON_KEYS + ("global_batch", "micro_batches", "precisions", "checkpointing", "steps", "batch")
INFER_KEYS = COMMON_KEYS + ("requests", "gpu_memory_utilization", "max_num_seqs", "kv_cache_dtype", "parallel")
TRAIN_MODEL_KEYS = ("params", "activation_mib_per_sample", "step_time_s", "micro_batch_knee", "allreduce_gib_s")
INFER_MODEL_KEYS = ("weights_mib", "kv_mib_per_seq", "requests_per_s", "concurrency_knee")
DECLARED_KEYS = ("throughput", "gpu_mem_mib")

# Bounds: far beyond any real job, so that an absurd value is a clear error instead of an overflow or a hang later.
MAX_CHOICES = 128
MAX_SHAPES = 4096
MAX_NAME = 128
MAX_CPUS = 4096
MAX_HOST_MEM_MIB = 64 * 1024 * 1024
MAX_BATCH = 2**20
MAX_WORK = 10**12
MAX_SEQS = 65536
MAX_GPUS = 4096
BIG = 1e15
"""The largest throughput, throughput floor or model hint (a number of parameters, say) accepted."""


@dataclass(frozen=True)
class Declared:
    """Numbers a user (or the profiler) measured for one shape; None = use the estimate."""

    throughput: float | None = None
    gpu_mem_mib: float | None = None


@dataclass(frozen=True)
class FamilySpec:
    """A validated family spec; `knobs` holds the per-kind choice lists, `model` the estimate hints."""

    source: str
    kind: str  # "train" or "infer"
    work: float  # steps or requests
    mps_shares: tuple[int, ...]
    throughput_floor: float
    knobs: dict[str, tuple[Any, ...]]
    name: str = ""
    cpus: int = 2
    host_mem_mib: int = 8192
    default: str | None = None
    model: dict[str, float] = field(default_factory=dict)
    declared: dict[str, Declared] = field(default_factory=dict)
    global_batch: int = 0
    gpus: tuple[int, ...] = (1,)
    """GPU counts of the shapes: 1 = an MPS share of one GPU, n > 1 = n whole GPUs (n ranks or replicas)."""
    gpus_per_node: int = 0
    """At most this many of one shape's GPUs on a node; 0 = not set (max(gpus): one node holds any shape)."""
    max_nodes: int = 0
    """At most this many nodes for one shape; 0 = no limit."""
    parallel: str = ""
    """Inference: how n GPUs are used (`PARALLEL_RULES`); "" for training and 1-GPU-only families."""
    gpu_types: tuple[str, ...] = ()
    """The GPU types the job may run on (`spec_types`); () = any."""
    batch: BatchRule | None = None
    """Training: the global batches the job may adapt to and its learning-rate rule (`spec_batch`); None = fixed."""

    @property
    def per_node_limit(self) -> int:
        """The most GPUs of one shape on one node."""
        return self.gpus_per_node or max(self.gpus)

    def shapes_of(self) -> list[tuple[dict[str, Any], int, int]]:
        """(knobs, MPS share, GPUs) of every shape of the cross product: one per share on 1 GPU, one per n > 1.

        Training knobs at n GPUs hold only combinations with micro_batch x accumulation x n = global_batch; at
        a count n that does not divide the batch (each rank computes its part, `runtime.split.rank_part`), every
        micro batch no larger than the largest part, its last piece shorter.
        """
        out = []
        for combo in itertools.product(*self.knobs.values()):
            knobs = dict(zip(self.knobs, combo))
            for n in self.gpus:
                if n == 1:
                    out.extend((knobs, share, 1) for share in self.mps_shares)
                elif self.kind != "train" or offered(self.global_batch, n, knobs["micro_batch"]):
                    out.append((knobs, 0, n))
        return out


def shape_name(kind: str, knobs: Mapping[str, Any], share: int, gpus: int = 1, parallel: str = "") -> str:
    """The stable, readable name of one shape (it is what `AdminComment` carries to the job).

    A 1-GPU shape ends in `-mps<share>` (the names before GPU counts existed); an n-GPU shape in `-gpus<n>`
    (training: n ranks) or `-dp<n>` / `-tp<n>` (inference replicas / tensor parallel, `parallel`).
    """
    if gpus > 1:
        tail = f"gpus{gpus}" if kind == "train" else f"{PARALLEL_SUFFIX[parallel]}{gpus}"
    else:
        tail = f"mps{share}"
    if kind == "train":
        ck = "-ckpt" if knobs["checkpointing"] else ""
        return f"mb{knobs['micro_batch']}-{knobs['precision']}{ck}-{tail}"
    return f"gmu{knobs['gpu_memory_utilization']:g}-seqs{knobs['max_num_seqs']}-kv{knobs['kv_cache_dtype']}-{tail}"


def layout(gpus: int, per_node: int, max_nodes: int = 0) -> tuple[int, int] | None:
    """(nodes, GPUs per node) for `gpus` GPUs spread evenly, on the fewest nodes; None when none fits.

    Even: every node holds the same count (`scontrol update Gres=gpu:P NumNodes=K-K`, `slurm.gpu_count`).
    """
    for nodes in range(1, (max_nodes or gpus) + 1):
        if gpus % nodes == 0 and gpus // nodes <= per_node:
            return nodes, gpus // nodes
    return None


class _Checker:
    """Collects problems with their key paths instead of stopping at the first."""

    def __init__(self, data: Mapping[str, Any]):
        self.data = data
        self.problems: list[str] = []

    def bad(self, key: str, msg: str) -> None:
        self.problems.append(f"{key}: {msg}")

    def number(self, key: str, *, required: bool, lo: float, integer: bool = False, hi: float | None = None,
               default: Any = None, data: Mapping[str, Any] | None = None, path: str | None = None,
               above: bool = False) -> Any:
        src = self.data if data is None else data
        path = path or key
        if key not in src:
            if required:
                self.bad(path, f"required; a{'n integer' if integer else ' number'} >= {lo:g}")
            return default
        v = _yaml_float(src[key]) if not integer else src[key]
        ok = isinstance(v, int) if integer else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok or (not integer and not math.isfinite(v)):
            self.bad(path, f"expected a{'n integer' if integer else ' number'}, got {v!r}")
            return default
        if v < lo or (above and v == lo) or (hi is not None and v > hi):
            low = f"{'>' if above else '>='} {_bound(lo)}"
            rng = low if hi is None else f"between {_bound(lo)} and {_bound(hi)}" if not above else f"{low} and <= {_bound(hi)}"
            self.bad(path, f"{v!r} is out of range; allowed: {rng}")
            return default
        return v

    def choices(self, key: str, *, allowed: tuple | None = None, integer: bool = False, lo: float = 0.0,
                hi: float | None = None, boolean: bool = False, above: bool = False) -> tuple:
        """A non-empty list of distinct choices, each checked; returns () when wrong."""
        if key not in self.data:
            self.bad(key, "required; a non-empty list")
            return ()
        v = self.data[key]
        if not isinstance(v, list) or not v:
            self.bad(key, f"expected a non-empty list, got {v!r}")
            return ()
        if len(v) > MAX_CHOICES:
            self.bad(key, f"{len(v)} choices; allowed: at most {MAX_CHOICES}")
            return ()
        out, ok = [], True
        for i, item in enumerate(v):
            where = f"{key}[{i}]"
            if allowed is not None:
                if item not in allowed or isinstance(item, bool) != isinstance(allowed[0], bool):
                    self.bad(where, f"{item!r} is not allowed; allowed: {', '.join(map(str, allowed))}")
                    ok = False
            elif boolean:
                if not isinstance(item, bool):
                    self.bad(where, f"expected true or false, got {item!r}")
                    ok = False
            else:
                good = isinstance(item, int) if integer else isinstance(item, (int, float))
                if isinstance(item, bool) or not good:
                    self.bad(where, f"expected a{'n integer' if integer else ' number'}, got {item!r}")
                    ok = False
                elif (item <= lo if above else item < lo) or (hi is not None and item > hi):
                    low = f"> {_bound(lo)}" if above else f">= {_bound(lo)}"
                    self.bad(where, f"{item!r} is out of range; allowed: {low}" + (f" and <= {_bound(hi)}" if hi is not None else ""))
                    ok = False
            out.append(item)
        if ok and len(set(out)) != len(out):
            twice = sorted({x for x in out if out.count(x) > 1}, key=out.index)
            self.bad(key, f"choices repeat: {shorten(twice)}; allowed: each choice once")
            ok = False
        return tuple(out) if ok else ()


def parse_spec(data: Any, source: str = "<family>") -> FamilySpec:
    """Validate a parsed YAML mapping into a `FamilySpec`, raising one `ConfigError` listing every problem."""
    if not isinstance(data, Mapping):
        raise ConfigError(source, [f"(top level): expected a mapping with a 'kind' key, got {type(data).__name__}"])
    c = _Checker(data)
    kind = data.get("kind")
    if kind not in ("train", "infer"):
        c.bad("kind", f"{kind!r} is not allowed; allowed: train, infer")
        raise ConfigError(source, c.problems)
    allowed_keys = TRAIN_KEYS if kind == "train" else INFER_KEYS
    for key in data:
        if key not in allowed_keys and key != "batch":  # `batch` on an inference family: its own message below
            hint = (" (a family keeps the global batch fixed unless it opts in with "
                    "batch: {adaptive: true, min: ..., max: ...})") if "batch" in str(key) else ""
            c.bad(str(key), f"unknown key for kind {kind}{hint}; allowed: {', '.join(allowed_keys)}")

    gpus, per_node, max_nodes, parallel = _gpu_counts(c, kind)
    gpu_types = gpu_types_of(data, c.bad)
    shares: tuple = ()
    if 1 in gpus or not gpus:
        shares = c.choices("mps_shares", integer=True, lo=1, hi=100)
    elif "mps_shares" in data:
        c.bad("mps_shares", f"only a 1-GPU shape takes an MPS share, and gpus {list(gpus)} lists no 1; "
                            "allowed: add 1 to gpus, or drop mps_shares")
    floor = c.number("throughput_floor", required=False, lo=0.0, hi=BIG, default=0.0)
    cpus = c.number("cpus", required=False, lo=1, hi=MAX_CPUS, integer=True, default=2)
    host = c.number("host_mem_mib", required=False, lo=0, hi=MAX_HOST_MEM_MIB, integer=True, default=8192)
    name = data.get("name", "")
    if not isinstance(name, str):
        c.bad("name", f"expected a string, got {name!r}")
        name = ""
    elif len(name) > MAX_NAME:
        c.bad("name", f"{len(name)} characters; allowed: at most {MAX_NAME}")
        name = ""

    knobs: dict[str, tuple] = {}
    global_batch = 0
    if kind == "train":
        global_batch = c.number("global_batch", required=True, lo=1, hi=MAX_BATCH, integer=True, default=0)
    batch_rule = batch_rule_of(data, kind, global_batch, c.bad)
    if kind == "train":
        work = c.number("steps", required=True, lo=1, hi=MAX_WORK, integer=True, default=1)
        micro = c.choices("micro_batches", integer=True, lo=1, hi=MAX_BATCH)
        if global_batch and micro:
            wrong = [m for m in micro if global_batch % m]
            if wrong:
                c.bad("micro_batches", f"{wrong} do not divide global_batch {global_batch}; "
                                       f"allowed: divisors of it ({_divisors(global_batch)})")
                micro = ()
        if global_batch and micro and gpus:
            if _batch_problems(c, global_batch, micro, gpus):
                gpus = ()
        knobs = {
            "micro_batch": micro,
            "precision": c.choices("precisions", allowed=PRECISIONS),
            "checkpointing": c.choices("checkpointing", boolean=True),
        }
        model_keys = TRAIN_MODEL_KEYS
    else:
        work = c.number("requests", required=True, lo=1, hi=MAX_WORK, integer=True, default=1)
        knobs = {
            "gpu_memory_utilization": c.choices("gpu_memory_utilization", lo=0.0, hi=1.0, above=True),
            "max_num_seqs": c.choices("max_num_seqs", integer=True, lo=1, hi=MAX_SEQS),
            "kv_cache_dtype": c.choices("kv_cache_dtype", allowed=KV_DTYPES),
        }
        model_keys = INFER_MODEL_KEYS

    model: dict[str, float] = {}
    hints = data.get("model", {})
    if not isinstance(hints, Mapping):
        c.bad("model", f"expected a mapping of hints ({', '.join(model_keys)}), got {hints!r}")
    else:
        for key in hints:
            if key not in model_keys:
                c.bad(f"model.{key}", f"unknown hint for kind {kind}; allowed: {', '.join(model_keys)}")
                continue
            v = c.number(key, required=False, lo=0.0, hi=BIG, above=True, data=hints, path=f"model.{key}")
            if v is not None:
                model[key] = float(v)

    names = set()
    ready = all(knobs.values()) and gpus and (shares or 1 not in gpus)
    if ready:
        count = math.prod(len(k) for k in knobs.values()) * (len(shares) + sum(1 for n in gpus if n > 1))
        count *= 1 + (len(batch_rule.batches(global_batch)) if batch_rule is not None else 0)  # other batches too
        if count > MAX_SHAPES:
            c.bad("(top level)", f"the choices make {count} shapes; allowed: at most {MAX_SHAPES} (list fewer choices)")
            ready = False
    if ready:
        draft = FamilySpec(source=source, kind=kind, work=1.0, mps_shares=tuple(shares), throughput_floor=0.0,
                           knobs=knobs, global_batch=global_batch, gpus=gpus, parallel=parallel)
        names = {shape_name(kind, k, share, n, parallel) for k, share, n in draft.shapes_of()}
        if batch_rule is not None:  # the shapes at other global batches may be declared too (`enumerate`)
            names |= {other_batch_name(b, n) for b in batch_rule.batches(global_batch) for n in names}

    declared: dict[str, Declared] = {}
    raw = data.get("declared", {})
    if not isinstance(raw, Mapping):
        c.bad("declared", f"expected a mapping of shape name -> {{{', '.join(DECLARED_KEYS)}}}, got {raw!r}")
    else:
        for sname, numbers in raw.items():
            path = f"declared.{sname}"
            why = declared_name_problem(sname, names, gpu_types)
            if why:
                c.bad(path, f"{why}; allowed: {_some(names)} (each may end in @<gpu type>)")
                continue
            if not isinstance(numbers, Mapping) or not numbers:
                c.bad(path, f"expected a mapping with any of {', '.join(DECLARED_KEYS)}, got {numbers!r}")
                continue
            vals = {}
            for key, v in numbers.items():
                if key not in DECLARED_KEYS:
                    c.bad(f"{path}.{key}", f"unknown key; allowed: {', '.join(DECLARED_KEYS)}")
                    continue
                got = c.number(key, required=False, lo=0.0, hi=BIG, above=True, data=numbers, path=f"{path}.{key}")
                if got is not None:
                    vals[key] = float(got)
            declared[sname] = Declared(**vals)

    default = data.get("default")
    if default is not None and (not isinstance(default, str) or (names and default not in names)):
        c.bad("default", f"{default!r} is not a shape of this family; allowed: {_some(names)}")
        default = None

    if c.problems:
        raise ConfigError(source, c.problems)
    return FamilySpec(source=source, kind=kind, work=float(work), mps_shares=tuple(sorted(shares)),
                      throughput_floor=float(floor), knobs=knobs, name=name, cpus=cpus, host_mem_mib=host,
                      default=default, model=model, declared=declared, global_batch=global_batch,
                      gpus=tuple(sorted(gpus)), gpus_per_node=per_node, max_nodes=max_nodes, parallel=parallel,
                      gpu_types=gpu_types, batch=batch_rule)


def _gpu_counts(c: _Checker, kind: str) -> tuple[tuple[int, ...], int, int, str]:
    """`gpus`, `gpus_per_node`, `max_nodes` and (inference) `parallel`, checked together; gpus () when wrong."""
    data = c.data
    gpus: tuple[int, ...] = c.choices("gpus", integer=True, lo=1, hi=MAX_GPUS) if "gpus" in data else (1,)
    per_node = c.number("gpus_per_node", required=False, lo=1, hi=MAX_GPUS, integer=True, default=0)
    max_nodes = c.number("max_nodes", required=False, lo=1, hi=MAX_GPUS, integer=True, default=0)
    parallel = ""
    if kind == "infer":
        parallel = data.get("parallel", "")
        if "parallel" in data and parallel not in PARALLEL_RULES:
            c.bad("parallel", f"{parallel!r} is not allowed; allowed: {', '.join(PARALLEL_RULES)}")
            parallel, gpus = "", ()
        elif "parallel" not in data and "gpus" in data:
            c.bad("gpus", "an inference family that lists GPU counts needs a replica rule: "
                          "parallel: replicas (n engine replicas over the request list) or "
                          "parallel: tensor (tensor_parallel_size n); allowed: " + ", ".join(PARALLEL_RULES))
            gpus = ()
        elif "parallel" in data and "gpus" not in data:
            c.bad("parallel", "a replica rule without gpus has nothing to do; allowed: add gpus: [1, 2, ...]")
    if gpus and per_node:
        unfit = [n for n in gpus if layout(n, per_node, max_nodes) is None]
        if unfit:
            where = f"on at most {max_nodes} node(s) " if max_nodes else ""
            c.bad("gpus", f"{unfit} cannot be spread evenly {where}with at most gpus_per_node={per_node} per node; "
                          f"allowed: counts n = nodes x per-node with per-node <= {per_node}"
                          + (f" and nodes <= {max_nodes}" if max_nodes else ""))
            gpus = ()
    return gpus, per_node, max_nodes, parallel


def _batch_problems(c: _Checker, global_batch: int, micro: tuple[int, ...], gpus: tuple[int, ...]) -> bool:
    """Every rank count needs a micro batch that splits each rank's part (`runtime.split.offered`)."""
    found = False
    for n in gpus:
        if n > global_batch:
            c.bad("gpus", f"{n} ranks for global_batch {global_batch} leave a rank without samples; allowed: at most "
                          f"{global_batch} ranks")
            found = True
        elif not any(offered(global_batch, n, m) for m in micro):
            part = largest_part(global_batch, n)
            c.bad("gpus", f"{n} ranks compute {part} samples each a step, and no micro batch of {list(micro)} "
                          f"divides {part}; allowed: a micro batch dividing it ({_divisors(part)}), or fewer ranks"
                  if global_batch % n == 0 else
                  f"{n} ranks compute at most {part} samples each a step, and every micro batch of {list(micro)} "
                  f"is larger; allowed: a micro batch of at most {part}, or fewer ranks")
            found = True
    return found
