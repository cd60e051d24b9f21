"""GPU counts for data-parallel jobs: weighted shortest remaining time first, whole requests before partial ones,
the shortest on more GPUs where their speedup earns it.

Why not the prices alone: mean completion time counts every second a job
waits as much as every second it runs, and the measured data-parallel
speedups are close to linear (Pollux's placements: 6 GPUs run CIFAR-10 at
5.2× one GPU), so spreading the GPUs over many jobs — what prices with a
value of T/T_max settle on — slows every job and finishes none sooner. The
GPUs do most good on the jobs closest to done: the order is a job's
GPU-seconds left at its request (its remaining *area*, as Tiresias's two
dimensions count service, but looking ahead) divided by its fairness weight
(so a job that waits long enough under the `waiting` rule goes first,
whatever its size).

Two passes over the jobs in that order, over a budget of GPU equivalents
(free GPUs plus those the elastic running jobs hold):

1. A pending job starts only at its fastest shape within its *limit*, or
   waits: a job started on a fraction of its request holds GPUs that a
   shorter job would finish on sooner. The limit is its cap (the GPU count
   it was submitted with), or more where its measured speedup earns it
   (`share_limit`, over the GPUs no running job after it holds, and never
   for a job Slurm cannot requeue): heSRPT's optimal split of GPUs among
   jobs whose speedup on n GPUs is n^p (Berg, Vesilo, Harchol-Balter,
   SIGMETRICS 2020) gives
   the shortest of m jobs the fraction 1 − (1 − 1/m)^(1/(1−p)) of the GPUs
   left, the next the same fraction of what remains, and so on; with
   speedups near linear a short job finishing on many GPUs delays the jobs
   behind it less than it gains (two equal jobs on two GPUs with speedup
   1.9: one after the other they end at 0.53 and 1.05 of the one-GPU time,
   side by side both at 1). Each shape's own speedup over the job's best
   single GPU gives its p. A running job keeps the shape it runs as while
   that fits what is left, and moves up to its limit only when the time
   saved over its remaining work pays the restart; when shorter jobs have
   taken what it holds, it shrinks to what is left, and with nothing left it
   is preempted (it resumes when its turn comes, paying one restart) — or,
   when `preempt` is off, keeps its smallest shape.
2. What is left after everyone had their turn starts waiting jobs, in the
   same order, on less than they asked for: idle GPUs help nobody.

Several GPU types: each slot is on one type (`Claim.types`; -1 any) and the
budget is kept per type (`Budget`). A job's choice among its slots weighs
each by a shadow price per type (`prices`, λ_t per GPU): it takes the slot
with the least priced time per unit of work, `(1 + λ_t·size) / throughput`
— at zero prices its fastest, as on one type. `planner.type_prices` finds
the prices: a type that jobs want beyond what it has gets dearer, one with
GPUs left over cheaper, so the jobs that gain least from a fast type go to
another. A pending job whose choice's type is full starts at the same size
on another type where one fits (a later move pays for itself or is not
made: `_running`), else waits.

Several partitions (the helper managing every partition, each job on its
own partitions' nodes, `planner.partitions`): a claim may be limited to some
nodes (`Claim.nodes`). Where one is, the GPU equivalents left are also kept
per node and GPU type (`NodeRoom`): such a claim takes at most what its
nodes have left of a slot's type, and every claim takes from the nodes of
its slot's type that the fewest claims may use first. So on nested
partitions (`small` inside `all`) a job of `small` is not allotted GPUs that
only `all` has, which it could never be placed on, while a job of `all`
waits for them; and a job of `all` on the a100 nodes leaves the room of the
t4 partition alone. What the jobs outside the claims (those the prices
place) took is taken from their nodes first. A job of several partitions
takes a gang (more than one GPU) within one of them (`Claim.node_sets`), as
Slurm allocates a job in one partition. Without limited claims nothing is
kept per node.

Pure: no I/O, no clock; the same claims give the same answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_elastico.planner import reshape

NONE = -1
"""Waits (a pending job) or is preempted (a running one)."""

EPS = 1e-9


@dataclass(frozen=True)
class Claim:
    """One job's side of the allotment."""

    key: float
    """GPU-seconds left at its request (remaining work ÷ its speed per GPU there) ÷ its weight: smaller goes
    first."""
    sizes: Sequence[float]
    """GPU equivalents each shape slot holds (a gang: its GPUs; a share: its fraction of one GPU)."""
    tput: Sequence[float]
    allowed: Sequence[bool]
    cap: float
    """GPU equivalents it may take in the first pass (its submitted count)."""
    work: float = math.inf
    """Work left (only read for a running job)."""
    current: int | None = None
    """The slot a running job runs as; None for a pending job."""
    restart_s: float = 0.0
    """What leaving `current` costs (checkpoint and restart)."""
    extra: bool = True
    """May it take more than its cap (heSRPT's split)? Not a job Slurm cannot requeue: it could never give
    them back."""
    types: Sequence[int] = ()
    """Each slot's GPU type (an index of the budget's pools), -1 for any; () = every slot any type."""
    nodes: frozenset[int] | None = None
    """The nodes (indices of `allot`'s `node_room`) of the partitions it was submitted to; None: any."""
    node_sets: tuple[frozenset[int], ...] | None = None
    """Of a job submitted to several partitions, each one's nodes: a slot of more than one GPU (a gang) fits
    within one of them (Slurm allocates a job in one partition); None: within `nodes`."""

    def type_of(self, s: int) -> int:
        return self.types[s] if self.types else -1

    def slot_types(self) -> Sequence[int]:
        """`type_of` every slot, in order."""
        return self.types or (-1,) * len(self.sizes)


