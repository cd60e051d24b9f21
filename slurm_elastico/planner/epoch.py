"""One scheduling epoch (PDS): from a `Snapshot` and the jobs' families to a `Plan` of actions.

Steps: read the free capacity per GPU and node; reserve for the head of the
queue; price (a few projected-subgradient rounds, `slurm_elastico.pricing`);
pack pending jobs in the policy's order, each at the fastest shape that fits
without exceeding what its prices chose; start the jobs the prices left out
where room remains; upgrade placed jobs into what is still free; reshape
running jobs whose gain pays their restart; then write the actions.

Pure: no clock (`now` is passed in), no subprocess, no globals; the same
inputs give the same plan. Jobs without a family are never acted on, but what
they hold counts. Held jobs are left alone (held by a user, or mid-reshape).

A shape is a share of one GPU, or a data-parallel gang of n whole GPUs on as
few nodes as hold them (`Resources.gpus`; the global batch is the same at
every n). A running job that holds whole GPUs and whose family has gang
shapes is *elastic*: it takes part in the pricing with the pending jobs, at
a restart charge for any shape but its own, so that when the queue makes
GPUs dear it gives some back (shrinks before the packing), and when GPUs
sit idle it takes them (grows after the packing) — each only when the gain
over its remaining work pays the restart.

Under a policy with `allot` (elastico), the GPU counts of the jobs with
data-parallel shapes come from `planner.allot` instead of the prices: the
jobs with the fewest GPU-seconds left (weighted) go first, each on its
whole request or not at all, and a longer running job shrinks or is
preempted for them (requeue-held, `elastico:held=1` in its AdminComment) and
resumed when its turn comes; the mark stays until the job runs again (a resume
cut short leaves it held and still known as ours), then it is lifted. Jobs held
by anyone else stay untouched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from slurm_elastico import pricing
from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SlowdownModel, SoloProfile
from slurm_elastico.model import (Action, ActionKind, Family, JobState, JobView, Placement, Plan, Shape, Snapshot)
from slurm_elastico.planner import allot, gpu_choice, reshape, weights
from slurm_elastico.planner.gpu_choice import mps_gpu
from slurm_elastico.planner.packing import GpuState
from slurm_elastico.planner.seats import Row, Seat, best_solo
from slurm_elastico.planner.slowdown import PairCache, for_gpu
from slurm_elastico.shapes.current import ADMIN_PREFIX, PREEMPTED_MARK, named_in_comment, preempted_by_us, running_shape
from slurm_elastico.shapes.solo import solo_profile
from slurm_elastico.shapes.units import percent_of, shares_of

RESOURCES = ("mps", "gpu_mem", "cpus", "host_mem")

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
    view: JobView
    table: Table
    weight: float
    seat: Seat
    running: bool = False


def _named_shape(job: JobView, family: Family) -> Shape | None:
    """The shape of `family` the job's AdminComment names, if any (whatever share it holds)."""
    name = named_in_comment(job.admin_comment)
    return next((s for s in family.shapes if s.name == name), None) if name is not None else None


def shape_of_running(job: JobView, table: Table, held_share: int, shares_per_gpu: int) -> int:
    """Slot of the shape a running job runs as: the rule elastico-run follows (`shapes.current.running_shape`)."""
    shape, _ = running_shape(table.family.shapes, table.family.default_shape, job.admin_comment, held_share,
                             shares_per_gpu)
    return table.family.shapes.index(shape)


def gang_of_running(job: JobView, table: Table, gpus: int) -> int | None:
    """Slot of the data-parallel shape a running job holding `gpus` whole GPUs runs as: the one its AdminComment
    names if it has that many GPUs, else the fastest with that many (None: the family has none)."""
    rows = [r for r in table.rows if r.gpus == gpus]
    named = _named_shape(job, table.family)
    for r in rows:
        if named is not None and table.family.shapes[r.slot] is named:
            return r.slot
    return max(rows, key=lambda r: (r.tput, -r.slot)).slot if rows else None


