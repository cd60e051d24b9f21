"""Undoing a co-location the probe judged a failure (`interference.probe.judge_pairings`): pure logic.

A reverted pair whose two jobs still share a GPU is undone by moving one of
them to a shape that does not share: the job that joined the GPU last (the
later start; the pairing was its trial), or else the other (a job must allow
requeueing and have a whole-GPU shape), is requeued at its fastest whole-GPU
shape on its node, with the AdminComment naming that shape first, exactly the
`set_admin_comment` + `reshape_running` pair the planner issues for a reshape
(journaled by the executor like any action). Slurm starts it again once a
whole GPU is free there; while the refusal lasts the planner does not pair the
two again. A job the epoch's plan already acts on is left to that plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from slurm_elastico.interference.probe import Verdict
from slurm_elastico.model import Action, ActionKind, Family, JobState, JobView, Shape
from slurm_elastico.shapes.current import ADMIN_PREFIX
from slurm_elastico.shapes.units import PERCENT, shares_of


def _whole_shapes(family: Family | None) -> list[Shape]:
    return [s for s in (family.shapes if family is not None else ()) if s.resources.mps == PERCENT]


def _gpus(job: JobView) -> set[tuple[str, int]]:
    return {(node, gpu) for node, gpu, _ in job.gpu_alloc}


def undo_actions(verdicts: Iterable[Verdict], jobs: Iterable[JobView], families: Mapping[int, Family],
                 acted: set[int], shares_per_gpu: int) -> tuple[list[Action], list[str]]:
    """(actions that separate each reverted pair still sharing a GPU, notes on every reverted pair).

    `jobs`: the snapshot's; `acted`: jobs the plan already has actions for.
    """
    by_id = {j.job_id: j for j in jobs}
    actions: list[Action] = []
    notes: list[str] = []
    for v in verdicts:
        if not v.revert:
            continue
        a, b = (by_id.get(j) for j in v.jobs)
        if a is None or b is None or a.state is not JobState.RUNNING or b.state is not JobState.RUNNING:
            notes.append(f"revert jobs {v.jobs[0]} and {v.jobs[1]}: no longer both running, nothing to undo ({v.reason})")
            continue
        shared = sorted(_gpus(a) & _gpus(b))
        if not shared:
            notes.append(f"revert jobs {a.job_id} and {b.job_id}: they no longer share a GPU ({v.reason})")
            continue
        if {a.job_id, b.job_id} & acted:
            notes.append(f"revert jobs {a.job_id} and {b.job_id}: an action for one of them is planned this epoch or still in progress ({v.reason})")
            continue
        movable = [(j, whole) for j in sorted((a, b), key=lambda j: (j.start_time or 0, j.job_id), reverse=True)
                   if j.requeue and (whole := _whole_shapes(families.get(j.job_id)))]
        if not movable:
            notes.append(f"revert jobs {a.job_id} and {b.job_id}: neither can be requeued to a whole-GPU shape; "
                         f"the pair stays, refused from now on ({v.reason})")
            continue
        mover, whole = movable[0]  # the later arrival where it can move
        shape = max(whole, key=lambda s: s.throughput)
        node = shared[0][0]
        why = f"undo a co-location that did not pay: {v.reason}; job {mover.job_id} moves to {shape.name} on {node}"
        actions += [Action(ActionKind.SET_ADMIN_COMMENT, mover.job_id, why, shape=shape.name,
                           text=f"{ADMIN_PREFIX}{shape.name}"),
                    Action(ActionKind.RESHAPE_RUNNING, mover.job_id, why, share=shares_of(PERCENT, shares_per_gpu),
                           nodes=(node,), shape=shape.name)]
        notes.append(f"revert jobs {a.job_id} and {b.job_id}: {v.reason}")
    return actions, notes
