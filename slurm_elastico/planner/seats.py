"""What one job holds as the packing sees it: a shape as a `Row`, the job's hold on GPUs as a `Seat`.

Plain data the epoch builds from a family table and the snapshot, and that
`planner.packing.GpuState` places, moves and checks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple


class Row(NamedTuple):
    """One shape as packing needs it (a named tuple: an epoch builds one per shape of each family and hashes them
    as the packing's questions, both in C)."""

    slot: int  # index of the shape in its family table
    uid: int  # profile id for the interference cache
    tput: float  # solo throughput
    share: int  # MPS shares of one GPU (0 for a data-parallel row)
    mem: float  # GPU memory per GPU
    cpus: float  # for the whole job
    hmem: float  # for the whole job
    gpus: int = 0  # whole GPUs of a data-parallel row (a gang); 0 for a share of one GPU
    gtype: int = -1  # the GPU type it runs on (`Board.types` index; its throughput is there's); -1: any type


@dataclass(slots=True)
class Seat:
    """One job's hold on one GPU (a planned job, a running one, or a foreign one)."""

    job_id: int
    floor: float
    row: Row | None = None
    gpu: int = -1
    slow: float = 1.0
    margin: float = 0.0  # admission margin next to its current co-runners (per-pair margins only)
    gang: tuple[int, ...] = ()  # every GPU of a data-parallel row (`gpu` is the first); () for a share
    # Throughput alone at its family's best single-GPU shape (`best_solo`): the reference of its fraction of solo
    # speed in the gain rule. 0 = unknown: its row's own solo throughput is the reference (f = 1 / slowdown),
    # which the floors already imply whenever floor >= 0.5, i.e. the rule as it was before the gain check.
    best_solo: float = 0.0
    whole: bool = False  # asks whole GPUs (`gpu:N`): Slurm gives it `gpu_choice.whole_gpus`, not an MPS share's GPU
    # The nodes (`GpuState.gpu_node` numbers) of the partitions it was submitted to (`planner.partitions`); None: any
    nodes: frozenset[int] | None = None
    # Of a job submitted to several partitions, each one's nodes (`partitions.node_sets`): Slurm allocates a job in
    # one partition, so a gang takes its GPUs within one of them (`GpuState.gang_for`); None: within `nodes`.
    gang_nodes: tuple[frozenset[int], ...] | None = None


def best_solo(rows: Iterable[Row]) -> float:
    """`Seat.best_solo` of a job whose family has these rows: the fastest that holds at most one GPU (0: none)."""
    return max((r.tput for r in rows if r.gpus <= 1), default=0.0)
