"""The epoch's words for a job: its family as arrays (`Table`) and the job with its table and seat (`Job`).

One `Table` per distinct family (as the policy narrowed it), built once an
epoch: what the pricing (`planner.prices`) and the packing need per shape —
T/T_max, demand in GPU equivalents, the throughput floor, Γ's contention
against a stand-in neighbour, the allowed shapes fastest first. Shares are in
Slurm's counts from here on (the shapes' are percent).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.model import Family, JobView
from slurm_elastico.planner.seats import Row, Seat
from slurm_elastico.planner.slowdown import PairCache
from slurm_elastico.shapes.solo import solo_profile
from slurm_elastico.shapes.type_speed import discounted
from slurm_elastico.shapes.units import percent_of, shares_of

RESOURCES = ("mps", "gpu_mem", "cpus", "host_mem")
"""The resources priced, in this order in every demand and price vector; on a cluster of several GPU types
one more per type follows (`resources`): the GPU equivalents of that type, so that each type has its price."""


def resources(types: tuple[str, ...]) -> tuple[str, ...]:
    """The priced resources' names on a cluster with these GPU types: one GPU dimension per type when several."""
    return RESOURCES + (tuple(f"gpus@{t}" for t in types) if len(types) > 1 else ())


def type_index(gpu_type: str, types: tuple[str, ...]) -> int:
    """A shape's `Row.gtype`: -1 for no type, its index in `types`, or len(types) for a type the cluster lacks
    (a row that fits no GPU)."""
    if not gpu_type:
        return -1
    return types.index(gpu_type) if gpu_type in types else len(types)


@dataclass
class Table:
    """One distinct family, as arrays: what pricing and packing need per shape."""

    family: Family
    rows: list[Row]
    value: np.ndarray  # [C] T / T_max
    demand: np.ndarray  # [C, R] in GPU equivalents
    allowed: np.ndarray  # [C] at or above the floor
    contention: np.ndarray  # [C] 1 − 1/S against a stand-in neighbour (0 at a whole GPU)
    by_speed: list[int]  # allowed slots, fastest first
    density: float  # best value per dominant GPU-equivalent
    gangs: bool = False  # whether any shape holds whole GPUs as a data-parallel gang


@dataclass
class Job:
    """One job the epoch plans: its view, its family's table, its fairness weight (`planner.weights`), its seat."""

    view: JobView
    table: Table
    weight: float
    seat: Seat
    running: bool = False


WHOLE_UID = -1
"""`Row.uid` of a row holding whole GPUs: never looked up (nobody shares a GPU it holds)."""


