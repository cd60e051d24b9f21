"""Running jobs in the epoch: which are elastic, and when and how a running job changes shape.

A running job that holds whole GPUs and whose family has gang shapes is
*elastic* (`is_elastic`): it takes part in the pricing with the pending jobs
(`planner.prices`), so when the queue makes GPUs dear it gives some back — it
shrinks, or under the allotment is preempted, before the packing
(`give_back`) — and when GPUs sit idle it takes them after the packing
(`reshape_running`). A shrink or preemption whose GPUs nobody took is undone
(`undo_idle_shrinks`). Any other running job may be reshaped on its own GPU,
or under the allotment moved off its share to a faster shape elsewhere; a job
on a gang that kept its GPUs may take faster knobs on them, in place. Each
change only when the time saved over its remaining work pays the restart
(`planner.reshape`), by the hysteresis margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import islice

from slurm_elastico import pricing
from slurm_elastico.config import PlannerSettings
from slurm_elastico.planner import reshape
from slurm_elastico.planner.packing import GpuState
from slurm_elastico.planner.seats import Row
from slurm_elastico.planner.tables import Job
from slurm_elastico.runtime import rebatch


@dataclass
class Changes:
    """What the epoch does to its running jobs, filled phase by phase."""

    reshaped: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Job id -> (seconds saved, negative for a shrink; seconds left) of each reshaped job."""
    shrunk: dict[int, tuple[Row, tuple[int, ...]]] = field(default_factory=dict)
    """What each shrunk or preempted job held before: its row and its GPUs."""
    preempted: set[int] = field(default_factory=set)
    moved: set[int] = field(default_factory=set)
    """Running jobs `_move` put on another GPU."""
    in_place: set[int] = field(default_factory=set)
    """Running data-parallel jobs given other knobs on the GPUs they hold (`_reknob_gang`): relaunched, no requeue."""
    no_restart: set[int] = field(default_factory=set)
    """Running goodput jobs given a new batch they take in process (`runtime.rebatch`): no relaunch at all."""


def give_back(elastic: list[Job], targets: Mapping[int, int], growers: list[Job], state: GpuState, now: float,
              progress: Mapping[int, float], cost_s: float) -> Changes:
    """Before the packing: elastic running jobs give back what the queue prices above their use (shrunk to the
    pricing's `targets`, or preempted where the allotment gave what they hold to shorter jobs), then the
    allotment's `growers` grow, in its order, before the queue's starts."""
    ch = Changes()
    for j in sorted(elastic, key=lambda j: (j.weight, j.view.job_id)):
        t = targets[j.view.job_id]
        if t == pricing.NONE:  # the allotment gave what it holds to shorter jobs
            ch.shrunk[j.view.job_id] = (j.seat.row, j.seat.gang or (j.seat.gpu,))
            state.remove(j.seat)
            ch.preempted.add(j.view.job_id)
        elif size(j.table.rows[t], state, j.seat.gpu) < size(j.seat.row, state, j.seat.gpu):
            before = (j.seat.row, j.seat.gang or (j.seat.gpu,))
            got = _regang(j, state, t, now, progress, cost_s)
            if got is not None:
                ch.reshaped[j.view.job_id] = got
                ch.shrunk[j.view.job_id] = before
    for j in growers:  # the allotment's grows come before the queue's starts, in its order
        t = targets[j.view.job_id]
        if t == pricing.NONE:
            continue
        row = j.table.rows[t]
        if row.tput > j.seat.row.tput and (size(row, state, j.seat.gpu) > size(j.seat.row, state, j.seat.gpu)
                                           or row.gtype != j.seat.row.gtype):  # more GPUs, or a faster type
            got = _regang(j, state, t, now, progress, cost_s)
            if got is not None:
                ch.reshaped[j.view.job_id] = got
    return ch


def undo_idle_shrinks(elastic: list[Job], ch: Changes, state: GpuState) -> None:
    """After the packing: a shrink or preemption whose GPUs nobody took would be a restart for nothing: undone."""
    for j in elastic:
        if j.view.job_id in ch.shrunk:
            old, held = ch.shrunk[j.view.job_id]
            if all(not state.occ[g] or state.occ[g] == [j.seat] for g in held):
                if j.seat.gpu >= 0:
                    state.remove(j.seat)
                if old.gpus:
                    state.place_gang(j.seat, old, held)
                else:
                    state.place(j.seat, old, held[0])
                ch.reshaped.pop(j.view.job_id, None)
                ch.preempted.discard(j.view.job_id)


