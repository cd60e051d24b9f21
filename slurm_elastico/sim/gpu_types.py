"""The simulated cluster's GPU types: each known type's memory, and the cluster spec (`--cluster`) naming them.

A typed cluster is a list of node groups, `TYPE:NODESxGPUS` each
(`parse_cluster`): `aws:6x4,dgx-ext:2x8,rtx:3x8` is Sia's 64-GPU default,
which `sia` names. The type names are Sia's (its profile files are
`placements-<type>.csv`); each must be in `GPU_TYPES`, whose memory comes
from the vendors' public specifications. The T4 counts 15 GiB usable of its
16 GiB (ECC and the driver's reserve: what the bundled one-type simulator has
always assumed); the others count their nominal size.

Traps: a type may appear once in a spec (a second group of the same type
would be the same nodes twice: write one group with the sum); GPUs per node
are at most 64 (`SimSettings.gpus_per_node`'s bound) and a group has at most
4096 nodes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_elastico.errors import ConfigError


@dataclass(frozen=True)
class GpuType:
    """One known GPU type: the card, its memory a job may use (MiB), and where the figure comes from."""

    card: str
    memory_mib: int
    source: str


GPU_TYPES: dict[str, GpuType] = {
    "aws": GpuType("NVIDIA T4 (AWS g4dn.12xlarge, 4 per node)", 15 * 1024,
                   "16 GB GDDR6 (NVIDIA T4 datasheet); 15 GiB usable, as the one-type simulator assumes"),
    "rtx": GpuType("NVIDIA GeForce RTX 2080 Ti (8 per node)", 11 * 1024, "11 GB GDDR6 (NVIDIA product page)"),
    "dgx-ext": GpuType("NVIDIA A100 40GB (DGX A100, 8 per node, NVLink)", 40 * 1024,
                       "40 GB HBM2 (NVIDIA A100 datasheet)"),
    "dgx": GpuType("NVIDIA A100 40GB (DGX A100; fewer profiled batch sizes than dgx-ext)", 40 * 1024,
                   "40 GB HBM2 (NVIDIA A100 datasheet)"),
    "azure": GpuType("NVIDIA V100 32GB (Azure ND40rs_v2, 8 per node)", 32 * 1024,
                     "32 GB HBM2 (NVIDIA V100 datasheet)"),
    "quad": GpuType("NVIDIA Quadro RTX 6000 (4 per node)", 24 * 1024, "24 GB GDDR6 (NVIDIA Quadro RTX 6000 datasheet)"),
}
"""Every GPU type a cluster spec may name (Sia's names), with its usable memory."""

SIA_CLUSTER = "aws:6x4,dgx-ext:2x8,rtx:3x8"
"""Sia's default simulated cluster (its simulator_config: 6 × 4 T4, 2 × 8 A100, 3 × 8 RTX 2080 Ti = 64 GPUs)."""
SPEC_FORM = "sia, or TYPE:NODESxGPUS[,TYPE:NODESxGPUS...] (e.g. aws:6x4,dgx-ext:2x8,rtx:3x8)"
MAX_GPUS_PER_NODE = 64
MAX_NODES = 4096
_GROUP = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*):(\d+)x(\d+)$")


@dataclass(frozen=True)
class NodeGroup:
    """`nodes` nodes of `gpus_per_node` GPUs of one type, each GPU with `memory_mib` for jobs, in `partitions`
    (() = the simulated cluster's one partition, `sim.gateway.PARTITION`)."""

    gpu_type: str
    nodes: int
    gpus_per_node: int
    memory_mib: int
    partitions: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def known_types() -> str:
    """The known type names with their cards, for error messages."""
    return ", ".join(f"{name} ({t.card.split(' (')[0]}, {t.memory_mib // 1024} GiB)" for name, t in GPU_TYPES.items())


def memory_of(gpu_type: str, where: str = "cluster") -> int:
    """Usable memory (MiB) of one GPU of `gpu_type`; `ConfigError` naming the known types for any other."""
    try:
        return GPU_TYPES[gpu_type].memory_mib
    except KeyError:
        raise ConfigError(where, [f"unknown GPU type {gpu_type!r}; known: {known_types()}"]) from None


def parse_cluster(spec: str, where: str = "--cluster") -> tuple[NodeGroup, ...]:
    """The node groups of a cluster spec (`SPEC_FORM`), in the order written; one `ConfigError` naming every bad
    part and the allowed form."""
    text = (spec or "").strip()
    if text == "sia":
        text = SIA_CLUSTER
    if not text:
        raise ConfigError(where, [f"an empty cluster spec; allowed: {SPEC_FORM}"])
    problems: list[str] = []
    groups: list[NodeGroup] = []
    seen: set[str] = set()
    for part in text.split(","):
        part = part.strip()
        m = _GROUP.match(part)
        if not m:
            problems.append(f"{part!r} is not a node group; allowed: {SPEC_FORM}")
            continue
        name, nodes, per = m.group(1), int(m.group(2)), int(m.group(3))
        if name not in GPU_TYPES:
            problems.append(f"{part!r}: unknown GPU type {name!r}; known: {known_types()}")
            continue
        if name in seen:
            problems.append(f"{part!r}: type {name!r} appears twice; allowed: one group per type (add the nodes up)")
            continue
        if not 1 <= nodes <= MAX_NODES or not 1 <= per <= MAX_GPUS_PER_NODE:
            problems.append(f"{part!r}: allowed: 1..{MAX_NODES} nodes of 1..{MAX_GPUS_PER_NODE} GPUs")
            continue
        seen.add(name)
        groups.append(NodeGroup(name, nodes, per, GPU_TYPES[name].memory_mib))
    if problems:
        raise ConfigError(where, problems)
    return tuple(groups)


def describe(groups: tuple[NodeGroup, ...]) -> str:
    """The spec of `groups` as `parse_cluster` reads it (`aws:6x4,dgx-ext:2x8`)."""
    return ",".join(f"{g.gpu_type}:{g.nodes}x{g.gpus_per_node}" for g in groups)


def by_type(nodes: Sequence[NodeGroup]) -> tuple[NodeGroup, ...]:
    """One group per GPU type of `nodes` (a history's, one `NodeGroup` a node), in first-seen order: its nodes, the
    most GPUs one of them has, and the least memory; no partitions (what a family on that type may be: its
    shapes' GPU counts and memory; the cluster itself keeps every node as it is)."""
    out: dict[str, NodeGroup] = {}
    for g in nodes:
        had = out.get(g.gpu_type)
        out[g.gpu_type] = NodeGroup(g.gpu_type, g.nodes, g.gpus_per_node, g.memory_mib) if had is None else NodeGroup(
            g.gpu_type, had.nodes + g.nodes, max(had.gpus_per_node, g.gpus_per_node), min(had.memory_mib, g.memory_mib))
    return tuple(out.values())
