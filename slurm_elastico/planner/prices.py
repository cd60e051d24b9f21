"""The epoch's prices: the jobs' tables as one pricing problem, a few projected-subgradient rounds of
shadow prices (`slurm_elastico.pricing`), and under a policy with `allot` the GPU counts of the jobs with
data-parallel shapes from `planner.allot` instead of from the prices.

Elastic running jobs (`running.is_elastic`) take part with the pending ones,
never left out, at a restart charge for any shape but their own
(`_restart_charge`), so that when the queue makes GPUs dear they give some
back, and when GPUs sit idle they take them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from slurm_elastico import pricing
from slurm_elastico.config import PlannerSettings
from slurm_elastico.planner import allot
from slurm_elastico.planner.board import Board
from slurm_elastico.planner.packing import GpuState
from slurm_elastico.planner.running import left_s
from slurm_elastico.planner.type_prices import priced_allotment
from slurm_elastico.planner.tables import RESOURCES, Job, Table, resources


@dataclass
class Priced:
    """What the prices (and the allotment) chose."""

    problem: pricing.PriceProblem
    result: pricing.PriceResult
    choice: np.ndarray  # per pending job, in `pending` order: the slot chosen, or `pricing.NONE`
    targets: dict[int, int]  # elastic running job's id -> the slot chosen (`pricing.NONE`: preempted)
    allotted: list[int]  # pending jobs whose GPU count the allotment chose, in its order
    growers: list[Job]  # elastic running jobs, in the allotment's order
    names: tuple[str, ...] = RESOURCES  # the priced resources (`tables.resources`)

    def note(self) -> str:
        """The prices and the rounds it took, for the plan's notes."""
        return ("prices (GPU equivalents): " + ", ".join(f"{r}={v:.3g}" for r, v in zip(self.names, self.result.prices))
                + f" after {self.result.rounds} round(s)")


def price(pending: list[Job], elastic: list[Job], board: Board, policy, ps: PlannerSettings, now: float,
          progress: Mapping[int, float]) -> Priced:
    """Price the pending and elastic jobs over what is free (with `policy.price`; else every job asks its
    fastest shape at zero prices), then let the allotment choose the GPU counts (with `policy.allot`)."""
    restart = [_restart_charge(j, now, progress, ps.reshape_cost_s, ps.hysteresis) for j in elastic]
    problem = _problem(pending, board.state, board.per_gpu, elastic, restart, len(board.types))
    if policy.price and (pending or elastic):
        result = pricing.solve(problem, ps.rounds, ps.step)
    else:
        z = np.zeros(len(problem.capacity))
        result = pricing.PriceResult(z, pricing.choose(problem, z), 0)
    choice = result.choice[:len(pending)].copy()
    targets = {j.view.job_id: int(c) for j, c in zip(elastic, result.choice[len(pending):])}
    allotted: list[int] = []  # pending jobs whose GPU count the allotment chose, in its order
    growers: list[Job] = []  # elastic running jobs, in the allotment's order
    if policy.allot:
        allotted, growers = _allot(pending, elastic, choice, targets, problem, now, progress, ps,
                                   float(board.per_gpu[0]), board.state)
    return Priced(problem, result, choice, targets, allotted, growers, resources(board.types))


def _restart_charge(job: Job, now: float, progress: Mapping[int, float], cost_s: float, hysteresis: float) -> float:
    """What a reshape costs an elastic job in the pricing's units: its weight × the share of its remaining time
    the restart takes (with the hysteresis margin), at most its weight."""
    _, left = left_s(job, now, progress)
    return job.weight * min(1.0, (1.0 + hysteresis) * cost_s / max(left, 1e-9)) if math.isfinite(left) else 0.0