def reshape_running(running: list[Job], elastic: list[Job], pending: list[Job], targets: Mapping[int, int],
                    allot: bool, state: GpuState, ch: Changes, now: float, progress: Mapping[int, float],
                    ps: PlannerSettings) -> None:
    """After the starts: elastic jobs grow into what nobody waiting could use (under the allotment, `allot`, what
    it left to nobody); the others, heaviest first, are reshaped on their GPU, or under the allotment moved."""
    waiting = any(j.seat.gpu < 0 for j in pending)
    for j in sorted(elastic, key=lambda j: (-j.weight, j.view.job_id)):
        if j.view.job_id in ch.preempted:
            continue
        # grow into what nobody waiting could use (under the allotment, what it left to nobody)
        if j.view.job_id not in ch.reshaped and (allot or not waiting):
            got = _grow(j, state, targets[j.view.job_id], now, progress, ps.reshape_cost_s, ps.hysteresis)
            if got is not None:
                ch.reshaped[j.view.job_id] = got
    for j in sorted(running, key=lambda j: (-j.weight, j.view.job_id)):
        if j.view.job_id in ch.reshaped or j.view.job_id in ch.preempted:
            continue  # (an elastic job that did not grow may still take faster knobs where it is)
        if j.seat.gang:
            got = _reknob_gang(j, state, now, progress, ps.reshape_cost_s, ps.hysteresis, ch)
            if got is not None:
                ch.reshaped[j.view.job_id] = got
                ch.in_place.add(j.view.job_id)
            continue
        got = _reshape(j, state, now, progress, ps.reshape_cost_s, ps.hysteresis, ch)
        if got is None and allot:
            got = _move(j, state, now, progress, ps.reshape_cost_s, ps.hysteresis)
            if got is not None:
                ch.moved.add(j.view.job_id)
        if got is not None:
            ch.reshaped[j.view.job_id] = got


RESTART_BUDGET = 10
"""An elastic job is reshaped only while its restarts, this one included, would take at most a tenth
(1 / RESTART_BUDGET) of its life: the time since its submission plus what it has left at its current rate. So
restarts stay a small part of every job's time however the queue moves, while a long job may still adapt soon
after it starts (a spacing of ten restarts after every start, the rule before, kept every job at its first size
for its first ten minutes: most of a short job's life)."""


def is_elastic(job: Job, state: GpuState, now: float, cost_s: float, progress: Mapping[int, float]) -> bool:
    """A running job that holds whole GPUs, may be requeued, whose family has data-parallel shapes, and whose
    restarts, one more included, stay within its budget (`RESTART_BUDGET`)."""
    whole = bool(job.seat.gang) or job.seat.row.share >= state.total_share[job.seat.gpu]
    settled = True
    if job.view.start_time is not None:
        _, left = left_s(job, now, progress)
        born = job.view.submit_time if job.view.submit_time is not None else job.view.start_time
        settled = RESTART_BUDGET * (job.view.restarts + 1) * cost_s <= now - born + left
    return whole and settled and job.view.requeue and job.table.gangs


def left_s(job: Job, now: float, progress: Mapping[int, float]) -> tuple[float, float]:
    """(work left, seconds left at its current rate) of a running job."""
    rate = job.seat.row.tput / job.seat.slow
    work = reshape.remaining_work(job.table.family.total_work, progress.get(job.view.job_id), job.view.start_time,
                                  now, rate)
    return work, (work / rate if rate > 0 else math.inf)


def size(row: Row, state: GpuState, g: int) -> float:
    """GPUs a row holds: its gang's, or its share of GPU g."""
    return float(row.gpus) if row.gpus else row.share / state.total_share[g]


def _keeping_host(row: Row, old: Row) -> Row:
    """`row` with the CPUs and host memory of `old`: Slurm keeps a requeued job's (a direct call: this runs for
    every candidate shape of every running job)."""
    return Row(row.slot, row.uid, row.tput, row.share, row.mem, old.cpus, old.hmem, row.gpus, row.gtype)


def _regang(job: Job, state: GpuState, slot: int, now: float, progress: Mapping[int, float],
            cost_s: float) -> tuple[float, float] | None:
    """Move an elastic running job to `slot` (the pricing's choice); (seconds saved — negative for a shrink —,
    seconds left), or None when it does not fit (the job keeps what it holds)."""
    seat = job.seat
    old, gang, g0 = seat.row, seat.gang, seat.gpu
    work, left = left_s(job, now, progress)
    if work <= 0:
        return None
    mark = state.gained
    state.remove(seat)
    row = job.table.rows[slot]
    row = _keeping_host(row, old)
    if row.gpus:
        got = state.gang_for(row, seat)
        if got:
            state.place_gang(seat, row, got)
    elif state.fits(seat, row, g0):
        state.place(seat, row, g0)
    if seat.gpu < 0:  # back where it was
        if gang:
            state.place_gang(seat, old, gang)
        else:
            state.place(seat, old, g0)
        state.put_back(mark)
        return None
    after = work / row.tput + cost_s
    return left - after, left


def _grow(job: Job, state: GpuState, target: int, now: float, progress: Mapping[int, float], cost_s: float,
          hysteresis: float) -> tuple[float, float] | None:
    """Give an elastic job more GPUs when they sit idle: the pricing's target, else the largest that fits,
    only if the time saved over its remaining work beats the restart by the hysteresis margin."""
    old = job.seat.row
    work, _ = left_s(job, now, progress)
    rate_now = old.tput / job.seat.slow
    bigger = [s for s in job.table.by_speed if job.table.rows[s].gpus > max(old.gpus, 1)
              and reshape.saving(work, rate_now, job.table.rows[s].tput, cost_s, hysteresis) > 0]
    bigger.sort(key=lambda s: (s != target, -job.table.rows[s].tput, s))
    for s in bigger:
        got = _regang(job, state, s, now, progress, cost_s)
        if got is not None:
            return got
    return None


