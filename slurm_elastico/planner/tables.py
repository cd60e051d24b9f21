"""The epoch's words for a job: its family as arrays (`Table`) and the job with its table and seat (`Job`).

One `Table` per distinct family (as the policy narrowed it), built once an
epoch: what the pricing (`planner.prices`) and the packing need per shape —
T/T_max, demand in GPU equivalents, the throughput floor, Γ's contention
against a stand-in neighbour, the allowed shapes fastest first. Shares are in
Slurm's counts from here on (the shapes' are percent). `make_table` gives a
table its rows as the epoch meets the family; `fill_tables` then gives every
table its arrays in one pass over all the epoch's rows (an epoch has a few
dozen tables of a few dozen rows: numpy's cost per call, paid per table,
would be most of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, compress, repeat

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


_UNFILLED = np.zeros(0)
_UNFILLED.flags.writeable = False
"""A `make_table` table's arrays until `fill_tables` gives it its own (one read-only array for every table, not
four new ones each)."""


@dataclass(slots=True)
class Table:
    """One distinct family, as arrays: what pricing and packing need per shape (the rows from `make_table`, the
    rest from `fill_tables`)."""

    family: Family
    rows: list[Row]
    tmax: float  # T_max: the fastest throughput among the shapes the cluster can run (among all, when none)
    fastest: float  # the fastest shape's throughput as declared (no discount, any type): weights' and notes' T_max
    gangs: bool  # whether any shape holds whole GPUs as a data-parallel gang
    # From `fill_tables` (`_UNFILLED` until then):
    value: np.ndarray  # [C] T / T_max
    demand: np.ndarray  # [C, R] in GPU equivalents
    allowed: np.ndarray  # [C] at or above the floor, of a type the cluster has
    contention: np.ndarray  # [C] 1 − 1/S against a stand-in neighbour (0: whole GPU)
    by_speed: list[int] = field(default_factory=list)  # allowed slots, fastest first
    density: float = 0.0  # best value per dominant GPU-equivalent
    columns: tuple = ()  # the rows' fields as lists, one per field of `Row`, then each shape's declared throughput


@dataclass(slots=True)
class Job:
    """One job the epoch plans: its view, its family's table, its fairness weight (`planner.weights`), its seat."""

    view: JobView
    table: Table
    weight: float
    seat: Seat
    running: bool = False
    held_back: bool = False  # the allotment gave this epoch's GPUs to jobs before it in its order (`starts.pack`)


WHOLE_UID = -1
"""`Row.uid` of a row holding whole GPUs: never looked up (nobody shares a GPU it holds)."""


def make_table(fam: Family, cache: PairCache, shares_per_gpu: int, types: tuple[str, ...] = (),
               levels: dict[int, int] | None = None) -> Table:
    """`fam`'s rows as a `Table` on a cluster with GPU `types` (its arrays: `fill_tables`); each shape that is a
    share of a GPU gets a profile in `cache`. A shape of a type the cluster lacks is not allowed; T/T_max is over
    the shapes that are. `levels`: each share (percent) in Slurm's counts, filled as met (the epoch's families
    have a few share levels between them: one dict for all its tables converts each once)."""
    shapes = fam.shapes
    n = len(shapes)
    levels = {} if levels is None else levels  # shares in Slurm's counts from here on (the shapes' are percent)
    index: dict[str, int] = {}  # each type looked up once
    uids, tputs, share, mem, cpus, hmem, gpus, gtypes, declared = [], [], [], [], [], [], [], [], []
    # (each column's append bound once: the loop below runs for every shape of every family, every epoch)
    to_uid, to_tput, to_share, to_mem, to_cpus, to_hmem, to_gpus, to_gtype, to_declared = (
        c.append for c in (uids, tputs, share, mem, cpus, hmem, gpus, gtypes, declared))
    # Only a share of a GPU ever sits beside another job: whole-GPU rows (all of one, or a gang) need no
    # profile in the interference model's all-pairs block (WHOLE_UID), which then is a fraction of the size.
    # The copies of one shape on several GPU types share one profile (the first's): the predictors know no
    # GPU type (a type they never saw gets their cautious view, `slowdown.for_gpu`), and one profile per copy
    # would make that block the number of types squared times larger.
    profiled: dict[tuple, int] = {}
    for s in shapes:  # (one pass, every column at once: an epoch makes each of its tables' rows this way)
        r, t = s.resources, s.throughput
        to_declared(t)
        # A throughput carried over from another GPU type counts at a conservative quantile of its uncertainty
        # (`shapes.type_speed.discounted`): a type where the job was measured wins a near tie against a guess.
        to_tput(discounted(t, s.throughput_sigma) if s.throughput_sigma else t)
        g = index.get(s.gpu_type)
        if g is None:
            g = index[s.gpu_type] = type_index(s.gpu_type, types)
        to_gtype(g)
        m = r.mps
        z = levels.get(m)
        if z is None:
            z = levels[m] = shares_of(m, shares_per_gpu) if m else 0
        to_share(z)
        uid = WHOLE_UID
        if 0 < z < shares_per_gpu:
            twin = (s.knobs, m, r.gpu_mem_mib, s.measured) if s.gpu_type else None
            uid = profiled.get(twin, -1) if twin is not None else -1
            if uid < 0:
                uid = cache.add(solo_profile(s, fam.kind, fam.name))
                if twin is not None:
                    profiled[twin] = uid
        to_uid(uid)
        to_mem(float(r.gpu_mem_mib))
        to_cpus(float(r.cpus))
        to_hmem(float(r.host_mem_mib))
        to_gpus(r.gpus)
    # T_max over the shapes of the types the cluster has (a family of no type: every shape runs anywhere)
    # (`compress` and `map` here: C loops, where a comprehension runs Python bytecode per row)
    here = list(compress(tputs, map(len(types).__gt__, gtypes))) if any(index) else tputs
    tmax = max(here) if here else max(tputs)
    columns = (range(n), uids, tputs, share, mem, cpus, hmem, gpus, gtypes)
    rows = list(map(tuple.__new__, repeat(Row, n), zip(*columns)))  # (not `Row._make`: a Python call per row)
    return Table(fam, rows, tmax, max(declared), any(gpus), _UNFILLED, _UNFILLED, _UNFILLED, _UNFILLED,
                 columns=(*columns, declared))


