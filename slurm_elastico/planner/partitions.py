"""Which jobs the helper plans and where each may run: the partitions a job was submitted to.

A job names one partition, or several (`sbatch -p a100,t4`: Slurm starts it in
whichever can first), and runs only on nodes of those. Clusters often have one
partition per GPU type, so a helper that manages every partition
(`slurm.partition` empty) must keep each job on its own partitions' nodes:
Slurm accepts a `NodeList=` outside them, and the job then never starts (the
gateway refuses only a GPU type its partitions lack, before any update:
`slurm.gpu_count.plan_update`). Pure: names and node lists in, sets out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurm_elastico.model import JobView, NodeView, partition_names


def managed(job: JobView, part: str) -> bool:
    """Whether a helper managing partition `part` ("" = every partition) plans `job`: one of its partitions is
    `part`."""
    return not part or part in partition_names(job.partition)


def allowed_nodes(job: JobView, nodes: Sequence[NodeView]) -> frozenset[int] | None:
    """Indices in `nodes` of the nodes of `job`'s partitions; None when that is every one of them (or the job names
    no partition), the common case, which then costs the searches nothing."""
    mine = partition_names(job.partition)
    if not mine:
        return None
    ok = frozenset(i for i, n in enumerate(nodes) if mine.intersection(n.partitions))
    return None if len(ok) == len(nodes) else ok


def node_sets(field: str, partitions_of_nodes: Sequence[Sequence[str]]) -> list[frozenset[int]]:
    """Indices of the nodes (given by the partitions each is in) of each partition a job's partition field names,
    in name order, those with no node left out: Slurm starts a job within one of them. [] for a field that names
    none."""
    sets = (frozenset(i for i, ps in enumerate(partitions_of_nodes) if p in ps)
            for p in sorted(partition_names(field)))
    return [s for s in sets if s]


def outside(job: JobView | None, names_of_nodes: Sequence[str], nodes: Mapping[str, NodeView]) -> list[str]:
    """Those of `names_of_nodes` that are in none of `job`'s partitions (nodes the snapshot lacks are Slurm's to
    refuse); [] for a job that names no partition, or is not in the snapshot."""
    mine = partition_names(job.partition) if job is not None else frozenset()
    return [n for n in names_of_nodes if mine and n in nodes and not mine.intersection(nodes[n].partitions)]