def _problem(pending: list[Job], state: GpuState, per_gpu: np.ndarray, elastic: list[Job] = (),
             restart: list[float] = (), n_types: int = 0) -> pricing.PriceProblem:
    """Stack the jobs' tables into padded [J, C] arrays over the free pool: the pending jobs, then the elastic
    running ones (never left out; only their whole-GPU shapes; `restart` charged on all but the current one;
    what they hold is added to the pool). With several GPU types (`n_types` > 1) the pool has one more entry per
    type: its free GPU equivalents."""
    every = [*pending, *elastic]
    width = max((len(j.table.rows) for j in every), default=1)
    uniq: dict[int, int] = {}
    tabs: list[Table] = []
    idx = np.empty(len(every), dtype=int)
    for k, j in enumerate(every):
        u = uniq.get(id(j.table))
        if u is None:
            u = uniq[id(j.table)] = len(tabs)
            tabs.append(j.table)
        idx[k] = u
    typed = n_types if n_types > 1 else 0
    nt, r = max(1, len(tabs)), len(RESOURCES) + typed
    value = np.zeros((nt, width))
    demand = np.zeros((nt, width, r))
    allowed = np.zeros((nt, width), dtype=bool)
    contention = np.zeros((nt, width))
    for u, t in enumerate(tabs):
        c = len(t.rows)
        value[u, :c], demand[u, :c], allowed[u, :c], contention[u, :c] = t.value, t.demand, t.allowed, t.contention
    w = np.array([j.weight for j in every], dtype=float)
    v = value[idx]
    open_gpus = [g for g, f in enumerate(state.free_share) if f > 0]
    held = {g: j for j in elastic for g in (j.seat.gang or (j.seat.gpu,))}  # GPUs an elastic job could give back
    open_nodes = sorted({state.gpu_node[g] for g in (*open_gpus, *held)})
    share_unit = per_gpu[0]
    free = np.array([
        sum(state.free_share[g] for g in open_gpus),
        sum(max(0.0, state.free_mem[g]) for g in open_gpus),
        sum(max(0.0, state.node_cpu[n]) for n in open_nodes),
        sum(min(max(0.0, state.node_mem[n]), 1e15) for n in open_nodes),
        *(sum(state.free_share[g] for g in open_gpus if state.gpu_type[g] == t) / share_unit for t in range(typed)),
    ], dtype=float)
    allow = allowed[idx]
    penalty = w[:, None] * v * contention[idx]
    optional = np.ones(len(every), dtype=bool)
    for k, (j, charge) in enumerate(zip(elastic, restart), start=len(pending)):
        rows = j.table.rows
        allow[k, :len(rows)] &= np.array([bool(r.gpus) or r.share >= state.total_share[j.seat.gpu] for r in rows])
        allow[k, j.seat.row.slot] = True
        penalty[k, :len(rows)] += charge
        penalty[k, j.seat.row.slot] -= charge
        optional[k] = False
        mine = j.seat.gang or (j.seat.gpu,)
        free += np.array([sum(state.total_share[g] for g in mine), sum(max(0.0, state.free_mem[g]) + j.seat.row.mem
                                                                       for g in mine), j.seat.row.cpus, j.seat.row.hmem,
                          *(sum(state.total_share[g] for g in mine if state.gpu_type[g] == t) / share_unit
                            for t in range(typed))])
    cap = free.copy()
    cap[:4] /= per_gpu
    if cap[0] <= 0:
        allow[:len(pending)] = False
    return pricing.PriceProblem(
        value=v, demand=demand, penalty=penalty, allowed=allow,
        weight=w, capacity=cap, optional=optional, group=idx)


def _node_room(state: GpuState, elastic: list[Job], per_gpu_share: float) -> tuple[list[float], list[int]]:
    """GPU equivalents per node (`GpuState.gpu_node` numbers) the allotment may hand out: its free shares and the
    GPUs the elastic running jobs hold there (the budget's, per node); and each node's GPU type (a node's GPUs are
    of one)."""
    room = [0.0] * (max(state.gpu_node, default=-1) + 1)
    types = [-1] * len(room)
    for g, f in enumerate(state.free_share):
        types[state.gpu_node[g]] = state.gpu_type[g]
        if f > 0:
            room[state.gpu_node[g]] += f / per_gpu_share
    for j in elastic:
        for g in j.seat.gang or (j.seat.gpu,):
            room[state.gpu_node[g]] += state.total_share[g] / per_gpu_share
    return room, types


