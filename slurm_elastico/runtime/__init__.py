"""In-job runtime API: the current shape, the checkpoint-request flag, atomic checkpoints.

The training loop helper (`slurm_elastico.runtime.train`) and the inference
runner (`slurm_elastico.runtime.infer`, its engines in `runtime.engines`) need
torch and are imported from their modules, so reading the shape stays cheap for programs that do not use them;
so does `slurm_elastico.runtime.dist` (a data-parallel rank's membership from
torch's env:// variables, its process group and device).
"""

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


def __getattr__(name: str) -> object:
    """Checkpoint functions import torch; load them on first use."""
    from slurm_elastico.runtime import checkpoint

    if name in ("save_checkpoint", "load_checkpoint", "load_latest", "Checkpoint", "CheckpointError", "CheckpointCorruptError"):
        return getattr(checkpoint, name)
    raise AttributeError(f"module 'slurm_elastico.runtime' has no attribute {name!r}")


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
