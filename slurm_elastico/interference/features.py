"""Pair features for the slowdown predictor: per-job encoding, then symmetric pair combinations.

A job is encoded as standardized numeric features (missing → 0, the training
mean, plus a mask bit saying it was missing) and one-hots for kind, precision
and model family (unknown → all zeros). A pair (self, partner) is
[self, partner, same family, same job]: the last two are symmetric, so
predict(a, b) and predict(b, a) see the same pair context and differ only in
whose slowdown is asked. There are deliberately no per-pair products or sums:
sums are redundant for an MLP, and without products the first layer splits
into a per-job part computed once per distinct job (see
`predictor._first_layer`), which keeps 10,000 pairs within milliseconds; the
hidden layers learn the interactions. Numeric features never
seen in training (e.g. NVML counters in Gavel data) are left out of the
schema rather than fed as constant masks the net could not have learned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.errors import ModelFileError

FEATURE_VERSION = 2  # 2: pair = [self, partner, same family, same job]
NUMERIC = ("log_throughput", "log_batch", "log_samples_per_s", "sm_util", "membw_util",
           "mem_used_gib", "power_100w", "mps_share")
KINDS = ("train", "infer")
PRECISIONS = ("fp32", "fp16", "bf16")


def _log(x: float) -> float:
    return math.log(x) if x > 0 else math.nan  # NaN > 0 is False: missing stays missing


def numeric_values(p: SoloProfile) -> tuple[float, ...]:
    """Raw numeric features of a job in `NUMERIC` order; NaN where unmeasured."""
    return (_log(p.throughput), _log(p.batch), _log(p.throughput * p.batch), p.sm_util, p.membw_util,
            p.mem_used_mib / 1024.0, p.power_w / 100.0, min(max(p.mps_share, 1), 100) / 100.0)


def measured_stats(raw: np.ndarray, names: Sequence[str]) -> tuple[tuple[str, ...], tuple[float, ...], tuple[float, ...]]:
    """(names of the columns of `raw` measured at least once, their means, their standard deviations (1 where
    constant)), over the measured (non-NaN) values."""
    keep, mean, std = [], [], []
    for j, name in enumerate(names):
        col = raw[:, j][~np.isnan(raw[:, j])]
        if col.size:
            keep.append(name)
            mean.append(float(col.mean()))
            std.append(float(col.std()) if col.std() > 1e-9 else 1.0)
    return tuple(keep), tuple(mean), tuple(std)


@dataclass(frozen=True)
class FeatureSchema:
    """Which features a trained model uses and how to standardize them; saved with the model."""

    numeric: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    families: tuple[str, ...]
    version: int = FEATURE_VERSION

    @classmethod
    def fit(cls, profiles: Sequence[SoloProfile], use_family: bool) -> FeatureSchema:
        """Keeps the numeric features measured at least once; standardizes over the measured values."""
        raw = np.array([numeric_values(p) for p in profiles], dtype=float).reshape(-1, len(NUMERIC))
        keep, mean, std = measured_stats(raw, NUMERIC)
        families = tuple(sorted({p.model_family for p in profiles if p.model_family})) if use_family else ()
        return cls(keep, mean, std, families)

    def job_names(self) -> list[str]:
        return ([f"{n}" for n in self.numeric] + [f"{n}_missing" for n in self.numeric]
                + [f"kind={k}" for k in KINDS] + [f"precision={p}" for p in PRECISIONS]
                + [f"family={f}" for f in self.families])

    def names(self) -> list[str]:
        """Names of the pair features, in the order the net sees them."""
        job = self.job_names()
        return [f"self.{n}" for n in job] + [f"partner.{n}" for n in job] + ["same_family", "same_job"]

    def encode(self, profiles: Sequence[SoloProfile]) -> tuple[np.ndarray, np.ndarray]:
        """(job features (n, d), family code per job (-1 unknown)) for each profile."""
        cols = [NUMERIC.index(n) for n in self.numeric]
        raw = np.array([numeric_values(p) for p in profiles], dtype=float).reshape(-1, len(NUMERIC))[:, cols]
        missing = np.isnan(raw)
        values = np.where(missing, 0.0, (raw - np.array(self.mean)) / np.array(self.std))
        fam_index = {f: i for i, f in enumerate(self.families)}
        n = len(profiles)
        kind = np.zeros((n, len(KINDS)))
        prec = np.zeros((n, len(PRECISIONS)))
        fam = np.zeros((n, len(self.families)))
        codes = np.full(n, -1, dtype=np.int64)
        all_families: dict[str, int] = {}
        for i, p in enumerate(profiles):
            if p.kind in KINDS:
                kind[i, KINDS.index(p.kind)] = 1.0
            if p.precision in PRECISIONS:
                prec[i, PRECISIONS.index(p.precision)] = 1.0
            if p.model_family:
                # Codes compare families between jobs, including ones outside the vocabulary.
                codes[i] = all_families.setdefault(p.model_family, len(all_families))
                if p.model_family in fam_index:
                    fam[i, fam_index[p.model_family]] = 1.0
        return np.hstack([values, missing.astype(float), kind, prec, fam]).astype(np.float32), codes

    def pairs(self, ea: np.ndarray, eb: np.ndarray, ca: np.ndarray, cb: np.ndarray) -> np.ndarray:
        """Pair features of (self=ea[k], partner=eb[k]) for every k."""
        same_family = ((ca == cb) & (ca >= 0)).astype(np.float32)[:, None]
        same_job = np.all(ea == eb, axis=1).astype(np.float32)[:, None]
        return np.hstack([ea, eb, same_family, same_job])

    def to_dict(self) -> dict:
        return {"version": self.version, "numeric": list(self.numeric), "mean": list(self.mean),
                "std": list(self.std), "families": list(self.families), "names": self.names()}

    @classmethod
    def from_dict(cls, d: dict, source: str) -> FeatureSchema:
        """Rebuilds a saved schema; refuses one this code would encode differently."""
        try:
            version = int(d["version"])
            schema = cls(tuple(d["numeric"]), tuple(map(float, d["mean"])), tuple(map(float, d["std"])),
                         tuple(d["families"]), version)
            names = list(d["names"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"{source}: feature schema is incomplete ({exc!r})") from None
        if version != FEATURE_VERSION:
            raise ModelFileError(f"{source}: feature schema version {version}, this slurm-elastico reads "
                                 f"version {FEATURE_VERSION}; retrain with `elastico iac train`")
        unknown = [n for n in schema.numeric if n not in NUMERIC]
        if unknown or names != schema.names():
            raise ModelFileError(f"{source}: its features ({', '.join(unknown) or 'their order'}) differ from the "
                                 f"features this slurm-elastico computes; retrain with `elastico iac train`")
        return schema
