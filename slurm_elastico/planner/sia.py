"""Sia (Jayaram Subramanya et al., SOSP 2023) as a planner policy: GPU type, count and batch chosen for goodput.

Each epoch every job is offered Sia's configurations: on each GPU type, 1, 2,
4 … GPUs within one node (powers of two below the node size, and the whole
node), then whole nodes (2, 3, … × the node size), up to the type's GPUs
(`sia_counts`; the artifact's CONFIGS_4GPU / CONFIGS_8GPU), and at most twice
the most GPUs the job has held on any type (at least one; the artifact's
`share_max_replicas`). A configuration's goodput is the best its family
offers there (throughput × statistical efficiency over every global batch the
family declares: Sia's batch-size choice, as `planner.pollux`).

What Sia knows of a job grows as it runs (its bootstrapping): before the job
has run anywhere, only one GPU on each type, all worth the same; once it has
run on a type, its goodput there for every count (what Sia's throughput model,
fitted from the job's own steps, predicts; here the family's profile), and on
the types it has not run on that goodput times the ratio of the job's
one-GPU throughputs between the two types (the artifact's
`--project_throughputs`: Sia scales a fitted model by the app's one-GPU
throughput ratio). Goodputs are divided by the job's smallest, so its least
configuration is worth 1, and every configuration other than the one a
running job holds is multiplied by Pollux's restart factor
`max(age − restarts·d, 0) / (age + d)` (1 while the job is younger than d; d:
`planner.reshape_cost_s`, the artifact's per-application restart penalty).
Sia knows no host limits: a job's CPUs and memory (which Slurm keeps as
submitted, split over its nodes by GPUs) are checked only where it is
placed, so a job submitted for many GPUs that Sia starts on one may fill a
node's CPUs there (`planner.pollux` instead never plans a job below that
host floor).

The allocation minimises Σ round(goodput^p, 2) over the jobs given a
configuration plus λ_n = 1.1 for each job given none, p = −0.5 (the paper's
and the artifact's settings: `run_experiment.sh`), with at most one
configuration per job and the GPUs of each type as capacity: an integer
programme (CBC to a relative gap of 1e-4 in the artifact; here exact, by
dynamic programming over each type's GPUs left, `solve`). A job still
restoring from its last start (younger than d since it started) keeps what
it has, as do jobs Slurm would not requeue. Jobs that keep their configuration keep their GPUs; the others are
placed on their type's nodes, largest first (`planner.per_type.place_on`), the
largest smaller count of the same type where the chosen one cannot be
placed. A job that keeps its GPUs changes its batch in place only when the
goodput gained over its remaining work pays a restart, none for a new batch
taken in process (as `planner.pollux`).

State Slurm forgets, in the AdminComment beside `elastico:shape=`:
`elastico:sia.top=` (most GPUs held), `elastico:sia.ran=` (types it has run on,
`+`-joined), `elastico:sia.held=1` (preempted by this policy, to be resumed):
under `elastico:`, so the helper counts them as a policy's own parts. Pure: a
`Snapshot` and families in, a `Plan` out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Action, Family, JobView, Placement, Plan, Shape, Snapshot
from slurm_elastico.planner.baselines import planned_jobs
from slurm_elastico.planner.gpu_choice import start_key
from slurm_elastico.planner.narrowers import whole_gpu_any_batch
from slurm_elastico.planner.pollux import restart_factor
from slurm_elastico.planner.per_type import (TypeView, keep_actions, place_on, preempt_actions, running_on,
                                             speed_table, start_actions, state_of, types_of, with_state)
from slurm_elastico.runtime import rebatch
from slurm_elastico.shapes.current import named_in_comment

POWER = -0.5
"""Sia's p: the objective sums normalised goodput^p (p < 0: minimised, fairer the more negative)."""
NO_ALLOC = 1.1
"""Sia's λ_n: what a job given no GPU costs (above 1, the cost of a job's least configuration)."""
CLIP = 3000.0
"""Largest cost one configuration may have (the artifact's `sia_goodput_clip_val`)."""
STATE = "elastico:sia."
UNTYPED = "-"
"""How `elastico:sia.ran=` names the one type of a cluster whose gres names none."""


