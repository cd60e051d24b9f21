"""A job in the simulation: its trace row, its request as Slurm holds it, where it runs and what it has done.

`SimJob` is mutable, on purpose: the cluster (`sim.cluster`, its scheduler and
gateway) changes its state, request and GPUs; the engine (`sim.engine`) its
progress accounting. Nothing else writes it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from slurm_elastico.model import Family, GresRequest, JobState, Shape
from slurm_elastico.shapes.current import running_shape
from slurm_elastico.sim.trace import TraceJob


@dataclass
class SimJob:
    """One job's whole life in the simulation (mutable; only this module and the engine change it)."""

    trace: TraceJob
    family: Family | None
    gres: GresRequest
    cpus: int
    mem_mib: int
    state: JobState = JobState.PENDING
    held: bool = False
    begin: float = 0.0
    pin: tuple[str, ...] = ()
    """Node names the job must run on (NodeList=); an `mps` job uses only the first."""
    per_node: bool = False
    """A gang asked as `Gres=gpu:P NumNodes=K-K` (`commands.set_gpu_count`): P = N / K GPUs on each of its K
    pinned nodes (one node when unpinned). False: `gpus:N` for the job as submitted (`--gpus=N`), which Slurm
    may spread unevenly."""
    comment: str = ""
    reach: tuple[frozenset[int], ...] | None = None
    """Indices of the nodes of each partition the job was submitted to (`TraceJob.partition`), in name order:
    Slurm starts it within one of them. None: any node (it names none, or they hold every node). Set at submit
    (`SimCluster.submit`)."""
    within: frozenset[int] | None = None
    """The nodes of all of them together (None: any node): where a job on one node may start."""
    # while running
    alloc: tuple[tuple[int, int], ...] = ()
    """(node index, GPU index) of every GPU the job holds, in node then GPU order."""
    share: int = 0
    """MPS shares it holds on each of its GPUs (all of them when it holds them whole)."""
    shape: str = ""
    shape_since: float = -1.0
    """When it began to run `shape` (its start, or the switch to it): what it measures there is from then on."""
    context_since: float = -1.0
    """When who shares its GPUs last changed (the engine's `_settle`): the live observer starts a new interval
    then, so a solo speed counts from here too."""
    start: float = -1.0
    # progress accounting (the engine's)
    done: float = 0.0
    rate: float = 0.0
    mark: float = 0.0
    ready_at: float = 0.0
    version: int = 0
    # outcomes
    first_start: float = -1.0
    end: float = -1.0
    restarts: int = 0  # requeues, as Slurm counts them
    relaunches: int = 0  # in-place relaunches at a new shape (USR1)
    starts: int = 0

    @property
    def job_id(self) -> int:
        return self.trace.job_id

    @property
    def whole(self) -> bool:
        """Whether the job asks for whole GPUs (a `gpus:N` gang) rather than an MPS share."""
        return self.gres.kind == "gpus"

    @property
    def placement(self) -> tuple[int, ...]:
        """GPUs it holds on each of its nodes, most first (e.g. (4, 2)); () when not running."""
        return tuple(sorted(Counter(ni for ni, _ in self.alloc).values(), reverse=True))

    @property
    def node_indices(self) -> tuple[int, ...]:
        """Its nodes, in index order."""
        return tuple(sorted({ni for ni, _ in self.alloc}))

    def family_shape(self, name: str) -> Shape:
        """The family's shape of that name (a job with a family)."""
        assert self.family is not None
        return next(s for s in self.family.shapes if s.name == name)

    def shape_name(self, shares_per_gpu: int) -> str:
        """The shape the job runs as when it starts: the rule elastico-run follows (`shapes.current.running_shape`)."""
        if self.family is None:
            return ""
        held = self.gres.count if self.gres.kind == "mps" else None  # the share it starts with, in Slurm's counts
        return running_shape(self.family.shapes, self.family.default_shape, self.comment, held, shares_per_gpu)[0].name
