"""Baseline policies a reader would ask for, runnable by the live helper and the simulator alike.

- `LasPolicy` is *Tiresias* (Gu et al., NSDI 2019) as the Pollux artifact's
  simulator runs it (`tiresias.py`): discretised two-dimensional least
  attained service. Attained service is GPUs × time run. Two queues: Q0
  holds every job until its service reaches `threshold_gpu_s` (16 GPU-hours,
  the peer's limit), then it moves to the back of Q1 for good (the peer's
  starvation rule is switched off: `_solve_starvation = 0`). Each epoch the
  jobs are walked Q0 first (arrival order), then Q1 (order of demotion);
  each runs if its submitted GPU count fits in what the walk has left, else
  it waits, and a running job that no longer fits is preempted (requeue-held
  with its progress, resumed later, paying its restart). Jobs start on whole
  GPUs at their submitted count, taking the free GPUs of the node with the
  most free first (the peer's placement), the same count on each node as
  Slurm's `Gres=gpu:P NumNodes=K-K` asks (`planner.gangs`); running jobs keep
  theirs.
- `planned_jobs`: the jobs a preempting baseline plans (Tiresias here, Pollux
  in `planner.pollux`).

Static MPS sharing is a `Policy` of the registry with the `half_gpu`
narrower; it and the Pollux-style `whole_gpu_any_batch` are in
`planner.narrowers`. All are pure: a `Snapshot` and families in, a `Plan` out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Action, ActionKind, Family, JobState, JobView, Placement, Plan, Shape, Snapshot
from slurm_elastico.planner import partitions
from slurm_elastico.planner.gangs import split
from slurm_elastico.planner.gpu_choice import start_key
from slurm_elastico.planner.narrowers import whole_gpu
from slurm_elastico.shapes.current import ADMIN_PREFIX, named_in_comment
from slurm_elastico.shapes.units import shares_of

QUEUE_LIMIT_GPU_S = 16 * 3600.0
"""The peer's one queue limit: Q0 until 16 GPU-hours of attained service, then Q1 (`tiresias.py`)."""

STATE = "tiresias:"
"""AdminComment parts where Tiresias keeps what Slurm forgets across a preemption, beside `elastico:shape=`:
`tiresias:gpu_s=<attained GPU-seconds up to its last stop>`, `tiresias:q1_at=<when it reached Q1>` and
`tiresias:held=1` (a job this policy preempted and will resume; a job held by anyone else is left alone)."""


@dataclass(frozen=True)
class LasState:
    """What a job's AdminComment says of its past (see `STATE`)."""

    gpu_s: float = 0.0
    q1_at: float | None = None
    held: bool = False


def las_state(admin_comment: str) -> LasState:
    vals: dict[str, str] = {}
    for part in (admin_comment or "").split(","):
        part = part.strip()
        if part.startswith(STATE) and "=" in part:
            k, v = part[len(STATE):].split("=", 1)
            vals[k.strip()] = v.strip()

    def num(key: str) -> float | None:
        try:
            x = float(vals[key])
        except (KeyError, ValueError):
            return None
        return x if math.isfinite(x) else None

    return LasState(num("gpu_s") or 0.0, num("q1_at"), vals.get("held") == "1")


def las_comment(old: str, shape: str, state: LasState) -> str:
    """`old` with its shape and Tiresias parts replaced (anything else an admin wrote kept after them)."""
    keep = [p.strip() for p in (old or "").split(",")
            if p.strip() and not p.strip().startswith(ADMIN_PREFIX) and not p.strip().startswith(STATE)]
    parts = [f"{ADMIN_PREFIX}{shape}", f"{STATE}gpu_s={state.gpu_s:.0f}"]
    if state.q1_at is not None:
        parts.append(f"{STATE}q1_at={state.q1_at:.0f}")
    if state.held:
        parts.append(f"{STATE}held=1")
    return ",".join(parts + keep)


def planned_jobs(snapshot: Snapshot, families: Mapping[int, Family], part: str, held_by_us: Callable[[str], bool]
                 ) -> Iterator[tuple[JobView, Family, bool]]:
    """The jobs a preempting baseline plans, each with its family and whether it runs: family jobs of the
    partition running on GPUs, or pending with a GPU request — a held one only when its AdminComment says this
    policy held it (`held_by_us`). Held by someone else, suspended, completing: left alone."""
    for j in snapshot.jobs:
        fam = families.get(j.job_id)
        if fam is None or not fam.shapes or not partitions.managed(j, part):
            continue
        running = j.state is JobState.RUNNING and bool(j.gpu_alloc)
        pending = (j.state is JobState.PENDING and (held_by_us(j.admin_comment) if j.held else True)
                   and j.gres is not None and j.gres.kind in ("mps", "gpu", "gpus"))
        if running or pending:
            yield j, fam, running