def plan_epoch(snapshot: Snapshot, families: Mapping[int, Family], settings: Settings,
               model: SlowdownModel | None, now: float, policy, progress: Mapping[int, float] | None = None) -> Plan:
    """Plan one epoch under `policy` (its fields, never its name, decide what runs)."""
    ps, gs = settings.planner, settings.gpu
    part = settings.slurm.partition
    floor = settings.interference.floor if policy.interference else 0.0
    # On a GPU type the model never trained on, its cautious view (shrunk predictions, larger margins).
    cache = PairCache(for_gpu(model, gs.type) if policy.interference else None)
    progress = progress or {}

    # -- capacity -----------------------------------------------------------
    nodes = [n for n in snapshot.nodes if n.usable and (not part or part in n.partitions)]
    gpu_node, free_share, total_share, free_mem, gpu_mem, gpu_key = [], [], [], [], [], []
    where: dict[tuple[str, int], int] = {}
    node_cpu, node_mem = [], []
    for ni, n in enumerate(nodes):
        node_cpu.append(float(n.cpus - n.cpus_alloc))
        node_mem.append(float(n.memory_mib - n.memory_alloc_mib) if n.memory_mib > 0 else math.inf)
        mem = float(n.gpu_memory_mib or gs.memory_mib)
        for gv in n.gpus:
            where[(n.name, gv.index)] = len(gpu_node)
            gpu_node.append(ni)
            free_share.append(gv.shares_free)
            total_share.append(gv.shares_total)
            free_mem.append(mem)
            gpu_mem.append(mem)
            gpu_key.append((n.name, gv.index))
    n_gpus = len(gpu_node)
    state = GpuState(gpu_node, free_share, free_mem, node_cpu, node_mem, cache, floor, total_share=total_share,
                     lowest_unused=gpu_choice.lowest_unused(snapshot.slurm_version))
    per_gpu = np.array([
        float(gs.shares_per_gpu),
        float(np.mean(gpu_mem)) if n_gpus else float(gs.memory_mib),
        max(1.0, sum(n.cpus for n in nodes) / max(1, n_gpus)),
        max(1.0, sum(n.memory_mib for n in nodes) / max(1, n_gpus)),
    ])

    # -- families as tables (one per distinct family object) ----------------
    tables: dict[int, Table] = {}
    narrowed: dict[int, Family] = {}

    def table_of(fam: Family, running: JobView | None = None) -> Table:
        key = id(fam)
        if key not in narrowed:
            narrowed[key] = policy.narrow(fam)
        small = narrowed[key]
        if running is not None:
            # A running job keeps the shape it runs as, even one the policy's narrowing drops.
            now_as = _named_shape(running, fam)
            if now_as is not None and now_as not in small.shapes:
                extra = (key, now_as.name)
                if extra not in narrowed:
                    narrowed[extra] = dataclasses.replace(small, shapes=small.shapes + (now_as,))
                small = narrowed[extra]
        t = tables.get(id(small))
        if t is None:
            t = tables[id(small)] = _table(small, cache, per_gpu, gs.shares_per_gpu)
        return t

    # -- who is where --------------------------------------------------------
    jobs: list[Job] = []
    by_id: dict[int, Job] = {}
    for jv in snapshot.jobs:
        fam = families.get(jv.job_id)
        if fam is None or not fam.shapes or (part and jv.partition != part):
            continue
        if (jv.state is JobState.PENDING and (not jv.held or (policy.allot and preempted_by_us(jv.admin_comment)))
                and (jv.gres is None or jv.gres.kind in ("mps", "gpu", "gpus"))):
            t = table_of(fam)
            by_id[jv.job_id] = Job(jv, t, 1.0, Seat(jv.job_id, fam.throughput_floor, best_solo=best_solo(t.rows),
                                                    whole=jv.whole_gpus > 0))
        elif jv.state is JobState.RUNNING:
            t = table_of(fam, jv)
            by_id[jv.job_id] = Job(jv, t, 1.0, Seat(jv.job_id, fam.throughput_floor, best_solo=best_solo(t.rows),
                                                    whole=jv.whole_gpus > 0), running=True)
    # Stand-ins for what the planner does not manage, one per share, all added before the first lookup
    # (a trained model's scorer covers the profiles it was built for; a later one would rebuild it).
    foreign = {shares: cache.add(SoloProfile(kind="train", mps_share=round(percent_of(shares, gs.shares_per_gpu))))
               for shares in sorted({u.shares for n in nodes for gv in n.gpus for u in gv.users if not u.whole})}
    gangs: dict[int, list[int]] = {}
    for n in nodes:
        for gv in n.gpus:
            g = where[(n.name, gv.index)]
            for use in gv.users:
                if use.whole:
                    job = by_id.get(use.job_id)
                    if job is not None and job.running:
                        gangs.setdefault(use.job_id, []).append(g)
                    continue
                job = by_id.get(use.job_id)
                if job is not None and job.running and job.seat.gpu < 0:
                    slot = shape_of_running(job.view, job.table, use.shares, gs.shares_per_gpu)
                    base = job.table.rows[slot]
                    uid = base.uid
                    if uid == WHOLE_UID and use.shares < gv.shares_total:  # named whole, holds a share: profile it
                        uid = cache.add(solo_profile(job.table.family.shapes[slot], job.table.family.kind,
                                                     job.table.family.name))
                    job.seat.row = Row(slot, uid, base.tput, use.shares, base.mem,
                                       float(job.view.cpus), float(job.view.memory_mib))
                    state.attach(job.seat, g, base.mem)
                else:
                    row = Row(-1, foreign[use.shares], math.inf, use.shares, gpu_mem[g] * use.shares / gs.shares_per_gpu, 0, 0)
                    state.attach(Seat(use.job_id, 0.0, row), g, row.mem)
    for jid, held in gangs.items():
        job = by_id[jid]
        slot = gang_of_running(job.view, job.table, len(held))
        if slot is None and len(held) == 1 and job.seat.gpu < 0:
            # One whole GPU (`gpu:1`: elastico-submit starts a family with GPU counts so): its one-GPU shape at
            # the GPU's full share, as a job holding all of its MPS shares; it may then grow into a gang.
            g, full = held[0], int(state.total_share[held[0]])
            slot = shape_of_running(job.view, job.table, full, gs.shares_per_gpu)
            base = job.table.rows[slot]
            job.seat.row = Row(slot, base.uid, base.tput, full, base.mem, float(job.view.cpus),
                               float(job.view.memory_mib))
            state.attach(job.seat, g, base.mem)
            continue
        if slot is None or job.seat.gpu >= 0:
            continue  # no shape of its family holds that many GPUs: left alone
        base = job.table.rows[slot]
        job.seat.row = Row(slot, base.uid, base.tput, 0, base.mem, float(job.view.cpus), float(job.view.memory_mib),
                           gpus=len(held))
        state.attach_gang(job.seat, tuple(held), base.mem)
    _contention(list(tables.values()), cache, gs.shares_per_gpu)
    for j in by_id.values():
        if not j.running or j.seat.gpu >= 0:
            jobs.append(j)  # running jobs we cannot locate on a GPU are left alone
    jobs.sort(key=lambda j: j.view.job_id)
    for j in jobs:
        j.weight = weights.weight_of(j.view, j.table.family, ps.fairness, now, progress.get(j.view.job_id))
    pending = [j for j in jobs if not j.running]
    running = [j for j in jobs if j.running]
    elastic = [j for j in running if policy.reshape and _elastic(j, state, now, ps.reshape_cost_s)] if any(
        t.gangs for t in tables.values()) else []
    notes: list[str] = []

    # -- reservation for the head of the queue -------------------------------
    head_id = _queue_head(snapshot, part)
    head = by_id.get(head_id) if head_id is not None else None
    if head is not None and head.running:
        head = None
    if head_id is not None and head is None and ps.reserve_queue_head:
        note = _reserve_foreign(snapshot.job(head_id), state, nodes, where)
        if note:
            notes.append(note)

    # -- prices ---------------------------------------------------------------
    restart = [_restart_charge(j, now, progress, ps.reshape_cost_s, ps.hysteresis) for j in elastic]
    problem = _problem(pending, state, per_gpu, elastic, restart)
    if policy.price and (pending or elastic):
        result = pricing.solve(problem, ps.rounds, ps.step)
    else:
        z = np.zeros(len(RESOURCES))
        result = pricing.PriceResult(z, pricing.choose(problem, z), 0)
    choice = result.choice[:len(pending)].copy()
    targets = {j.view.job_id: int(c) for j, c in zip(elastic, result.choice[len(pending):])}
    allotted: list[int] = []  # pending jobs whose GPU count the allotment chose, in its order
    growers: list[Job] = []  # elastic running jobs, in the allotment's order
    if policy.allot:
        allotted, growers = _allot(pending, elastic, choice, targets, problem, now, progress, ps, float(per_gpu[0]))
    notes.append("prices (GPU equivalents): " + ", ".join(f"{r}={v:.3g}" for r, v in zip(RESOURCES, result.prices))
                 + f" after {result.rounds} round(s)")

    # -- elastic running jobs give back what the queue prices above their use --
    reshaped: dict[int, tuple[int, float]] = {}
    shrunk: dict[int, tuple[Row, tuple[int, ...]]] = {}  # what each shrunk or preempted job held before
    preempted: set[int] = set()
    for j in sorted(elastic, key=lambda j: (j.weight, j.view.job_id)):
        t = targets[j.view.job_id]
        if t == pricing.NONE:  # the allotment gave what it holds to shorter jobs
            shrunk[j.view.job_id] = (j.seat.row, j.seat.gang or (j.seat.gpu,))
            state.remove(j.seat)
            preempted.add(j.view.job_id)
        elif _size(j.table.rows[t], state, j.seat.gpu) < _size(j.seat.row, state, j.seat.gpu):
            before = (j.seat.row, j.seat.gang or (j.seat.gpu,))
            got = _regang(j, state, t, now, progress, ps.reshape_cost_s)
            if got is not None:
                reshaped[j.view.job_id] = got
                shrunk[j.view.job_id] = before
    for j in growers:  # the allotment's grows come before the queue's starts, in its order
        t = targets[j.view.job_id]
        if t == pricing.NONE:
            continue
        row = j.table.rows[t]
        if row.tput > j.seat.row.tput and _size(row, state, j.seat.gpu) > _size(j.seat.row, state, j.seat.gpu):
            got = _regang(j, state, t, now, progress, ps.reshape_cost_s)
            if got is not None:
                reshaped[j.view.job_id] = got

    early = set(reshaped) | preempted  # running jobs changed before the packing: their actions come first

    # -- packing --------------------------------------------------------------
    order = policy.order(pending)
    mine = set(allotted)
    if mine:  # the allotment's jobs after the others (budgeted first), in its order
        order = [i for i in order if i not in mine] + allotted
    if head is not None and ps.reserve_queue_head:
        hi = pending.index(head)
        order = [hi] + [i for i in order if i != hi]
    deferred: list[int] = []
    for i in order:
        job = pending[i]
        target = int(choice[i])
        is_head = job is head and ps.reserve_queue_head
        if target == pricing.NONE and not is_head:
            if job.table.by_speed:
                deferred.append(i)
            continue
        if target == pricing.NONE:  # the head runs anyway: at its cheapest shape at these prices
            target = int(np.argmin(pricing.costs(problem, result.prices)[i, :-1]))
        cap = job.table.rows[target].tput
        slots = [s for s in job.table.by_speed if job.table.rows[s].tput <= cap]
        if not _place(job, state, slots):
            deferred.append(i)
        if is_head and job.seat.gpu < 0:
            note = _keep_free(job, state, slots, gpu_key)
            if note:
                notes.append(note)
    for i in deferred:  # what the prices left out, where room remains: the fastest share, else the smallest gang
        if i in mine:
            continue  # the allotment made it wait: shorter jobs have its GPUs
        t = pending[i].table
        _place(pending[i], state, [s for s in t.by_speed if not t.rows[s].gpus]
               + sorted((s for s in t.by_speed if t.rows[s].gpus), key=lambda s: (t.rows[s].gpus, -t.rows[s].tput)))
    for j in elastic:  # a shrink or preemption whose GPUs nobody took would be a restart for nothing: undone
        if j.view.job_id in shrunk:
            old, held = shrunk[j.view.job_id]
            if all(not state.occ[g] or state.occ[g] == [j.seat] for g in held):
                if j.seat.gpu >= 0:
                    state.remove(j.seat)
                if old.gpus:
                    state.place_gang(j.seat, old, held)
                else:
                    state.place(j.seat, old, held[0])
                reshaped.pop(j.view.job_id, None)
                preempted.discard(j.view.job_id)
    if policy.price:
        for i in order:
            _upgrade(pending[i], state)
    _seat_in_start_order([j for j in pending if j.seat.gpu >= 0], state)

    # -- running jobs ---------------------------------------------------------
    moved: set[int] = set()  # running jobs `_move` put on another GPU
    if policy.reshape:
        waiting = any(j.seat.gpu < 0 for j in pending)
        for j in sorted(elastic, key=lambda j: (-j.weight, j.view.job_id)):
            if j.view.job_id in preempted:
                continue
            # grow into what nobody waiting could use (under the allotment, what it left to nobody)
            if j.view.job_id not in reshaped and (policy.allot or not waiting):
                got = _grow(j, state, targets[j.view.job_id], now, progress, ps.reshape_cost_s, ps.hysteresis)
                if got is not None:
                    reshaped[j.view.job_id] = got
        for j in sorted(running, key=lambda j: (-j.weight, j.view.job_id)):
            if j in elastic or j.seat.gang:
                continue
            got = _reshape(j, state, now, progress, ps.reshape_cost_s, ps.hysteresis)
            if got is None and policy.allot:
                got = _move(j, state, now, progress, ps.reshape_cost_s, ps.hysteresis)
                if got is not None:
                    moved.add(j.view.job_id)
            if got is not None:
                reshaped[j.view.job_id] = got

    # -- actions --------------------------------------------------------------
    actions: list[Action] = []
    placements: list[Placement] = []
    objective = 0.0
    # Actions in the order the plan placed the jobs, which is the order Slurm places them in: the running jobs
    # changed before the packing (shrinks, preemptions, the allotment's grows), then the starts in Slurm's order
    # (`_seat_in_start_order`: a released job may start before the next is released, or Slurm may start them all
    # in one pass), then the running jobs reshaped around them. A relaunch returns once its job runs again; the
    # starts before it are only released, and Slurm starts them at its next pass, seconds before a requeued job
    # can run again.
    starts = sorted(pending, key=lambda j: gpu_choice.start_key(j.view))
    before = [j for j in running if j.view.job_id in early]
    for j in before + starts + [j for j in running if j.view.job_id not in early]:
        t, seat, jid = j.table, j.seat, j.view.job_id
        tmax = max(s.throughput for s in t.family.shapes)
        if jid in preempted:
            objective += j.weight
            held_row, held_gpus = shrunk[jid]
            shape = t.family.shapes[held_row.slot]
            why = (f"preempted: jobs with fewer GPU-seconds left (weighted) need its "
                   f"{_size(held_row, state, held_gpus[0]):g} GPU(s); it resumes when its turn comes")
            actions.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, why, shape=shape.name,
                                  text=f"{ADMIN_PREFIX}{shape.name},{PREEMPTED_MARK}"))
            actions.append(Action(ActionKind.PREEMPT, jid, why, shape=shape.name))
            continue
        if seat.gpu < 0:
            objective += j.weight
            if not t.by_speed:
                notes.append(f"job {jid} not started: every shape is below its throughput floor "
                             f"{t.family.throughput_floor:g}")
            else:
                notes.append(f"job {jid} not started: no GPU has room for any of its shapes this epoch")
            continue
        shape = t.family.shapes[seat.row.slot]
        rate = seat.row.tput / seat.slow
        objective += j.weight * (1.0 - rate / tmax)
        node, gpu = gpu_key[seat.gpu]
        placements.append(Placement(jid, node, gpu, shape.name, seat.row.share, rate))
        comment = f"{ADMIN_PREFIX}{shape.name}"
        unit = "steps/s" if t.family.kind == "train" else "req/s"
        on = tuple(dict.fromkeys(gpu_key[g][0] for g in seat.gang))  # the gang's nodes, in GPU order
        if j.running:
            if jid not in reshaped:
                if preempted_by_us(j.view.admin_comment):  # resumed and running now: the mark has done its work
                    actions.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, "resumed: it runs again, so the mark of "
                                          "its preemption is lifted", shape=shape.name, text=comment))
                continue
            saved, left = reshaped[jid]
            if saved >= 0:
                why = (f"reshape to {shape.name} ({rate:.3g} {unit}): saves {saved:.0f} s of {left:.0f} s remaining "
                       f"after a {ps.reshape_cost_s:g} s restart")
            else:
                why = (f"shrink to {shape.name} ({rate:.3g} {unit}): the queue prices its GPUs above their use "
                       f"({-saved:.0f} s slower over {left:.0f} s remaining)")
            actions.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, why, shape=shape.name, text=comment))
            if seat.gang:
                actions.append(Action(ActionKind.RESHAPE_RUNNING, jid, why, gpus=seat.row.gpus, nodes=on,
                                      shape=shape.name))
            elif jid not in moved and (seat.row.share == j.view.mps_share
                                       or (j.view.whole_gpus == 1 and _one_whole_gpu(j, state))):
                # Same resources, new knobs: elastico-run relaunches in place on USR1, no requeue.
                actions.append(Action(ActionKind.SIGNAL, jid, why, signal="USR1", shape=shape.name))
            elif _one_whole_gpu(j, state):
                # Asks whole GPUs (a gang shrunk to one GPU, or a gpu:1 job moved): it keeps asking whole GPUs,
                # since Slurm 22.05 refuses to move a job from gpu to mps ("Invalid generic resource").
                actions.append(Action(ActionKind.RESHAPE_RUNNING, jid, why, gpus=1, nodes=(node,), shape=shape.name))
            else:
                actions.append(Action(ActionKind.RESHAPE_RUNNING, jid, why, share=seat.row.share, nodes=(node,),
                                      shape=shape.name))
            continue
        where_to = (f"on {seat.row.gpus} GPUs of {','.join(on)}" if seat.gang
                    else f"at {shape.resources.mps}% of GPU {node}:{gpu}")
        why = (f"start as {shape.name} {where_to} "
               f"({rate:.3g} {unit}, {100 * rate / tmax:.0f}% of its fastest; weight {j.weight:.2f})")
        if j.view.held:  # one this policy preempted keeps its mark until it runs: a resume cut short (a crash
            comment += f",{PREEMPTED_MARK}"  # between its steps) leaves it held and still known as ours
        if j.view.admin_comment != comment:
            actions.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, why, shape=shape.name, text=comment))
        if seat.gang:
            actions.append(Action(ActionKind.SET_GPUS, jid, why, gpus=seat.row.gpus, nodes=on, shape=shape.name))
        elif _one_whole_gpu(j, state):
            # Asks whole GPUs (elastico-submit starts a family with GPU counts on gpu:1) and gets all of one:
            # it keeps asking whole GPUs, since Slurm 22.05 refuses to move a job from gpu to mps.
            if j.view.whole_gpus != 1:
                actions.append(Action(ActionKind.SET_GPUS, jid, why, gpus=1, nodes=(node,), shape=shape.name))
        elif j.view.gres is None or j.view.gres.kind != "mps" or j.view.gres.count != seat.row.share:
            actions.append(Action(ActionKind.SET_SHARE, jid, why, share=seat.row.share, shape=shape.name))
        if j.view.held:  # one this policy preempted: pinned to its place, started, released
            actions.append(Action(ActionKind.RESUME, jid, why, nodes=on if seat.gang else (node,), shape=shape.name))
            continue
        if not seat.gang:
            actions.append(Action(ActionKind.SET_NODES, jid, why, nodes=(node,), shape=shape.name))
        if j.view.reason == "BeginTime":  # placed now: no need to sit out the submit's placement window
            actions.append(Action(ActionKind.START_NOW, jid, why, shape=shape.name))
    return Plan(actions=tuple(actions), objective=objective, notes=tuple(notes),
                placements=tuple(sorted(placements, key=lambda p: p.job_id)),
                prices=tuple(float(p) for p in result.prices))