def sia_counts(node_gpus: int, nodes: int) -> tuple[int, ...]:
    """The GPU counts Sia offers on a type of `nodes` nodes of `node_gpus` GPUs: powers of two below the node size
    and the whole node, then 2, 3, … whole nodes (4 per node: 1, 2, 4, 8, 12, …; 8 per node: 1, 2, 4, 8, 16, …)."""
    if node_gpus < 1 or nodes < 1:
        raise ValueError(f"a GPU type has at least one node of at least one GPU, not {nodes} x {node_gpus}")
    small = {c for c in (2 ** k for k in range(0, 12)) if c < node_gpus} | {node_gpus}
    return tuple(sorted(small | {node_gpus * k for k in range(2, nodes + 1)}))


def goodputs(table: Mapping[tuple[str, int], Shape], counts: Mapping[str, tuple[int, ...]], ran: tuple[str, ...],
             cap: int, least: int = 1) -> dict[tuple[str, int], float]:
    """Sia's normalised goodput of each configuration (type, GPUs) it would offer the job (module docstring), from
    `least` to `cap` GPUs: its least worth 1; before the job has run anywhere, its smallest count on each type
    (one GPU, unless its host share needs more), each worth 1."""
    if not any(t in counts for t in ran):
        first = {t: min((n for n in ns if n >= least and (t, n) in table), default=None) for t, ns in counts.items()}
        return {(t, n): 1.0 for t, n in first.items() if n is not None}
    ref = next(t for t in ran if t in counts)
    one = {t: table[(t, 1)].throughput for t in counts if (t, 1) in table}
    out: dict[tuple[str, int], float] = {}
    for t, ns in counts.items():
        for n in ns:
            if not least <= n <= cap or (t, n) not in table:
                continue
            if t in ran:
                g = table[(t, n)].throughput
            elif (ref, n) in table and one.get(ref, 0) > 0 and t in one:
                g = table[(ref, n)].throughput * one[t] / one[ref]
            else:
                continue
            if g > 0:
                out[(t, n)] = g
    if not out:
        return {}
    lo = min(out.values())
    return {k: v / lo for k, v in out.items()}


def cost(value: float, power: float = POWER) -> float:
    """What one configuration of normalised goodput `value` adds to Sia's objective: value^p, to 2 decimals, clipped."""
    return min(round(value ** power, 2), CLIP) if value > 0 else CLIP


def solve(costs: list[dict[tuple[str, int], float]], fixed: list[tuple[str, int] | None],
          capacity: Mapping[str, int], no_alloc: float = NO_ALLOC) -> list[tuple[str, int] | None]:
    """At most one configuration per job minimising Σ cost + `no_alloc` per job given none, within each type's GPUs
    (`fixed[j]`: the configuration job j must keep, or None).

    Exact by dynamic programming over the GPUs left per type (a knapsack with one dimension per type, as
    `planner.pollux.allocate` has one) while the types' capacities span at most `DP_STATES` states; beyond, the
    linear relaxation (HiGHS), its integral choices kept and the few fractional jobs given what still fits."""
    options = [[k for k, c in cs.items() if fixed[j] == k or (fixed[j] is None and c < no_alloc)]
               for j, cs in enumerate(costs)]
    types = [t for t in capacity]
    dims = tuple(max(0, int(capacity[t])) + 1 for t in types)
    if int(np.prod(dims)) <= DP_STATES:
        return _solve_dp(costs, fixed, options, types, dims, no_alloc)
    return _solve_lp(costs, fixed, options, types, capacity, no_alloc)


DP_STATES = 250_000
"""Most states (Π over types of GPUs + 1) the exact programme runs over (Sia's 64 GPUs of 3 types: 25 × 17 × 25)."""