class Budget:
    """GPU equivalents left, per GPU type (one pool on a cluster of one type)."""

    def __init__(self, pools: float | Sequence[float]):
        self.left = [float(pools)] if isinstance(pools, (int, float)) else [float(x) for x in pools]

    @property
    def total(self) -> float:
        return sum(self.left)

    def room(self, t: int) -> float:
        """What a slot of type t may take: its type's pool, or for a slot of any type all of them; none for a type
        the pools lack (no usable node has it)."""
        if t >= len(self.left):
            return 0.0
        return self.left[t] if t >= 0 else self.total

    def take(self, t: int, z: float) -> None:
        if t >= len(self.left):
            return  # a type the pools lack: held outside them (a running job on a node no longer usable)
        if t >= 0:
            self.left[t] -= z
            return
        for k in sorted(range(len(self.left)), key=lambda k: -self.left[k]):  # any type: from the fullest pools
            d = min(z, max(0.0, self.left[k]))
            self.left[k] -= d
            z -= d
        self.left[0] -= z  # what no pool had (never, when `room` was checked first)


class NodeRoom:
    """GPU equivalents left per node, for claims limited to some nodes (see the module docstring), kept per region:
    the nodes of one GPU type that the same claims' node sets hold (on a cluster of partitions, few), so that a
    claim's room and take cost a few regions, not every node. A slot of a type takes from and fits into its
    type's regions only (of any type, -1: all of them). `booked`: what jobs outside the claims took already
    (each its node set, type and GPU equivalents), taken before any claim."""

    def __init__(self, room: Sequence[float], claims: Sequence[Claim], types: Sequence[int] | None = None,
                 booked: Sequence[tuple[frozenset[int] | None, int, float]] = ()):
        sets = list(dict.fromkeys(x for x in [*(c.nodes for c in claims), *(b[0] for b in booked),
                                              *(s for c in claims for s in c.node_sets or ())] if x is not None))
        region: dict[tuple, int] = {}
        self.left: list[float] = []
        self.type: list[int] = []  # each region's GPU type (-1: untyped)
        members: list[tuple[bool, ...]] = []
        for n, r in enumerate(room):
            t = types[n] if types is not None else -1
            sig = (t, *(n in s for s in sets))
            k = region.get(sig)
            if k is None:
                k = region[sig] = len(self.left)
                self.left.append(0.0)
                self.type.append(t)
                members.append(sig[1:])
            self.left[k] += float(r)
        every = tuple(range(len(self.left)))
        self.regions: dict[frozenset[int] | None, tuple[int, ...]] = {None: every}
        for i, s in enumerate(sets):
            self.regions[s] = tuple(k for k in every if members[k][i])
        uses = [0] * len(self.left)
        for c in claims:
            for k in self.regions[c.nodes]:
                uses[k] += 1
        self.by_use = {key: tuple(sorted(ks, key=lambda k: (uses[k], k))) for key, ks in self.regions.items()}
        """Each node set's regions by how many claims may use them, fewest first: where a claim takes what it
        takes."""
        for nodes, t, z in booked:
            self._take(nodes, t, z)

    def room(self, c: Claim, t: int = -1, size: float = 0.0) -> float:
        """What `c` may take on GPU type t (-1: any): its nodes' room there (a claim not limited: no limit here);
        for a slot of `size` above one GPU (a gang) of a claim of several partitions, the most within one."""
        out = math.inf if c.nodes is None else self._room(c.nodes, t)
        if c.node_sets and size > 1 + EPS:
            out = min(out, max(self._room(s, t) for s in c.node_sets))
        return out

    def _room(self, nodes: frozenset[int], t: int) -> float:
        return sum(self.left[k] for k in self.regions[nodes] if t < 0 or self.type[k] == t)

    def take(self, c: Claim, z: float, t: int = -1) -> None:
        """`c` takes `z` GPU equivalents of type t (-1: any); a gang of a claim of several partitions, within the
        first of them (in name order, as the packing tries them, `GpuState.gang_for`) that has room for it."""
        nodes = c.nodes
        if c.node_sets and z > 1 + EPS:
            nodes = next((s for s in c.node_sets if self._room(s, t) >= z - EPS), nodes)
        self._take(nodes, t, z)

    def _take(self, nodes: frozenset[int] | None, t: int, z: float) -> None:
        for k in self.by_use[nodes]:
            if z <= EPS:
                return
            if t >= 0 and self.type[k] != t:
                continue
            d = min(z, max(0.0, self.left[k]))
            self.left[k] -= d
            z -= d


