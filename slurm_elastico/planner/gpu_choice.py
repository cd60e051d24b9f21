"""Which GPUs of a node Slurm gives a job: the rule the planner follows, since it can pin only the node.

The helper asks Slurm for a node (`scontrol update NodeList=`) and a count
(`Gres=mps:N`, `Gres=gpu:P`); Slurm itself picks the GPUs on that node, so
a plan that assumed another GPU would check interference against the wrong
co-runners. Modelled rather than constrained: Slurm offers no per-GPU request
for a GRES without a site-specific `Type` per device, while its pick is
simple and the same on every version measured.

Measured with select/cons_tres, `Flags=all_sharing` MPS and no GPU topology
(`tests/slurm/test_placement_live.py` checks every rule live on Slurm 22.05
and 24.11):

- `mps:N`: the lowest-index GPU not held whole with at least N MPS shares
  free — first fit, neither best fit nor spread (GPU 0 at 50 of 100 free and
  GPU 1 at 30: an `mps:30` goes to GPU 0). Jobs Slurm starts in one
  scheduling pass are placed in turn, each seeing what the earlier took, in
  Slurm's order (`start_key`); a job released while others wait may start
  at once, before the next is released, so the helper releases a plan's
  starts in that order too.
- `gpu:P`: on 22.05 the P lowest-index GPUs not held whole, MPS use ignored
  (it starts a whole-GPU job on a GPU MPS jobs share: GPU 0 held whole, GPU 1
  at mps:20 -> GPUs 1 and 2); on 24.11 the P lowest with no user at all (GPUs
  2 and 3 there). The planner follows the version it plans for
  (`lowest_unused`): on 24.11 the P lowest GPUs with no user; on any other
  version (22.05, and every release not measured, before or after 24.11) and
  on one it cannot read, a node qualifies only when its P lowest GPUs not
  held whole are idle, where both measured rules take exactly those: at worst
  it leaves a GPU idle, never plans a GPU Slurm would not give.

Pure: lists of per-GPU state in, indices out; GPUs are given in Slurm's index
order on their node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from slurm_elastico.model import JobView


def start_key(job: JobView) -> tuple[int, float, int]:
    """Slurm's order of pending jobs: highest priority, then earliest submitted, then lowest id."""
    return (-job.priority, job.submit_time if job.submit_time is not None else math.inf, job.job_id)


def mps_gpu(free: Sequence[int], share: int, whole: Sequence[bool] = ()) -> int:
    """Index of the GPU Slurm gives an `mps:share` job on a node whose GPUs have `free` MPS shares each, or -1.

    `whole[i]`: GPU i is held whole by a `gpu:N` job (Slurm never adds an MPS job there); missing = False.
    `free` is what Slurm sees: shares total minus the MPS shares its jobs hold (no planner reservation).
    """
    if share < 1:
        raise ValueError(f"an MPS request is at least 1 share, not {share}")
    for i, f in enumerate(free):
        if f >= share and not (i < len(whole) and whole[i]):
            return i
    return -1


LOWEST_UNUSED = frozenset({(24, 11)})
"""The Slurm releases measured to give `gpu:P` the P lowest GPUs with no user at all (22.05: the P lowest not held
whole). Every other release was not measured, so it gets the rule that is right on both."""


def lowest_unused(version: str) -> bool:
    """Whether Slurm `version` ("24.11.5") gives `gpu:P` its P lowest GPUs with no user (False: not known to)."""
    parts = version.split(".")
    try:
        return (int(parts[0]), int(parts[1])) in LOWEST_UNUSED
    except (IndexError, ValueError):
        return False


def whole_gpus(idle: Sequence[bool], count: int, whole: Sequence[bool] = (),
               unused: Sequence[bool] | None = None) -> tuple[int, ...]:
    """Indices of the `count` GPUs Slurm gives a `gpu:count` job on a node, or () when the planner must not
    ask this node for them.

    `idle[i]`: GPU i is free for the job as the planner plans it (no user at all). Without `unused` (22.05's
    rule, and the one right on every version), Slurm takes the `count` lowest-index GPUs not held whole
    (`whole[i]`); those may have MPS users, which the job would then share, so the node qualifies only when
    every GPU Slurm would take is idle. With `unused` (on 24.11, `lowest_unused`), Slurm takes the `count`
    lowest GPUs with no user as it sees them (`unused[i]`: besides the idle ones, GPUs the planner keeps for
    someone else without telling Slurm), and again each must be idle.
    """
    if count < 1:
        raise ValueError(f"a whole-GPU request is at least 1 GPU, not {count}")
    if unused is not None:
        taken = [i for i in range(len(idle)) if unused[i]][:count]
    else:
        taken = [i for i in range(len(idle)) if not (i < len(whole) and whole[i])][:count]
    if len(taken) < count or not all(idle[i] for i in taken):
        return ()
    return tuple(taken)