# ---------------------------------------------------------------------------


WHOLE_UID = -1
"""`Row.uid` of a row holding whole GPUs: never looked up (nobody shares a GPU it holds)."""


def _table(fam: Family, cache: PairCache, per_gpu: np.ndarray, shares_per_gpu: int) -> Table:
    shapes = fam.shapes
    n = len(shapes)
    tputs = [s.throughput for s in shapes]
    tmax = max(tputs)
    rows = []  # shares in Slurm's counts from here on; the shapes' are percent
    res = np.empty((n, 4))
    gang = []  # (slot, GPUs, GPU memory) of each data-parallel row
    shares: dict[int, int] = {}  # a family has a few share levels: each converted once
    for i, s in enumerate(shapes):
        r = s.resources
        share = 0
        if r.mps:
            share = shares.get(r.mps)
            if share is None:
                share = shares[r.mps] = shares_of(r.mps, shares_per_gpu)
        # Only a share of a GPU ever sits beside another job: whole-GPU rows (all of one, or a gang) need no
        # profile in the interference model's all-pairs block (WHOLE_UID), which then is a fraction of the size.
        uid = cache.add(solo_profile(s, fam.kind, fam.name)) if 0 < share < shares_per_gpu else WHOLE_UID
        rows.append(Row(i, uid, s.throughput, share, float(r.gpu_mem_mib), float(r.cpus), float(r.host_mem_mib),
                        gpus=r.gpus))
        res[i] = (share, r.gpu_mem_mib, r.cpus, r.host_mem_mib)
        if r.gpus:
            gang.append((i, r.gpus, r.gpu_mem_mib))
    demand = res / per_gpu
    for i, g, mem in gang:  # n whole GPUs: n GPU equivalents of shares and of GPU memory
        demand[i, 0] = g
        demand[i, 1] = g * mem / per_gpu[1]
    tput = np.array(tputs)
    floor = fam.throughput_floor
    allowed = tput >= floor
    contention = np.zeros(n)  # filled for all tables at once by _contention
    value = tput / tmax
    dominant = np.maximum(demand.max(axis=1), 1e-9)
    dens = value / dominant
    by_speed = sorted((i for i in range(n) if tputs[i] >= floor), key=lambda i: (-tputs[i], i))
    return Table(fam, rows, value, demand, allowed, contention, by_speed,
                 float(dens[allowed].max()) if by_speed else 0.0, bool(gang))


