"""Parsed records to the model's views: nodes with per-GPU users, and partitions (pure).

The gateway's `snapshot()` parses one squeue and one node listing
(`jobs.parse_squeue`, `nodes.parse_sinfo`) and assembles them here. Per-GPU
use comes from the jobs' `gpu_alloc`, never from a node's `gres_used`, which
22.05 prints wrong for MPS ("mps:(null):1(IDX:0)").
"""

from __future__ import annotations

from collections.abc import Iterable

from slurm_elastico.model import MPS_SHARES_PER_GPU, GpuUse, GpuView, JobView, NodeView, PartitionView
from slurm_elastico.slurm.nodes import NodeRecord

__all__ = ["build_nodes", "partitions_from"]


def build_nodes(
    records: Iterable[NodeRecord],
    jobs: Iterable[JobView],
    shares_per_gpu: int = MPS_SHARES_PER_GPU,
    gpu_memory_mib: int = 0,
) -> tuple[NodeView, ...]:
    """Nodes with per-GPU users, from node records and the active jobs' `gpu_alloc`.

    Each GPU's MPS total is the node's MPS count over its GPU count (Slurm
    splits `Count` evenly; a remainder is dropped), or `shares_per_gpu` when
    the node has no MPS. A GPU held by a `gpu:N` job is a whole user even when
    MPS jobs share it (22.05 allows that). Holds on GPUs or nodes the records
    do not have (squeue and sinfo run moments apart) are left out.
    """
    holds: dict[tuple[str, int], list[GpuUse]] = {}
    for job in jobs:
        if not job.state.active:
            continue
        for node, index, shares in job.gpu_alloc:
            use = GpuUse(job.job_id, shares, whole=shares == 0)
            holds.setdefault((node, index), []).append(use)
    out = []
    for r in records:
        per_gpu = r.mps_total // r.gpus if r.gpus and r.mps_total else shares_per_gpu
        gpus = tuple(
            GpuView(node=r.name, index=i, shares_total=per_gpu, users=tuple(holds.get((r.name, i), ())))
            for i in range(r.gpus)
        )
        out.append(
            NodeView(
                name=r.name,
                state=r.state,
                partitions=r.partitions,
                cpus=r.cpus,
                cpus_alloc=r.alloc_cpus,
                memory_mib=r.real_memory,
                memory_alloc_mib=r.alloc_memory,
                gpus=gpus,
                gpu_memory_mib=gpu_memory_mib,
            )
        )
    return tuple(out)


def partitions_from(records: Iterable[NodeRecord]) -> tuple[PartitionView, ...]:
    """Partitions in first-seen order with their nodes; state "UP" unless a 24.11 group said otherwise."""
    nodes: dict[str, list[str]] = {}
    states: dict[str, str] = {}
    for r in records:
        for p in r.partitions:
            nodes.setdefault(p, [])
            if r.name not in nodes[p]:
                nodes[p].append(r.name)
        for p, s in r.partition_states:
            if s:
                states[p] = s
    return tuple(PartitionView(name=p, nodes=tuple(ns), state=states.get(p, "UP")) for p, ns in nodes.items())
