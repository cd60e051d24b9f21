"""The words every part of slurm-elastico speaks: typed, frozen dataclasses.

Why frozen: the planner, pricing and interference code are pure functions of a
`Snapshot`; immutability is what lets the live helper and the simulator hand
the same objects to the same code without defensive copies.

The Slurm side (`GpuView`, `NodeView`, `PartitionView`, `JobView`,
`Snapshot`) describes the cluster as one `squeue`/`sinfo` pair saw it. The
planner side (`Resources`, `Shape`, `Family`, `Action`, `Plan`) describes what
a job could run as and what the helper decides.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

MPS_SHARES_PER_GPU = 100
"""MPS shares of one GPU: the local cluster and the planner count in percent."""


# --------------------------------------------------------------------------
# What Slurm shows
# --------------------------------------------------------------------------


class JobState(str, enum.Enum):
    """Base job states the helper cares about; anything else is OTHER."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    OTHER = "OTHER"

    @classmethod
    def parse(cls, text: str) -> "JobState":
        try:
            return cls(text.upper())
        except ValueError:
            return cls.OTHER

    @property
    def active(self) -> bool:
        return self in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING)


@dataclass(frozen=True)
class GresRequest:
    """What a job asked for: per node `mps:N` (percent of one GPU) or `gpu:N` (whole GPUs), or `gpus:N`,
    N whole GPUs for the whole job on as many nodes as it takes (Slurm's `--gpus=N`, a data-parallel gang)."""

    kind: str  # "mps", "gpu" or "gpus"
    count: int
    gpu_type: str = ""
    """The GPU type asked for (`gpu:a100:2`); "" when the request names none (any type)."""

    def __post_init__(self) -> None:
        if self.kind not in ("mps", "gpu", "gpus"):
            raise ValueError(f"GRES kind must be 'mps', 'gpu' or 'gpus', not {self.kind!r}")
        if self.count < 0:
            raise ValueError(f"GRES count must be >= 0, not {self.count}")

    def __str__(self) -> str:
        return f"{self.kind}:{self.gpu_type}:{self.count}" if self.gpu_type else f"{self.kind}:{self.count}"


@dataclass(frozen=True)
class GpuUse:
    """One job's hold on one GPU: MPS shares, or the whole GPU (`whole=True`)."""

    job_id: int
    shares: int
    whole: bool = False


@dataclass(frozen=True)
class GpuView:
    """One GPU of a node, with who uses it.

    `shares_used` counts MPS shares; a GPU held whole by a `gpu:N` job has
    `held_whole=True` and counts as fully used, whatever its MPS count says
    (22.05 lets MPS and whole-GPU jobs overlap; the planner must not add to it).
    """

    node: str
    index: int
    shares_total: int = MPS_SHARES_PER_GPU
    users: tuple[GpuUse, ...] = ()

    @property
    def held_whole(self) -> bool:
        return any(u.whole for u in self.users)

    @property
    def shares_used(self) -> int:
        if self.held_whole:
            return self.shares_total
        return sum(u.shares for u in self.users)

    @property
    def shares_free(self) -> int:
        return max(0, self.shares_total - self.shares_used)

    @property
    def job_ids(self) -> tuple[int, ...]:
        return tuple(u.job_id for u in self.users)


@dataclass(frozen=True)
class NodeView:
    name: str
    state: str  # lower case as sinfo prints it: idle, mixed, allocated, down, drain, ...
    partitions: tuple[str, ...]
    cpus: int
    cpus_alloc: int
    memory_mib: int
    memory_alloc_mib: int
    gpus: tuple[GpuView, ...] = ()
    gpu_memory_mib: int = 0
    """Memory of each GPU; Slurm does not know it, so it comes from settings (per type: `gpu.types`)."""
    gpu_type: str = ""
    """The type of the node's GPUs from its gres (`gpu:a100:4` → "a100"); "" when the gres names no type.
    A node's GPUs are of one type: Slurm lets a node mix types, the planner treats such a node by its first."""

    @property
    def usable(self) -> bool:
        """A node the planner may place on: up and not draining."""
        bad = ("down", "drain", "drained", "draining", "fail", "failing", "future", "maint", "not_responding", "unknown")
        return not any(word in self.state for word in bad)

    @property
    def mps_total(self) -> int:
        return sum(g.shares_total for g in self.gpus)

    @property
    def mps_used(self) -> int:
        return sum(g.shares_used for g in self.gpus)


@dataclass(frozen=True)
class PartitionView:
    name: str
    nodes: tuple[str, ...]
    state: str = "UP"


