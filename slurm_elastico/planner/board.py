"""Reading the snapshot for one epoch: the free capacity per GPU and node, the families as tables, who is where.

Jobs without a family are never acted on, but what they hold counts (a
foreign occupant, with a stand-in profile per share it holds). A running job
is put on the GPU(s) it holds at the shape elastico-run runs it as
(`shape_of_running`, `gang_of_running`); one the epoch cannot locate is left
alone. Held jobs are left alone (held by a user, or mid-reshape), but under a
policy with `allot` one this policy preempted is planned again (its
AdminComment's mark, `shapes.current.preempted_by_us`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.model import Family, JobState, JobView, NodeView, Shape, Snapshot
from slurm_elastico.planner import gpu_choice, partitions
from slurm_elastico.planner.packing import GpuState
from slurm_elastico.planner.seats import Row, Seat, best_solo
from slurm_elastico.planner.slowdown import PairCache
from slurm_elastico.planner.tables import WHOLE_UID, Job, Table, fill_tables, make_table
from slurm_elastico.shapes.current import named_in_comment, preempted_by_us, running_shape
from slurm_elastico.shapes.solo import solo_profile
from slurm_elastico.shapes.units import percent_of


@dataclass
class Board:
    """What `read_board` found: the GPU ledger and the managed jobs on it, with the lookups later phases use."""

    nodes: list[NodeView]  # usable nodes of the partition
    types: tuple[str, ...]  # their GPU types, sorted ("" not among them); `Row.gtype` and `GpuState.gpu_type` index it
    where: dict[tuple[str, int], int]  # (node, GPU index) -> the GPU's number in `state`
    gpu_key: list[tuple[str, int]]  # the GPU's number -> (node, GPU index)
    per_gpu: np.ndarray  # one GPU's worth of each resource (`tables.RESOURCES`): the pricing's unit
    state: GpuState
    tables: dict[int, Table]
    by_id: dict[int, Job]  # every job with a family the epoch may plan, by id
    jobs: list[Job]  # those it plans (a running one only where located on a GPU), by id
    notes: list[str] = field(default_factory=list)  # jobs it leaves out and why, for the plan's notes


def _named_shape(job: JobView, family: Family) -> Shape | None:
    """The shape of `family` the job's AdminComment names, if any (whatever share it holds)."""
    name = named_in_comment(job.admin_comment)
    return next((s for s in family.shapes if s.name == name), None) if name is not None else None


def _on_types(family: Family, kinds: frozenset[str]) -> Family:
    """`family` without its shapes of other GPU types than `kinds` (untyped shapes stay); its default named only
    when kept. A family left with no shape has none here: the job is not planned (`table_of`'s caller)."""
    keep = tuple(s for s in family.shapes if not s.gpu_type or s.gpu_type in kinds)
    default = family.default if any(s.name == family.default for s in keep) else None
    return dataclasses.replace(family, shapes=keep, default=default)


def shape_of_running(job: JobView, table: Table, held_share: int, shares_per_gpu: int) -> int:
    """Slot of the shape a running job runs as: the rule elastico-run follows (`shapes.current.running_shape`)."""
    shape, _ = running_shape(table.family.shapes, table.family.default_shape, job.admin_comment, held_share,
                             shares_per_gpu)
    return table.family.shapes.index(shape)


def on_type(table: Table, slot: int, gtype: int) -> int:
    """The slot of the same shape on GPU type `gtype` (where a running job is): `slot` itself if its type is that
    one or none, else the shape with the same knobs and GPUs on `gtype`, else the fastest with its GPUs there."""
    rows, shapes = table.rows, table.family.shapes
    if rows[slot].gtype in (-1, gtype):
        return slot
    same = [r for r in rows if r.gtype == gtype and r.gpus == rows[slot].gpus]
    twin = [r for r in same if shapes[r.slot].knobs == shapes[slot].knobs]
    return max(twin or same, key=lambda r: (r.tput, -r.slot)).slot if (twin or same) else slot