def _solve_dp(costs, fixed, options, types, dims, no_alloc) -> list[tuple[str, int] | None]:
    best = np.zeros(dims)  # least cost of the jobs so far using at most this many GPUs of each type
    picks = []
    for j, opts in enumerate(options):
        new = np.full(dims, np.inf) if fixed[j] is not None else best + no_alloc
        pick = np.full(dims, -1, dtype=np.int16)
        for i, (t, n) in enumerate(opts):
            if t not in types:
                continue
            ax = types.index(t)
            if n >= dims[ax]:
                continue
            cand = np.full(dims, np.inf)
            src = [slice(None)] * len(dims)
            dst = [slice(None)] * len(dims)
            src[ax], dst[ax] = slice(0, dims[ax] - n), slice(n, None)
            cand[tuple(dst)] = best[tuple(src)] + costs[j][(t, n)]
            better = cand < new - 1e-12
            new = np.where(better, cand, new)
            pick = np.where(better, i, pick)
        best = new
        picks.append(pick)
    out: list[tuple[str, int] | None] = list(fixed)
    at = [d - 1 for d in dims]
    if not np.isfinite(best[tuple(at)]):  # a fixed job that does not fit: the others planned around what is left
        return _solve_lp(costs, fixed, options, types, {t: d - 1 for t, d in zip(types, dims)}, no_alloc)
    for j in range(len(options) - 1, -1, -1):
        i = int(picks[j][tuple(at)])
        out[j] = options[j][i] if i >= 0 else None
        if i >= 0:
            t, n = options[j][i]
            at[types.index(t)] -= n
    return out


def _solve_lp(costs, fixed, options, types, capacity, no_alloc) -> list[tuple[str, int] | None]:
    var = [(j, k) for j, opts in enumerate(options) for k in opts if k[0] in capacity]
    out: list[tuple[str, int] | None] = list(fixed)
    if not var:
        return out
    rows, cols, vals = [], [], []
    for i, (j, (t, n)) in enumerate(var):
        rows += [j, len(costs) + types.index(t)]
        cols += [i, i]
        vals += [1.0, float(n)]
    # scipy when a solve needs it: importing it costs about 0.3 s, every helper epoch otherwise
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix
    a = coo_matrix((vals, (rows, cols)), shape=(len(costs) + len(types), len(var))).tocsr()
    ub = np.array([1.0] * len(costs) + [float(capacity[t]) for t in types])
    c = np.array([costs[j][k] - no_alloc for j, k in var])
    lb = np.array([1.0 if fixed[j] == k else 0.0 for j, k in var])
    res = linprog(c, A_ub=a, b_ub=ub, bounds=np.column_stack([lb, np.ones(len(var))]), method="highs")
    x = res.x if res.x is not None else np.zeros(len(var))
    left = {t: float(capacity[t]) for t in types}
    for i in np.flatnonzero(x > 1 - 1e-6):
        j, k = var[i]
        out[j] = k
        left[k[0]] -= k[1]
    for i in np.argsort(-x, kind="stable"):  # the fractional jobs, most chosen first: the cheapest option that fits
        j, _ = var[i]
        if out[j] is None and x[i] > 1e-6:
            for k in sorted(options[j], key=lambda k: costs[j][k]):
                if left[k[0]] >= k[1]:
                    out[j] = k
                    left[k[0]] -= k[1]
                    break
    return out


@dataclass(eq=False)
class _Job:
    view: JobView
    family: Family
    table: dict[tuple[str, int], Shape]
    on: str | None  # the type it runs on (running)
    where: dict[str, list[int]]  # node -> GPU indices it holds (running)
    shape: Shape | None  # the shape it runs as (running)
    top: int
    ran: tuple[str, ...]
    values: dict[tuple[str, int], float] = field(default_factory=dict)

    @property
    def held_now(self) -> int:
        return sum(len(g) for g in self.where.values())

    @property
    def current(self) -> tuple[str, int] | None:
        return (self.on, self.held_now) if self.on is not None else None


