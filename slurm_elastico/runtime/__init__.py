"""In-job runtime API: the current shape, the checkpoint-request flag, atomic checkpoints.

The training loop helper (`slurm_elastico.runtime.train`) and the inference
runner (`slurm_elastico.runtime.infer`, its engines in `runtime.engines`) need
torch and are imported from their modules, so reading the shape stays cheap for programs that do not use them;
so does `slurm_elastico.runtime.dist` (a data-parallel rank's membership from
torch's env:// variables, its process group and device).
"""

import importlib

from slurm_elastico.runtime.progress import report_progress
from slurm_elastico.runtime.shape import (
    EXIT_CHECKPOINTED,
    InferShape,
    TrainShape,
    checkpoint_dir,
    current_infer_shape,
    current_shape,
    current_train_shape,
    runtime_shape,
    shape_env,
)
from slurm_elastico.runtime.signals import (
    checkpoint_requested,
    clear_checkpoint_request,
    install_signal_handlers,
    request_checkpoint,
    requested_by,
)


_LAZY = frozenset(
    ("save_checkpoint", "load_checkpoint", "load_latest", "Checkpoint", "CheckpointError", "CheckpointCorruptError")
)


def __getattr__(name: str) -> object:
    """Checkpoint functions import torch; load them on first use.

    The name is checked before anything is imported: `from package import sub`
    asks this hook for `sub` first, so importing the submodule that way here
    would recurse forever.
    """
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    checkpoint = importlib.import_module(__name__ + ".checkpoint")
    return getattr(checkpoint, name)


__all__ = [
    "EXIT_CHECKPOINTED",
    "InferShape",
    "TrainShape",
    "checkpoint_dir",
    "checkpoint_requested",
    "clear_checkpoint_request",
    "current_infer_shape",
    "current_shape",
    "current_train_shape",
    "install_signal_handlers",
    "report_progress",
    "request_checkpoint",
    "requested_by",
    "runtime_shape",
    "shape_env",
    "save_checkpoint",
    "load_checkpoint",
    "load_latest",
    "Checkpoint",
    "CheckpointError",
    "CheckpointCorruptError",
]