def gang_of_running(job: JobView, table: Table, gpus: int, gtype: int = -1) -> int | None:
    """Slot of the data-parallel shape a running job holding `gpus` whole GPUs of type `gtype` runs as: the one its
    AdminComment names if it has that many GPUs, else the fastest with that many (None: the family has none)."""
    rows = [r for r in table.rows if r.gpus == gpus and r.gtype in (-1, gtype)]
    named = _named_shape(job, table.family)
    for r in rows:
        if named is not None and table.family.shapes[r.slot] is named:
            return r.slot
    return max(rows, key=lambda r: (r.tput, -r.slot)).slot if rows else None


def read_board(snapshot: Snapshot, families: Mapping[int, Family], settings: Settings, policy, cache: PairCache,
               floor: float) -> Board:
    """The capacity and the jobs of `snapshot` as the epoch plans them under `policy` (its `narrow` and `allot`);
    `cache` gets a profile per shape that may share a GPU, `floor` is the co-location floor the ledger checks."""
    gs = settings.gpu
    part = settings.slurm.partition
    # -- capacity -----------------------------------------------------------
    nodes = [n for n in snapshot.nodes if n.usable and (not part or part in n.partitions)]
    types = tuple(sorted({n.gpu_type for n in nodes if n.gpus and n.gpu_type}))
    gpu_type: list[int] = []
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
            gpu_type.append(types.index(n.gpu_type) if n.gpu_type else -1)
    n_gpus = len(gpu_node)
    state = GpuState(gpu_node, free_share, free_mem, node_cpu, node_mem, cache, floor, total_share=total_share,
                     lowest_unused=gpu_choice.lowest_unused(snapshot.slurm_version), gpu_type=gpu_type)
    per_gpu = np.array([
        float(gs.shares_per_gpu),
        float(np.mean(gpu_mem)) if n_gpus else float(gs.memory_mib),
        max(1.0, sum(n.cpus for n in nodes) / max(1, n_gpus)),
        max(1.0, sum(n.memory_mib for n in nodes) / max(1, n_gpus)),
    ])

    # -- families as tables (one per distinct family object) ----------------
    tables: dict[int, Table] = {}
    narrowed: dict[object, Family] = {}  # by family id (and the types its partitions have, a running shape)
    levels: dict[int, int] = {}  # share (percent) -> Slurm's count, for all the tables

    def table_of(fam: Family, running: JobView | None = None, kinds: frozenset[str] | None = None) -> Table | None:
        key = id(fam)
        if key not in narrowed:
            narrowed[key] = policy.narrow(fam)
        small = narrowed[key]
        if kinds is not None and any(s.gpu_type and s.gpu_type not in kinds for s in small.shapes):
            # Its partitions have GPUs of `kinds` only: the shapes of other types are not its to take.
            key = (key, kinds)
            if key not in narrowed:
                narrowed[key] = _on_types(small, kinds)
            small = narrowed[key]
        if running is not None:
            # A running job keeps the shape it runs as, even one the policy's narrowing drops.
            now_as = _named_shape(running, fam)
            # (`is` first: the shape is usually the family's own object, found without comparing shapes field by field)
            if now_as is not None and not any(s is now_as for s in small.shapes) and now_as not in small.shapes:
                extra = (key, now_as.name)
                if extra not in narrowed:
                    narrowed[extra] = dataclasses.replace(small, shapes=small.shapes + (now_as,))
                small = narrowed[extra]
        if not small.shapes:
            return None  # no shape of its family runs on its partitions' GPUs: left to Slurm
        t = tables.get(id(small))
        if t is None:
            t = tables[id(small)] = make_table(small, cache, gs.shares_per_gpu, types, levels)
        return t

    # -- who is where --------------------------------------------------------
    jobs: list[Job] = []
    by_id: dict[int, Job] = {}
    solo: dict[int, float] = {}  # `best_solo` of each table, by id

    def seat(jv: JobView, fam: Family, t: Table, allowed: frozenset[int] | None,
             gang_nodes: tuple[frozenset[int], ...] | None) -> Seat:
        best = solo.get(id(t))
        if best is None:
            best = solo[id(t)] = best_solo(t.rows)
        return Seat(jv.job_id, fam.throughput_floor, best_solo=best, whole=jv.whole_gpus > 0, nodes=allowed,
                    gang_nodes=gang_nodes)

    reach: dict[str, tuple] = {}  # by partition field

    def where_to(jv: JobView) -> tuple[frozenset[int] | None, frozenset[str] | None,
                                       tuple[frozenset[int], ...] | None]:
        """The nodes of the job's partitions (None: every node here), their GPU types (None: no limit) and, for a
        job of several partitions, each one's nodes (`Seat.gang_nodes`)."""
        got = reach.get(jv.partition)
        if got is None:
            allowed = partitions.allowed_nodes(jv, nodes)
            kinds = None if allowed is None else frozenset(nodes[i].gpu_type for i in allowed if nodes[i].gpu_type)
            sets = partitions.node_sets(jv.partition, [n.partitions for n in nodes])
            got = reach[jv.partition] = (allowed, kinds, tuple(sets) if len(sets) > 1 else None)
        return got

    notes: list[str] = []
    for jv in snapshot.jobs:
        fam = families.get(jv.job_id)
        if fam is None or not fam.shapes or not partitions.managed(jv, part):
            continue
        allowed, kinds, gang_nodes = where_to(jv)
        pending = (jv.state is JobState.PENDING
                   and (not jv.held or (policy.allot and preempted_by_us(jv.admin_comment)))
                   and (jv.gres is None or jv.gres.kind in ("mps", "gpu", "gpus")))
        if not pending and jv.state is not JobState.RUNNING:
            continue
        t = table_of(fam, None if pending else jv, kinds)
        if t is None:
            why = ("its family has no shape this policy plans" if kinds is None else
                   f"its family has no shape for the GPU types of its partitions {jv.partition} "
                   f"({', '.join(sorted(kinds)) or 'none'})")
            notes.append(f"job {jv.job_id} not planned: {why}; Slurm runs it as submitted")
            continue
        by_id[jv.job_id] = Job(jv, t, 1.0, seat(jv, fam, t, allowed, gang_nodes), running=not pending)
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
                    slot = on_type(job.table, shape_of_running(job.view, job.table, use.shares, gs.shares_per_gpu),
                                   gpu_type[g])
                    base = job.table.rows[slot]
                    uid = base.uid
                    if uid == WHOLE_UID and use.shares < gv.shares_total:  # named whole, holds a share: profile it
                        uid = cache.add(solo_profile(job.table.family.shapes[slot], job.table.family.kind,
                                                     job.table.family.name))
                    job.seat.row = Row(slot, uid, base.tput, use.shares, base.mem,
                                       float(job.view.cpus), float(job.view.memory_mib), gtype=base.gtype)
                    state.attach(job.seat, g, base.mem)
                else:
                    row = Row(-1, foreign[use.shares], math.inf, use.shares, gpu_mem[g] * use.shares / gs.shares_per_gpu, 0, 0)
                    state.attach(Seat(use.job_id, 0.0, row), g, row.mem)
    for jid, held in gangs.items():
        job = by_id[jid]
        slot = gang_of_running(job.view, job.table, len(held), gpu_type[held[0]])
        if slot is None and len(held) == 1 and job.seat.gpu < 0:
            # One whole GPU (`gpu:1`: elastico-submit starts a family with GPU counts so): its one-GPU shape at
            # the GPU's full share, as a job holding all of its MPS shares; it may then grow into a gang.
            g, full = held[0], int(state.total_share[held[0]])
            slot = on_type(job.table, shape_of_running(job.view, job.table, full, gs.shares_per_gpu), gpu_type[g])
            base = job.table.rows[slot]
            job.seat.row = Row(slot, base.uid, base.tput, full, base.mem, float(job.view.cpus),
                               float(job.view.memory_mib), gtype=base.gtype)
            state.attach(job.seat, g, base.mem)
            continue
        if slot is None or job.seat.gpu >= 0:
            continue  # no shape of its family holds that many GPUs: left alone
        base = job.table.rows[slot]
        job.seat.row = Row(slot, base.uid, base.tput, 0, base.mem, float(job.view.cpus), float(job.view.memory_mib),
                           gpus=len(held), gtype=base.gtype)
        state.attach_gang(job.seat, tuple(held), base.mem)
    fill_tables(list(tables.values()), cache, per_gpu, gs.shares_per_gpu, types)
    for j in by_id.values():
        if not j.running or j.seat.gpu >= 0:
            jobs.append(j)  # running jobs we cannot locate on a GPU are left alone
    jobs.sort(key=lambda j: j.view.job_id)
    return Board(nodes, types, where, gpu_key, per_gpu, state, tables, by_id, jobs, notes)
