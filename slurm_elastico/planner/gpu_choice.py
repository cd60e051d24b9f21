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
  scheduling pass are placed in turn, each seeing what the earlier took.
- `gpu:P`: on 22.05 the P lowest-index GPUs not held whole, MPS use ignored
  (it starts a whole-GPU job on a GPU MPS jobs share: GPU 0 held whole, GPU 1
  at mps:20 -> GPUs 1 and 2); on 24.11 the P lowest with no user at all (GPUs
  2 and 3 there). The rule the planner uses is constrained to be right on
  both: a node qualifies only when its P lowest GPUs not held whole are idle,
  where both versions take exactly those.

Pure: lists of per-GPU state in, indices out; GPUs are given in Slurm's index
order on their node.
"""

from __future__ import annotations

from collections.abc import Sequence


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


def whole_gpus(idle: Sequence[bool], count: int, whole: Sequence[bool] = ()) -> tuple[int, ...]:
    """Indices of the `count` GPUs Slurm gives a `gpu:count` job on a node, or () when the planner must not
    ask this node for them.

    Slurm takes the `count` lowest-index GPUs not held whole (`whole[i]`); `idle[i]` says GPU i has no user
    at all. On 22.05 those GPUs may have MPS users, which the job would then share, so the node qualifies
    only when every GPU Slurm would take is idle.
    """
    if count < 1:
        raise ValueError(f"a whole-GPU request is at least 1 GPU, not {count}")
    taken = [i for i in range(len(idle)) if not (i < len(whole) and whole[i])][:count]
    if len(taken) < count or not all(idle[i] for i in taken):
        return ()
    return tuple(taken)
