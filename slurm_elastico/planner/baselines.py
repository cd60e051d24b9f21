"""Baseline policies a reader would ask for, runnable by the live helper and the simulator alike.

- `half_gpu` narrows a family for *static MPS sharing*: every job at its
  submitted knobs on half a GPU, first come first served, blind to
  interference (what a site configures by hand with `mps:50`).
- `whole_gpu_any_batch` narrows for the *Pollux-style* goodput baseline:
  whole GPUs only, any knobs the family offers — including other global
  batches when the family declares them with a learning-rate rule (their
  throughput is then goodput, in steps of the submitted batch per second).
- `LasPolicy` is *Tiresias-style* least attained service on a sharing
  cluster. The gateway has no plain preemption (requeue and stay pending),
  so LAS demotes instead: when a waiting job finds no room, the running job
  with the most attained GPU-seconds beyond `threshold_gpu_s` is reshaped
  from a whole GPU to half of one, and the waiting job takes the other half.
  Jobs start first come, first served, on a whole GPU when one is free, else
  on half of one. A demoted job gets its whole GPU back when its neighbour
  leaves and the restart pays.

All are pure: a `Snapshot` and families in, a `Plan` out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Action, ActionKind, Family, JobState, JobView, Placement, Plan, Shape, Snapshot
from slurm_elastico.planner import reshape
from slurm_elastico.planner.epoch import ADMIN_PREFIX, shape_of_running

HALF = 50


def _whole_gpu(fam: Family) -> Family:
    """`policies.whole_gpu` (imported late: policies imports this module)."""
    from slurm_elastico.planner.policies import whole_gpu

    return whole_gpu(fam)


def _same_knobs(fam: Family, d: Shape, share: int) -> Shape:
    """The family's shape with `d`'s knobs at `share`; if pruned away, `d` at that share with throughput in proportion."""
    for s in fam.shapes:
        if s.resources.mps == share and s.knobs == d.knobs:
            return s
    res = dataclasses.replace(d.resources, mps=share)
    return dataclasses.replace(d, resources=res, throughput=d.throughput * share / max(d.resources.mps, 1))


def half_gpu(fam: Family) -> Family:
    """The submitted knobs on half a GPU (a multi-GPU job as submitted); no floor (static sharing checks nothing)."""
    if fam.default_shape.resources.gpus:
        return _whole_gpu(fam)
    d = _same_knobs(fam, fam.default_shape, HALF)
    return dataclasses.replace(fam, shapes=(d,), default=d.name, throughput_floor=0.0)


def whole_gpu_any_batch(fam: Family) -> Family:
    """Every shape the family offers on whole GPUs (its largest share of one, or several), the default kept."""
    top = max(s.resources.mps for s in fam.shapes)
    keep = tuple(s for s in fam.shapes if s.resources.gpus or s.resources.mps == top)
    d = fam.default_shape
    default = d.name if d in keep else max(keep, key=lambda s: s.throughput).name
    return dataclasses.replace(fam, shapes=keep, default=default, throughput_floor=0.0)


def las_shapes(fam: Family) -> Family:
    """The submitted knobs on a whole GPU and on half of one (a multi-GPU job as submitted): all `LasPolicy`
    ever runs a job as."""
    if fam.default_shape.resources.gpus:
        return _whole_gpu(fam)
    top = max(s.resources.mps for s in fam.shapes)
    whole = _same_knobs(fam, fam.default_shape, top)
    half = _same_knobs(fam, fam.default_shape, HALF)
    return dataclasses.replace(fam, shapes=(whole, half) if half.name != whole.name else (whole,), default=whole.name,
                               throughput_floor=0.0)


@dataclass(frozen=True)
class LasPolicy:
    """Tiresias-style least attained service with demotion to half a GPU (see the module docstring).

    Has the fields other code reads from a `Policy` (`narrow`, `price`,
    `interference`, `reshape`) with what they mean here.
    """

    name: str
    description: str
    threshold_gpu_s: float = 3600.0
    """Attained GPU-seconds after which a running job may be demoted (Tiresias' first queue limit)."""
    narrow: Callable[[Family], Family] = las_shapes
    price: bool = False
    interference: bool = False
    reshape: bool = True

    def plan(self, snapshot: Snapshot, families: Mapping[int, Family], settings: Settings,
             model: SlowdownModel | None, now: float, progress: Mapping[int, float] | None = None) -> Plan:
        part = settings.slurm.partition
        per_gpu = settings.gpu.shares_per_gpu
        progress = progress or {}
        nodes = [n for n in snapshot.nodes if n.usable and (not part or part in n.partitions)]
        free: dict[tuple[str, int], int] = {(n.name, g.index): g.shares_free for n in nodes for g in n.gpus}
        order = [(n.name, g.index) for n in nodes for g in n.gpus]
        mine = {j.job_id: j for j in snapshot.jobs if j.job_id in families and (not part or j.partition == part)}
        cpus = {n.name: n.cpus - n.cpus_alloc for n in nodes}
        mem: dict[tuple[str, int], float] = {}
        for n in nodes:
            size = float(n.gpu_memory_mib or settings.gpu.memory_mib)
            for g in n.gpus:
                used = 0.0
                for u in g.users:
                    j = mine.get(u.job_id)
                    if j is not None and j.state is JobState.RUNNING and not u.whole:
                        fam = families[j.job_id]
                        used += fam.shapes[shape_of_running(j, _Table(fam), u.shares)].resources.gpu_mem_mib
                    else:
                        used += size * (1.0 if u.whole else u.shares / per_gpu)
                mem[(n.name, g.index)] = size - used

        def fits(k: tuple[str, int], shape: Shape) -> bool:
            r = shape.resources
            return free[k] >= r.mps and mem[k] >= r.gpu_mem_mib and cpus[k[0]] >= r.cpus
        running = [j for j in mine.values() if j.state is JobState.RUNNING and j.gpu_alloc]
        pending = sorted((j for j in mine.values() if j.state is JobState.PENDING and not j.held
                          and (j.gres is None or j.gres.kind == "mps")),
                         key=lambda j: (j.submit_time if j.submit_time is not None else float("inf"), j.job_id))

        def attained(j: JobView) -> float:
            share = j.gpu_alloc[0][2] or per_gpu
            return max(0.0, now - (j.start_time or now)) * share / per_gpu

        victims = sorted((j for j in running if j.gpu_alloc[0][2] == per_gpu and attained(j) >= self.threshold_gpu_s),
                         key=lambda j: (-attained(j), j.job_id))
        actions: list[Action] = []
        placements: list[Placement] = []
        notes: list[str] = []
        for job in pending:
            fam = families[job.job_id]
            whole, half = _same_knobs(fam, fam.default_shape, per_gpu), half_gpu(fam).shapes[0]
            spot = next((k for k in order if fits(k, whole)), None)
            shape = whole
            if spot is None:
                spot, shape = next((k for k in order if fits(k, half)), None), half
            while spot is None and victims:
                v = victims.pop(0)
                vf = families[v.job_id]
                vhalf = half_gpu(vf).shapes[0]
                node, gpu, _ = v.gpu_alloc[0]
                vnow = vf.shapes[shape_of_running(v, _Table(vf), per_gpu)]
                room = mem[(node, gpu)] + vnow.resources.gpu_mem_mib - vhalf.resources.gpu_mem_mib
                if room < half.resources.gpu_mem_mib or cpus[node] < half.resources.cpus:
                    continue  # even halved, this victim leaves no room for the job
                mem[(node, gpu)] = room
                why = (f"attained {attained(v):.0f} GPU-s > {self.threshold_gpu_s:g}: demoted to half a GPU for job "
                       f"{job.job_id}")
                actions.append(Action(ActionKind.SET_ADMIN_COMMENT, v.job_id, why, shape=vhalf.name,
                                      text=f"{ADMIN_PREFIX}{vhalf.name}"))
                actions.append(Action(ActionKind.RESHAPE_RUNNING, v.job_id, why, share=vhalf.resources.mps,
                                      nodes=(node,), shape=vhalf.name))
                placements.append(Placement(v.job_id, node, gpu, vhalf.name, vhalf.resources.mps, vhalf.throughput))
                free[(node, gpu)] = per_gpu - vhalf.resources.mps
                spot, shape = (node, gpu), half
            if spot is None or not fits(spot, shape):
                notes.append(f"job {job.job_id} waits: no GPU has room and no job has attained enough to yield")
                break  # first come, first served: nobody overtakes the head
            free[spot] -= shape.resources.mps
            mem[spot] -= shape.resources.gpu_mem_mib
            cpus[spot[0]] -= shape.resources.cpus
            why = f"least attained service: start as {shape.name} at {shape.resources.mps}% of GPU {spot[0]}:{spot[1]}"
            actions += _start(job, shape, spot[0], why)
            placements.append(Placement(job.job_id, spot[0], spot[1], shape.name, shape.resources.mps, shape.throughput))
        if not notes:  # nobody left waiting
            actions += self._promote(running, families, free, mem, now, progress, settings)
        return Plan(actions=tuple(actions), notes=tuple(notes),
                    placements=tuple(sorted(placements, key=lambda p: p.job_id)))

    def _promote(self, running, families, free, mem, now, progress, settings) -> list[Action]:
        """With nobody waiting, give a half-GPU job its whole GPU back when its neighbour has gone and it pays."""
        out: list[Action] = []
        per_gpu = settings.gpu.shares_per_gpu
        for j in sorted(running, key=lambda j: j.job_id):
            node, gpu, share = j.gpu_alloc[0]
            if not share or share >= per_gpu or free.get((node, gpu), 0) < per_gpu - share:
                continue
            fam = families[j.job_id]
            cur = fam.shapes[shape_of_running(j, _Table(fam), share)] if fam.shapes else None
            if cur is None:
                continue
            whole = _same_knobs(fam, cur, per_gpu)
            if mem.get((node, gpu), 0.0) + cur.resources.gpu_mem_mib < whole.resources.gpu_mem_mib:
                continue
            work = reshape.remaining_work(fam.total_work, progress.get(j.job_id), j.start_time, now, cur.throughput)
            if reshape.saving(work, cur.throughput, whole.throughput, settings.planner.reshape_cost_s,
                              settings.planner.hysteresis) <= 0:
                continue
            free[(node, gpu)] -= per_gpu - share
            mem[(node, gpu)] -= whole.resources.gpu_mem_mib - cur.resources.gpu_mem_mib
            why = f"alone on its GPU again: back to a whole GPU as {whole.name}"
            out.append(Action(ActionKind.SET_ADMIN_COMMENT, j.job_id, why, shape=whole.name,
                              text=f"{ADMIN_PREFIX}{whole.name}"))
            out.append(Action(ActionKind.RESHAPE_RUNNING, j.job_id, why, share=per_gpu, nodes=(node,), shape=whole.name))
        return out


@dataclass
class _Table:
    """The one field of the epoch's table that `shape_of_running` reads."""

    family: Family


def _start(job: JobView, shape: Shape, node: str, why: str) -> list[Action]:
    out = []
    comment = f"{ADMIN_PREFIX}{shape.name}"
    if job.admin_comment != comment:
        out.append(Action(ActionKind.SET_ADMIN_COMMENT, job.job_id, why, shape=shape.name, text=comment))
    if job.gres is None or job.gres.count != shape.resources.mps:
        out.append(Action(ActionKind.SET_SHARE, job.job_id, why, share=shape.resources.mps, shape=shape.name))
    out.append(Action(ActionKind.SET_NODES, job.job_id, why, nodes=(node,), shape=shape.name))
    if job.reason == "BeginTime":
        out.append(Action(ActionKind.START_NOW, job.job_id, why, shape=shape.name))
    return out