@dataclass
class _Entry:
    view: JobView
    shape: Shape
    gpus: int  # submitted GPU count (what it runs on)
    holds: int  # GPUs it holds now (running), else gpus
    attained: float  # GPU-seconds
    q1_at: float | None  # None: in Q0
    banked: float


@dataclass(frozen=True)
class LasPolicy:
    """Tiresias: two-queue discretised least attained service with preemption (see the module docstring).

    Has the fields other code reads from a `Policy` (`narrow`, `price`,
    `interference`, `reshape`) with what they mean here.
    """

    name: str
    description: str
    threshold_gpu_s: float = QUEUE_LIMIT_GPU_S
    """Attained GPU-seconds at which a job leaves Q0 for Q1."""
    narrow: Callable[[Family], Family] = whole_gpu
    price: bool = False
    interference: bool = False
    reshape: bool = False

    def queue_key(self, e: _Entry) -> tuple:
        """Q0 (arrival order) before Q1 (order of demotion, then arrival)."""
        sub = e.view.submit_time if e.view.submit_time is not None else math.inf
        if e.q1_at is None:
            return (0, 0.0, sub, e.view.job_id)
        return (1, e.q1_at, sub, e.view.job_id)

    def plan(self, snapshot: Snapshot, families: Mapping[int, Family], settings: Settings,
             model: SlowdownModel | None, now: float, progress: Mapping[int, float] | None = None) -> Plan:
        part = settings.slurm.partition
        nodes = [n for n in snapshot.nodes if n.usable and (not part or part in n.partitions)]
        entries: dict[int, _Entry] = {}
        for j, fam, running in planned_jobs(snapshot, families, part, lambda c: las_state(c).held):
            st = las_state(j.admin_comment)
            shape = self.narrow(fam).default_shape
            n = max(1, shape.resources.gpus)
            holds = len({(g[0], g[1]) for g in j.gpu_alloc}) if running else n
            attained, q1_at = st.gpu_s, st.q1_at
            if running and j.start_time is not None:
                attained += n * max(0.0, now - j.start_time)
                if q1_at is None and attained >= self.threshold_gpu_s:  # demoted during this run
                    q1_at = j.start_time + max(0.0, self.threshold_gpu_s - st.gpu_s) / n
            if q1_at is None and attained >= self.threshold_gpu_s:
                q1_at = now
            if running:
                cur = named_in_comment(j.admin_comment)
                shape = next((s for s in fam.shapes if s.name == cur), shape)
            entries[j.job_id] = _Entry(j, shape, n, holds, attained, q1_at, st.gpu_s)

        # GPUs this policy may hand out: those of usable nodes nobody else holds.
        mine_on: dict[tuple[str, int], list[int]] = {}
        free: dict[str, list[int]] = {}
        for n in nodes:
            for g in n.gpus:
                users = [u.job_id for u in g.users]
                if all(u in entries for u in users):
                    mine_on[(n.name, g.index)] = users
        capacity = len(mine_on)

        order = sorted(entries.values(), key=self.queue_key)
        keep = [e for e in order if e.view.state is JobState.RUNNING and not e.view.requeue]  # cannot be preempted
        left = capacity - sum(e.holds for e in keep)
        run = {e.view.job_id for e in keep}
        for e in order:
            if e.view.job_id in run:
                continue
            need = e.holds if e.view.state is JobState.RUNNING else e.gpus
            if need <= left:
                run.add(e.view.job_id)
                left -= need
        stop = [e for e in order if e.view.state is JobState.RUNNING and e.view.job_id not in run]
        begin = [e for e in order if e.view.state is JobState.PENDING and e.view.job_id in run]

        gone = {e.view.job_id for e in stop}
        for (node, gi), users in mine_on.items():
            if all(u in gone for u in users):
                free.setdefault(node, []).append(gi)
        index = {n.name: i for i, n in enumerate(nodes)}

        actions: list[Action] = []
        placements: list[Placement] = []
        notes: list[str] = [f"Tiresias: {sum(e.q1_at is None for e in order)} job(s) in Q0, "
                            f"{sum(e.q1_at is not None for e in order)} in Q1; {capacity} GPU(s) to share"]
        for e in stop:
            q = "Q1" if e.q1_at is not None else "Q0"
            why = (f"preempted ({q}, {e.attained:.0f} GPU-s attained): jobs ahead of it in least attained "
                   "service need its GPUs")
            state = LasState(e.attained, e.q1_at, True)
            actions.append(Action(ActionKind.SET_ADMIN_COMMENT, e.view.job_id, why, shape=e.shape.name,
                                  text=las_comment(e.view.admin_comment, e.shape.name, state)))
            actions.append(Action(ActionKind.PREEMPT, e.view.job_id, why, shape=e.shape.name))
        # Start in Slurm's own order, so that its fill of each job's nodes is the one planned here.
        for e in sorted(begin, key=lambda e: start_key(e.view)):
            # The same count on each node (Slurm's Gres=gpu:P NumNodes=K-K), fewest nodes, most free first (the
            # peer's rule).
            # (`gangs.split`: any count per node where the snapshot says so, the peer's rule, calibration only.)
            where = split(e.gpus, sorted(free, key=lambda k: index[k]), lambda k, p: min(p, len(free[k])),
                          lambda k: (-len(free[k]), index[k]), snapshot.even_gangs)
            if where is None:
                notes.append(f"job {e.view.job_id}: {e.gpus} GPU(s) counted free but not on equal parts of "
                             "nodes; it waits")
                continue
            take: list[tuple[str, list[int]]] = []
            for node, p in where.items():
                take.append((node, free[node][:p]))
                free[node] = free[node][p:]
                if not free[node]:
                    del free[node]
            on = tuple(sorted((nd for nd, _ in take), key=lambda k: index[k]))
            jid, shape, view = e.view.job_id, e.shape, e.view
            q = "Q1" if e.q1_at is not None else "Q0"
            why = f"least attained service ({q}, {e.attained:.0f} GPU-s): runs on {e.gpus} GPU(s) of {','.join(on)}"
            comment = las_comment(view.admin_comment, shape.name, LasState(e.banked, e.q1_at, False))
            if view.admin_comment != comment:
                actions.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, why, shape=shape.name, text=comment))
            if view.held:
                if shape.resources.gpus:  # the request names its nodes' count (Gres=gpu:P NumNodes=K-K): set anew
                    actions.append(Action(ActionKind.SET_GPUS, jid, why, gpus=shape.resources.gpus, nodes=on,
                                          shape=shape.name))
                actions.append(Action(ActionKind.RESUME, jid, why, nodes=on, shape=shape.name))
            else:
                if shape.resources.gpus:
                    actions.append(Action(ActionKind.SET_GPUS, jid, why, gpus=shape.resources.gpus, nodes=on,
                                          shape=shape.name))
                else:
                    share = shares_of(shape.resources.mps, settings.gpu.shares_per_gpu)
                    if view.gres is None or view.gres.kind != "mps" or view.gres.count != share:
                        actions.append(Action(ActionKind.SET_SHARE, jid, why, share=share,
                                              shape=shape.name))
                    actions.append(Action(ActionKind.SET_NODES, jid, why, nodes=on, shape=shape.name))
                if view.reason == "BeginTime":
                    actions.append(Action(ActionKind.START_NOW, jid, why, shape=shape.name))
            node, gpus = take[0]
            held = settings.gpu.shares_per_gpu if shape.resources.gpus else shares_of(shape.resources.mps,
                                                                                      settings.gpu.shares_per_gpu)
            placements.append(Placement(jid, node, gpus[0], shape.name, held, shape.throughput))
        for e in order:
            if e.view.state is JobState.RUNNING and e.view.job_id in run:
                node, gpu, share = e.view.gpu_alloc[0]
                placements.append(Placement(e.view.job_id, node, gpu, e.shape.name, share or settings.gpu.shares_per_gpu,
                                            e.shape.throughput))
        waiting = [e.view.job_id for e in order if e.view.job_id not in run]
        if waiting:
            notes.append(f"waiting: {', '.join(map(str, waiting[:20]))}{' …' if len(waiting) > 20 else ''}")
        return Plan(actions=tuple(actions), notes=tuple(notes),
                    placements=tuple(sorted(placements, key=lambda p: p.job_id)))