def order(claims: Sequence[Claim]) -> list[int]:
    """Indices by key, ties by position."""
    return sorted(range(len(claims)), key=lambda i: (claims[i].key, i))


def _best(c: Claim, limit: float, prices: Sequence[float], budget: Budget | None = None,
          size: float | None = None, nodes: NodeRoom | None = None) -> int:
    """The allowed slot holding at most `limit` with the least priced time per unit of work (`(1 + λ_t·size) /
    throughput`: at zero prices the fastest; ties: the smaller, then the first), or NONE; with `budget` (and
    `nodes`), only slots whose type has room (on the claim's nodes); with `size`, only slots of that size."""
    best, best_key = NONE, (math.inf, math.inf)
    cheapest = min(prices, default=0.0)
    top, n_prices = limit + EPS, len(prices)
    for s, (z, t, ok, ty) in enumerate(zip(c.sizes, c.tput, c.allowed, c.slot_types())):
        if not ok or t <= 0 or z > top or (size is not None and abs(z - size) > EPS):
            continue
        if budget is not None and z > budget.room(ty) + EPS or nodes is not None and z > nodes.room(c, ty, z) + EPS:
            continue
        lam = prices[ty] if 0 <= ty < n_prices else cheapest
        key = ((1.0 + lam * z) / t, z)
        if key < best_key:
            best, best_key = s, key
    return best


def share_limit(c: Claim, budget: float, left: int) -> float:
    """The most GPU equivalents `c` may take in the first pass when it and `left - 1` jobs after it share `budget`:
    its cap, or the largest shape heSRPT's split gives it (see the module docstring), p from that shape's
    speedup over the job's fastest shape on at most one GPU."""
    base = max((t for t, z, ok in zip(c.tput, c.sizes, c.allowed) if ok and z <= 1 + EPS), default=0.0)
    limit = c.cap
    if base <= 0 or left < 1 or not c.extra:
        return limit
    for size, t, ok in zip(c.sizes, c.tput, c.allowed):
        if not ok or size <= max(1.0, limit) + EPS or t <= base:
            continue
        p = math.log(t / base) / math.log(size)  # the speedup as size ** p
        frac = 1.0 if p >= 1 - EPS or left == 1 else 1.0 - (1.0 - 1.0 / left) ** (1.0 / (1.0 - p))
        if size <= frac * budget + EPS:
            limit = size
    return limit


