"""The head of the queue: capacity kept for the job Slurm would start first, so that smaller jobs packed around
it cannot starve it.

A head without a family has what it asked for held back before the packing
(`reserve_head`). A head with a family is packed first, and if it fits
nowhere yet, GPUs are kept free for it this epoch (`keep_free`): the ones
Slurm would give it, so that the others' shares go elsewhere.
"""

from __future__ import annotations

from slurm_elastico.model import JobState, JobView, Snapshot
from slurm_elastico.planner import gpu_choice, partitions
from slurm_elastico.planner.board import Board
from slurm_elastico.planner.gpu_choice import mps_gpu
from slurm_elastico.planner.packing import GpuState
from slurm_elastico.planner.tables import Job


def reserve_head(snapshot: Snapshot, part: str, board: Board, reserve: bool, notes: list[str]) -> Job | None:
    """The queue's head if the epoch plans it (a pending job with a family), else None; a head the epoch does not
    plan gets what it asked for held back when `reserve` (`planner.reserve_queue_head`), said in `notes`."""
    head_id = _queue_head(snapshot, part)
    head = board.by_id.get(head_id) if head_id is not None else None
    if head is not None and head.running:
        head = None
    if head_id is not None and head is None and reserve:
        note = _reserve_foreign(snapshot.job(head_id), board.state, board.nodes, board.where)
        if note:
            notes.append(note)
    return head


def _queue_head(snapshot: Snapshot, part: str) -> int | None:
    """The pending, unheld job Slurm would start first: highest priority, then oldest, then lowest id."""
    cands = [j for j in snapshot.jobs if j.state is JobState.PENDING and not j.held and partitions.managed(j, part)]
    if not cands:
        return None
    return min(cands, key=gpu_choice.start_key).job_id


def _reserve_foreign(job: JobView, state: GpuState, nodes, where) -> str:
    """Hold back what a family-less head job asked for: mps:N on the GPU Slurm would give it (the first with room,
    in node and GPU order: `planner.gpu_choice`), gpu:N whole GPUs on one node; on its partitions' nodes only."""
    if job.gres is None:
        return ""
    allowed = partitions.allowed_nodes(job, nodes)
    if allowed is not None:
        nodes = [n for i, n in enumerate(nodes) if i in allowed]
    if job.gres.gpu_type:  # `gpu:a100:2`: only nodes of that type (Slurm's names, compared as Slurm does)
        nodes = [n for n in nodes if n.gpu_type == job.gres.gpu_type]
    if job.gres.kind == "mps":
        mine = [where[(n.name, gv.index)] for n in nodes for gv in n.gpus]  # in node and GPU order
        k = mps_gpu([state.free_share[g] for g in mine], job.gres.count) if job.gres.count > 0 else -1
        if k < 0:
            return ""
        g = mine[k]
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


def keep_free(job: Job, state: GpuState, slots: list[int], gpu_key: list[tuple[str, int]]) -> str:
    """Keep free, this epoch, GPUs for the queue's head that fits nowhere yet; returns the note saying which.

    A job asking whole GPUs where Slurm gives `gpu:P` its P lowest GPUs not held whole (22.05, and a version the
    planner cannot tell: `gpu_choice.whole_gpus`) gets only GPUs that rule picks, on the node where they are least
    used (`GpuState.whole_gpus_for`): Slurm would never give it another idle GPU, so keeping one would idle it for
    nothing. Otherwise the emptiest GPU, the last of a node among equals: Slurm fills a node's GPUs first fit by
    index (`planner.gpu_choice`), so the others' shares go below it rather than onto it. Only GPUs it could run
    on: on its partitions' nodes (`Seat.nodes`), of a type its `slots` name.
    """
    nodes = job.seat.nodes
    types: set[int] | None = {job.table.rows[s].gtype for s in slots}
    if -1 in types:  # a shape of no type runs on any
        types = None
    if job.seat.whole and not state.lowest_unused:
        count = min((job.table.rows[s].gpus or 1 for s in slots), default=1)
        keep = [g for g in state.whole_gpus_for(count, nodes, types) if state.free_share[g] > 0]
    else:
        mine = [g for g, n in enumerate(state.gpu_node)
                if (nodes is None or n in nodes) and (types is None or state.gpu_type[g] in types)]
        g = max(mine, key=lambda k: (state.free_share[k], k), default=None)
        keep = [g] if g is not None and state.free_share[g] > 0 else []
    if not keep:
        return ""
    for g in keep:
        state.block(g, state.free_share[g])
    names = ", ".join(f"{gpu_key[g][0]}:{gpu_key[g][1]}" for g in keep)
    gpus = "GPUs" if len(keep) > 1 else "GPU"
    return f"job {job.view.job_id} heads the queue and fits nowhere yet: {gpus} {names} kept free for it"