def _reshape(job: Job, state: GpuState, now: float, progress: Mapping[int, float], cost_s: float,
             hysteresis: float, ch: Changes) -> tuple[float, float] | None:
    """Reshape a running job on its own GPU when the gain pays; returns (seconds saved, seconds left) or None."""
    seat = job.seat
    old, g = seat.row, seat.gpu
    rate_now = old.tput / seat.slow
    work = reshape.remaining_work(job.table.family.total_work, progress.get(job.view.job_id),
                                  job.view.start_time, now, rate_now)
    rows = job.table.rows
    # (of its GPU's type: `fits` says no on another type's GPU)
    faster = [s for s in job.table.by_speed
              if rows[s].tput > old.tput and not rows[s].gpus and state.on_type(rows[s], g)]
    if not job.view.requeue:  # `--no-requeue`: Slurm refuses the requeue, so only an in-place reshape can work
        faster = [s for s in faster if rows[s].share == old.share]
    if not faster or work <= 0:
        return None
    mark = state.gained
    state.remove(seat)
    best, best_saved = None, 0.0
    for s in faster:
        row = _keeping_host(rows[s], old)  # Slurm keeps its CPUs and memory
        slow = state.fits(seat, row, g, stays=row.share == old.share)  # a new share goes where Slurm puts it
        if slow:
            saved = reshape.saving(work, rate_now, row.tput / slow, _restart_s(job, old, row, cost_s), hysteresis)
            if saved > best_saved:
                best, best_saved = row, saved
    state.place(seat, best or old, g)
    if best is None:
        state.put_back(mark)
        return None
    if not _restart_s(job, old, best, cost_s):
        ch.no_restart.add(job.view.job_id)
    return best_saved, work / rate_now if rate_now > 0 else math.inf


def _reknob_gang(job: Job, state: GpuState, now: float, progress: Mapping[int, float], cost_s: float,
                 hysteresis: float, ch: Changes) -> tuple[float, float] | None:
    """Give a running data-parallel job the shape with as many GPUs of its type that saves the most on the very
    GPUs it holds, when the time saved over its remaining work pays the restart (by the hysteresis margin; a new
    batch the job takes in process costs none: `_restart_s`); (seconds saved, seconds left) or None.

    Same GPUs, other knobs (micro-batch and accumulation, precision, checkpointing; in goodput mode another
    global batch): elastico-run relaunches it in place on USR1, as a job on one GPU, so it is no requeue and no
    restart in Slurm's count (`RESTART_BUDGET` limits requeues). Without it a job whose batch was chosen for
    an efficiency that has since moved (the noise scale grows as training goes on) would keep that batch until
    it is requeued, which a job past its restart budget never is."""
    seat = job.seat
    old, gang = seat.row, seat.gang
    rate_now = old.tput / seat.slow
    work = reshape.remaining_work(job.table.family.total_work, progress.get(job.view.job_id),
                                  job.view.start_time, now, rate_now)
    rows = job.table.rows
    room = min(state.free_mem[g] for g in gang) + old.mem
    best, best_saved = None, 0.0
    for s in job.table.by_speed:
        if rows[s].gpus == old.gpus and rows[s].gtype == old.gtype and rows[s].tput > old.tput and rows[s].mem <= room:
            saved = reshape.saving(work, rate_now, rows[s].tput, _restart_s(job, old, rows[s], cost_s), hysteresis)
            if saved > best_saved:
                best, best_saved = rows[s], saved
    if best is None:
        return None
    if not _restart_s(job, old, best, cost_s):
        ch.no_restart.add(job.view.job_id)
    state.remove(seat)
    state.place_gang(seat, _keeping_host(best, old), gang)
    return best_saved, work / rate_now if rate_now > 0 else math.inf


def _restart_s(job: Job, old: Row, new: Row, cost_s: float) -> float:
    """What a change of shape on the job's own GPU(s) costs it (`runtime.rebatch.restart_s`)."""
    shapes = job.table.family.shapes
    return rebatch.restart_s(job.table.family, shapes[old.slot], shapes[new.slot], cost_s)


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
    faster = list(islice((s for s in job.table.by_speed
                          if (rows[s].share <= room if not rows[s].gpus else idle)
                          and reshape.saving(work, rate_now, rows[s].tput, cost_s, hysteresis) > 0), MOVE_TRIES))
    if not faster:
        return None
    mark = state.gained
    state.remove(seat)
    best: tuple[float, Row, tuple[int, ...], int] | None = None
    for s in faster:
        base = rows[s]
        row = _keeping_host(base, old)
        if row.gpus:
            gang, slow = state.gang_for(row, seat), 1.0
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
        state.put_back(mark)
        return None
    saved, row, gang, g = best
    if gang:
        state.place_gang(seat, row, gang)
    else:
        state.place(seat, row, g)
    return saved, work / rate_now if rate_now > 0 else math.inf
