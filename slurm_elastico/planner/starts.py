"""The pending jobs onto GPUs: packed in the policy's order at what the prices chose, the ones the prices left
out where room remains, upgrades into what is still free, then seated where Slurm will start them.

Each job goes at the fastest shape that fits without exceeding what its
prices chose (`place`: a share by `GpuState.find`, a gang by
`GpuState.find_gang`). The queue's head goes first; if it fits nowhere yet,
GPUs are kept free for it (`reservation.keep_free`).
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from slurm_elastico import pricing
from slurm_elastico.config import PlannerSettings
from slurm_elastico.planner import gpu_choice
from slurm_elastico.planner.packing import GpuState
from slurm_elastico.planner.reservation import keep_free
from slurm_elastico.planner.prices import Priced
from slurm_elastico.planner.tables import Job


def pack(pending: list[Job], priced: Priced, head: Job | None, policy, state: GpuState, ps: PlannerSettings,
         gpu_key: list[tuple[str, int]], notes: list[str]) -> list[int]:
    """Place the pending jobs in `policy.order` (the allotment's jobs after the others, the queue's head first),
    then the ones the prices left out where room remains; returns the order they were packed in."""
    choice, problem, result, allotted = priced.choice, priced.problem, priced.result, priced.allotted
    order = policy.order(pending)
    mine = set(allotted)
    if mine:  # the allotment's jobs after the others (budgeted first), in its order
        order = [i for i in order if i not in mine] + allotted
    if head is not None and ps.reserve_queue_head:
        hi = pending.index(head)
        order = [hi] + [i for i in order if i != hi]
    deferred: list[int] = []
    at_most: dict[tuple[int, int], list[int]] = {}  # (table, target) -> its slots no faster than the target
    for i in order:
        job = pending[i]
        target = int(choice[i])
        is_head = job is head and ps.reserve_queue_head
        if target == pricing.NONE and not is_head:
            if job.table.by_speed:
                deferred.append(i)
                job.held_back = i in mine  # the allotment has nothing for it (it is not placed below)
            continue
        if target == pricing.NONE:  # the head runs anyway: at its cheapest shape at these prices
            target = int(np.argmin(pricing.costs(problem, result.prices)[i, :-1]))
        slots = at_most.get((id(job.table), target))
        if slots is None:  # (jobs of one family at one target ask the same slots: listed once)
            cap = job.table.rows[target].tput
            slots = at_most[id(job.table), target] = [s for s in job.table.by_speed if job.table.rows[s].tput <= cap]
        if not place(job, state, slots):
            deferred.append(i)
        if is_head and job.seat.gpu < 0:
            note = keep_free(job, state, slots, gpu_key)
            if note:
                notes.append(note)
    fallback: dict[int, list[int]] = {}  # by table: its slots in that order (jobs of one family share them)
    for i in deferred:  # what the prices left out, where room remains: the fastest share, else the smallest gang
        if i in mine:
            continue  # the allotment made it wait: shorter jobs have its GPUs
        t = pending[i].table
        slots = fallback.get(id(t))
        if slots is None:
            slots = fallback[id(t)] = [s for s in t.by_speed if not t.rows[s].gpus] + sorted(
                (s for s in t.by_speed if t.rows[s].gpus), key=lambda s: (t.rows[s].gpus, -t.rows[s].tput))
        place(pending[i], state, slots)
    return order


def place(job: Job, state: GpuState, slots: list[int]) -> bool:
    """Put `job` at the first of `slots` that fits anywhere. A job asking what a job of its family asked since the
    ledger last changed, with the same floor, reference speed and request (all that the searches read of it), gets
    the same no without a search (`GpuState.unplaced`)."""
    seat = job.seat
    question = (id(job.table), tuple(slots), seat.floor, seat.best_solo, seat.whole, seat.nodes, seat.gang_nodes)
    if state.unplaced.get(question) == state.changes:
        return False
    cut, rows, best = state.cut_short, job.table.rows, seat.best_solo
    bounds: dict[int, tuple[list[int], list[float]]] = {}  # per GPU type (`GpuState.bounds`: nothing changes until
    for s in slots:                                         # a shape fits)
        row = rows[s]
        if row.gpus:
            gang = state.gang_for(row, seat)
            if gang:
                state.place_gang(seat, row, gang)
                return True
            continue
        b = bounds.get(row.gtype)
        if b is None:
            b = bounds[row.gtype] = state.bounds(row.gtype)
        k = bisect_left(b[0], row.share)
        if k == len(b[0]):
            continue  # no GPU with its share free
        ref = row.tput if row.tput > best else best  # (`state.alone`, written out: this loop runs for every slot)
        if (row.tput / ref if ref > 0 else 0.0) < b[1][k]:
            continue  # none the gain rule lets it share: `find`'s answer
        g, _ = state.find(seat, row)
        if g >= 0:
            state.place(seat, row, g)
            return True
    if state.cut_short == cut:
        state.unplaced[question] = state.changes
    return False


def upgrade(job: Job, state: GpuState) -> None:
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
    mark = state.gained
    state.remove(seat)
    if not place(job, state, faster):
        if gang:
            state.place_gang(seat, old, gang)
        else:
            state.place(seat, old, g0)
        state.put_back(mark)


def seat_in_start_order(starts: list[Job], state: GpuState) -> None:
    """Put this epoch's starts where Slurm will put them: in its order, each on the GPU its rule gives then.

    The plan packs in its own order (the queue's head first, then value or the allotment's, then upgrades), but
    Slurm starts the released jobs in its order (`gpu_choice.start_key`), each seeing what the earlier took
    (`gpu_choice`): two shares on one node would swap GPUs, a share could take the GPU a gang was planned on.
    So the starts are taken off and put back in Slurm's order. A job whose planned GPU is the one Slurm gives it
    then, with nothing unplanned there, goes back as planned (the plan's checks hold). Otherwise it goes at its
    shape to the GPU Slurm gives it on the planned node if the co-location checks allow (`GpuState.fits`), else
    at the first of that shape and its slower ones that fits anywhere (`place`), else it waits an epoch.
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
        if place(j, state, [row.slot] + [s for s in j.table.by_speed if j.table.rows[s].tput < row.tput]):
            changed.update(seat.gang or (seat.gpu,))