def make_table(fam: Family, cache: PairCache, per_gpu: np.ndarray, shares_per_gpu: int,
               types: tuple[str, ...] = ()) -> Table:
    """`fam` as a `Table` on a cluster with GPU `types`; each shape that is a share of a GPU gets a profile in
    `cache`. A shape of a type the cluster lacks is not allowed; T/T_max is over the shapes that are."""
    shapes = fam.shapes
    n = len(shapes)
    typed = len(types) > 1
    # A throughput carried over from another GPU type counts at a conservative quantile of its uncertainty
    # (`shapes.type_speed.discounted`): a type where the job was measured wins a near tie against a guess.
    tputs = [discounted(s.throughput, s.throughput_sigma) if s.throughput_sigma else s.throughput for s in shapes]
    if any(s.gpu_type for s in shapes):
        gtypes = [type_index(s.gpu_type, types) for s in shapes]
        tmax = max((t for t, g in zip(tputs, gtypes) if g < len(types)), default=max(tputs))
    else:  # a family of no type (every one-type cluster's): every shape runs anywhere
        gtypes = [-1] * n
        tmax = max(tputs)
    rows = []  # shares in Slurm's counts from here on; the shapes' are percent
    res = []  # each row's (share, GPU memory, CPUs, host memory)
    gang = []  # (slot, GPUs, GPU memory) of each data-parallel row
    shares: dict[int, int] = {}  # a family has a few share levels: each converted once
    profiled: dict[tuple, int] = {}
    for i, s in enumerate(shapes):
        r = s.resources
        share = 0
        if r.mps:
            share = shares.get(r.mps)
            if share is None:
                share = shares[r.mps] = shares_of(r.mps, shares_per_gpu)
        # Only a share of a GPU ever sits beside another job: whole-GPU rows (all of one, or a gang) need no
        # profile in the interference model's all-pairs block (WHOLE_UID), which then is a fraction of the size.
        # The copies of one shape on several GPU types share one profile (the first's): the predictors know no
        # GPU type (a type they never saw gets their cautious view, `slowdown.for_gpu`), and one profile per copy
        # would make that block the number of types squared times larger.
        uid = WHOLE_UID
        if 0 < share < shares_per_gpu:
            twin = (s.knobs, r.mps, r.gpu_mem_mib, s.measured) if s.gpu_type else None
            uid = profiled.get(twin, -1) if twin is not None else -1
            if uid < 0:
                uid = cache.add(solo_profile(s, fam.kind, fam.name))
                if twin is not None:
                    profiled[twin] = uid
        mem, cpus, hmem = float(r.gpu_mem_mib), float(r.cpus), float(r.host_mem_mib)
        rows.append(Row(i, uid, tputs[i], share, mem, cpus, hmem, r.gpus, gtypes[i]))
        res.append((share, mem, cpus, hmem))
        if r.gpus:
            gang.append((i, r.gpus, r.gpu_mem_mib))
    demand = np.zeros((n, 4 + (len(types) if typed else 0)))
    demand[:, :4] = np.array(res, dtype=float).reshape(n, 4) / per_gpu
    for i, g, mem in gang:  # n whole GPUs: n GPU equivalents of shares and of GPU memory
        demand[i, 0] = g
        demand[i, 1] = g * mem / per_gpu[1]
    if typed:  # the GPU equivalents of its type (a shape of no type draws on the total alone)
        for i, t in enumerate(gtypes):
            if 0 <= t < len(types):
                demand[i, 4 + t] = demand[i, 0]
    tput = np.array(tputs)
    floor = fam.throughput_floor
    allowed = (tput >= floor) & (np.array(gtypes) < len(types))  # a type the cluster lacks: never
    contention = np.zeros(n)  # filled for all tables at once by fill_contention
    value = tput / tmax
    dominant = np.maximum(demand[:, :4].max(axis=1), 1e-9)
    dens = value / dominant
    by_speed = sorted((i for i in range(n) if allowed[i]), key=lambda i: (-tputs[i], i))
    return Table(fam, rows, value, demand, allowed, contention, by_speed,
                 float(dens[allowed].max()) if by_speed else 0.0, bool(gang))


def fill_contention(tables: list[Table], cache: PairCache, shares_per_gpu: int) -> None:
    """Γ's slowdown for every partial-GPU shape, next to a stand-in neighbour holding the rest; one model call,
    one question in it per profile and share left over (the copies of a shape on several GPU types share both)."""
    todo = [(t, i) for t in tables for i, r in enumerate(t.rows) if r.share < shares_per_gpu and not r.gpus]
    if not todo or not cache.enabled:
        return
    asked: dict[tuple[int, int], int] = {}  # (profile, share left over) -> its place in the call
    which = [asked.setdefault((t.rows[i].uid, shares_per_gpu - t.rows[i].share), len(asked)) for t, i in todo]
    # one stand-in per share left over (the same object each time, so a model may compute it once)
    stand_in: dict[int, SoloProfile] = {}
    for _, rest in asked:
        if rest not in stand_in:
            stand_in[rest] = SoloProfile(kind="train", mps_share=round(percent_of(rest, shares_per_gpu)))
    slow = cache.vs_partners([uid for uid, _ in asked], [stand_in[rest] for _, rest in asked])
    contention = (1.0 - 1.0 / np.asarray(slow, dtype=float)).tolist()
    for (t, i), k in zip(todo, which):
        t.contention[i] = contention[k]
