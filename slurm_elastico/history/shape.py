"""The cluster's own shape, as the replay needs it (pure): its GPU nodes, their GPUs, type, CPUs and memory.

Read from one `Snapshot` (`slurm.gateway.SlurmGateway.snapshot`: sinfo and
scontrol through the parsers of every supported Slurm), so the replay runs on
the nodes Slurm has now, each in the partitions it is in now. A node without
GPUs is left out (a GPU job never runs there); with a partition, only that
partition's nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import MPS_SHARES_PER_GPU, Snapshot, partition_names
from slurm_elastico.planner.partitions import node_sets


@dataclass(frozen=True)
class NodeShape:
    name: str
    gpus: int
    gpu_type: str  # "" when its gres names no type
    cpus: int
    mem_mib: int
    partitions: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterShape:
    nodes: tuple[NodeShape, ...]
    shares_per_gpu: int = MPS_SHARES_PER_GPU
    slurm_version: str = ""
    partition: str = ""

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def partitioned(self) -> bool:
        """Whether each job runs in its own partitions here: the shape is the whole cluster's (no `partition`) and
        its nodes name their partitions (a shape built by hand may not)."""
        return not self.partition and any(n.partitions for n in self.nodes)

    def partition_of(self, field: str) -> str:
        """The partition field a past job runs under here: its own (`-p a,b`: any of them) when `partitioned`, else
        "" (any node)."""
        return field if self.partitioned else ""

    def nodes_for(self, field: str, gpu_type: str = "") -> list[list[NodeShape]]:
        """The nodes a job of partition field `field` (as `partition_of` gives it) and GPU type may start on, one
        list per partition it names, in name order (a job runs within one); one list of every node for a field
        naming none. Lists with no node are left out."""
        sets = node_sets(field, [n.partitions for n in self.nodes]) if partition_names(field) else [
            frozenset(range(len(self.nodes)))]
        groups = ([n for i, n in enumerate(self.nodes) if i in s and (not gpu_type or n.gpu_type == gpu_type)]
                  for s in sets)
        return [g for g in groups if g]

    def describe(self) -> str:
        """'2 nodes x 4 GPUs (a100), 1 node x 8 GPUs': one group per (GPUs, type); then, where the jobs run in
        their own partitions and there are several, each partition's GPUs: '; partitions a100p (8 GPUs), t4p (8)'."""
        groups: dict[tuple[int, str], int] = {}
        for n in self.nodes:
            groups[(n.gpus, n.gpu_type)] = groups.get((n.gpus, n.gpu_type), 0) + 1
        out = ", ".join(f"{k} node{'s' if k > 1 else ''} x {g} GPUs" + (f" ({t})" if t else "")
                        for (g, t), k in groups.items())
        names = sorted({p for n in self.nodes for p in n.partitions}) if self.partitioned else []
        if len(names) > 1:
            gpus = [sum(n.gpus for n in self.nodes if p in n.partitions) for p in names]
            out += "; partitions " + ", ".join(f"{p} ({g}" + (" GPUs)" if i == 0 else ")")
                                               for i, (p, g) in enumerate(zip(names, gpus)))
        return out


def from_snapshot(snapshot: Snapshot, partition: str = "", shares_per_gpu: int = MPS_SHARES_PER_GPU) -> ClusterShape:
    """The GPU nodes of the snapshot (of `partition` when given); `ConfigError` when there are none, naming the
    partitions that have some."""
    nodes = tuple(NodeShape(n.name, len(n.gpus), n.gpu_type, n.cpus, n.memory_mib, n.partitions) for n in snapshot.nodes
                  if n.gpus and (not partition or partition in n.partitions))
    if not nodes:
        have = sorted({p for n in snapshot.nodes if n.gpus for p in n.partitions})
        where = f"partition {partition!r}" if partition else "the cluster"
        raise ConfigError("cluster shape", [f"{where} has no node with GPUs; partitions with GPU nodes: "
                                            f"{', '.join(have) or 'none'}"])
    return ClusterShape(nodes, shares_per_gpu, snapshot.slurm_version, partition)