def _contention(tables: list[Table], cache: PairCache, shares_per_gpu: int) -> None:
    """Γ's slowdown for every partial-GPU shape, next to a stand-in neighbour holding the rest; one model call."""
    todo = [(t, i) for t in tables for i, r in enumerate(t.rows) if r.share < shares_per_gpu and not r.gpus]
    if not todo or not cache.enabled:
        return
    # one stand-in per share left over (the same object each time, so a model may compute it once)
    stand_in: dict[int, SoloProfile] = {}
    for t, i in todo:
        rest = shares_per_gpu - t.rows[i].share
        if rest not in stand_in:
            stand_in[rest] = SoloProfile(kind="train", mps_share=round(percent_of(rest, shares_per_gpu)))
    partners = [stand_in[shares_per_gpu - t.rows[i].share] for t, i in todo]
    slow = cache.vs_partners([t.rows[i].uid for t, i in todo], partners)
    for (t, i), s in zip(todo, slow):
        t.contention[i] = 1.0 - 1.0 / s


def _problem(pending: list[Job], state: GpuState, per_gpu: np.ndarray, elastic: list[Job] = (),
             restart: list[float] = ()) -> pricing.PriceProblem:
    """Stack the jobs' tables into padded [J, C] arrays over the free pool: the pending jobs, then the elastic
    running ones (never left out; only their whole-GPU shapes; `restart` charged on all but the current one;
    what they hold is added to the pool)."""
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
    nt, r = max(1, len(tabs)), len(RESOURCES)
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
    free = np.array([
        sum(state.free_share[g] for g in open_gpus),
        sum(max(0.0, state.free_mem[g]) for g in open_gpus),
        sum(max(0.0, state.node_cpu[n]) for n in open_nodes),
        sum(min(max(0.0, state.node_mem[n]), 1e15) for n in open_nodes),
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
                                                                       for g in mine), j.seat.row.cpus, j.seat.row.hmem])
    cap = free / per_gpu
    if cap[0] <= 0:
        allow[:len(pending)] = False
    return pricing.PriceProblem(
        value=v, demand=demand[idx], penalty=penalty, allowed=allow,
        weight=w, capacity=cap, optional=optional)


