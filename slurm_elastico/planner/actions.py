"""The epoch's result as a `Plan`: the actions for each job, with the reason, in the order Slurm places the jobs.

A pending job placed this epoch gets its AdminComment (the shape elastico-run
runs), its GPUs (`SET_SHARE` for a share, `SET_GPUS` for whole GPUs) and its
node, then `RESUME` if this policy preempted it or `START_NOW` if it sits out
the submit's placement window. A running job reshaped gets `SIGNAL` when it
keeps its resources (elastico-run relaunches in place, no requeue), else
`RESHAPE_RUNNING`; a preempted one `PREEMPT`, with the mark that makes it
ours to resume (`shapes.current.PREEMPTED_MARK`), lifted once it runs again.
"""

from __future__ import annotations

import numpy as np

from slurm_elastico.model import Action, ActionKind, Placement, Plan
from slurm_elastico.planner import gpu_choice
from slurm_elastico.planner.packing import GpuState
from slurm_elastico.planner.running import Changes, size
from slurm_elastico.planner.tables import Job
from slurm_elastico.shapes.current import ADMIN_PREFIX, PREEMPTED_MARK, preempted_by_us


def write_plan(pending: list[Job], running: list[Job], early: set[int], ch: Changes, state: GpuState,
               gpu_key: list[tuple[str, int]], cost_s: float, notes: list[str], prices: np.ndarray) -> Plan:
    """The plan of the epoch: `early` are the running jobs changed before the packing (their actions first),
    `ch` what became of the running jobs, `cost_s` the restart a reshape costs, `prices` the final prices."""
    actions: list[Action] = []
    placements: list[Placement] = []
    objective = 0.0
    # Actions in the order the plan placed the jobs, which is the order Slurm places them in: the running jobs
    # changed before the packing (shrinks, preemptions, the allotment's grows), then the starts in Slurm's order
    # (`seat_in_start_order`: a released job may start before the next is released, or Slurm may start them all
    # in one pass), then the running jobs reshaped around them. A relaunch returns once its job runs again; the
    # starts before it are only released, and Slurm starts them at its next pass, seconds before a requeued job
    # can run again.
    starts = sorted(pending, key=lambda j: gpu_choice.start_key(j.view))
    before = [j for j in running if j.view.job_id in early]
    for j in before + starts + [j for j in running if j.view.job_id not in early]:
        t, seat, jid = j.table, j.seat, j.view.job_id
        tmax = t.fastest
        if jid in ch.preempted:
            objective += j.weight
            held_row, held_gpus = ch.shrunk[jid]
            shape = t.family.shapes[held_row.slot]
            why = (f"preempted: jobs with fewer GPU-seconds left (weighted) need its "
                   f"{size(held_row, state, held_gpus[0]):g} GPU(s); it resumes when its turn comes")
            actions.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, why, shape=shape.name,
                                  text=f"{ADMIN_PREFIX}{shape.name},{PREEMPTED_MARK}"))
            actions.append(Action(ActionKind.PREEMPT, jid, why, shape=shape.name))
            continue
        if seat.gpu < 0:
            objective += j.weight
            if not t.by_speed:
                notes.append(f"job {jid} not started: every shape is below its throughput floor "
                             f"{t.family.throughput_floor:g}")
            elif j.held_back:
                notes.append(f"job {jid} waits: the allotment gives this epoch's GPUs to jobs with fewer GPU-seconds "
                             f"left (weighted), running ones included; it starts when its turn comes")
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
            if jid not in ch.reshaped:
                if preempted_by_us(j.view.admin_comment):  # resumed and running now: the mark has done its work
                    actions.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, "resumed: it runs again, so the mark of "
                                          "its preemption is lifted", shape=shape.name, text=comment))
                continue
            saved, left = ch.reshaped[jid]
            if saved >= 0:
                cost = ("with no restart (a new batch the job takes in process)" if jid in ch.no_restart
                        else f"after a {cost_s:g} s restart")
                why = f"reshape to {shape.name} ({rate:.3g} {unit}): saves {saved:.0f} s of {left:.0f} s remaining {cost}"
            else:
                why = (f"shrink to {shape.name} ({rate:.3g} {unit}): the queue prices its GPUs above their use "
                       f"({-saved:.0f} s slower over {left:.0f} s remaining)")
            actions.append(Action(ActionKind.SET_ADMIN_COMMENT, jid, why, shape=shape.name, text=comment))
            if seat.gang and jid in ch.in_place:
                # The GPUs it holds, new knobs: elastico-run relaunches in place on USR1, no requeue.
                actions.append(Action(ActionKind.SIGNAL, jid, why, signal="USR1", shape=shape.name))
            elif seat.gang:
                actions.append(Action(ActionKind.RESHAPE_RUNNING, jid, why, gpus=seat.row.gpus, nodes=on,
                                      shape=shape.name, gpu_type=shape.gpu_type))
            elif jid not in ch.moved and (seat.row.share == j.view.mps_share
                                       or (j.view.whole_gpus == 1 and _one_whole_gpu(j, state))):
                # Same resources, new knobs: elastico-run relaunches in place on USR1, no requeue.
                actions.append(Action(ActionKind.SIGNAL, jid, why, signal="USR1", shape=shape.name))
            elif _one_whole_gpu(j, state):
                # Asks whole GPUs (a gang shrunk to one GPU, or a gpu:1 job moved): it keeps asking whole GPUs,
                # since Slurm 22.05 refuses to move a job from gpu to mps ("Invalid generic resource").
                actions.append(Action(ActionKind.RESHAPE_RUNNING, jid, why, gpus=1, nodes=(node,), shape=shape.name,
                                      gpu_type=shape.gpu_type))
            else:
                actions.append(Action(ActionKind.RESHAPE_RUNNING, jid, why, share=seat.row.share, nodes=(node,),
                                      shape=shape.name, gpu_type=shape.gpu_type))
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
            actions.append(Action(ActionKind.SET_GPUS, jid, why, gpus=seat.row.gpus, nodes=on, shape=shape.name,
                                  gpu_type=shape.gpu_type))
        elif _one_whole_gpu(j, state):
            # Asks whole GPUs (elastico-submit starts a family with GPU counts on gpu:1) and gets all of one:
            # it keeps asking whole GPUs, since Slurm 22.05 refuses to move a job from gpu to mps.
            if j.view.whole_gpus != 1 or (shape.gpu_type and j.view.gres is not None
                                          and j.view.gres.gpu_type not in ("", shape.gpu_type)):
                actions.append(Action(ActionKind.SET_GPUS, jid, why, gpus=1, nodes=(node,), shape=shape.name,
                                      gpu_type=shape.gpu_type))
        elif j.view.gres is None or j.view.gres.kind != "mps" or j.view.gres.count != seat.row.share:
            actions.append(Action(ActionKind.SET_SHARE, jid, why, share=seat.row.share, shape=shape.name,
                                  gpu_type=shape.gpu_type))
        if j.view.held:  # one this policy preempted: pinned to its place, started, released
            actions.append(Action(ActionKind.RESUME, jid, why, nodes=on if seat.gang else (node,), shape=shape.name))
            continue
        if not seat.gang:
            actions.append(Action(ActionKind.SET_NODES, jid, why, nodes=(node,), shape=shape.name))
        if j.view.reason == "BeginTime":  # placed now: no need to sit out the submit's placement window
            actions.append(Action(ActionKind.START_NOW, jid, why, shape=shape.name))
    return Plan(actions=tuple(actions), objective=objective, notes=tuple(notes),
                placements=tuple(sorted(placements, key=lambda p: p.job_id)),
                prices=tuple(float(p) for p in prices))


def _one_whole_gpu(job: Job, state: GpuState) -> bool:
    """The job asks whole GPUs (`gpu:N`) and is placed on all of one GPU: Slurm must be asked `gpu:1`, never an MPS
    share (22.05 refuses to move a job from gpu to mps: "Invalid generic resource")."""
    return bool(job.view.whole_gpus) and job.seat.row.share >= state.total_share[job.seat.gpu]
