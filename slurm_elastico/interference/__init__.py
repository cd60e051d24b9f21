"""Interference prediction (IAC): how much a job slows down when it shares a GPU.

`load_model` is what the helper calls: the trained predictor when a model
file is configured (the prior-corrected predictor of `transfer.model`, a JSON file
read without torch, or the MLP of `predictor`, which needs PyTorch), else the
untrained `ContentionModel` — so a controller without torch still schedules.
"""

from __future__ import annotations

import os

from slurm_elastico.interference.base import ContentionModel, SlowdownModel, SoloProfile, admissible

__all__ = ["ContentionModel", "SlowdownModel", "SoloProfile", "admissible", "load_model"]


def load_model(path: str | os.PathLike | None) -> SlowdownModel:
    """The trained predictor at `path` (by its content), or the `ContentionModel` when `path` is empty or None."""
    if path is None or str(path).strip() == "":
        return ContentionModel()
    from slurm_elastico.errors import ConfigError
    from slurm_elastico.inputs import check_file
    from slurm_elastico.interference.errors import ModelFileError

    if not os.path.exists(path):
        raise ModelFileError(f"{path}: no such model file")
    try:
        check_file(path, "model file")  # a FIFO would block the open below
    except ConfigError as exc:
        raise ModelFileError(f"{path}: {'; '.join(exc.problems)}") from None
    try:
        with open(path, "rb") as handle:
            head = handle.read(64).lstrip()
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such model file") from None
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot be read ({exc.strerror})") from None
    if head.startswith(b"{"):
        from slurm_elastico.interference.transfer.model import PriorCorrected

        return PriorCorrected.load(path)
    from slurm_elastico.interference.predictor import MlpPredictor  # imports torch

    return MlpPredictor.load(path)
