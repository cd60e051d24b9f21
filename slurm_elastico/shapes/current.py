"""Which shape a job runs as: one rule for the planner and for elastico-run.

The planner writes the chosen shape into the job's AdminComment
(`elastico:shape=<name>`; on a cluster of several GPU types `<name>@<type>`,
`shapes.typed`, which a job that knows only the untyped shapes reads as `<name>`). A named shape counts only if it matches the MPS
share the job holds: a comment can be stale (a plan whose share change
failed), and running a shape's knobs at another share would break its memory
and speed assumptions. Without a usable name the job runs its family's default
when the default fits the held share, else the fastest shape at that share.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_elastico.model import MPS_SHARES_PER_GPU, Shape
from slurm_elastico.shapes.units import shares_of

ADMIN_PREFIX = "elastico:shape="
"""AdminComment the planner writes so the job wrapper knows its shape: `elastico:shape=<name>`."""


PREEMPTED_MARK = "elastico:held=1"
"""AdminComment part of a job the planner preempted (requeue-held) and will resume; a job held by anyone
else is left alone."""


def preempted_by_us(admin_comment: str) -> bool:
    return PREEMPTED_MARK in (part.strip() for part in (admin_comment or "").split(","))


def named_in_comment(admin_comment: str) -> str | None:
    """The shape name in an AdminComment `...,elastico:shape=<name>,...`, or None."""
    for part in (admin_comment or "").split(","):
        part = part.strip()
        if part.startswith(ADMIN_PREFIX):
            name = part[len(ADMIN_PREFIX):].strip()
            if name:
                return name
    return None


def ranks_of(shape: Shape) -> int:
    """GPUs a shape runs on: n for n whole GPUs, 1 for a share of one GPU."""
    return shape.resources.gpus or 1


def running_shape(shapes: Sequence[Shape], default: Shape | None, admin_comment: str,
                  held_share: int | None, shares_per_gpu: int = MPS_SHARES_PER_GPU,
                  held_gpus: int | None = None) -> tuple[Shape, str]:
    """The shape a job holding `held_share` (None: unknown) runs as, and where that answer came from.

    `held_share` is in Slurm's MPS shares (`shares_per_gpu` of them per GPU); shapes are in percent
    (`shapes.units.shares_of` converts). `held_gpus` is the whole GPUs the job holds on all its nodes
    (None: unknown or a share): a shape must then run on that many (`ranks_of`); a 1-GPU shape runs
    on one whole GPU too."""
    if not shapes:
        raise ValueError("a family has at least one shape")

    def fits(s: Shape) -> bool:
        if held_gpus:
            return ranks_of(s) == held_gpus
        return not held_share or (s.resources.mps > 0 and shares_of(s.resources.mps, shares_per_gpu) == held_share)

    note = ""
    name = named_in_comment(admin_comment)
    if name is not None:
        named = next((s for s in shapes if s.name == name), None)
        if named is None and "@" in name:  # a typed name (`<shape>@<type>`) read by one-type candidates
            named = next((s for s in shapes if s.name == name.partition("@")[0] and not s.gpu_type), None)
        if named is not None and fits(named):
            return named, "AdminComment"
        note = (f" (AdminComment names unknown shape {name!r})" if named is None
                else f" (AdminComment names {name!r}, which runs on {ranks_of(named)} GPU(s), not the {held_gpus} "
                     f"the job holds)" if held_gpus
                else f" (AdminComment names {name!r}, which needs share {named.resources.mps} % of a GPU, "
                        f"not {held_share} of {shares_per_gpu} shares)")
    if default is not None and fits(default):
        return default, "default" + note
    same = [s for s in shapes if fits(s)]
    if same:
        held = f"{held_gpus} GPU(s)" if held_gpus else f"share {held_share}"
        return max(same, key=lambda s: s.throughput), f"fastest at {held}" + note
    return (default or shapes[0]), "default" + note