def _gang_capable(job: Job) -> bool:
    return job.table.gangs


def _allot(pending: list[Job], elastic: list[Job], choice: np.ndarray, targets: dict[int, int],
           problem: pricing.PriceProblem, now: float, progress: Mapping[int, float], ps,
           per_gpu_share: float) -> tuple[list[int], list[Job]]:
    """Replace the prices' choice for the jobs with data-parallel shapes by `planner.allot` (weighted shortest
    remaining time first); the other pending jobs keep the prices' choice and are budgeted first. Returns the
    allotted pending jobs' indices and the elastic jobs, each in the allotment's order."""
    budget = float(problem.capacity[0])
    for i, j in enumerate(pending):
        if not _gang_capable(j) and choice[i] != pricing.NONE:
            budget -= float(problem.demand[i, choice[i], 0])
    who = [i for i, j in enumerate(pending) if _gang_capable(j)]
    claims = []
    for j in [pending[i] for i in who] + list(elastic):
        rows, t = j.table.rows, j.table
        sizes = [float(r.gpus) if r.gpus else r.share / per_gpu_share for r in rows]
        cap = float(max(1, t.family.default_shape.resources.gpus))
        # the key's speed: per GPU at its request, so that the key is the GPU-seconds left (its area, as
        # Tiresias's two dimensions count service, but what is left rather than what was had)
        rate = max((r.tput for r, z in zip(rows, sizes) if z <= cap + 1e-9), default=0.0) / cap
        rate = rate if rate > 0 else max(r.tput for r in rows) / cap
        if j.running:
            work, _ = _left_s(j, now, progress)
            # a running job moves only between whole GPUs (a gang, or one GPU alone)
            allowed = [bool(r.gpus) or r.share >= per_gpu_share for r in rows]
            allowed[j.seat.row.slot] = True
            claims.append(allot.Claim(work / rate / j.weight, sizes, [r.tput for r in rows], allowed,
                                      max(cap, sizes[j.seat.row.slot]), work, j.seat.row.slot, ps.reshape_cost_s))
        else:
            work = max(0.0, t.family.total_work - (progress.get(j.view.job_id) or 0.0))
            claims.append(allot.Claim(work / rate / j.weight, sizes, [r.tput for r in rows], list(t.allowed), cap,
                                      extra=j.view.requeue))
    picks = allot.allot(claims, budget, ps.hysteresis)
    for i, p in zip(who, picks):
        choice[i] = p
    for j, p in zip(elastic, picks[len(who):]):
        targets[j.view.job_id] = p
    seq = allot.order(claims)
    return [who[k] for k in seq if k < len(who)], [elastic[k - len(who)] for k in seq if k >= len(who)]


