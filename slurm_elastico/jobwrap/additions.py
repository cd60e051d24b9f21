"""What `elastico-submit` adds to sbatch's command line so the helper can reshape the job; the user's choices win."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_elastico.slurm.sbatch_options import Option

# What sbatch reads from the environment for the options elastico-submit may add (man sbatch, INPUT ENVIRONMENT).
ENV_FOR = {
    "requeue": ("SBATCH_REQUEUE", "SBATCH_NO_REQUEUE"),
    "open-mode": ("SBATCH_OPEN_MODE",),
    "signal": ("SBATCH_SIGNAL",),
    "gres": ("SBATCH_GRES", "SBATCH_GPUS", "SBATCH_GPUS_PER_NODE", "SBATCH_GPUS_PER_TASK", "SBATCH_GPUS_PER_SOCKET"),
    "job-name": ("SBATCH_JOB_NAME",),
}
# Long names that mean "the user chose" each thing elastico-submit would otherwise add.
CHOSEN_BY = {
    "requeue": ("requeue", "no-requeue"),
    "open-mode": ("open-mode",),
    "signal": ("signal",),
    "gres": ("gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket"),
    "begin": ("begin",),
    "job-name": ("job-name",),
    "nodes": ("nodes",),
}


def chosen(what: str, options: Iterable[Option], env: Mapping[str, str]) -> bool:
    """Did the user choose `what` (a key of CHOSEN_BY) on the command line, in `#SBATCH` lines or through SBATCH_*?"""
    names = CHOSEN_BY[what]
    return any(o.name in names for o in options) or any(env.get(v) for v in ENV_FOR.get(what, ()))


@dataclass(frozen=True)
class Additions:
    """What elastico-submit adds to the sbatch command line, and notes for the user about what it did not add."""

    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()


def added_options(options: Sequence[Option], env: Mapping[str, str], *, share: int, window_s: int, lead_s: int,
                  job_name: str, whole_gpus: tuple[int, int] | None = None) -> Additions:
    """The options reshapes need that the user has not chosen themselves: theirs always win.

    `whole_gpus` (nodes, GPUs per node): a family that lists GPU counts starts on whole GPUs
    (`--gres=gpu:P --nodes=K`, `shapes.nodes.start_request`), not on an MPS share, because Slurm 22.05 refuses
    to switch a job from `mps` to `gpu` later (`slurm.gpu_count`).
    """
    argv: list[str] = []
    notes: list[str] = []
    if not chosen("requeue", options, env):
        argv.append("--requeue")
    elif any(o.name == "no-requeue" for o in options) or env.get("SBATCH_NO_REQUEUE"):
        notes.append("--no-requeue: the helper cannot move this job to another share (it can still reshape it in place)")
    if not chosen("open-mode", options, env):
        argv.append("--open-mode=append")  # a requeued run must not truncate the output of the runs before it
    if not chosen("signal", options, env) and lead_s > 0:
        argv.append(f"--signal=B:USR1@{lead_s}")
    if not chosen("gres", options, env) and whole_gpus is not None:
        argv.append(f"--gres=gpu:{whole_gpus[1]}")
        if not chosen("nodes", options, env):
            argv.append(f"--nodes={whole_gpus[0]}")
    elif not chosen("gres", options, env):
        argv.append(f"--gres=mps:{share}")
    else:
        notes.append("GRES chosen by the user: the job starts with it, not with its family's default share")
    if not chosen("begin", options, env) and window_s > 0:
        argv.append(f"--begin=now+{window_s}")
    if not chosen("job-name", options, env) and job_name:
        argv.append(f"--job-name={job_name}")  # sbatch names a job after its script; ours comes on stdin
    return Additions(tuple(argv), tuple(notes))


def signal_lead(options: Sequence[Option], default: int) -> int:
    """Seconds before the time limit the batch step is signalled: from the user's `--signal=...@N`, else `default`."""
    for o in reversed(options):
        if o.name == "signal" and o.value:
            m = re.search(r"@(\d+)$", o.value)
            if m:
                return int(m.group(1))
    return default