def fill_tables(tables: list[Table], cache: PairCache, per_gpu: np.ndarray, shares_per_gpu: int,
                types: tuple[str, ...] = ()) -> None:
    """Every table's arrays from its rows, all tables at once (each table's are views of the epoch's), Γ's
    contention included."""
    if not tables:
        return
    sizes = [len(t.rows) for t in tables]
    of = np.repeat(np.arange(len(tables)), sizes)  # each row's table
    n, absent = sum(sizes), len(types)
    # The columns as `Row` types them (its ints, then the floats: throughputs and resources), the declared
    # throughput last; read straight into arrays of the epoch's size (the slots, each table's 0 … n − 1, counted).
    first = np.cumsum([0] + sizes[:-1])  # each table's first row
    slot = np.arange(n) - np.repeat(first, sizes)
    uid, tput, share, mem, cpus, hmem, gpus, gtype, declared = (
        np.fromiter(chain.from_iterable(t.columns[k] for t in tables), dtype=kind, count=n)
        for k, kind in enumerate((np.int64, float, np.int64, float, float, float, np.int64, np.int64, float), start=1))
    typed = len(types) > 1
    demand = np.zeros((n, 4 + (len(types) if typed else 0)))
    demand[:, :4] = np.array([share, mem, cpus, hmem], dtype=float).T / per_gpu
    gang = gpus > 0  # n whole GPUs: n GPU equivalents of shares and of GPU memory
    demand[gang, 0] = gpus[gang]
    demand[gang, 1] = gpus[gang] * mem[gang] / per_gpu[1]
    if typed:  # the GPU equivalents of its type (a shape of no type draws on the total alone)
        on = np.flatnonzero((gtype >= 0) & (gtype < absent))
        demand[on, 4 + gtype[on]] = demand[on, 0]
    floor = np.repeat([t.family.throughput_floor for t in tables], sizes)
    # The floor is a speed the job asked for: held against each shape's expected throughput (as `exact` does), not
    # the discounted one that ranks near ties, or a family whose floor is near its own figure would fit no type
    # that carries an uncertainty (review finding). A pairing observed below it is undone (`helper.observer`).
    expected = np.where(floor > 0, declared, tput)
    allowed = (expected >= floor) & (gtype < absent)  # a type the cluster lacks: never
    value = tput / np.repeat([t.tmax for t in tables], sizes)
    dens = value / np.maximum(demand[:, :4].max(axis=1), 1e-9)  # per dominant GPU equivalent
    contention = np.zeros(n)
    _fill_contention(contention, uid, share, gpus, cache, shares_per_gpu)
    # the allowed slots of each table, fastest first, ties in slot order
    ok = np.flatnonzero(allowed)
    fast = ok[np.lexsort((slot[ok], -tput[ok], of[ok]))]
    cut = np.cumsum(np.bincount(of[ok], minlength=len(tables))).tolist()
    by_speed = slot[fast].tolist()
    best = np.maximum.reduceat(np.where(allowed, dens, -np.inf), first).tolist()
    a = k = 0
    for t, c, e, d in zip(tables, sizes, cut, best):
        b = a + c
        t.value, t.demand, t.allowed, t.contention = value[a:b], demand[a:b], allowed[a:b], contention[a:b]
        t.by_speed = by_speed[k:e]
        t.density = float(d) if e > k else 0.0
        a, k = b, e


def _fill_contention(contention: np.ndarray, uid: np.ndarray, share: np.ndarray, gpus: np.ndarray,
                     cache: PairCache, shares_per_gpu: int) -> None:
    """Γ's slowdown for every partial-GPU row (the epoch's rows as columns), next to a stand-in neighbour holding
    the rest: one model call, one question in it per profile and share left over (the copies of a shape on
    several GPU types share both), in the order the rows first ask them."""
    todo = np.flatnonzero((share < shares_per_gpu) & (gpus == 0))
    if not todo.size or not cache.enabled:
        return
    rest = shares_per_gpu - share[todo]
    _, first, which = np.unique((uid[todo] + 1) * (shares_per_gpu + 1) + rest, return_index=True,
                                return_inverse=True)
    order = np.argsort(first)  # the questions in the order the rows first ask them
    place = np.empty_like(order)
    place[order] = np.arange(order.size)
    ids, left = uid[todo[first[order]]].tolist(), rest[first[order]].tolist()
    # one stand-in per share left over (the same object each time, so a model may compute it once)
    stand_in = {r: SoloProfile(kind="train", mps_share=round(percent_of(r, shares_per_gpu))) for r in set(left)}
    slow = cache.vs_partners(ids, [stand_in[r] for r in left])
    contention[todo] = (1.0 - 1.0 / np.asarray(slow, dtype=float))[place[which]]