def _running(c: Claim, budget: Budget, hysteresis: float, preempt: bool, limit: float,
             prices: Sequence[float], nodes: NodeRoom | None = None) -> int:
    """A running job's slot in the first pass (see the module docstring)."""
    cur = c.current
    assert cur is not None
    want = _best(c, max(limit, c.sizes[cur]), prices, budget, nodes=nodes)
    if _fits(c, cur, budget, nodes):  # it keeps what it holds unless moving pays the restart
        if want == NONE or c.tput[want] <= c.tput[cur]:
            return cur
        return want if reshape.saving(c.work, c.tput[cur], c.tput[want], c.restart_s, hysteresis) > 0 else cur
    if want != NONE or preempt:
        return want
    return min((s for s, ok in enumerate(c.allowed) if ok), key=lambda s: (c.sizes[s], -c.tput[s]), default=cur)


def _fits(c: Claim, s: int, budget: Budget, nodes: NodeRoom | None) -> bool:
    """Whether slot s of `c` fits what is left of its type (on its nodes)."""
    t = c.type_of(s)
    return c.sizes[s] <= budget.room(t) + EPS and (nodes is None or c.sizes[s] <= nodes.room(c, t, c.sizes[s]) + EPS)


def allot(claims: Sequence[Claim], budget: float | Sequence[float], hysteresis: float, preempt: bool = True,
          prices: Sequence[float] | None = None, node_room: Sequence[float] | None = None,
          node_types: Sequence[int] | None = None,
          booked: Sequence[tuple[frozenset[int] | None, int, float]] = ()) -> list[int]:
    """Each claim's slot, or NONE (a pending job waits, a running one is preempted); see the module docstring.
    `budget`: GPU equivalents, one number or one per GPU type (net of what jobs outside the claims took); `prices`:
    λ per type (zero when None); `node_room`: GPU equivalents per node, which only claims limited to some nodes
    (`Claim.nodes`) are held to (the caller gives it only when there are such claims: `prices._allot`), with each
    node's GPU type (`node_types`, -1 untyped; None: all untyped) and what jobs outside the claims took of it
    (`booked`: `NodeRoom`'s)."""
    pool = Budget(budget)
    nodes = NodeRoom(node_room, claims, node_types, booked) if node_room is not None else None
    lam = list(prices) if prices is not None else [0.0] * len(pool.left)
    pick = [NONE] * len(claims)
    seq = order(claims)
    # What the running jobs after each position hold: GPUs beyond a job's cap come only from the others, so
    # that no running job shrinks or is preempted (a restart) for another's extra GPUs.
    held_after = [0.0] * len(seq)
    for k in range(len(seq) - 2, -1, -1):
        after = claims[seq[k + 1]]
        held_after[k] = held_after[k + 1] + (after.sizes[after.current] if after.current is not None else 0.0)
    for k, i in enumerate(seq):
        c = claims[i]
        limit = share_limit(c, max(0.0, pool.total - held_after[k]), len(seq) - k)
        if nodes is not None:
            limit = min(limit, nodes.room(c))
        if c.current is not None:
            want = _running(c, pool, hysteresis, preempt, limit, lam, nodes)
        else:
            want = _best(c, limit, lam)
            if want != NONE and not _fits(c, want, pool, nodes):
                # its whole request does not fit that type (on its nodes): the same size on another, or it waits
                # (pass 2 may start it smaller)
                want = _best(c, limit, lam, pool, c.sizes[want], nodes)
        if want != NONE:
            pick[i] = want
            _take(c, want, pool, nodes)
    for i in seq:  # idle GPUs help nobody: what is left starts waiting jobs on less than they asked
        c = claims[i]
        if pick[i] == NONE and c.current is None and pool.total > EPS:
            want = _best(c, c.cap, lam, pool, nodes=nodes)
            if want != NONE:
                pick[i] = want
                _take(c, want, pool, nodes)
    return pick


def _take(c: Claim, s: int, budget: Budget, nodes: NodeRoom | None) -> None:
    """`c` takes slot s from the budget (and its nodes' room)."""
    budget.take(c.type_of(s), c.sizes[s])
    if nodes is not None:
        nodes.take(c, c.sizes[s], c.type_of(s))
