"""A new batch without a relaunch: when a goodput-mode job may change its batch in process, and the file that says so.

In goodput mode (`batch: {adaptive: true}`) the scheduler moves a job to the
batch its measured noise scale pays for. On the GPUs the job holds, a shape
that differs from the running one only in how many samples a step takes and
how they are split (global batch, micro-batch, accumulation) needs no new
process: the training loop takes the next step at the new batch, as AdaptDL's
jobs do. Everything else the step depends on stays (ranks, precision,
activation checkpointing, the learning-rate rule, the submitted batch, the
work), and the loop's state at a step boundary is what a checkpoint holds, so
the switch gives exactly the parameters of a checkpoint and relaunch at the new
shape at that step (`runtime.train`).

The hand-over (no signal reaches the program, so a program still starting is
never interrupted): on the helper's SIGUSR1, elastico-run reads the job's new
shape; when `in_process` allows it, it writes the new shape's ELASTICO_*
variables to `NEXT_SHAPE_FILE` in the checkpoint directory (atomically), else
it forwards the signal as before (checkpoint, exit 75, relaunch). The loop
looks for the file at every step boundary (rank 0; the ranks agree in the
step's one collective), takes it (`take`: read, then removed) and goes on at
the new shape. A file it cannot use is a checkpoint request: the program exits
75 and elastico-run relaunches it at the shape Slurm's AdminComment names.
The simulator and the planner charge such a switch no restart.

Pure, no torch: elastico-run, the planner and the simulator use the rule too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

from slurm_elastico.atomic import write_atomic
from slurm_elastico.errors import ConfigError
from slurm_elastico.model import Family
from slurm_elastico.model import Shape as PlannedShape
from slurm_elastico.runtime.shape import TrainShape, current_train_shape, runtime_shape

log = logging.getLogger(__name__)

NEXT_SHAPE_FILE = "next-shape.json"
"""In the job's checkpoint directory: the ELASTICO_* variables of the shape to switch to, in process."""

_SAME = ("ranks", "precision", "checkpointing", "lr_scaling", "base_batch", "steps")
_BATCH = ("global_batch", "micro_batch", "accumulation")


def adaptive(family: Family) -> bool:
    """Whether `family` trains in goodput mode (its default shape's runtime shape has a learning-rate rule)."""
    if family.kind != "train" or not family.shapes:
        return False
    try:
        shape = runtime_shape(family, family.default_shape)
    except (ConfigError, KeyError):
        return False
    return isinstance(shape, TrainShape) and shape.adaptive


def switches_in_process(old: TrainShape, new: TrainShape) -> bool:
    """Whether a goodput-mode job running `old` may go on at `new` without a relaunch: the same everything but
    the batch and its split, and a different batch or split."""
    return (old.adaptive and all(getattr(old, f) == getattr(new, f) for f in _SAME)
            and any(getattr(old, f) != getattr(new, f) for f in _BATCH))


def in_process(family: Family, old: PlannedShape, new: PlannedShape) -> bool:
    """`switches_in_process` for two planned shapes of `family` on the GPUs the job holds (the same share or
    GPU count, the same GPU type); False for a shape the runtime cannot run."""
    if family.kind != "train" or old is new or (old.resources.mps, old.resources.gpus, old.gpu_type) != (
            new.resources.mps, new.resources.gpus, new.gpu_type):
        return False
    try:
        a, b = runtime_shape(family, old), runtime_shape(family, new)
    except (ConfigError, KeyError):  # (KeyError: a family whose default shape a planner's narrowing dropped)
        return False
    return isinstance(a, TrainShape) and isinstance(b, TrainShape) and switches_in_process(a, b)


def restart_s(family: Family, old: PlannedShape, new: PlannedShape, cost_s: float) -> float:
    """What moving a running job of `family` from `old` to `new` on the GPUs it holds costs it: nothing for a new
    batch it takes in process (`in_process`), else `cost_s`, the restart. The planners charge this."""
    return 0.0 if in_process(family, old, new) else cost_s


def offer(ckpt_dir: str | os.PathLike[str], shape: TrainShape) -> Path:
    """Write `shape` for the running loop to take (elastico-run); returns the file."""
    path = Path(ckpt_dir) / NEXT_SHAPE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: f.write(json.dumps(shape.to_env(), sort_keys=True).encode()))
    return path


def discard(ckpt_dir: str | os.PathLike[str]) -> None:
    """Remove an offer nobody took (elastico-run, before each launch: the launch's own shape is the newer)."""
    (Path(ckpt_dir) / NEXT_SHAPE_FILE).unlink(missing_ok=True)


def waiting(ckpt_dir: str | os.PathLike[str]) -> bool:
    return (Path(ckpt_dir) / NEXT_SHAPE_FILE).exists()


def take(ckpt_dir: str | os.PathLike[str], current: TrainShape) -> TrainShape:
    """The offered shape, the file removed; a ConfigError naming what is wrong when it is unreadable or not a
    switch `switches_in_process` allows from `current`. The offer is claimed first (renamed aside, then read): a
    later offer elastico-run writes meanwhile stays for the next step boundary, where reading then removing the
    file removed it unread."""
    path = Path(ckpt_dir) / NEXT_SHAPE_FILE
    claimed = path.with_name(f"{NEXT_SHAPE_FILE}.taken-{os.getpid()}")
    os.replace(path, claimed)
    try:
        text = claimed.read_text()
    finally:
        claimed.unlink(missing_ok=True)
    try:
        offered = json.loads(text)
    except ValueError as exc:
        raise ConfigError(str(path), [f"not JSON ({exc})"]) from None
    if not isinstance(offered, dict):
        raise ConfigError(str(path), ["not a JSON object of ELASTICO_* variables"])
    new = current_train_shape({**current.to_env(), **{str(k): str(v) for k, v in offered.items()}})
    if not switches_in_process(current, new):
        raise ConfigError(str(path), [f"shape {new.name or new} cannot follow {current.name or current} in process; "
                                      f"allowed: another {', '.join(_BATCH)} with the same {', '.join(_SAME)}"])
    return new


def agree(stop: bool, shape: TrainShape, ckpt_dir: str | os.PathLike[str], group) -> tuple[bool, TrainShape | None]:
    """At a step boundary of the training loop in goodput mode: (stop, the shape to go on at, or None to keep
    `shape`), the same on every rank (`group`: `runtime.dist.Group`). Rank 0 takes a new batch offered in process
    (`take`); one it cannot use is a stop (checkpoint, exit 75: elastico-run relaunches the job at the shape
    Slurm names). One collective."""
    new = None
    if group.member.is_main and not stop and waiting(ckpt_dir):
        try:
            new = take(ckpt_dir, shape)
        except ConfigError as exc:
            log.warning("%s; checkpointing instead, to be relaunched at the shape Slurm names", exc)
            stop = True
    split = (new.global_batch, new.micro_batch, new.accumulation) if new is not None else (0, 0, 0)
    agreed = group.max_ints([int(stop), *split])  # rank 0 alone offers a split; the others send zeros
    if agreed[0]:
        return True, None
    if not agreed[1]:
        return False, None
    return False, new or dataclasses.replace(shape, global_batch=agreed[1], micro_batch=agreed[2],
                                             accumulation=agreed[3])