def partition_names(field: str) -> frozenset[str]:
    """The partitions a job's partition field names: Slurm lists every one a job was submitted to
    (`-p a100,t4` → {a100, t4}); "" names none."""
    return frozenset(p for p in (s.strip() for s in field.split(",")) if p)


@dataclass(frozen=True)
class JobView:
    """One job as squeue shows it, flattened to what planning needs.

    Times are Unix seconds (None when Slurm has none). `gpu_indices` are the
    GPU indices on `node` the job holds (from `gres_detail`); `gres` is what it
    asked for per node. `held` is true for a job held by user or admin.
    """

    job_id: int
    name: str
    user: str
    partition: str
    state: JobState
    reason: str = ""
    held: bool = False
    gres: GresRequest | None = None
    nodes: tuple[str, ...] = ()
    gpu_indices: tuple[int, ...] = ()
    cpus: int = 1
    memory_mib: int = 0
    submit_time: int | None = None
    start_time: int | None = None
    end_time: int | None = None
    time_limit_s: int | None = None
    restarts: int = 0
    priority: int = 0
    requeue: bool = False
    comment: str = ""
    admin_comment: str = ""
    gpu_alloc: tuple[tuple[str, int, int], ...] = ()
    """(node, GPU index, MPS shares) for every GPU the job holds on every node; shares 0 = held whole."""
    work_dir: str = ""
    """The job's working directory (where elastico-run puts its progress report, see `runtime.progress`)."""

    @property
    def mps_share(self) -> int:
        """MPS shares per node the job asked for (0 when it asked for none)."""
        return self.gres.count if self.gres is not None and self.gres.kind == "mps" else 0

    @property
    def whole_gpus(self) -> int:
        return self.gres.count if self.gres is not None and self.gres.kind == "gpu" else 0

    @property
    def node(self) -> str | None:
        return self.nodes[0] if self.nodes else None


@dataclass(frozen=True)
class Snapshot:
    """The cluster at one instant, from one squeue and one sinfo call."""

    taken_at: float
    slurm_version: str
    nodes: tuple[NodeView, ...]
    jobs: tuple[JobView, ...]
    partitions: tuple[PartitionView, ...] = ()
    even_gangs: bool = True
    """A gang holds the same number of GPUs on each of its nodes (what Slurm's `Gres=gpu:P NumNodes=K-K` can be
    asked for). Only the simulator's calibration cluster (`SimSettings.even_gangs` false) says otherwise."""

    def job(self, job_id: int) -> JobView:
        for j in self.jobs:
            if j.job_id == job_id:
                return j
        raise KeyError(f"job {job_id} is not in the snapshot")

    def node(self, name: str) -> NodeView:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"node {name!r} is not in the snapshot")

    @property
    def pending(self) -> tuple[JobView, ...]:
        return tuple(j for j in self.jobs if j.state is JobState.PENDING)

    @property
    def running(self) -> tuple[JobView, ...]:
        return tuple(j for j in self.jobs if j.state is JobState.RUNNING)

    @property
    def gpus(self) -> tuple[GpuView, ...]:
        return tuple(g for n in self.nodes for g in n.gpus)


# --------------------------------------------------------------------------
# What the planner decides
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """A shape's demand: an MPS share of one GPU (`mps`, percent), or `gpus` whole GPUs on any nodes.

    A single-GPU shape has `gpus` 0 and its share in `mps`; a data-parallel
    shape of n ranks has `gpus` n (one whole GPU per rank) and `mps` 0.
    `gpu_mem_mib` is per GPU; `cpus` and `host_mem_mib` are for the whole job.
    """

    mps: int = 0
    gpu_mem_mib: int = 0
    cpus: int = 0
    host_mem_mib: int = 0
    gpus: int = 0

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.mps, self.gpu_mem_mib, self.cpus, self.host_mem_mib)

    def footprint(self) -> tuple[float, int, int, int]:
        """What the shape holds in all, comparable across share and multi-GPU shapes: GPUs, GPU memory, CPUs, host memory."""
        return (self.gpu_size, self.gpu_mem_mib * max(1, self.gpus), self.cpus, self.host_mem_mib)

    @property
    def gpu_size(self) -> float:
        """How much GPU the shape holds, in GPUs: n for n whole GPUs, the share ÷ 100 for a share of one."""
        return float(self.gpus) if self.gpus else self.mps / MPS_SHARES_PER_GPU


@dataclass(frozen=True)
class Counters:
    """NVML counters of a job running one shape alone on its GPU: utilisation in [0, 1], MiB, W; NaN = not measured."""

    sm_util: float = math.nan
    membw_util: float = math.nan
    mem_used_mib: float = math.nan
    power_w: float = math.nan