def _place(job: Job, state: GpuState, slots: list[int]) -> bool:
    """Put `job` at the first of `slots` that fits anywhere."""
    for s in slots:
        row = job.table.rows[s]
        if row.gpus:
            gang = state.find_gang(row)
            if gang:
                state.place_gang(job.seat, row, gang)
                return True
            continue
        g, _ = state.find(job.seat, row)
        if g >= 0:
            state.place(job.seat, row, g)
            return True
    return False


def _seat_in_start_order(starts: list[Job], state: GpuState) -> None:
    """Put this epoch's starts where Slurm will put them: in its order, each on the GPU its rule gives then.

    The plan packs in its own order (the queue's head first, then value or the allotment's, then upgrades), but
    Slurm starts the released jobs in its order (`gpu_choice.start_key`), each seeing what the earlier took
    (`gpu_choice`): two shares on one node would swap GPUs, a share could take the GPU a gang was planned on.
    So the starts are taken off and put back in Slurm's order. A job whose planned GPU is the one Slurm gives it
    then, with nothing unplanned there, goes back as planned (the plan's checks hold). Otherwise it goes at its
    shape to the GPU Slurm gives it on the planned node if the co-location checks allow (`GpuState.fits`), else
    at the first of that shape and its slower ones that fits anywhere (`_place`), else it waits an epoch.
    """
    planned = [(j, j.seat.row, j.seat.gpu, j.seat.gang) for j in starts]
    for j in starts:
        state.remove(j.seat)
    changed: set[int] = set()  # GPUs given a start the plan did not put there
    for j, row, g, gang in sorted(planned, key=lambda p: gpu_choice.start_key(p[0].view)):
        seat, n = j.seat, state.gpu_node[g]
        if gang:
            if state.gives_gang(row, gang):
                state.place_gang(seat, row, gang)
                continue
        else:
            given = state.given(n, row.share, state.asks_one_whole(seat, row, g))
            if (given == g and g not in changed and state.free_share[g] >= row.share
                    and state.node_cpu[n] >= row.cpus and state.node_mem[n] >= row.hmem):
                state.place(seat, row, g)
                continue
            if given >= 0 and state.fits(seat, row, given):
                state.place(seat, row, given)
                changed.add(given)
                continue
        if _place(j, state, [row.slot] + [s for s in j.table.by_speed if j.table.rows[s].tput < row.tput]):
            changed.update(seat.gang or (seat.gpu,))


