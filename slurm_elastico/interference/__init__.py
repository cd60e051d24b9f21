"""Interference prediction (IAC): how much a job slows down when it shares a GPU.

`load_model` is what the helper calls: the trained predictor (PyTorch) when a
model file is configured, else the torch-free `ContentionModel` — so a
controller without torch still schedules.
"""

from __future__ import annotations

import os

from slurm_elastico.interference.base import ContentionModel, SlowdownModel, SoloProfile, admissible

__all__ = ["ContentionModel", "SlowdownModel", "SoloProfile", "admissible", "load_model"]


def load_model(path: str | os.PathLike | None) -> SlowdownModel:
    """The trained predictor at `path`, or the `ContentionModel` when `path` is empty or None."""
    if path is None or str(path).strip() == "":
        return ContentionModel()
    from slurm_elastico.interference.predictor import MlpPredictor  # imports torch

    return MlpPredictor.load(path)
