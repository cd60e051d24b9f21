"""What the planner asks of an interference model, and the simple model used without a trained one.

The planner charges `Γ_j(c)` from the predicted slowdown and refuses pairs whose
co-located speed would fall below the floor. It only sees `SlowdownModel`; the
trained predictor and the contention model both implement it, so the planner
never branches on which one it has.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class SoloProfile:
    """A job's behaviour running alone on one GPU at one shape; any measured field may be missing (NaN).

    `sm_util` and `membw_util` are NVML utilisation in [0, 1]; `mps_share` is
    the percent of the GPU the job was given.
    """

    kind: str  # "train" or "infer"
    throughput: float = math.nan
    batch: float = math.nan
    precision: str = "fp32"
    model_family: str = ""
    sm_util: float = math.nan
    membw_util: float = math.nan
    mem_used_mib: float = math.nan
    power_w: float = math.nan
    mps_share: int = 100


class SlowdownModel(Protocol):
    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        """Slowdown S >= 1 of a[k] when it shares one GPU with b[k], for every k, in one batched call."""
        ...


class ContentionModel:
    """A documented, untrained stand-in: jobs slow down by how far their combined demand exceeds the GPU.

    Demand of a job is its SM utilisation (default 0.7 when unmeasured) scaled
    by its MPS share; memory-bandwidth contention is treated the same way.
    `S = max(1, (d_a + d_b) / 1)` on the more contended of the two, so two light
    jobs do not slow each other and two saturating jobs each run about half speed.
    """

    admission_margin = 0.0  # untrained: no calibrated safety margin (see `admissible`)

    def __init__(self, default_util: float = 0.7):
        self.default_util = default_util

    def _demand(self, p: SoloProfile) -> tuple[float, float]:
        share = min(max(p.mps_share, 1), 100) / 100.0
        sm = p.sm_util if not math.isnan(p.sm_util) else self.default_util
        bw = p.membw_util if not math.isnan(p.membw_util) else self.default_util * 0.7
        return min(sm, share), min(bw, share)

    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        if len(a) != len(b):
            raise ValueError(f"predict needs as many partners as jobs: {len(a)} != {len(b)}")
        da = np.array([self._demand(p) for p in a], dtype=float).reshape(-1, 2)
        db = np.array([self._demand(p) for p in b], dtype=float).reshape(-1, 2)
        total = da + db
        pressure = np.max(total, axis=1)
        return np.maximum(1.0, pressure)


def admissible(model: SlowdownModel, a: Sequence[SoloProfile], b: Sequence[SoloProfile], floor: float) -> np.ndarray:
    """Whether each pair (a[k], b[k]) may share a GPU: both keep >= floor of solo speed by the model.

    A trained predictor carries `admission_margin`, calibrated on its training
    folds so that at most ~5 % of truly bad pairs pass: the bar is then
    floor * (1 + margin). Models without the attribute use the plain floor.
    """
    bar = floor * (1.0 + float(getattr(model, "admission_margin", 0.0)))
    return (1.0 / model.predict(a, b) >= bar) & (1.0 / model.predict(b, a) >= bar)
