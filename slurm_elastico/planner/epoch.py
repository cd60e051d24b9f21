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

The phases, each in its own module: `board` (capacity, tables, who is
where), `reservation` (the queue's head), `prices` (prices and the
allotment), `running` (elastic jobs give back, grow; reshapes and moves that
pay), `starts` (the packing of pending jobs), `actions` (the `Plan`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Family, Plan, Snapshot
from slurm_elastico.planner import weights
from slurm_elastico.planner.actions import write_plan
from slurm_elastico.planner.board import read_board
from slurm_elastico.planner.reservation import reserve_head
from slurm_elastico.planner.prices import price
from slurm_elastico.planner.running import give_back, is_elastic, reshape_running, undo_idle_shrinks
from slurm_elastico.planner.slowdown import PairCache, for_gpu
from slurm_elastico.planner.starts import pack, seat_in_start_order, upgrade


@contextmanager
def collector_off() -> Iterator[None]:
    """Python's cyclic garbage collector off while an epoch runs (as `timeit` keeps it off while it times): an
    epoch allocates some 20,000 small objects (rows, profiles, seats) that reference counting frees as it
    returns, and each collection on the way walked every one of them alive then (3 % of a typed epoch at 200
    jobs, `benchmarks/planner.py`). Whatever the epoch leaves in a cycle is collected afterwards as usual."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def plan_epoch(snapshot: Snapshot, families: Mapping[int, Family], settings: Settings,
               model: SlowdownModel | None, now: float, policy, progress: Mapping[int, float] | None = None) -> Plan:
    """Plan one epoch under `policy` (its fields, never its name, decide what runs)."""
    with collector_off():
        return _plan(snapshot, families, settings, model, now, policy, progress)


def _plan(snapshot: Snapshot, families: Mapping[int, Family], settings: Settings, model: SlowdownModel | None,
          now: float, policy, progress: Mapping[int, float] | None) -> Plan:
    ps, gs = settings.planner, settings.gpu
    part = settings.slurm.partition
    floor = settings.interference.floor if policy.interference else 0.0
    # On a GPU type the model never trained on, its cautious view (shrunk predictions, larger margins).
    cache = PairCache(for_gpu(model, gs.type) if policy.interference else None)
    progress = progress or {}

    # -- capacity, the families as tables, who is where -----------------------
    board = read_board(snapshot, families, settings, policy, cache, floor)
    state, jobs = board.state, board.jobs
    for j in jobs:
        j.weight = weights.weight_of(j.view, j.table.family, ps.fairness, now, progress.get(j.view.job_id),
                                     j.table.fastest)
    pending = [j for j in jobs if not j.running]
    running = [j for j in jobs if j.running]
    elastic = [j for j in running if policy.reshape and is_elastic(j, state, now, ps.reshape_cost_s, progress)] if any(
        t.gangs for t in board.tables.values()) else []
    notes: list[str] = list(board.notes)

    # -- reservation for the head of the queue -------------------------------
    head = reserve_head(snapshot, part, board, ps.reserve_queue_head, notes)

    # -- prices ---------------------------------------------------------------
    priced = price(pending, elastic, board, policy, ps, now, progress)
    notes.append(priced.note())

    # -- elastic running jobs give back what the queue prices above their use --
    changes = give_back(elastic, priced.targets, priced.growers, state, now, progress, ps.reshape_cost_s)
    early = set(changes.reshaped) | changes.preempted  # running jobs changed before the packing: actions first

    # -- packing --------------------------------------------------------------
    order = pack(pending, priced, head, policy, state, ps, board.gpu_key, notes)
    undo_idle_shrinks(elastic, changes, state)
    if policy.price:
        for i in order:
            upgrade(pending[i], state)
    seat_in_start_order([j for j in pending if j.seat.gpu >= 0], state)

    # -- running jobs ---------------------------------------------------------
    if policy.reshape:
        reshape_running(running, elastic, pending, priced.targets, policy.allot, state, changes, now, progress, ps)

    # -- actions --------------------------------------------------------------
    return write_plan(pending, running, early, changes, state, board.gpu_key, ps.reshape_cost_s, notes,
                      priced.result.prices)
