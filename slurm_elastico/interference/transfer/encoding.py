"""Jobs as the correction sees them: standardized numeric features, family, kind and precision codes.

A job's speed is read per unit of its GPU's memory bandwidth (`log_bandwidth`), so that the same job on two GPU
types encodes about alike; `shift_direction` says whether an unseen GPU type lies above or below the training
types by that bandwidth. `distinct_jobs` encodes each distinct job once: kernels and predictions sum through them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.features import measured_stats
from slurm_elastico.interference.specs import spec_of

NUMERIC = ("log_steps_per_bw", "log_batch", "sm_util", "membw_util", "mem_used_gib", "mps_share")
KINDS = ("train", "infer")
PRECISIONS = ("fp32", "fp16", "bf16", "fp8")  # code 1.. ; 0 = not stated


def _log(x: float) -> float:
    return math.log(x) if x > 0 else math.nan


def log_bandwidth(gpu_type: str | None) -> float:
    """ln of the memory bandwidth (GB/s) of `gpu_type` by its spec; NaN for a type with no listed spec (or None)."""
    spec = None if gpu_type is None else spec_of(gpu_type)
    return math.nan if spec is None else math.log(spec.mem_bw_gbs)


def shift_direction(gpu_type: str, trained_on: Sequence[str]) -> str:
    """"up" when `gpu_type` has more memory bandwidth than every type of `trained_on`, "down" when it has less
    than every one, "" otherwise (between them, or a type with no listed spec)."""
    new = log_bandwidth(gpu_type)
    old = [log_bandwidth(g) for g in trained_on]
    if math.isnan(new) or not old or any(math.isnan(b) for b in old):
        return ""
    return "up" if new > max(old) else "down" if new < min(old) else ""


@dataclass
class Jobs:
    """Encoded jobs: standardized numeric features (NaN = unmeasured), family code (-1 unknown), kind, precision."""

    x: np.ndarray
    family: np.ndarray
    kind: np.ndarray
    precision: np.ndarray

    def take(self, idx: np.ndarray) -> Jobs:
        return Jobs(self.x[idx], self.family[idx], self.kind[idx], self.precision[idx])


@dataclass(frozen=True)
class Encoder:
    """Standardizes jobs' numeric features; a job's speed is read per unit of its GPU's memory bandwidth.

    Steps/s is not comparable across GPU types: the same job runs about as much faster on a bigger GPU as the
    GPU is bigger, so raw steps/s would place every job of an unseen, faster type outside the training range.
    Steps per GB of the GPU's memory bandwidth (`specs`) is about the same job on either type: how heavy a step
    is for the hardware. `ref_log_bw` (the training samples' mean ln bandwidth) stands in for a GPU type with
    no listed spec, and for a view asked without a GPU type. Where no training type has a listed spec it is NaN
    and every speed, on any type, is read as raw steps/s: a bandwidth known for the query's type alone would
    compare it with nothing.

    Every feature of `NUMERIC` is kept, also one the training data never measured (standardized by mean 0,
    scale 1): a job measured where training jobs were not is then a length scale apart on it (`kernel.job_kernel`).
    Such a job's prior is computed from its counters, while the training residuals were the residuals of the
    prior fed defaults: the correction learned from them is the wrong correction for it, and fades."""

    numeric: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    families: tuple[str, ...]
    ref_log_bw: float = math.nan

    @classmethod
    def fit(cls, profiles: Sequence[SoloProfile], gpus: Sequence[str]) -> Encoder:
        known = [b for b in map(log_bandwidth, gpus) if not math.isnan(b)]
        ref = float(np.mean(known)) if known else math.nan
        names, mean, std = measured_stats(_raw_matrix(profiles, gpus, ref), NUMERIC)
        stats = dict(zip(names, zip(mean, std, strict=True), strict=True))
        return cls(NUMERIC, tuple(stats.get(n, (0.0, 1.0))[0] for n in NUMERIC),
                   tuple(stats.get(n, (0.0, 1.0))[1] for n in NUMERIC),
                   tuple(sorted({p.model_family for p in profiles if p.model_family})), ref)

    def encode(self, profiles: Sequence[SoloProfile], gpus: Sequence[str | None] | str | None) -> Jobs:
        """`gpus`: each profile's GPU type, or one type (or None: unknown) for all of them."""
        cols = [NUMERIC.index(n) for n in self.numeric]
        raw = _raw_matrix(profiles, gpus, self.ref_log_bw)[:, cols]
        x = (raw - np.array(self.mean)) / np.array(self.std) if cols else raw
        fam = {f: i for i, f in enumerate(self.families)}
        family = np.array([fam.get(p.model_family, -1) for p in profiles], dtype=np.int64)
        kind = np.array([KINDS.index(p.kind) if p.kind in KINDS else -1 for p in profiles], dtype=np.int64)
        precision = np.array([PRECISIONS.index(p.precision) + 1 if p.precision in PRECISIONS else 0
                              for p in profiles], dtype=np.int64)
        return Jobs(x, family, kind, precision)


_FIELDS = attrgetter("throughput", "batch", "sm_util", "membw_util", "mem_used_mib", "mps_share")
"""What `_raw_matrix` reads of a profile, a field for each of `NUMERIC` in its order (speed and batch as they are,
memory in MiB, share in percent)."""


def _raw_matrix(profiles: Sequence[SoloProfile], gpus: Sequence[str | None] | str | None, ref: float) -> np.ndarray:
    """`NUMERIC` of each profile, its speed read per unit of its GPU type's bandwidth (`Encoder`): one row each."""
    def offset(g: str | None) -> float:  # ln bandwidth of type g; `ref` for a type without a spec; 0 without `ref`
        if math.isnan(ref):
            return 0.0
        b = log_bandwidth(g)
        return ref if math.isnan(b) else b

    if gpus is None or isinstance(gpus, str):
        offsets: float | np.ndarray = offset(gpus)
    else:
        if len(gpus) != len(profiles):
            raise ValueError(f"{len(gpus)} GPU types for {len(profiles)} profiles: one each, or one for all")
        at = {g: offset(g) for g in set(gpus)}  # once per GPU type, not per job
        offsets = np.array([at[g] for g in gpus], dtype=float)
    # (the fields read in C, then a column at a time: the planner encodes every shape of every family each epoch)
    x = np.array(list(map(_FIELDS, profiles)), dtype=float).reshape(-1, len(NUMERIC))
    for c in (0, 1):  # ln of the speed and the batch (math.log, not numpy's: the same number on every machine)
        x[:, c] = [_log(v) for v in x[:, c].tolist()]
    x[:, 0] -= offsets
    x[:, 4] /= 1024.0
    np.clip(x[:, 5], 1, 100, out=x[:, 5])
    x[:, 5] /= 100.0
    return x


def distinct_jobs(jobs: Jobs) -> tuple[Jobs, np.ndarray]:
    """(each distinct encoded job once, index of every job among them)."""
    key = np.hstack([np.nan_to_num(jobs.x, nan=-1e300), jobs.family[:, None], jobs.kind[:, None],
                     jobs.precision[:, None]])
    _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    return jobs.take(first), inverse.reshape(-1)
