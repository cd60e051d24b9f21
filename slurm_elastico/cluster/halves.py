"""The demo's two halves of the local cluster: a partition for plain Slurm and one for elastico, side by side.

The demo runs its job list on both halves at the same time, so both runs see the same load of the machine (on a
shared machine a run after the other met other noise, and the ratio of the two measured with it). Each half is a
partition of the same number of nodes with the same GPUs: plain `sbatch` jobs ask for the plain partition;
elastico-submit's jobs ask for the elastico one, and the helper's settings name it (`slurm.partition`), so it
plans with that partition's nodes and jobs only (`planner.epoch`) and never places a job on the plain half.

The partitions are made at run time (`scontrol create`, or `update` when they exist with other nodes) on the
running local cluster, beside its default partition: the cluster's slurm.conf is not changed, so a cluster left
running by an earlier demo serves as it is. slurmctld keeps them in its saved state.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_elastico.errors import ElasticoError
from slurm_elastico.model import NodeView, PartitionView

PARTITION = {"plain": "demo-plain", "elastico": "demo-elastico"}
"""The partition of each run of the demo."""
MODES = tuple(PARTITION)


class HalvesError(ElasticoError):
    """The local cluster cannot be split into two halves for the demo (says what it has and what is needed)."""


@dataclass(frozen=True)
class Half:
    """One run's part of the cluster: its mode (plain, elastico), its partition and its nodes."""

    mode: str
    partition: str
    nodes: tuple[str, ...]


def _node_order(name: str) -> tuple:
    """n2 before n10: the digits compare as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def split(nodes: Sequence[NodeView], gpus: int, gpus_per_node: int) -> tuple[Half, Half]:
    """The plain half (the first nodes, in name order) and the elastico half (the next ones): `gpus` GPUs each,
    on nodes of `gpus_per_node` GPUs. Raises `HalvesError` when the usable nodes cannot give both."""
    if gpus < 1 or gpus_per_node < 1 or gpus % gpus_per_node:
        raise HalvesError(f"a half of {gpus} GPUs on nodes of {gpus_per_node}: the GPUs must be a positive "
                          "multiple of the GPUs per node")
    per_half = gpus // gpus_per_node
    fit = sorted((n.name for n in nodes if n.usable and len(n.gpus) == gpus_per_node), key=_node_order)
    if len(fit) < 2 * per_half:
        have = ", ".join(f"{n.name} ({len(n.gpus)} GPUs{'' if n.usable else ', not usable'})"
                         for n in sorted(nodes, key=lambda n: _node_order(n.name))) or "none"
        raise HalvesError(f"the demo needs two halves of {per_half} usable node(s) with {gpus_per_node} GPUs each "
                          f"({2 * per_half} nodes); the cluster has: {have}")
    return (Half("plain", PARTITION["plain"], tuple(fit[:per_half])),
            Half("elastico", PARTITION["elastico"], tuple(fit[per_half:2 * per_half])))


def partition_argv(half: Half, existing: Sequence[PartitionView]) -> list[str] | None:
    """The scontrol command that makes `half`'s partition hold exactly its nodes, up; None when it already does."""
    now = next((p for p in existing if p.name == half.partition), None)
    if now is not None and set(now.nodes) == set(half.nodes) and now.state.upper() == "UP":
        return None
    verb = "create" if now is None else "update"
    return ["scontrol", verb, f"PartitionName={half.partition}", f"Nodes={','.join(half.nodes)}", "State=UP",
            "MaxTime=INFINITE", "Default=NO"]


def ensure(gateway, gpus: int, gpus_per_node: int) -> tuple[Half, Half]:
    """Split the cluster `gateway` reads (`split`) and make both partitions (`partition_argv`); returns the halves."""
    snap = gateway.snapshot()
    halves = split(snap.nodes, gpus, gpus_per_node)
    for half in halves:
        argv = partition_argv(half, snap.partitions)
        if argv is not None:
            done = gateway.runner(argv)
            if done.returncode != 0:
                raise HalvesError(f"{' '.join(argv)} failed ({done.returncode}): "
                                  f"{(done.stderr or done.stdout).strip()}")
    return halves
