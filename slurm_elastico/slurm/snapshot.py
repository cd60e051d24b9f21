"""Parsed records to the model's views: nodes with per-GPU users, and partitions (pure).

The gateway's `snapshot()` parses one squeue and one node listing
(`jobs.parse_squeue`, `nodes.parse_sinfo`) and assembles them here. Per-GPU
use comes from the jobs' `gpu_alloc`, never from a node's `gres_used`, which
22.05 prints wrong for MPS ("mps:(null):1(IDX:0)").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import MPS_SHARES_PER_GPU, GpuUse, GpuView, JobView, NodeView, PartitionView
from slurm_elastico.slurm.nodes import NodeRecord

__all__ = ["build_nodes", "node_gpu_memory", "partitions_from"]


def node_gpu_memory(record: NodeRecord, gpu_memory_mib: int, type_memory: Mapping[str, int]) -> int:
    """Memory (MiB) of each GPU of a node: its type's from `type_memory` (`gpu.types`), `gpu_memory_mib` for an
    untyped node or when no type is configured (a one-type cluster keeps its settings unchanged).

    `ConfigError` naming the node, its type and the configured types when `type_memory` lacks the node's type:
    the planner would size shapes for a memory it does not know. Names are compared exactly, as Slurm does (it
    refuses `gpu:A100:1` on nodes of `gpu:a100:4`).
    """
    kind = record.gpu_type
    if not kind or not type_memory:
        return gpu_memory_mib
    if kind in type_memory:
        return type_memory[kind]
    raise ConfigError("gpu.types", [
        f"node {record.name} has GPUs of type {kind!r} (gres {record.gres!r}), which gpu.types does not name; "
        f"configured: {', '.join(sorted(type_memory))}; add gpu.types.{kind}.memory_mib (memory of one such GPU)"])


def build_nodes(
    records: Iterable[NodeRecord],
    jobs: Iterable[JobView],
    shares_per_gpu: int = MPS_SHARES_PER_GPU,
    gpu_memory_mib: int = 0,
    type_memory: Mapping[str, int] | None = None,
) -> tuple[NodeView, ...]:
    """Nodes with per-GPU users, from node records and the active jobs' `gpu_alloc`.

    Each GPU's MPS total is the node's MPS count over its GPU count (Slurm
    splits `Count` evenly; a remainder is dropped), or `shares_per_gpu` when
    the node has no MPS. A GPU held by a `gpu:N` job is a whole user even when
    MPS jobs share it (22.05 allows that). Holds on GPUs or nodes the records
    do not have (squeue and sinfo run moments apart) are left out. Each node's GPU type is its gres's
    (`gpu:a100:4` → "a100"), its GPU memory that type's (`node_gpu_memory`).
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
                gpu_memory_mib=node_gpu_memory(r, gpu_memory_mib, type_memory or {}),
                gpu_type=r.gpu_type,
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
