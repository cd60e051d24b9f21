"""The pieces the heterogeneity-aware baselines (`planner.sia`, `planner.gavel`) share: a cluster seen per GPU type.

- `types_of`: the partition's usable GPU nodes grouped by `NodeView.gpu_type`
  ("" on a cluster whose gres names no type: one type, named ""), with each
  type's node size, and a `Room` of what the baselines may hand out (GPUs
  nobody else holds, the nodes' free CPUs and memory).
- `speed_table`: a family's best throughput per (type, GPU count): a shape
  with `gpu_type` "" runs on every type at its throughput (a one-type family),
  a typed one only on its type. `own_batch` keeps the shapes at the job's own
  global batch (no learning-rate rule): what a policy that does not adapt
  batch sizes may run.
- `running_on`: the type and GPUs a running job holds (from `gpu_alloc`).
- `place_on`: a gang of n GPUs on one type's nodes, as Slurm can be asked for it
  (`planner.gangs`: one node when one holds it, best fit; else the same count
  on the fewest nodes, most room first; any count per node where the
  snapshot says so, `Snapshot.even_gangs`, for calibration only).
- `start_actions`, `keep_actions`, `preempt_actions`: the actions a plan
  issues for a job it starts or moves (to a type: `Action.gpu_type`), keeps
  with a new shape, or preempts; `state_of`/`with_state`: a policy's own
  AdminComment parts (`<prefix>key=value`), beside `elastico:shape=`.

Traps: a node's GPUs are of one type (a node Slurm lets mix types counts by
its first, `NodeView.gpu_type`); a job never spans types here (Sia's rule,
and Slurm's `--gres=gpu:TYPE:N` names one type). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from slurm_elastico.model import Action, ActionKind, Family, JobView, Shape, Snapshot
from slurm_elastico.planner.gangs import split
from slurm_elastico.planner.pollux import Room
from slurm_elastico.shapes.current import ADMIN_PREFIX
from slurm_elastico.shapes.units import shares_of


@dataclass(frozen=True)
class TypeView:
    """One GPU type of the cluster: its nodes (in snapshot order), GPUs per node and GPUs in all."""

    name: str
    nodes: tuple[str, ...]
    node_gpus: int
    gpus: int


def types_of(snapshot: Snapshot, part: str, ours: set[int]) -> tuple[dict[str, TypeView], Room]:
    """The partition's usable GPU nodes per type (types in the order their first node appears), and the room the
    baselines may use: every GPU whose users are all jobs of `ours`, each node's free CPUs and memory."""
    nodes = [n for n in snapshot.nodes if n.usable and n.gpus and (not part or part in n.partitions)]
    grouped: dict[str, list] = {}
    for n in nodes:
        grouped.setdefault(n.gpu_type, []).append(n)
    types = {t: TypeView(t, tuple(n.name for n in ns), max(len(n.gpus) for n in ns), sum(len(n.gpus) for n in ns))
             for t, ns in grouped.items()}
    room = Room({n.name: [g.index for g in n.gpus if all(u.job_id in ours for u in g.users)] for n in nodes},
                {n.name: n.cpus - n.cpus_alloc for n in nodes},
                {n.name: (n.memory_mib - n.memory_alloc_mib) if n.memory_mib > 0 else math.inf for n in nodes},
                {n.name: i for i, n in enumerate(nodes)})
    return types, room


def gpus_of(shape: Shape) -> int:
    """Whole GPUs a whole-GPU shape holds: its gang size, or 1 for a full share of one GPU."""
    return max(1, shape.resources.gpus)


def own_batch(fam: Family, shape: Shape) -> bool:
    """Whether `shape` runs the job's own global batch (the default's; shapes without a global_batch knob do)."""
    own = fam.default_shape.knob("global_batch")
    return shape.knob("lr_scaling") is None and shape.knob("global_batch", own) == own


@lru_cache(maxsize=8192)
def speed_table(fam: Family, types: tuple[str, ...], own: bool = False) -> dict[tuple[str, int], Shape]:
    """{(type, GPU count): the family's fastest whole-GPU shape there} over `types` (only the job's own batch with
    `own`). Shapes on part of a GPU are left out (the family's largest share counts as one whole GPU)."""
    top = max(s.resources.mps for s in fam.shapes)
    best: dict[tuple[str, int], Shape] = {}
    for s in fam.shapes:
        if not s.resources.gpus and s.resources.mps != top:
            continue
        if own and not own_batch(fam, s):
            continue
        n = gpus_of(s)
        for t in ((s.gpu_type,) if s.gpu_type else types):
            if t in types and ((t, n) not in best or s.throughput > best[(t, n)].throughput):
                best[(t, n)] = s
    return best


