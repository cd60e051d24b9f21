"""The demo's two halves of the local cluster: a partition for plain Slurm and one for elastico, side by side.

The demo runs its job list on both halves at the same time, so both runs see the same load of the machine (on a
shared machine a run after the other met other noise, and the ratio of the two measured with it). Each half is a
partition of the same number of nodes with the same GPUs: plain `sbatch` jobs ask for the plain partition;
elastico-submit's jobs ask for the elastico one, and the helper's settings name it (`slurm.partition`), so it
plans with that partition's nodes and jobs only (`planner.epoch`) and never places a job on the plain half.

The partitions are made at run time (`scontrol create`, or `update` when they exist) on the running local
cluster, beside its default partition: the cluster's slurm.conf is not changed, so a cluster left running by an
earlier demo serves as it is. slurmctld keeps them in its saved state. The update, with `State=UP`, is issued
every time: Slurm 22.05's sinfo shows no partition state, so a partition left DOWN cannot be told from an up one.
A cluster whose demo partitions still hold jobs (an earlier demo stopped part-way) is refused: those jobs would
take GPUs from one half only and skew the comparison.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_elastico.cluster.programs import typed
from slurm_elastico.errors import ElasticoError
from slurm_elastico.model import JobState, JobView, NodeView, PartitionView, partition_names
from slurm_elastico.slurm import commands

PARTITION = {"plain": "demo-plain", "elastico": "demo-elastico"}
"""The partition of each run of the demo."""
MODES = tuple(PARTITION)
ACTIVE = (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)
"""The states of a job that holds or waits for a half's GPUs."""


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


def partition_argv(half: Half, existing: Sequence[PartitionView]) -> list[str]:
    """The scontrol command that makes `half`'s partition hold exactly its nodes, up: `create` when it does not
    exist, else `update`, even when it looks right (on Slurm 22.05 every partition reads as UP)."""
    verb = "update" if any(p.name == half.partition for p in existing) else "create"
    return ["scontrol", verb, f"PartitionName={half.partition}", f"Nodes={','.join(half.nodes)}", "State=UP",
            "MaxTime=INFINITE", "Default=NO"]


def leftover_jobs(jobs: Sequence[JobView]) -> list[JobView]:
    """The jobs pending or running in a demo partition (a job asking for several partitions lists them with
    commas)."""
    return [j for j in jobs if j.state in ACTIVE and partition_names(j.partition) & set(PARTITION.values())]


def leftover_error(jobs: Sequence[JobView], state_dir: str | Path | None = None) -> HalvesError:
    """The refusal naming the leftover jobs and the commands that remove them."""
    ids = sorted(j.job_id for j in jobs)
    shown = ", ".join(f"{j.job_id} ({j.partition}, {j.state.value.lower()})"
                      for j in sorted(jobs, key=lambda j: j.job_id))
    where = "" if state_dir is None else f" --state-dir {shlex.quote(str(state_dir))}"
    return HalvesError(
        f"the demo partitions still hold {len(ids)} job(s), left by an earlier demo: {shown}; they would take GPUs "
        f"from one half and skew the comparison. Cancel them with: eval \"$({typed('elastico')} cluster env{where})\"; "
        f"{shlex.join(commands.cancel(ids))} (or stop the cluster: {typed('elastico')} cluster down{where}), then "
        "run the demo again")


def ensure(gateway, gpus: int, gpus_per_node: int, state_dir: str | Path | None = None) -> tuple[Half, Half]:
    """Split the cluster `gateway` reads (`split`), refuse it when its demo partitions hold jobs (`leftover_jobs`;
    `state_dir` is the cluster's, named in the refusal) and make both partitions (`partition_argv`); returns the
    halves."""
    snap = gateway.snapshot()
    halves = split(snap.nodes, gpus, gpus_per_node)
    left = leftover_jobs(snap.jobs)
    if left:
        raise leftover_error(left, state_dir)
    for half in halves:
        argv = partition_argv(half, snap.partitions)
        done = gateway.runner(argv)
        if done.returncode != 0:
            raise HalvesError(f"{' '.join(argv)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return halves