def _keep_free(job: Job, state: GpuState, slots: list[int], gpu_key: list[tuple[str, int]]) -> str:
    """Keep free, this epoch, GPUs for the queue's head that fits nowhere yet; returns the note saying which.

    A job asking whole GPUs where Slurm gives `gpu:P` its P lowest GPUs not held whole (22.05, and a version the
    planner cannot tell: `gpu_choice.whole_gpus`) gets only GPUs that rule picks, on the node where they are least
    used (`GpuState.whole_gpus_for`): Slurm would never give it another idle GPU, so keeping one would idle it for
    nothing. Otherwise the emptiest GPU, the last of a node among equals: Slurm fills a node's GPUs first fit by
    index (`planner.gpu_choice`), so the others' shares go below it rather than onto it.
    """
    if job.seat.whole and not state.lowest_unused:
        count = min((job.table.rows[s].gpus or 1 for s in slots), default=1)
        keep = [g for g in state.whole_gpus_for(count) if state.free_share[g] > 0]
    else:
        g = max(range(len(state.free_share)), key=lambda k: (state.free_share[k], k), default=None)
        keep = [g] if g is not None and state.free_share[g] > 0 else []
    if not keep:
        return ""
    for g in keep:
        state.block(g, state.free_share[g])
    names = ", ".join(f"{gpu_key[g][0]}:{gpu_key[g][1]}" for g in keep)
    gpus = "GPUs" if len(keep) > 1 else "GPU"
    return f"job {job.view.job_id} heads the queue and fits nowhere yet: {gpus} {names} kept free for it"


def _upgrade(job: Job, state: GpuState) -> None:
    """Move a placed pending job to a faster shape if one fits now, anywhere."""
    seat = job.seat
    if seat.gpu < 0:
        return
    faster = [s for s in job.table.by_speed if job.table.rows[s].tput > seat.row.tput]
    if not job.view.requeue:  # `--no-requeue`: GPUs beyond its request could never be given back
        asked = max(1, job.table.family.default_shape.resources.gpus)
        faster = [s for s in faster if (job.table.rows[s].gpus or 1) <= asked]
    if not faster:
        return
    need = min(job.table.rows[s].share for s in faster)
    if (not seat.gang and not any(job.table.rows[s].gpus for s in faster)
            and state.free_share[seat.gpu] + seat.row.share < need and state.max_free() < need):
        return  # nowhere has the shares: skip the remove/re-place
    old, g0, gang = seat.row, seat.gpu, seat.gang
    state.remove(seat)
    if not _place(job, state, faster):
        if gang:
            state.place_gang(seat, old, gang)
        else:
            state.place(seat, old, g0)


def _reshape(job: Job, state: GpuState, now: float, progress: Mapping[int, float], cost_s: float,
             hysteresis: float) -> tuple[float, float] | None:
    """Reshape a running job on its own GPU when the gain pays; returns (seconds saved, seconds left) or None."""
    seat = job.seat
    old, g = seat.row, seat.gpu
    rate_now = old.tput / seat.slow
    work = reshape.remaining_work(job.table.family.total_work, progress.get(job.view.job_id),
                                  job.view.start_time, now, rate_now)
    faster = [s for s in job.table.by_speed if job.table.rows[s].tput > old.tput and not job.table.rows[s].gpus]
    if not job.view.requeue:  # `--no-requeue`: Slurm refuses the requeue, so only an in-place reshape can work
        faster = [s for s in faster if job.table.rows[s].share == old.share]
    if not faster or work <= 0:
        return None
    state.remove(seat)
    best, best_saved = None, 0.0
    for s in faster:
        row = job.table.rows[s]
        row = Row(row.slot, row.uid, row.tput, row.share, row.mem, old.cpus, old.hmem)  # Slurm keeps its CPUs and memory
        slow = state.fits(seat, row, g, stays=row.share == old.share)  # a new share goes where Slurm puts it
        if slow:
            saved = reshape.saving(work, rate_now, row.tput / slow, cost_s, hysteresis)
            if saved > best_saved:
                best, best_saved = row, saved
    state.place(seat, best or old, g)
    if best is None:
        return None
    return best_saved, work / rate_now if rate_now > 0 else math.inf


MOVE_TRIES = 4
"""Faster shapes `_move` tries per job (fastest first): each is a search of the GPUs."""


def _move(job: Job, state: GpuState, now: float, progress: Mapping[int, float], cost_s: float,
          hysteresis: float) -> tuple[float, float] | None:
    """Move a running job off its share of one GPU (a requeue) to a faster shape anywhere — a larger share
    elsewhere, a GPU of its own, or a gang of idle GPUs — when the time saved over its remaining work beats the
    restart by the hysteresis margin; (seconds saved, seconds left), or None (it stays).

    Why: a job started on what was left of a GPU (a quarter beside a long co-runner) would otherwise keep that
    share to its end however many GPUs go idle; runs after the packing, so it takes only what nobody
    pending was given."""
    seat = job.seat
    if seat.gang or not job.view.requeue or seat.gpu < 0:
        return None
    old, g0 = seat.row, seat.gpu
    rate_now = old.tput / seat.slow
    work = reshape.remaining_work(job.table.family.total_work, progress.get(job.view.job_id),
                                  job.view.start_time, now, rate_now)
    rows = job.table.rows
    room = state.max_free()  # what the other GPUs have (its own is `_reshape`'s question)
    idle = room >= state.total_share[g0]  # a GPU with nobody on it: a whole GPU or a gang may be there
    faster = [s for s in job.table.by_speed
              if (rows[s].share <= room if not rows[s].gpus else idle)
              and reshape.saving(work, rate_now, rows[s].tput, cost_s, hysteresis) > 0][:MOVE_TRIES]
    if not faster:
        return None
    state.remove(seat)
    best: tuple[float, Row, tuple[int, ...], int] | None = None
    for s in faster:
        base = rows[s]
        row = Row(base.slot, base.uid, base.tput, base.share, base.mem, old.cpus, old.hmem, gpus=base.gpus)
        if row.gpus:
            gang, slow = state.find_gang(row), 1.0
            g = gang[0] if gang else -1
        else:
            gang = ()
            g, slow = state.find(seat, row)
        if g < 0 or (g == g0 and not gang):
            continue  # nowhere, or its own GPU (`_reshape` had that question)
        saved = reshape.saving(work, rate_now, row.tput / slow, cost_s, hysteresis)
        if saved > 0 and (best is None or saved > best[0]):
            best = (saved, row, gang, g)
    if best is None:
        state.place(seat, old, g0)
        return None
    saved, row, gang, g = best
    if gang:
        state.place_gang(seat, row, gang)
    else:
        state.place(seat, row, g)
    return saved, work / rate_now if rate_now > 0 else math.inf


