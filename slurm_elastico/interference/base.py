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

    @classmethod
    def of(cls, fields: dict) -> SoloProfile:
        """`SoloProfile(**fields)` without the generated `__init__`, which sets a frozen dataclass's fields one
        Python call each: the planner builds one per shape of every family each epoch, and that was a tenth of
        a typed epoch's table building. Fields left out keep their defaults (the class's own values); the names
        are not checked (the caller's are literals: `tests/unit/test_counters.py` holds them to the
        constructor's)."""
        profile = object.__new__(cls)
        profile.__dict__.update(fields)
        return profile


class SlowdownModel(Protocol):
    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        """Slowdown S >= 1 of a[k] when it shares one GPU with b[k], for every k, in one batched call."""
        ...


class ContentionModel:
    """A documented, untrained stand-in for the predictor: contention for what MPS does not partition.

    MPS caps each client's SMs at its share, so SM contention only appears if
    shares over-commit the GPU (`sm_a + sm_b > 1`, each capped at its share).
    Memory bandwidth and caches are not partitioned: when the pair's bandwidth
    demands add up past the GPU's, each job loses in proportion to how
    memory-bound it is (`m = bw / max(bw, sm)`), and a partner's activity costs
    a little through shared caches and scheduling (`kappa·sm_b`):

        S_a = max(1, sm_a + sm_b) · (1 + m_a·max(0, bw_a + bw_b − 1)) · (1 + kappa·sm_b)

    Unmeasured counters default to `default_sm` / `default_bw` (utilisation of
    the GPU at the job's own shape, in [0, 1]). Two light jobs barely slow each
    other; two bandwidth-bound jobs at 0.8 each run at about 0.6 of solo speed.
    """

    admission_margin = 0.0  # untrained: no calibrated safety margin (see `admissible`)

    def __init__(self, default_sm: float = 0.7, default_bw: float = 0.5, kappa: float = 0.05):
        self.default_sm, self.default_bw, self.kappa = default_sm, default_bw, kappa

    def _demand(self, profiles: Sequence[SoloProfile]) -> tuple[np.ndarray, np.ndarray]:
        share, sm, bw = np.array([(p.mps_share, p.sm_util, p.membw_util) for p in profiles],
                                 dtype=float).reshape(-1, 3).T  # (one pass over the profiles: the planner's hot path)
        share = np.clip(share, 1, 100) / 100.0
        sm = np.minimum(np.where(np.isnan(sm), self.default_sm, sm), share)
        bw = np.clip(np.where(np.isnan(bw), self.default_bw, bw), 0.0, 1.0)
        return sm, bw

    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        if len(a) != len(b):
            raise ValueError(f"predict needs as many partners as jobs: {len(a)} != {len(b)}")
        return self._slowdown(*self._demand(a), *self._demand(b))

    def predict_indexed(self, a: Sequence[SoloProfile], ia: np.ndarray, b: Sequence[SoloProfile],
                        ib: np.ndarray) -> np.ndarray:
        """`predict` of a[ia[k]] next to b[ib[k]], for every k: each profile's demand computed once, not once a
        pair (the trained predictor's prior, for a few hundred profiles against the planner's stand-ins)."""
        sm_a, bw_a = self._demand(a)
        sm_b, bw_b = self._demand(b)
        return self._slowdown(sm_a[ia], bw_a[ia], sm_b[ib], bw_b[ib])

    def predict_matrix(self, profiles: Sequence[SoloProfile]) -> np.ndarray:
        """All pairs at once: entry [i, j] is the slowdown of profiles[i] next to profiles[j] (`predict_blocks`,
        spread to every pair of profiles)."""
        block, rows = self.predict_blocks(profiles)
        return block.take(rows, 0).take(rows, 1)

    def predict_blocks(self, profiles: Sequence[SoloProfile]) -> tuple[np.ndarray, list[int]]:
        """All pairs at once, as (block, rows): the slowdown of profiles[i] next to profiles[j] is
        block[rows[i], rows[j]]. A slowdown depends on the two (SM, bandwidth) demands alone, and a cluster's
        profiles have a few distinct ones (the kinds at each share): computed once per pair of those."""
        sm, bw = self._demand(profiles)
        at: dict[tuple[float, float], int] = {}  # each distinct demand's row, in the order met (a dict: `np.unique`
        rows = [at.setdefault(d, len(at)) for d in zip(sm.tolist(), bw.tolist())]  # by rows sorts, 10x slower)
        demand = np.array(list(at), dtype=float).reshape(-1, 2)
        sm, bw = demand[:, 0], demand[:, 1]
        return self._slowdown(sm[:, None], bw[:, None], sm[None, :], bw[None, :]), rows

    def _slowdown(self, sm_a, bw_a, sm_b, bw_b) -> np.ndarray:
        memory_bound = bw_a / np.maximum(np.maximum(bw_a, sm_a), 1e-9)
        sm_term = np.maximum(1.0, sm_a + sm_b)
        bw_term = 1.0 + memory_bound * np.maximum(0.0, bw_a + bw_b - 1.0)
        return sm_term * bw_term * (1.0 + self.kappa * sm_b)


def distinct(a: Sequence[SoloProfile], b: Sequence[SoloProfile],
             what: str = "predict") -> tuple[list[SoloProfile], np.ndarray, np.ndarray]:
    """(each distinct profile object once, row of a[k], row of b[k]): 10,000 pairs of 100 jobs encode 100 jobs."""
    if len(a) != len(b):
        raise ValueError(f"{what} needs as many partners as jobs: {len(a)} != {len(b)}")
    n = len(a)
    ids = np.concatenate([np.fromiter(map(id, a), dtype=np.int64, count=n),
                          np.fromiter(map(id, b), dtype=np.int64, count=n)])
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    return [a[i] if i < n else b[i - n] for i in first.tolist()], inverse[:n], inverse[n:]


MIN_GAIN = 0.1
"""The least gain a shared GPU must show, predicted (the planner's gain rule: combined speed >= 1 + margin, the
margin never below this) or observed (probe and revert, `interference.probe`): a pairing that gains less is not
worth its risk and its restarts. A policy choice, set above what a pair that gains nothing measures: two jobs
time-slicing one CPU core through real Slurm measured 0.96 to 1.06 of one GPU's worth of solo speed, around 1
but not at it, because each speed is taken while other work (the helper, other jobs) shares the machine
(an earlier tests/slurm/test_probe_revert_live.py, eight runs on Slurm 22.05 and 24.11; its jobs now take turns
on a fake GPU's clock, which measured 1.01). On a GPU the noise differs; this
is not a measured bound for it."""


def admissible(model: SlowdownModel, a: Sequence[SoloProfile], b: Sequence[SoloProfile], floor: float) -> np.ndarray:
    """Whether each pair (a[k], b[k]) may share a GPU: both keep >= floor of solo speed by the model.

    A trained predictor carries `admission_margin`, calibrated on its training
    folds so that few truly bad pairs pass: the bar is then floor * (1 + margin).
    One with `admission_margins(a, b)` gives a margin per pair (the prior-corrected
    predictor's follow each pair's prediction and its kind of shift,
    `interference.admission`; for a GPU type it never saw, pass
    `model.on_gpu(gpu_type)`). Models with neither use the plain floor.
    """
    if hasattr(model, "admission_margins"):
        margin = np.asarray(model.admission_margins(a, b), dtype=float)
    else:
        margin = float(getattr(model, "admission_margin", 0.0))
    bar = floor * (1.0 + margin)
    return (1.0 / model.predict(a, b) >= bar) & (1.0 / model.predict(b, a) >= bar)