@dataclass(frozen=True)
class Shape:
    """One equivalent configuration of a job and what it costs and yields.

    `knobs` are the settings the job runs with (micro_batch, accumulation,
    precision, checkpointing; or vLLM engine arguments), as sorted
    (name, value) pairs so the shape stays hashable. `throughput` is work units
    per second (optimizer steps or requests) at this shape, running alone.
    `measured` holds the counters this job showed running the shape alone,
    when the helper has them (`slurm_elastico.helper.observe`); None: not measured.
    """

    name: str
    resources: Resources
    throughput: float
    knobs: tuple[tuple[str, object], ...] = ()
    measured: Counters | None = None
    gpu_type: str = ""
    """The GPU type this shape runs on, with the throughput it has there; "" = any type (a one-type cluster)."""
    throughput_sigma: float = 0.0
    """Relative uncertainty (sigma of the log) of `throughput` where it is estimated from another GPU type
    (`shapes.type_speed`); 0 = measured, declared, or a one-type cluster. A planner may discount by it."""

    def knob(self, name: str, default: object = None) -> object:
        for k, v in self.knobs:
            if k == name:
                return v
        return default


@dataclass(frozen=True)
class Family:
    """A job's equivalent shapes: the same work (`total_work` units) done any of these ways."""

    kind: str  # "train" or "infer"
    shapes: tuple[Shape, ...]
    total_work: float
    throughput_floor: float = 0.0
    """`L_j`: a shape (or co-location) slower than this is never chosen."""
    name: str = ""
    """What the job runs (a model name); an interference feature, nothing more."""
    default: str | None = None
    """The shape the job runs as when nobody plans it (static baseline); None = the fastest at the most GPU."""

    def shape(self, name: str) -> Shape:
        for s in self.shapes:
            if s.name == name:
                return s
        raise KeyError(f"no shape {name!r} in this family")

    @property
    def default_shape(self) -> Shape:
        if self.default is not None:
            return self.shape(self.default)
        top = max(s.resources.gpu_size for s in self.shapes)
        return max((s for s in self.shapes if s.resources.gpu_size == top), key=lambda s: s.throughput)


class ActionKind(str, enum.Enum):
    SET_SHARE = "set_share"  # pending/held job: Gres=mps:N
    SET_GPUS = "set_gpus"  # pending/held job: N whole GPUs for the job (a data-parallel gang), NodeList=
    SET_NODES = "set_nodes"  # pending/held job: NodeList=
    RESHAPE_RUNNING = "reshape_running"  # signal, requeuehold, update, StartTime=now, release
    SIGNAL = "signal"
    SET_ADMIN_COMMENT = "set_admin_comment"
    START_NOW = "start_now"  # pending job held back only by its BeginTime (elastico-submit's placement window)
    PREEMPT = "preempt"  # running job: requeuehold, request unchanged; it stays pending HELD (Slurm will not restart it)
    RESUME = "resume"  # a job the policy held: NodeList= (when `nodes`), StartTime=now, release


@dataclass(frozen=True)
class Action:
    """One thing the helper will do to one job, with a reason a person can read."""

    kind: ActionKind
    job_id: int
    reason: str
    share: int | None = None
    gpus: int | None = None
    """Whole GPUs for the job (SET_GPUS, or a RESHAPE_RUNNING to a data-parallel shape); None: a share."""
    nodes: tuple[str, ...] = ()
    shape: str | None = None
    signal: str | None = None
    text: str | None = None
    gpu_type: str = ""
    """The GPU type the job is placed on or moved to (SET_GPUS, SET_SHARE, RESHAPE_RUNNING → `gpu:TYPE:N`);
    "" = the request names no type."""


@dataclass(frozen=True)
class Placement:
    """Where the planner puts one job this epoch: a GPU of a node, a share of it, a shape.

    Slurm itself picks the GPU within the node; `gpu` is the planner's belief,
    kept for the simulator, reports and capacity checks.
    """

    job_id: int
    node: str
    gpu: int
    shape: str
    share: int
    throughput: float
    """Predicted co-located throughput (solo throughput / slowdown)."""


@dataclass(frozen=True)
class Plan:
    """The result of one epoch: the actions, and what the planner believes they yield."""

    actions: tuple[Action, ...] = ()
    objective: float = 0.0
    notes: tuple[str, ...] = field(default=())
    placements: tuple[Placement, ...] = ()
    """Every family job the plan runs (started, reshaped or kept), in job-id order."""
    prices: tuple[float, ...] = ()
    """Final shadow price per resource (mps, gpu memory, cpus, host memory), in GPU equivalents."""