def _one_whole_gpu(job: Job, state: GpuState) -> bool:
    """The job asks whole GPUs (`gpu:N`) and is placed on all of one GPU: Slurm must be asked `gpu:1`, never an MPS
    share (22.05 refuses to move a job from gpu to mps: "Invalid generic resource")."""
    return bool(job.view.whole_gpus) and job.seat.row.share >= state.total_share[job.seat.gpu]


def _size(row: Row, state: GpuState, g: int) -> float:
    """GPUs a row holds: its gang's, or its share of GPU g."""
    return float(row.gpus) if row.gpus else row.share / state.total_share[g]


DWELL_RESTARTS = 10
"""An elastic job keeps a GPU count for at least this many restart costs before it is reshaped again, so
restarts take at most about a tenth of its time however the queue moves."""


def _elastic(job: Job, state: GpuState, now: float, cost_s: float) -> bool:
    """A running job that holds whole GPUs, may be requeued, whose family has data-parallel shapes, and that
    has run `DWELL_RESTARTS` restart costs since it last started."""
    whole = bool(job.seat.gang) or job.seat.row.share >= state.total_share[job.seat.gpu]
    settled = job.view.start_time is None or now - job.view.start_time >= DWELL_RESTARTS * cost_s
    return whole and settled and job.view.requeue and job.table.gangs


def _left_s(job: Job, now: float, progress: Mapping[int, float]) -> tuple[float, float]:
    """(work left, seconds left at its current rate) of a running job."""
    rate = job.seat.row.tput / job.seat.slow
    work = reshape.remaining_work(job.table.family.total_work, progress.get(job.view.job_id), job.view.start_time,
                                  now, rate)
    return work, (work / rate if rate > 0 else math.inf)


def _restart_charge(job: Job, now: float, progress: Mapping[int, float], cost_s: float, hysteresis: float) -> float:
    """What a reshape costs an elastic job in the pricing's units: its weight × the share of its remaining time
    the restart takes (with the hysteresis margin), at most its weight."""
    _, left = _left_s(job, now, progress)
    return job.weight * min(1.0, (1.0 + hysteresis) * cost_s / max(left, 1e-9)) if math.isfinite(left) else 0.0


def _regang(job: Job, state: GpuState, slot: int, now: float, progress: Mapping[int, float],
            cost_s: float) -> tuple[float, float] | None:
    """Move an elastic running job to `slot` (the pricing's choice); (seconds saved — negative for a shrink —,
    seconds left), or None when it does not fit (the job keeps what it holds)."""
    seat = job.seat
    old, gang, g0 = seat.row, seat.gang, seat.gpu
    work, left = _left_s(job, now, progress)
    if work <= 0:
        return None
    state.remove(seat)
    row = job.table.rows[slot]
    row = Row(row.slot, row.uid, row.tput, row.share, row.mem, old.cpus, old.hmem, gpus=row.gpus)
    if row.gpus:
        got = state.find_gang(row)
        if got:
            state.place_gang(seat, row, got)
    elif state.fits(seat, row, g0):
        state.place(seat, row, g0)
    if seat.gpu < 0:  # back where it was
        if gang:
            state.place_gang(seat, old, gang)
        else:
            state.place(seat, old, g0)
        return None
    after = work / row.tput + cost_s
    return left - after, left


def _grow(job: Job, state: GpuState, target: int, now: float, progress: Mapping[int, float], cost_s: float,
          hysteresis: float) -> tuple[float, float] | None:
    """Give an elastic job more GPUs when they sit idle: the pricing's target, else the largest that fits,
    only if the time saved over its remaining work beats the restart by the hysteresis margin."""
    old = job.seat.row
    work, _ = _left_s(job, now, progress)
    rate_now = old.tput / job.seat.slow
    bigger = [s for s in job.table.by_speed if job.table.rows[s].gpus > max(old.gpus, 1)
              and reshape.saving(work, rate_now, job.table.rows[s].tput, cost_s, hysteresis) > 0]
    bigger.sort(key=lambda s: (s != target, -job.table.rows[s].tput, s))
    for s in bigger:
        got = _regang(job, state, s, now, progress, cost_s)
        if got is not None:
            return got
    return None


def _queue_head(snapshot: Snapshot, part: str) -> int | None:
    """The pending, unheld job Slurm would start first: highest priority, then oldest, then lowest id."""
    cands = [j for j in snapshot.jobs if j.state is JobState.PENDING and not j.held and (not part or j.partition == part)]
    if not cands:
        return None
    return min(cands, key=gpu_choice.start_key).job_id


def _reserve_foreign(job: JobView, state: GpuState, nodes, where) -> str:
    """Hold back what a family-less head job asked for: mps:N on the GPU Slurm would give it (the first with room,
    in node and GPU order: `planner.gpu_choice`), gpu:N whole GPUs on one node."""
    if job.gres is None:
        return ""
    if job.gres.kind == "mps":
        g = mps_gpu(state.free_share, job.gres.count) if job.gres.count > 0 else -1
        if g < 0:
            return ""
        state.block(g, job.gres.count)
        return f"job {job.job_id} heads the queue: {job.gres.count} shares of GPU {g} kept for it"
    best: list[int] = []
    for n in nodes:
        empty = [where[(n.name, gv.index)] for gv in n.gpus
                 if state.free_share[where[(n.name, gv.index)]] >= gv.shares_total and not state.occ[where[(n.name, gv.index)]]]
        if len(empty) > len(best):
            best = empty
    for g in best[: job.gres.count]:
        state.block(g, state.free_share[g])
    return f"job {job.job_id} heads the queue: {min(len(best), job.gres.count)} whole GPU(s) kept for it" if best else ""