def running_on(view: JobView, snapshot: Snapshot) -> tuple[str | None, dict[str, list[int]]]:
    """(type, GPU indices per node) a running job holds; (None, {}) when it holds none."""
    where: dict[str, list[int]] = {}
    for node, gpu, _ in view.gpu_alloc:
        if gpu not in where.setdefault(node, []):
            where[node].append(gpu)
    if not where:
        return None, {}
    try:
        return snapshot.node(next(iter(where))).gpu_type, where
    except KeyError:
        return None, where


def place_on(n: int, room: Room, names: Iterable[str], cpus: int, mem: int, even: bool = True) -> dict[str, int] | None:
    """GPUs per node for a job of n GPUs (with `cpus` and `mem` in all) on the nodes `names` (one type), or None:
    one node when one holds it (best fit: fewest free GPUs), else `planner.gangs.split` over the nodes with the most
    room first."""
    names = [k for k in names if k in room.order]
    one = [k for k in names if room.room(k, n, n, cpus, mem) >= n]
    if one:
        return {min(one, key=lambda k: (len(room.gpus[k]), room.order[k])): n}
    return split(n, names, lambda k, p: room.room(k, p, n, cpus, mem),
                 lambda k: (-len(room.gpus.get(k, ())), room.order[k]), even)


def state_of(admin_comment: str, prefix: str) -> dict[str, str]:
    """A policy's parts of an AdminComment: `<prefix>key=value` → {key: value}."""
    out: dict[str, str] = {}
    for part in (admin_comment or "").split(","):
        part = part.strip()
        if part.startswith(prefix) and "=" in part:
            k, v = part[len(prefix):].split("=", 1)
            out[k.strip()] = v.strip()
    return out


def with_state(old: str, shape: str, prefix: str, state: Mapping[str, object]) -> str:
    """`old` with its shape and the policy's parts replaced (anything else an admin wrote kept after them)."""
    keep = [p.strip() for p in (old or "").split(",")
            if p.strip() and not p.strip().startswith(ADMIN_PREFIX) and not p.strip().startswith(prefix)]
    parts = [f"{ADMIN_PREFIX}{shape}"] + [f"{prefix}{k}={v}" for k, v in state.items() if v not in (None, "")]
    return ",".join(parts + keep)


def start_actions(view: JobView, running: bool, shape: Shape, n: int, gpu_type: str, on: tuple[str, ...],
                  comment: str, why: str, shares_per_gpu: int) -> list[Action]:
    """Start a pending job, or move a running one, on n GPUs of type `gpu_type` on the nodes `on` at `shape`."""
    jid = view.job_id
    out: list[Action] = []
    if comment != view.admin_comment:
        out.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, why, shape=shape.name, text=comment))
    gang = shape.resources.gpus > 0
    share = None if gang else shares_of(shape.resources.mps, shares_per_gpu)
    if running:
        out.append(Action(ActionKind.RESHAPE_RUNNING, jid, why, gpus=n if gang else None, share=share, nodes=on,
                          shape=shape.name, gpu_type=gpu_type))
        return out
    if gang:
        out.append(Action(ActionKind.SET_GPUS, jid, why, gpus=n, nodes=on, shape=shape.name, gpu_type=gpu_type))
    else:
        g = view.gres
        if g is None or g.kind != "mps" or g.count != share or g.gpu_type != gpu_type:
            out.append(Action(ActionKind.SET_SHARE, jid, why, share=share, shape=shape.name, gpu_type=gpu_type))
        out.append(Action(ActionKind.SET_NODES, jid, why, nodes=on, shape=shape.name))
    if view.held:
        out.append(Action(ActionKind.RESUME, jid, why, nodes=on, shape=shape.name))
    elif view.reason == "BeginTime":
        out.append(Action(ActionKind.START_NOW, jid, why, shape=shape.name))
    return out


def keep_actions(view: JobView, shape: Shape, changed: bool, comment: str, why: str) -> list[Action]:
    """A running job keeps its GPUs; a `changed` shape there is a restart in place (its comment names it, then
    USR1)."""
    out: list[Action] = []
    if comment != view.admin_comment:
        out.append(Action(ActionKind.SET_ADMIN_COMMENT, view.job_id, why, shape=shape.name, text=comment))
    if changed:
        out.append(Action(ActionKind.SIGNAL, view.job_id, why, signal="USR1", shape=shape.name))
    return out


def preempt_actions(view: JobView, shape_name: str, comment: str, why: str) -> list[Action]:
    """Requeue-hold a running job with its progress (its comment marks it as this policy's to resume)."""
    return [Action(ActionKind.SET_ADMIN_COMMENT, view.job_id, why, shape=shape_name, text=comment),
            Action(ActionKind.PREEMPT, view.job_id, why, shape=shape_name)]

