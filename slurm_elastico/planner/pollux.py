"""Pollux (Qiao et al., OSDI 2021) as a planner policy: GPU counts and batch sizes chosen for goodput.

Each job's goodput at r GPUs is the best its family offers there: throughput
× statistical efficiency, in steps of its own batch per second, over every
global batch the family declares with a learning-rate rule (the simulator's
goodput shapes, `sim.families.goodput_shapes`, whose efficiency follows the
job's gradient noise as training goes on). That is Pollux's joint choice:
the batch follows from the GPUs, and the allocation is judged by the best
batch each count allows. A job's speedup at r GPUs is that goodput over its
goodput at a fair share (the cluster's GPUs over the active jobs, rounded
up), scaled so a node's worth of GPUs counts 1, and multiplied by the
restart factor `max(age − restarts·d, 0) / (age + d)` when its allocation
changes (d: the restart delay; age: seconds since submission). The cluster's
allocation maximises the power mean with p = −1 of the speedups (+ 1e-3, so
a job with no GPU weighs 1000): Pollux's fairness-weighted objective.

Pollux searches allocations with a genetic algorithm over GPUs per node.
Here the same objective is optimised over GPU counts exactly, by dynamic
programming (it is a sum over jobs of 1/(speedup + 1e-3) under one capacity,
so a knapsack), then placed as Pollux constrains it: a job on the fewest
nodes, at most one job spanning several nodes on any node, jobs that keep
their count keep their GPUs; and, as Slurm's `Gres=gpu:P NumNodes=K-K` asks,
the same number of GPUs on each of its nodes (`planner.gangs`). Where a count cannot be placed, the job gets
the largest smaller count that can. The plan's speedups assume the fewest
nodes; the placement is what really runs.

Also as Pollux: a job may hold at most twice the most GPUs it has held so far
(at least one), so a new job starts on one GPU and grows as it proves it
scales (`pollux:top=` in its AdminComment); jobs are preempted (requeue-held
with their progress) when the objective gives them nothing; a job that
keeps its GPUs changes its batch in place only when the goodput gained over
its remaining work pays a restart (none in process, as AdaptDL's jobs do).

Pure: a `Snapshot` and families in, a `Plan` out, through the same actions as the other policies (SET_GPUS,
SET_SHARE/SET_NODES, RESHAPE_RUNNING, SIGNAL, PREEMPT/RESUME, SET_ADMIN_COMMENT, START_NOW). Jobs start in
Slurm's own order, each gang pinned with the same count on every node, so what Slurm starts is what was planned.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Action, ActionKind, Family, JobView, Placement, Plan, Shape, Snapshot
from slurm_elastico.planner.baselines import planned_jobs
from slurm_elastico.planner.gangs import split
from slurm_elastico.planner.gpu_choice import start_key
from slurm_elastico.planner.narrowers import whole_gpu_any_batch
from slurm_elastico.runtime import rebatch
from slurm_elastico.shapes.current import ADMIN_PREFIX, named_in_comment
from slurm_elastico.shapes.units import shares_of

POWER = -1.0
"""Exponent of the power mean over speedups (Pollux's p: more negative is fairer)."""
FLOOR = 1e-3
"""Added to every speedup before the power mean, so a job without GPUs weighs 1 / FLOOR."""
STATE = "pollux:"
"""AdminComment parts: `pollux:top=<most GPUs the job has held>`, `pollux:held=1` (preempted by this policy)."""


@dataclass(frozen=True)
class PolluxState:
    top: int = 0
    held: bool = False


def pollux_state(admin_comment: str) -> PolluxState:
    vals = {}
    for part in (admin_comment or "").split(","):
        part = part.strip()
        if part.startswith(STATE) and "=" in part:
            k, v = part[len(STATE):].split("=", 1)
            vals[k.strip()] = v.strip()
    top = vals.get("top", "0")
    return PolluxState(int(top) if top.isdigit() else 0, vals.get("held") == "1")


def pollux_comment(old: str, shape: str, state: PolluxState) -> str:
    """`old` with its shape and Pollux parts replaced (anything else an admin wrote kept after them)."""
    keep = [p.strip() for p in (old or "").split(",")
            if p.strip() and not p.strip().startswith(ADMIN_PREFIX) and not p.strip().startswith(STATE)]
    parts = [f"{ADMIN_PREFIX}{shape}", f"{STATE}top={state.top}"] + ([f"{STATE}held=1"] if state.held else [])
    return ",".join(parts + keep)


def gpus_of(shape: Shape) -> int:
    """Whole GPUs a (whole-GPU) shape holds: its gang size, or 1 for a full share of one GPU."""
    return max(1, shape.resources.gpus)


def best_by_gpus(fam: Family) -> dict[int, Shape]:
    """The highest-goodput shape at each GPU count the (narrowed) family offers: Pollux's batch for that count."""
    best: dict[int, Shape] = {}
    for s in fam.shapes:
        n = gpus_of(s)
        if n not in best or s.throughput > best[n].throughput:
            best[n] = s
    return dict(sorted(best.items()))


@lru_cache(maxsize=4096)
def _table(narrow: Callable[[Family], Family], fam: Family) -> tuple[Family, dict[int, Shape]]:
    """The narrowed family and its best shape per GPU count (cached: a family is the same until it is refreshed)."""
    return (narrowed := narrow(fam)), best_by_gpus(narrowed)


def restart_factor(age_s: float, restarts: int, delay_s: float) -> float:
    """Pollux's discount on the speedup of a job whose allocation changes: the share of its life not lost to
    restarts, counting the one this change would cost."""
    return max(age_s - restarts * delay_s, 0.0) / (age_s + delay_s) if age_s + delay_s > 0 else 0.0


def power_mean(speedups: Sequence[float], p: float = POWER) -> float:
    s = np.asarray(speedups, dtype=float) + FLOOR
    return float(np.mean(s ** p) ** (1.0 / p)) if len(s) else 0.0


def allocate(costs: Sequence[np.ndarray], capacity: int) -> list[int]:
    """GPU counts minimising the sum of `costs[j][count]` with at most `capacity` GPUs in all (exact).

    `costs[j]` holds job j's cost at 0, 1, … GPUs (inf where a count is not allowed; index 0 must be finite).
    Ties go to fewer GPUs for earlier jobs, so the answer is deterministic.
    """
    if capacity < 0:
        raise ValueError(f"capacity {capacity} must be >= 0")
    n = len(costs)
    dp = np.zeros(capacity + 1)
    choice = np.zeros((n, capacity + 1), dtype=int)
    for j, c in enumerate(costs):
        c = np.asarray(c, dtype=float)
        if not (c.ndim == 1 and len(c) and np.isfinite(c[0])):
            raise ValueError(f"costs of job {j} need a finite cost at 0 GPUs")
        best = dp + c[0]
        pick = np.zeros(capacity + 1, dtype=int)
        for r in range(1, min(len(c) - 1, capacity) + 1):
            if not np.isfinite(c[r]):
                continue
            cand = np.full(capacity + 1, np.inf)
            cand[r:] = dp[:capacity + 1 - r] + c[r]
            better = cand < best - 1e-12
            best = np.where(better, cand, best)
            pick = np.where(better, r, pick)
        dp, choice[j] = best, pick
    out = [0] * n
    left = capacity
    for j in range(n - 1, -1, -1):
        out[j] = int(choice[j, left])
        left -= out[j]
    return out


@dataclass
class Room:
    """What the plan may still hand out per node: free GPU indices, CPUs and host memory (Slurm keeps a job's
    CPUs and memory as submitted and splits them over its nodes by GPUs, rounded up), and the nodes a
    multi-node job already uses."""

    gpus: dict[str, list[int]]
    cpus: dict[str, int]
    mem: dict[str, float]
    order: dict[str, int]
    spread: set[str] = field(default_factory=set)

    def fits(self, node: str, k: int, n: int, cpus: int, mem: int) -> bool:
        return -(-cpus * k // n) <= self.cpus[node] and -(-mem * k // n) <= self.mem[node]

    def room(self, node: str, k: int, n: int, cpus: int, mem: int) -> int:
        """How many of k GPUs of a job of n GPUs `node` can take (Slurm's rule: idle ones whose host share fits)."""
        k = min(k, len(self.gpus.get(node, ())))
        while k > 0 and not self.fits(node, k, n, cpus, mem):
            k -= 1
        return k

    def holds(self, where: Mapping[str, Sequence[int]], n: int, cpus: int, mem: int) -> bool:
        """Whether these very GPUs (per node) are still free, with the host share a job of n GPUs needs there."""
        return all(set(g) <= set(self.gpus.get(node, ())) and self.fits(node, len(g), n, cpus, mem)
                   for node, g in where.items())

    def take(self, where: Mapping[str, int], n: int, cpus: int, mem: int) -> dict[str, list[int]]:
        """Hold `where` (GPUs per node) for a job of n GPUs; the GPU indices Slurm gives (the lowest idle ones)."""
        out = {node: self.gpus[node][:k] for node, k in where.items()}
        self.hold(out, n, cpus, mem)
        return out

    def hold(self, where: Mapping[str, Sequence[int]], n: int, cpus: int, mem: int) -> None:
        """Hold these very GPUs (per node) for a job of n GPUs, with its host share on each node."""
        for node, gpus in where.items():
            self.gpus[node] = [g for g in self.gpus[node] if g not in gpus]
            self.cpus[node] -= -(-cpus * len(gpus) // n)
            self.mem[node] -= -(-mem * len(gpus) // n)
        if len(where) > 1:
            self.spread.update(where)

    def free(self, where: Mapping[str, Sequence[int]], n: int, cpus: int, mem: int) -> None:
        """Give back what a job of n GPUs holds (`where`: its GPU indices per node)."""
        for node, gpus in where.items():
            if node in self.order:
                self.gpus[node] = sorted(set(self.gpus.get(node, [])) | set(gpus))
                self.cpus[node] += -(-cpus * len(gpus) // n)
                self.mem[node] += -(-mem * len(gpus) // n)


def place(n: int, room: Room, cpus: int, mem: int, even: bool = True) -> dict[str, int] | None:
    """GPUs per node for a job of n GPUs (with `cpus` and `mem` in all), as Slurm can be asked for them: the same
    count on each node (`planner.gangs.split`; with `even` false any count, the peer's rule, for calibration
    only: `Snapshot.even_gangs`), on as few nodes as fit. One node when one holds it (best
    fit), else the nodes with the most room first, never a node another multi-node job uses (Pollux's rule).
    None when it cannot be placed."""
    one = [k for k in room.order if room.room(k, n, n, cpus, mem) >= n]
    if one:
        return {min(one, key=lambda k: (len(room.gpus[k]), room.order[k])): n}
    spare = [k for k in sorted(room.order, key=lambda k: room.order[k]) if k not in room.spread]
    return split(n, spare, lambda k, p: room.room(k, p, n, cpus, mem),
                 lambda k: (-len(room.gpus.get(k, ())), room.order[k]), even)


@dataclass(eq=False)
class _Job:
    view: JobView
    family: Family
    best: dict[int, Shape]
    current: dict[str, list[int]]  # node -> GPU indices it holds now (running)
    shape: Shape | None  # the shape it runs as now (running)
    state: PolluxState
    cap: int
    least: int
    costs: np.ndarray = field(default_factory=lambda: np.zeros(1))
    speedup: dict[int, float] = field(default_factory=dict)
    """Speedup at each GPU count it may run at (before any restart discount)."""

    @property
    def running(self) -> bool:
        return bool(self.current)

    @property
    def held_now(self) -> int:
        return sum(len(g) for g in self.current.values())


@dataclass(frozen=True)
class PolluxPolicy:
    """Pollux: goodput-driven GPU counts and batch sizes under a p = −1 power-mean objective (module docstring).

    Has the fields other code reads from a `Policy` (`narrow`, `price`, `interference`, `reshape`) with what
    they mean here, and `adapts_batch`: it wants goodput shapes at other global batches in every family.
    """

    name: str
    description: str
    narrow: Callable[[Family], Family] = whole_gpu_any_batch
    price: bool = False
    interference: bool = False
    reshape: bool = True
    adapts_batch: bool = True
    power: float = POWER

    def plan(self, snapshot: Snapshot, families: Mapping[int, Family], settings: Settings,
             model: SlowdownModel | None, now: float, progress: Mapping[int, float] | None = None) -> Plan:
        part = settings.slurm.partition
        spg = settings.gpu.shares_per_gpu
        delay = settings.planner.reshape_cost_s
        nodes = [n for n in snapshot.nodes if n.usable and (not part or part in n.partitions)]
        gpu_nodes = [n for n in nodes if n.gpus]
        cpus_per_gpu = max((n.cpus / len(n.gpus) for n in gpu_nodes), default=1.0)
        mem_per_gpu = max((n.memory_mib / len(n.gpus) for n in gpu_nodes), default=0.0) or math.inf
        jobs = self._jobs(snapshot, families, part, cpus_per_gpu, mem_per_gpu)
        fixed = [j for j in jobs if j.running and not j.view.requeue]  # Slurm would not requeue these

        # What this policy may hand out: GPUs of usable nodes nobody else holds, the nodes' free CPUs and memory.
        ours = {j.view.job_id for j in jobs}
        room = Room({}, {n.name: n.cpus - n.cpus_alloc for n in nodes},
                    {n.name: (n.memory_mib - n.memory_alloc_mib) if n.memory_mib > 0 else math.inf for n in nodes},
                    {n.name: i for i, n in enumerate(nodes)})
        for n in nodes:
            room.gpus[n.name] = [g.index for g in n.gpus if all(u.job_id in ours for u in g.users)]
        capacity = sum(len(v) for v in room.gpus.values())
        for j in jobs:  # every job of ours is planned anew; those that keep their GPUs take them back below
            if j.running:
                room.free(j.current, j.held_now, j.view.cpus, j.view.memory_mib)
        flexible = [j for j in jobs if j not in fixed]
        total = sum(len(n.gpus) for n in nodes)
        fair = max(1, math.ceil(total / max(1, len(jobs))))
        scale = len(nodes) / max(1, total)  # a node's worth of GPUs counts 1
        for j in jobs:
            self._costs(j, fair, scale, now, delay)
        counts = allocate([j.costs for j in flexible], max(0, capacity - sum(j.held_now for j in fixed)))
        want = {j.view.job_id: n for j, n in zip(flexible, counts)}
        want.update({j.view.job_id: j.held_now for j in fixed})

        # Jobs keeping their count keep their GPUs; the others are placed in Slurm's order.
        keep = [j for j in jobs if j.running and want[j.view.job_id] == j.held_now]
        for j in keep:
            room.hold(j.current, j.held_now, j.view.cpus, j.view.memory_mib)
        start = sorted((j for j in jobs if want[j.view.job_id] > 0 and j not in keep),
                       key=lambda j: start_key(j.view))
        placed: dict[int, tuple[int, dict[str, list[int]]]] = {}
        for j in start:
            for n in sorted((c for c in j.best if j.least <= c <= want[j.view.job_id]), reverse=True):
                if n == j.held_now and room.holds(j.current, n, j.view.cpus, j.view.memory_mib):
                    room.hold(j.current, n, j.view.cpus, j.view.memory_mib)
                    keep.append(j)  # back to what it runs on: no restart
                    break
                where = place(n, room, j.view.cpus, j.view.memory_mib, snapshot.even_gangs)
                if where is not None:
                    placed[j.view.job_id] = (n, room.take(where, n, j.view.cpus, j.view.memory_mib))
                    break
        order = room.order

        actions: list[Action] = []
        placements: list[Placement] = []
        speedups: list[float] = []
        for j in jobs:
            jid = j.view.job_id
            if j in keep:
                shape = self._retune(j, progress, delay, settings.planner.hysteresis)
                speedups.append(j.speedup.get(j.held_now, 0.0))
                node, gpus = next(iter(sorted(j.current.items(), key=lambda kv: order.get(kv[0], 0))))
                placements.append(Placement(jid, node, gpus[0], shape.name, settings.gpu.shares_per_gpu,
                                            shape.throughput))
                if shape is not j.shape:
                    why = (f"batch for goodput on its {j.held_now} GPU(s): {shape.name} "
                           f"({shape.throughput:.3g} steps/s of its own batch, was "
                           f"{j.shape.throughput if j.shape else 0:.3g})")
                    actions.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, why, shape=shape.name,
                                          text=pollux_comment(j.view.admin_comment, shape.name, j.state)))
                    actions.append(Action(ActionKind.SIGNAL, jid, why, signal="USR1", shape=shape.name))
                continue
            got = placed.get(jid)
            if got is None:
                speedups.append(0.0)
                if j.running:
                    name = j.shape.name if j.shape else j.family.default_shape.name
                    why = (f"preempted: the power-mean objective gives its {j.held_now} GPU(s) to others "
                           f"({'no room to place it' if want[jid] else 'no GPU for it'})")
                    state = PolluxState(j.state.top, True)
                    actions.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, why, shape=name,
                                          text=pollux_comment(j.view.admin_comment, name, state)))
                    actions.append(Action(ActionKind.PREEMPT, jid, why, shape=name))
                continue
            n, where = got
            shape = j.best[n]
            speedups.append(j.speedup[n])
            on = tuple(sorted(where, key=lambda k: order[k]))
            state = PolluxState(max(j.state.top, n), False)
            comment = pollux_comment(j.view.admin_comment, shape.name, state)
            why = (f"{n} GPU(s) on {','.join(on)} at {shape.name}: goodput {shape.throughput:.3g} steps/s of its own "
                   f"batch, speedup {j.speedup[n]:.3g} (fair share {fair} GPU(s))")
            placements.append(Placement(jid, on[0], where[on[0]][0], shape.name, settings.gpu.shares_per_gpu,
                                        shape.throughput))
            if comment != j.view.admin_comment:
                actions.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, why, shape=shape.name, text=comment))
            gang = shape.resources.gpus > 0
            if j.running:
                actions.append(Action(ActionKind.RESHAPE_RUNNING, jid, why, gpus=n if gang else None,
                                      share=None if gang else shares_of(shape.resources.mps, spg), nodes=on,
                                      shape=shape.name))
                continue
            if gang:
                actions.append(Action(ActionKind.SET_GPUS, jid, why, gpus=n, nodes=on, shape=shape.name))
            else:
                share = shares_of(shape.resources.mps, spg)
                if j.view.gres is None or j.view.gres.kind != "mps" or j.view.gres.count != share:
                    actions.append(Action(ActionKind.SET_SHARE, jid, why, share=share,
                                          shape=shape.name))
                actions.append(Action(ActionKind.SET_NODES, jid, why, nodes=on, shape=shape.name))
            if j.view.held:
                actions.append(Action(ActionKind.RESUME, jid, why, nodes=on, shape=shape.name))
            elif j.view.reason == "BeginTime":
                actions.append(Action(ActionKind.START_NOW, jid, why, shape=shape.name))
        objective = power_mean(speedups, self.power)
        running = sum(1 for s in speedups if s > 0)
        notes = (f"Pollux: {len(jobs)} job(s), {running} with GPUs; {capacity} GPU(s), fair share {fair}; "
                 f"power mean of speedups {objective:.3g}",)
        return Plan(actions=tuple(actions), objective=objective, notes=notes,
                    placements=tuple(sorted(placements, key=lambda p: p.job_id)))

    # ------------------------------------------------------------------ pieces

    def _jobs(self, snapshot: Snapshot, families: Mapping[int, Family], part: str, cpus_per_gpu: float,
              mem_per_gpu: float) -> list[_Job]:
        """The jobs this policy plans, each with its best shape per GPU count, what it holds, its cap (twice the
        most it has held) and its host floor: the fewest GPUs whose share of their nodes' CPUs and memory covers
        what the job holds of those (Slurm keeps a job's CPUs and memory as submitted, so on fewer GPUs it
        would leave the rest of its nodes' GPUs without any)."""
        out: list[_Job] = []
        for v, fam, running in planned_jobs(snapshot, families, part, lambda c: pollux_state(c).held):
            state = pollux_state(v.admin_comment)
            narrowed, best = _table(self.narrow, fam)
            if not best:
                continue
            current: dict[str, list[int]] = {}
            shape = None
            if running:
                for node, gpu, _ in v.gpu_alloc:
                    if gpu not in current.setdefault(node, []):
                        current[node].append(gpu)
                name = named_in_comment(v.admin_comment)
                shape = next((s for s in fam.shapes if s.name == name), None)
            held = sum(len(g) for g in current.values())
            top = max(state.top, held)
            least = max(1, math.ceil(max(v.cpus / cpus_per_gpu, v.memory_mib / mem_per_gpu) - 1e-9))
            out.append(_Job(v, narrowed, best, current, shape, PolluxState(top, state.held), max(least, 2 * top),
                            least))
        return out

    def _costs(self, j: _Job, fair: int, scale: float, now: float, delay: float) -> None:
        """Job j's cost 1/(speedup + FLOOR) at 0, 1, … GPUs (inf where it may not run), and its speedups: the
        counts its family offers from its host floor to its cap (none there: its least above the floor), and what
        it holds now."""
        base_n = max((n for n in j.best if n <= fair), default=min(j.best))
        base = j.best[base_n].throughput
        age = max(0.0, now - j.view.submit_time) if j.view.submit_time is not None else 0.0
        factor = restart_factor(age, j.view.restarts, delay)
        held = j.held_now
        counts = [n for n in j.best if j.least <= n <= j.cap or n == held] or [n for n in j.best if n >= j.least][:1]
        allowed = counts if base > 0 else []
        cost = np.full(max(allowed, default=0) + 1, np.inf)
        cost[0] = 1.0 / FLOOR
        speed = {0: 0.0}
        for n in allowed:
            speed[n] = scale * j.best[n].throughput / base
            cost[n] = 1.0 / (speed[n] * (1.0 if n == held else factor) + FLOOR)
        j.costs, j.speedup = cost, speed

    @staticmethod
    def _retune(j: _Job, progress: Mapping[int, float] | None, delay: float, hysteresis: float) -> Shape:
        """The shape a job keeping its GPUs runs as: its best-goodput batch there when the gain over its remaining
        work pays an in-place restart (`rebatch.restart_s`), else the shape it has."""
        best = j.best.get(j.held_now)
        cur = j.shape
        if best is None:  # it holds a count its family does not offer (Slurm started it so): left as it is
            return cur if cur is not None else j.family.default_shape
        if cur is best:
            return cur
        if cur is None or gpus_of(cur) != j.held_now or cur.throughput <= 0:
            return best
        done = (progress or {}).get(j.view.job_id)
        if done is None or best.throughput <= cur.throughput:
            return cur
        left = max(0.0, j.family.total_work - done)
        saved = left / cur.throughput - left / best.throughput
        return best if saved > rebatch.restart_s(j.family, cur, best, delay) * (1.0 + hysteresis) else cur