def _gang_capable(job: Job) -> bool:
    return job.table.gangs


def _allot(pending: list[Job], elastic: list[Job], choice: np.ndarray, targets: dict[int, int],
           problem: pricing.PriceProblem, now: float, progress: Mapping[int, float], ps,
           per_gpu_share: float, state: GpuState) -> tuple[list[int], list[Job]]:
    """Replace the prices' choice for the jobs with data-parallel shapes by `planner.allot` (weighted shortest
    remaining time first; on several GPU types at the types' prices, `planner.type_prices`); the other pending
    jobs keep the prices' choice and are budgeted first. Returns the allotted pending jobs' indices and the
    elastic jobs, each in the allotment's order."""
    typed = problem.capacity.shape[0] - len(RESOURCES)
    pool = allot.Budget(problem.capacity[len(RESOURCES):] if typed else float(problem.capacity[0]))
    booked: list[tuple[frozenset[int] | None, int, float]] = []  # their takes, on their nodes (`allot.NodeRoom`)
    for i, j in enumerate(pending):
        if not _gang_capable(j) and choice[i] != pricing.NONE:
            d = problem.shape_demand(i, choice[i])
            ty = int(np.argmax(d[len(RESOURCES):])) if typed and d[len(RESOURCES):].any() else -1
            pool.take(ty, float(d[0]))
            booked.append((j.seat.nodes, ty, float(d[0])))
    who = [i for i, j in enumerate(pending) if _gang_capable(j)]
    claims = []
    shared: dict[int, tuple] = {}  # what a claim takes from its table, by id (jobs of one family share it)
    for j in [pending[i] for i in who] + list(elastic):
        rows, t = j.table.rows, j.table
        got = shared.get(id(t))
        if got is None:
            sizes = [float(r.gpus) if r.gpus else r.share / per_gpu_share for r in rows]
            cap = float(max(1, t.family.default_shape.resources.gpus))
            # the key's speed: per GPU at its request, so that the key is the GPU-seconds left (its area, as
            # Tiresias's two dimensions count service, but what is left rather than what was had); on several GPU
            # types, on its fastest
            rate = max((r.tput for r, z in zip(rows, sizes) if z <= cap + 1e-9 and r.gtype < max(typed, 1)),
                       default=0.0) / cap
            rate = rate if rate > 0 else max(r.tput for r in rows) / cap
            got = shared[id(t)] = (sizes, [r.gtype for r in rows] if typed else [], cap, rate, [r.tput for r in rows],
                                   list(t.allowed))
        sizes, types, cap, rate, tputs, allowed = got
        if j.running:
            work, _ = left_s(j, now, progress)
            # a running job moves only between whole GPUs (a gang, or one GPU alone), of types the cluster has
            allowed = [(bool(r.gpus) or r.share >= per_gpu_share) and r.gtype < max(typed, 1) for r in rows]
            allowed[j.seat.row.slot] = True
            claims.append(allot.Claim(work / rate / j.weight, sizes, tputs, allowed,
                                      max(cap, sizes[j.seat.row.slot]), work, j.seat.row.slot, ps.reshape_cost_s,
                                      types=types, nodes=j.seat.nodes, node_sets=j.seat.gang_nodes))
        else:
            work = max(0.0, t.family.total_work - (progress.get(j.view.job_id) or 0.0))
            claims.append(allot.Claim(work / rate / j.weight, sizes, tputs, allowed, cap, extra=j.view.requeue,
                                      types=types, nodes=j.seat.nodes, node_sets=j.seat.gang_nodes))
    room, types = _node_room(state, elastic, per_gpu_share) if any(
        c.nodes is not None or c.node_sets for c in claims) else (None, None)
    picks, _ = priced_allotment(claims, pool.left, ps.hysteresis, node_room=room, node_types=types, booked=booked)
    for i, p in zip(who, picks):
        choice[i] = p
    for j, p in zip(elastic, picks[len(who):]):
        targets[j.view.job_id] = p
    seq = allot.order(claims)
    return [who[k] for k in seq if k < len(who)], [elastic[k - len(who)] for k in seq if k >= len(who)]