@dataclass(frozen=True)
class SiaPolicy:
    """Sia: heterogeneity-aware, goodput-optimised allocation by an integer programme (module docstring).

    Has the fields other code reads from a `Policy` (`narrow`, `price`, `interference`, `reshape`) and
    `adapts_batch` (it wants goodput shapes at other global batches in every family).
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
        delay = settings.planner.reshape_cost_s
        spg = settings.gpu.shares_per_gpu
        found = list(planned_jobs(snapshot, families, settings.slurm.partition,
                                  lambda c: state_of(c, STATE).get("held") == "1"))
        types, room = types_of(snapshot, settings.slurm.partition, {v.job_id for v, _, _ in found})
        counts = {t: sia_counts(tv.node_gpus, len(tv.nodes)) for t, tv in types.items()}
        jobs = self._jobs(snapshot, found, types)
        capacity = {t: sum(len(room.gpus[n]) for n in tv.nodes) for t, tv in types.items()}
        for j in jobs:
            if j.where:
                room.free(j.where, j.held_now, j.view.cpus, j.view.memory_mib)

        costs, fixed = [], []
        for j in jobs:
            j.values = goodputs(j.table, counts, j.ran, max(2 * j.top, 1))
            if j.current is not None and j.current not in j.values and j.current in j.table:
                j.values[j.current] = min(j.values.values(), default=1.0)  # a count Sia would not offer, kept
            age = max(0.0, now - j.view.submit_time) if j.view.submit_time is not None else 0.0
            factor = 1.0 if age < delay else restart_factor(age, j.view.restarts, delay)
            costs.append({k: cost(v * (1.0 if k == j.current else factor), self.power) for k, v in j.values.items()})
            restoring = j.view.start_time is not None and now - j.view.start_time < delay
            fixed.append(j.current if j.current is not None and (restoring or not j.view.requeue) else None)
        chosen = solve(costs, fixed, capacity)

        keep: dict[int, tuple[str, int]] = {}
        for j, k in zip(jobs, chosen):
            if k is not None and k == j.current:
                room.hold(j.where, j.held_now, j.view.cpus, j.view.memory_mib)
                keep[j.view.job_id] = k
        placed: dict[int, tuple[str, int, dict[str, list[int]]]] = {}
        todo = sorted(((j, k) for j, k in zip(jobs, chosen) if k is not None and j.view.job_id not in keep),
                      key=lambda jk: (-jk[1][1], start_key(jk[0].view)))
        for j, (t, n) in todo:
            for m in [c for c in (n,) + tuple(reversed(counts.get(t, ()))) if c <= n and (t, c) in j.table]:
                if (t, m) == j.current and room.holds(j.where, m, j.view.cpus, j.view.memory_mib):
                    room.hold(j.where, m, j.view.cpus, j.view.memory_mib)
                    keep[j.view.job_id] = (t, m)  # back to what it runs on: no restart
                    break
                spot = place_on(m, room, types[t].nodes, j.view.cpus, j.view.memory_mib, snapshot.even_gangs)
                if spot is not None:
                    placed[j.view.job_id] = (t, m, room.take(spot, m, j.view.cpus, j.view.memory_mib))
                    break
        return self._actions(jobs, keep, placed, room.order, progress, delay, settings.planner.hysteresis, spg,
                             capacity)

    # ------------------------------------------------------------------ pieces

    def _jobs(self, snapshot: Snapshot, found: list[tuple[JobView, Family, bool]], types: Mapping[str, TypeView]
              ) -> list[_Job]:
        """The jobs Sia plans: each with its goodput table per (type, count), what it holds, the most it has held
        and the types it has run on."""
        names = tuple(types)
        out: list[_Job] = []
        for v, fam, running in found:
            table = speed_table(self.narrow(fam), names)
            if not table:
                continue
            state = state_of(v.admin_comment, STATE)
            on, where = running_on(v, snapshot) if running else (None, {})
            held = sum(len(g) for g in where.values())
            ran = tuple("" if t == UNTYPED else t for t in state.get("ran", "").split("+") if t)
            if on is not None and on not in ran:
                ran += (on,)
            top = max(int(state["top"]) if state.get("top", "").isdigit() else 0, held)
            shape = None
            if running:
                name = named_in_comment(v.admin_comment)
                shape = next((s for s in fam.shapes if s.name == name), None)
            out.append(_Job(v, fam, table, on, where, shape, top, ran))
        return out

    def _actions(self, jobs: list[_Job], keep: Mapping[int, tuple[str, int]],
                 placed: Mapping[int, tuple[str, int, dict[str, list[int]]]], order: Mapping[str, int],
                 progress: Mapping[int, float] | None, delay: float, hysteresis: float, spg: int,
                 capacity: Mapping[str, int]) -> Plan:
        actions: list[Action] = []
        placements: list[Placement] = []
        objective = 0.0
        for j in jobs:
            v = j.view
            jid = v.job_id
            if jid in keep:
                t, n = keep[jid]
                shape = retune(j.shape, j.table.get((t, n)), j.family, (progress or {}).get(jid), delay, hysteresis)
                objective += j.values.get((t, n), 0.0)
                comment = with_state(v.admin_comment, shape.name, STATE, _state(j, t, n, False))
                why = f"keeps {n} {t or 'GPU'} GPU(s) at {shape.name}"
                actions += keep_actions(v, shape, j.shape is not None and shape is not j.shape, comment, why)
                node, gpus = min(j.where.items(), key=lambda kv: order.get(kv[0], 0))
                placements.append(Placement(jid, node, gpus[0], shape.name, spg, shape.throughput))
                continue
            got = placed.get(jid)
            if got is None:
                if j.where:
                    name = j.shape.name if j.shape else j.family.default_shape.name
                    comment = with_state(v.admin_comment, name, STATE, _state(j, j.on or "", 0, True))
                    actions += preempt_actions(v, name, comment, "preempted: Sia's allocation gives it no GPU")
                continue
            t, n, where = got
            shape = j.table[(t, n)]
            objective += j.values.get((t, n), 0.0)
            on = tuple(sorted(where, key=lambda k: order[k]))
            comment = with_state(v.admin_comment, shape.name, STATE, _state(j, t, n, False))
            why = (f"{n} {t or 'GPU'} GPU(s) on {','.join(on)} at {shape.name}: goodput {shape.throughput:.3g} steps/s "
                   f"of its own batch, {j.values.get((t, n), 0.0):.3g} x its least configuration")
            actions += start_actions(v, bool(j.where), shape, n, t, on, comment, why, spg)
            placements.append(Placement(jid, on[0], where[on[0]][0], shape.name, spg, shape.throughput))
        used = sum(k[1] for k in keep.values()) + sum(p[1] for p in placed.values())
        notes = (f"Sia: {len(jobs)} job(s), {len(keep) + len(placed)} with GPUs ({used} of "
                 f"{sum(capacity.values())}); GPUs per type: "
                 f"{', '.join(f'{t or chr(45)} {c}' for t, c in capacity.items())}",)
        return Plan(actions=tuple(actions), objective=objective, notes=notes,
                    placements=tuple(sorted(placements, key=lambda p: p.job_id)))


def _state(j: _Job, t: str, n: int, held: bool) -> dict[str, object]:
    ran = j.ran + ((t,) if t not in j.ran and not held else ())
    return {"top": max(j.top, n), "ran": "+".join(t or UNTYPED for t in ran), "held": "1" if held else ""}


def retune(cur: Shape | None, best: Shape | None, fam: Family, done: float | None, delay: float,
           hysteresis: float) -> Shape:
    """The shape a job keeping its GPUs runs as: the best goodput there when the time it saves over the remaining
    work pays an in-place restart (`rebatch.restart_s`: none for a new batch taken in process; with the planner's
    hysteresis), else the one it has."""
    if best is None:
        return cur if cur is not None else fam.default_shape
    if cur is None or cur is best:
        return best if cur is None else cur
    if done is None or cur.throughput <= 0 or best.throughput <= cur.throughput:
        return cur
    left = max(0.0, fam.total_work - done)
    saved = left / cur.throughput - left / best.throughput
    return best if saved > rebatch.restart_s(fam, cur, best, delay) * (1.0 + hysteresis) else cur
