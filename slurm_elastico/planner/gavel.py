"""Gavel (Narayanan et al., OSDI 2020) as Sia's evaluation ran it ("Gavel + TunedJobs"): heterogeneity-aware rounds.

Every job runs at the GPU count and global batch it was submitted with (the
"tuned" jobs: Gavel adapts neither), on one GPU type at a time. Its
throughput on each type is the family's fastest shape there at that count
and batch (steps per second; the artifact reads the measured profile the
same way). Gavel's policy turns throughputs into an allocation X: x[j, t],
the fraction of time job j should run on type t (Σ_t x[j, t] ≤ 1, Σ_j
GPUs_j · x[j, t] ≤ the type's GPUs), as a linear programme (HiGHS):

- `sum` (the registered `gavel`, what Sia's port runs: its
  `gavel_default_policy = "max_sum_throughput_perf"`): maximise Σ x · throughput.
- `maxmin` (`gavel-maxmin`, the Gavel paper's heterogeneity-aware max-min
  fairness / LAS): maximise the least effective throughput, each job's
  normalised by its throughput on an equal share of every type
  (x = the type's GPUs over the GPUs all jobs ask for, at most 1 in all).

Rounds of `ROUND_S` = 360 s (the artifact's `--interval=360` for Gavel)
realise X: each (job, type) gets priority x[j, t] / (its share of the time
type t has been given out), and in descending priority each job not yet
placed takes its GPUs on that type if enough are left; jobs keep their GPUs
when they stay on the same type. A job placed on another type or count, or
newly, restarts; one left out is preempted (requeue-held, resumed later).
Between round boundaries the plan changes nothing (a job that arrives waits
for the next round, as in Gavel).

Differences from the port, forced by a pure planner over a `Snapshot`: the
time each job received per type travels in its AdminComment
(`elastico:gavel.t.<type>=<seconds>`, starting at half a round per type, as
Gavel does; `elastico:gavel.round=` the last round it was placed in;
`elastico:gavel.held=1`), and a
type's total is the sum over the jobs present, where Gavel also counts jobs
that have finished (the same factor for every job on a type: it changes the
order across types only). A gang is placed as Slurm can be asked for it
(`planner.per_type.place_on`); where the type's free GPUs are too fragmented for
that, the job waits for the next round (Gavel's workers ignore node
boundaries). Rounds are noticed at the first epoch the planner runs after
they begin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Action, Family, JobView, Placement, Plan, Shape, Snapshot
from slurm_elastico.planner.baselines import planned_jobs
from slurm_elastico.planner.narrowers import whole_gpu_any_batch
from slurm_elastico.planner.per_type import (gpus_of, keep_actions, place_on, preempt_actions, running_on,
                                             speed_table, start_actions, state_of, types_of, with_state)

ROUND_S = 360.0
"""Gavel's round in Sia's evaluation (`run_experiment.sh`: `--policy=gavel --interval=360`)."""
STATE = "elastico:gavel."
OBJECTIVES = ("sum", "maxmin")


def allocation(tput: np.ndarray, scale: np.ndarray, capacity: np.ndarray, objective: str = "sum") -> np.ndarray:
    """Gavel's allocation X (jobs × types): time fractions maximising Σ x · tput (`sum`) or the least effective
    throughput over each job's on an equal share (`maxmin`), with Σ_t x ≤ 1 per job and Σ_j scale_j · x ≤ capacity
    per type. Zero throughput (a type the job cannot run on) gets no time."""
    if objective not in OBJECTIVES:
        raise ValueError(f"Gavel objective {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    m, n = tput.shape
    if m == 0 or n == 0:
        return np.zeros((m, n))
    ok = tput > 0
    cells = np.argwhere(ok)
    k = len(cells)
    if k == 0:
        return np.zeros((m, n))
    extra = 1 if objective == "maxmin" else 0
    rows, cols, vals = [], [], []
    for i, (j, t) in enumerate(cells):
        rows += [j, m + t]
        cols += [i, i]
        vals += [1.0, float(scale[j])]
    ub = list(np.ones(m)) + list(capacity.astype(float))
    if objective == "sum":
        c = -tput[ok]
    else:
        share = np.minimum(1.0, capacity / max(float(scale.sum()), 1e-9))  # each job's equal share of each type
        norm = tput @ share
        norm = np.where(norm > 0, norm, 1.0)
        for i, (j, t) in enumerate(cells):  # z - Σ_t tput[j,t] / norm_j · x[j,t] <= 0
            rows.append(m + n + j)
            cols.append(i)
            vals.append(-tput[j, t] / norm[j])
        rows += [m + n + j for j in range(m)]
        cols += [k] * m
        vals += [1.0] * m
        ub += [0.0] * m
        c = np.zeros(k + 1)
        c[k] = -1.0
    # scipy when a solve needs it: importing it costs about 0.3 s, every helper epoch otherwise
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix
    a = coo_matrix((vals, (rows, cols)), shape=(len(ub), k + extra)).tocsr()
    res = linprog(c, A_ub=a, b_ub=np.array(ub), bounds=[(0.0, 1.0)] * k + [(0.0, None)] * extra, method="highs")
    x = np.zeros((m, n))
    if res.x is not None:
        x[ok] = np.clip(np.round(res.x[:k], 5), 0.0, 1.0)
    return x


def round_order(x: np.ndarray, received: np.ndarray) -> list[tuple[int, int]]:
    """(job, type) pairs in Gavel's order for a round: priority x / (the job's share of the time the type has given
    out) descending, then x; ties in job, then type order. Pairs with x = 0 come last (they still fill what is left)."""
    total = received.sum(axis=0)
    frac = np.divide(received, total, out=np.zeros_like(received), where=total > 0)
    prio = np.where(x > 0, np.divide(x, frac, out=np.full_like(x, 1e9), where=frac > 0), 0.0)
    m, n = x.shape
    entries = [(t * m + j, j, t) for t in range(n) for j in range(m)]  # the port lists each type's jobs in turn
    entries.sort(key=lambda e: (-prio[e[1], e[2]], -x[e[1], e[2]], e[0]))
    return [(j, t) for _, j, t in entries]


@dataclass(eq=False)
class _Job:
    view: JobView
    family: Family
    scale: int
    shapes: dict[str, Shape]  # type -> its own-batch shape at its submitted count
    on: str | None
    where: dict[str, list[int]]
    received: dict[str, float]


@dataclass(frozen=True)
class GavelPolicy:
    """Gavel with its jobs as submitted, in rounds (module docstring); `objective` is `sum` or `maxmin`.

    Has the fields other code reads from a `Policy` (`narrow`, `price`, `interference`, `reshape`).
    """

    name: str
    description: str
    objective: str = "sum"
    narrow: Callable[[Family], Family] = whole_gpu_any_batch
    price: bool = False
    interference: bool = False
    reshape: bool = True
    round_s: float = ROUND_S

    def plan(self, snapshot: Snapshot, families: Mapping[int, Family], settings: Settings,
             model: SlowdownModel | None, now: float, progress: Mapping[int, float] | None = None) -> Plan:
        found = list(planned_jobs(snapshot, families, settings.slurm.partition,
                                  lambda c: state_of(c, STATE).get("held") == "1"))
        rnd = int(now // self.round_s)
        last = max((_int(state_of(v.admin_comment, STATE).get("round")) for v, _, _ in found), default=-1)
        if rnd <= last:
            return Plan(notes=(f"Gavel: round {rnd} under way; nothing changes until the next",))
        types, room = types_of(snapshot, settings.slurm.partition, {v.job_id for v, _, _ in found})
        names = tuple(types)
        jobs = self._jobs(snapshot, found, names)
        for j in jobs:
            if j.where:
                room.free(j.where, sum(len(g) for g in j.where.values()), j.view.cpus, j.view.memory_mib)
        capacity = np.array([sum(len(room.gpus[n]) for n in types[t].nodes) for t in names])
        tput = np.array([[j.shapes[t].throughput if t in j.shapes else 0.0 for t in names] for j in jobs]
                        ).reshape(len(jobs), len(names))
        scale = np.array([j.scale for j in jobs], dtype=float)
        x = allocation(tput, scale, capacity, self.objective)
        received = np.array([[j.received.get(t, self.round_s / 2) for t in names] for j in jobs]
                            ).reshape(len(jobs), len(names))

        left = capacity.copy()
        chosen: dict[int, int] = {}
        for ji, ti in round_order(x, received):
            if ji in chosen or tput[ji, ti] <= 0 or jobs[ji].scale > left[ti]:
                continue
            chosen[ji] = ti
            left[ti] -= jobs[ji].scale

        keep: dict[int, str] = {}
        placed: dict[int, tuple[str, dict[str, list[int]]]] = {}
        for ji in sorted(chosen, key=lambda ji: -jobs[ji].scale):  # largest first, the port's order per type
            j, t = jobs[ji], names[chosen[ji]]
            held = sum(len(g) for g in j.where.values())
            if j.on == t and held == j.scale and room.holds(j.where, held, j.view.cpus, j.view.memory_mib):
                room.hold(j.where, held, j.view.cpus, j.view.memory_mib)
                keep[ji] = t
        for ji in sorted(chosen, key=lambda ji: -jobs[ji].scale):
            if ji in keep:
                continue
            j, t = jobs[ji], names[chosen[ji]]
            spot = place_on(j.scale, room, types[t].nodes, j.view.cpus, j.view.memory_mib, snapshot.even_gangs)
            if spot is not None:
                placed[ji] = (t, room.take(spot, j.scale, j.view.cpus, j.view.memory_mib))

        spg = settings.gpu.shares_per_gpu
        actions: list[Action] = []
        placements: list[Placement] = []
        for ji, j in enumerate(jobs):
            v = j.view
            t = keep.get(ji) or (placed[ji][0] if ji in placed else None)
            if t is None:
                if j.where:
                    shape = j.shapes.get(j.on or "") or j.family.default_shape
                    comment = with_state(v.admin_comment, shape.name, STATE, self._state(j, None, rnd, True))
                    actions += preempt_actions(v, shape.name, comment, f"preempted: Gavel's round {rnd} leaves it out")
                continue
            shape = j.shapes[t]
            comment = with_state(v.admin_comment, shape.name, STATE, self._state(j, t, rnd, False))
            why = (f"round {rnd}: {j.scale} {t or 'GPU'} GPU(s), time fraction {x[ji, names.index(t)]:.3g} there "
                   f"(throughput {shape.throughput:.3g} steps/s)")
            if ji in keep:
                actions += keep_actions(v, shape, False, comment, why)
                node, gpus = min(j.where.items(), key=lambda kv: room.order.get(kv[0], 0))
            else:
                where = placed[ji][1]
                on = tuple(sorted(where, key=lambda k: room.order[k]))
                actions += start_actions(v, bool(j.where), shape, j.scale, t, on, comment, why, spg)
                node, gpus = on[0], where[on[0]]
            placements.append(Placement(v.job_id, node, gpus[0], shape.name, spg, shape.throughput))
        objective = float((x * tput).sum())
        notes = (f"Gavel ({self.objective}): round {rnd}, {len(jobs)} job(s), {len(keep) + len(placed)} placed; "
                 f"Σ x·throughput {objective:.3g}",)
        return Plan(actions=tuple(actions), objective=objective, notes=notes,
                    placements=tuple(sorted(placements, key=lambda p: p.job_id)))

    def _jobs(self, snapshot: Snapshot, found: list[tuple[JobView, Family, bool]], names: tuple[str, ...]
              ) -> list[_Job]:
        """Each job with its submitted GPU count, its own-batch shape at that count on each type, where it runs and
        the time it has received per type."""
        out: list[_Job] = []
        for v, fam, running in found:
            scale = gpus_of(fam.default_shape)
            table = speed_table(self.narrow(fam), names, own=True)
            shapes = {t: table[(t, scale)] for t in names if (t, scale) in table}
            if not shapes:
                continue
            state = state_of(v.admin_comment, STATE)
            got = {k[2:]: float(val) for k, val in state.items() if k.startswith("t.") and _num(val)}
            on, where = running_on(v, snapshot) if running else (None, {})
            out.append(_Job(v, fam, scale, shapes, on, where, got))
        return out

    def _state(self, j: _Job, t: str | None, rnd: int, held: bool) -> dict[str, object]:
        got = dict(j.received)
        if t is not None:
            got[t] = got.get(t, self.round_s / 2) + self.round_s
        out: dict[str, object] = {f"t.{k}": f"{val:.0f}" for k, val in sorted(got.items())}
        out["round"] = rnd
        out["held"] = "1" if held else ""
        return out


def _num(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _int(text: str | None) -> int:
    return int(text) if text is not None and text.lstrip("-").isdigit() else -1
