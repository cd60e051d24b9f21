"""A slowdown predictor whose knowledge transfers: the contention model as prior, a learned correction on top.

    log S(a | b, gpu) = log S_prior(a, b) + f(a, b, gpu),   S >= 1

`S_prior` is `base.ContentionModel`: physics of what MPS does not partition,
fed the jobs' solo counters (SM and memory-bandwidth utilisation). Where a
counter is unmeasured it uses a default, and those two defaults are the only
parameters of the prior fitted to the training data (a grid, least absolute
log error); with counters measured, the prior is the untrained model.

`f` is the posterior mean of a Gaussian process (kernel ridge regression) on
the training residuals log S − log S_prior, with the kernel

    k = [k_job(a, a') · k_job(b, b') + linear · (φ(a)·φ(a') + φ(b)·φ(b'))] · k_gpu(gpu, gpu')

`k_job` compares two jobs on standardized numeric features (log steps/s
per GB/s of the GPU's memory bandwidth, `Encoder`; log batch, SM and
bandwidth utilisation, memory used, MPS share; a feature measured on one
job and not the other counts as one length scale apart, also one training
never measured),
times `family_sim` unless both have the same known model family, times
e^-1 if their kinds (train/infer) differ and e^-0.5 if their precisions do.
`k_gpu` compares GPU types by their specifications (`specs`: ln SMs, ln
bandwidth, ln memory): `shared + (1 − shared)·exp(−d²/2·gpu_scale²)`, `shared`
being the part of what is learned on one GPU type that is taken to hold on
every type; a type with no listed spec gets only that part. The kernel
decays with distance, so a workload or GPU unlike anything in training gets
f → 0: the prior, never the training mean.

The product part learns what is particular to pairs like the training pairs,
and fades for a job of an unseen family (`family_sim`). The linear part
(`linear` > 0) learns trends that carry over: φ are a job's demand features
(`LINEAR`: steps/s per GB/s, the solo counters, the MPS share; clipped to
`LINEAR_CLIP` standard deviations), so log S = ... + φ(self)·β_own +
φ(partner)·β_partner: a job with lighter steps leaves its partner more of the
GPU, whatever its family. It is weighed by the pair's `nearness` to the
training jobs (families aside), so it too fades away from the data.
`batch` = 0 leaves log batch out of the distance of two jobs: a batch counts
samples, whose size differs between models (a sentence, an image, a user's
row), so batches compare within a family only, where steps/s already tells
them apart.

Measured speed-ups (normalized throughput > 1) train as S = 1: predictions
never promise a speed-up. Reasons (see docs/interference-data.md, "speed-ups"):
the planner clamps S to >= 1 before using it (`planner.slowdown._clean`),
so a predicted speed-up could only change a decision by admitting a pair on
the strength of it; and the error this costs on a true speed-up of n is
(n − 1)/n of normalized throughput, 9 % at n = 1.1.

Hyper-parameters (`KernelConfig`, the linear part and the batch weight
among them) are chosen on leave-one-model-out folds of the training data
(k-fold with fewer than 3 families), by MAPE. The model file also
carries its held-out error (`heldout`): on k-fold, leave-one-model-out and,
with two or more GPU types, leave-one-GPU-out folds of the training data.
From the same held-out pairs come the admission thresholds per floor
(`admission`, `admission_tables`; margins per pair from the pair's
prediction, by the kind of shift: seen, an unseen family, an unseen GPU type
and whether that type is bigger or smaller than the training types) and the
gain rule's margins (`margins_from_heldout`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from slurm_elastico.interference.base import ContentionModel, SoloProfile, distinct
from slurm_elastico.interference.admission import FLOORS, from_json, margins, thresholds, to_json
from slurm_elastico.interference.admission import TARGET as ADMISSION_TARGET
from slurm_elastico.interference.errors import MeasurementError, ModelFileError
from slurm_elastico.interference.features import measured_stats
from slurm_elastico.interference.files import check_header, write_atomically
from slurm_elastico.interference.measurements import Colocation, samples
from slurm_elastico.interference.specs import spec_of

FILE_FORMAT = "slurm-elastico/iac-prior-corrected"
FILE_VERSION = 4  # 3: throughput per unit of the GPU's memory bandwidth; 4: the correction's batch weight and linear part
OLDER_VERSIONS = (3,)  # read as written: a version-3 file is the same model with batch 1 and no linear part
NUMERIC = ("log_steps_per_bw", "log_batch", "sm_util", "membw_util", "mem_used_gib", "mps_share")
KINDS = ("train", "infer")
PRECISIONS = ("fp32", "fp16", "bf16", "fp8")  # code 1.. ; 0 = not stated
FALSE_ADMISSION_TARGET = 0.10  # the share of held-out pairs whose truth may fall below prediction / (1 + margin)
HELDOUT_KINDS = ("kfold", "leave-one-model-out", "leave-one-gpu-out")  # the splits a model file reports
ADMISSION_KINDS = ("seen", "family", "gpu", "gpu_up", "gpu_down")  # its sets of admission thresholds
REPORT_FLOOR = 0.6  # the floor `format_transfer` shows the admission thresholds at
LINEAR = ("log_steps_per_bw", "sm_util", "membw_util", "mem_used_gib", "mps_share")  # monotone demand features
LINEAR_CLIP = 3.0  # standard deviations: how far the linear part extrapolates
_BATCH = NUMERIC.index("log_batch")
_LINEAR = [NUMERIC.index(n) for n in LINEAR]
PRIOR_SM = tuple(np.round(np.arange(0.30, 1.001, 0.05), 2))
PRIOR_BW = tuple(np.round(np.arange(0.10, 0.901, 0.10), 2))


@dataclass(frozen=True)
class KernelConfig:
    lam: float = 0.1  # noise variance on log S residuals (ridge)
    num_scale: float = 1.0  # length scale of the standardized numeric features
    family_sim: float = 0.3  # kernel factor between different (or unknown) model families
    gpu_scale: float = 1.0  # length scale of the GPU spec vector (ln units)
    shared: float = 0.5  # part of the correction taken to hold on every GPU type
    batch: float = 1.0  # weight of log batch in the distance of two jobs (0: batches are not compared)
    linear: float = 0.0  # prior variance of the correction's additive linear part (`LINEAR`); 0: none


GRID = tuple(KernelConfig(lam=lam, num_scale=ns, family_sim=fs, batch=batch, linear=linear)
             for lam in (0.03, 0.2) for ns in (0.5, 1.5) for fs in (0.1, 0.5) for batch in (1.0, 0.0)
             for linear in (0.0, 0.3))


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


def _raw(p: SoloProfile, log_bw: float) -> tuple[float, ...]:
    return (_log(p.throughput) - log_bw, _log(p.batch), p.sm_util, p.membw_util, p.mem_used_mib / 1024.0,
            min(max(p.mps_share, 1), 100) / 100.0)


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
    scale 1): a job measured where training jobs were not is then a length scale apart on it (`job_kernel`).
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


def _raw_matrix(profiles: Sequence[SoloProfile], gpus: Sequence[str | None] | str | None, ref: float) -> np.ndarray:
    if gpus is None or isinstance(gpus, str):
        gpus = [gpus] * len(profiles)
    bw = {} if math.isnan(ref) else {g: log_bandwidth(g) for g in set(gpus)}  # once per GPU type, not per job
    offsets = [bw.get(g, 0.0) for g in gpus]
    return np.array([_raw(p, ref if math.isnan(b) else b) for p, b in zip(profiles, offsets, strict=True)],
                    dtype=float).reshape(-1, len(NUMERIC))


def job_kernel(a: Jobs, b: Jobs, cfg: KernelConfig) -> np.ndarray:
    """(len(a), len(b)) similarity of jobs, in (0, 1]."""
    return _similarity(*_distance2(a, b, cfg), cfg)


def _similarity(d2: np.ndarray, same_family: np.ndarray, cfg: KernelConfig) -> np.ndarray:
    """`job_kernel` from `_distance2`'s answer (callers that also need the distances compute them once)."""
    return np.exp(-0.5 * d2) * np.where(same_family, 1.0, cfg.family_sim)


def _distance2(a: Jobs, b: Jobs, cfg: KernelConfig) -> tuple[np.ndarray, np.ndarray]:
    """(squared distance of every job of `a` to every job of `b` apart from their families, whether they share a
    known family)."""
    d2 = np.zeros((len(a.family), len(b.family)))
    for j in range(a.x.shape[1]):
        weight = cfg.batch if j == _BATCH else 1.0
        if weight == 0.0:
            continue
        xa, xb = a.x[:, j][:, None], b.x[:, j][None, :]
        na, nb = np.isnan(xa), np.isnan(xb)
        diff = np.where(na | nb, 0.0, (np.nan_to_num(xa) - np.nan_to_num(xb)) / cfg.num_scale) ** 2
        d2 += weight * (diff + (na ^ nb))
    same_family = (a.family[:, None] == b.family[None, :]) & (a.family[:, None] >= 0)
    d2 += 2.0 * (a.kind[:, None] != b.kind[None, :])
    prec = (a.precision[:, None] != b.precision[None, :]) & (a.precision[:, None] != 0) & (b.precision[None, :] != 0)
    d2 += 1.0 * prec
    return d2, same_family


def linear_features(jobs: Jobs) -> np.ndarray:
    """(len(jobs), len(LINEAR)) a job's standardized demand features of `LINEAR` (unmeasured: 0, the training
    mean), clipped to `LINEAR_CLIP` standard deviations: the inputs of the correction's linear part."""
    return np.clip(np.nan_to_num(jobs.x[:, _LINEAR], nan=0.0), -LINEAR_CLIP, LINEAR_CLIP)


def nearness(d2: np.ndarray) -> np.ndarray:
    """exp(−d²/2) of each job's distance (`_distance2`, rows) to its nearest training job (columns), families
    aside: 1 for a training job. The linear part of a pair is weighed by its jobs' nearness, so the trend carries
    over to an unseen family and fades, as the rest of the correction, away from the data."""
    return np.exp(-0.5 * d2.min(axis=1))


def gpu_kernel(g: Sequence[str], h: Sequence[str], cfg: KernelConfig) -> np.ndarray:
    """(len(g), len(h)) similarity of GPU types: 1 for the same type, else `shared` plus a part by specification."""
    out = np.empty((len(g), len(h)))
    for i, x in enumerate(g):
        for j, y in enumerate(h):
            if x == y:
                out[i, j] = 1.0
                continue
            sx, sy = spec_of(x), spec_of(y)
            near = 0.0
            if sx is not None and sy is not None:
                d2 = sum((p - q) ** 2 for p, q in zip(sx.vector(), sy.vector(), strict=True)) / cfg.gpu_scale ** 2
                near = math.exp(-0.5 * d2)
            out[i, j] = cfg.shared + (1.0 - cfg.shared) * near
    return out


@dataclass
class Samples:
    """Both directions of every fitting pair: self, partner, GPU type, observed log S (>= 0), index of the pair."""

    selves: list[SoloProfile]
    partners: list[SoloProfile]
    gpus: list[str]
    log_s: np.ndarray
    pair: np.ndarray


def samples_of(observations: Sequence[Colocation]) -> Samples:
    selves, partners, norms, pair = samples(observations)
    log_s = np.log(np.maximum(1.0, 1.0 / np.array(norms, dtype=float)))  # a measured speed-up trains as no slowdown
    return Samples(selves, partners, [observations[i].gpu_type for i in pair], log_s, np.array(pair, dtype=np.int64))


def fit_prior(smp: Samples) -> ContentionModel:
    """The contention model with the defaults for unmeasured counters that fit `smp` best (least absolute log error)."""
    best = None
    for sm in PRIOR_SM:
        for bw in PRIOR_BW:
            prior = ContentionModel(default_sm=float(sm), default_bw=float(bw))
            err = float(np.mean(np.abs(np.log(prior.predict(smp.selves, smp.partners)) - smp.log_s)))
            if best is None or err < best[0] - 1e-12:
                best = (err, prior)
    assert best is not None
    return best[1]


@dataclass
class Fitted:
    """The training samples as the fit saw them: distinct jobs, each sample's self and partner among them, its GPU
    type, and its weight. Predictions sum over samples through the distinct jobs (`PriorCorrected._pair_weights`)."""

    jobs: Jobs
    self_idx: np.ndarray
    partner_idx: np.ndarray
    gpus: list[str]
    alpha: np.ndarray
    target: np.ndarray  # log S − log S_prior of each sample: what the correction was fitted to

    def refit(self, cfg: KernelConfig) -> Fitted:
        """The same samples with weights solved again (after samples were added)."""
        ker = _sample_kernels(self.jobs, self.self_idx, self.partner_idx, self.gpus, cfg)
        return Fitted(self.jobs, self.self_idx, self.partner_idx, self.gpus,
                      _solve(ker.job * ker.gpu, self.target, cfg.lam), self.target)

    def plus(self, jobs: Jobs, self_idx: np.ndarray, partner_idx: np.ndarray, gpus: Sequence[str],
             target: np.ndarray) -> Fitted:
        """These samples and the given ones that are not already among them (weights not solved: `refit`)."""
        n_old = len(self.jobs.family)
        merged = Jobs(np.vstack([self.jobs.x, jobs.x]), np.concatenate([self.jobs.family, jobs.family]),
                      np.concatenate([self.jobs.kind, jobs.kind]), np.concatenate([self.jobs.precision, jobs.precision]))
        unique, where = distinct_jobs(merged)
        s = np.concatenate([where[self.self_idx], where[n_old + self_idx]])
        p = np.concatenate([where[self.partner_idx], where[n_old + partner_idx]])
        g = list(self.gpus) + list(gpus)
        t = np.concatenate([self.target, target])
        seen: set = set()
        keep = []
        for i in range(len(t)):
            key = (int(s[i]), int(p[i]), g[i], round(float(t[i]), 9))
            if key not in seen:
                seen.add(key)
                keep.append(i)
        k = np.array(keep, dtype=np.int64)
        return Fitted(unique, s[k], p[k], [g[i] for i in keep], np.zeros(len(k)), t[k])


def distinct_jobs(jobs: Jobs) -> tuple[Jobs, np.ndarray]:
    """(each distinct encoded job once, index of every job among them)."""
    key = np.hstack([np.nan_to_num(jobs.x, nan=-1e300), jobs.family[:, None], jobs.kind[:, None],
                     jobs.precision[:, None]])
    _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    return jobs.take(first), inverse.reshape(-1)


def _solve(k: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """(K + lam·I)⁻¹ y by Cholesky (K is a product of positive semi-definite kernels, so K + lam·I is definite)."""
    from scipy.linalg import cho_factor, cho_solve

    return cho_solve(cho_factor(k + lam * np.eye(len(y)), lower=True, check_finite=False), y, check_finite=False)


class PriorCorrected:
    """The trained transfer predictor; implements `SlowdownModel`. Build with `fit_transfer` or `load`."""

    def __init__(self, prior: ContentionModel, encoder: Encoder, config: KernelConfig, fitted: Fitted,
                 training_mean_norm: float, heldout: dict[str, dict[str, float]], gpu_types: Sequence[str],
                 admission: dict[str, np.ndarray], gpu: str | None = None):
        self.prior, self.encoder, self.config, self.fitted = prior, encoder, config, fitted
        self.training_mean_norm = training_mean_norm
        self.heldout = heldout
        self.admission = admission  # thresholds per floor (`admission.FLOORS`) for seen, family, gpu pairs
        # The held-out pairs `admission` was calibrated on, per kind of fold (`admission_tables`); None when loaded
        # from a file (it keeps the thresholds only).
        self.calibration: dict[str, Cross] | None = None
        self.gpu_types = tuple(gpu_types)
        self.gpu = gpu  # None: each training sample counts as if on the query's GPU (no discount); use on_gpu
        self.margins = margins_from_heldout(heldout)
        self._base = fitted  # what `fine_tune` adds to
        self._pair_weights = self._weights(gpu)

    def _weights(self, gpu: str | None) -> np.ndarray:
        """W[s, p]: summed weight of the training samples whose self is distinct job s and partner p, each weighed by
        how alike its GPU type is to `gpu` (None: no discount). The correction is then k(a)·W·k(b)ᵀ."""
        f = self.fitted
        alpha = f.alpha
        if gpu is not None:  # the kernel once per training GPU type, not per sample (`on_gpu` runs every epoch)
            types = sorted(set(f.gpus))
            near = dict(zip(types, gpu_kernel([gpu], types, self.config)[0].tolist()))
            alpha = alpha * np.array([near[g] for g in f.gpus], dtype=float)
        u = len(f.jobs.family)
        w = np.zeros((u, u))
        np.add.at(w, (f.self_idx, f.partner_idx), alpha)
        return w

    def _parts(self, profiles: Sequence[SoloProfile]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(kernel of each profile to the training jobs, the correction's linear part of each profile as the job
        itself and as the partner (zeros without one), its nearness to the training jobs). The linear part of a
        pair is its two jobs' nearness times (own part of the job + partner part of the partner)."""
        cfg, train = self.config, self.fitted.jobs
        jobs = self.encoder.encode(profiles, self.gpu)
        d2, same_family = _distance2(jobs, train, cfg)
        k = _similarity(d2, same_family, cfg)
        n = len(profiles)
        if not cfg.linear or not len(train.family):
            return k, np.zeros(n), np.zeros(n), np.zeros(n)
        phi, phi_train, w = cfg.linear * linear_features(jobs), linear_features(train), self._pair_weights
        return k, phi @ (phi_train.T @ w.sum(axis=1)), phi @ (phi_train.T @ w.sum(axis=0)), nearness(d2)

    @property
    def gain_margin(self) -> float:
        """Margin for the rule that a shared GPU gains (combined speed > 1 + margin) on this view's GPU type: from
        the held-out over-prediction of pairs' combined speed (an unseen GPU type: the largest shift's figure)."""
        if self.gpu is not None and not self.seen_gpu(self.gpu):
            return self.margins["gain_gpu"]
        return self.margins["gain_family"]

    # -- views -------------------------------------------------------------------
    def seen_gpu(self, gpu_type: str) -> bool:
        return gpu_type in self.gpu_types

    def on_gpu(self, gpu_type: str) -> PriorCorrected:
        """The model as it answers on `gpu_type`: the correction weighted by how alike that type is to training's."""
        view = PriorCorrected(self.prior, self.encoder, self.config, self.fitted, self.training_mean_norm,
                              self.heldout, self.gpu_types, self.admission, gpu_type)
        view._base = self._base
        return view

    # -- predictions ---------------------------------------------------------------
    def _table(self, profiles: Sequence[SoloProfile], parts: tuple | None = None) -> np.ndarray:
        """Correction f of every pair of `profiles` (i next to j); `parts`: their `_parts`, if computed already."""
        k, own, partner, near = self._parts(profiles) if parts is None else parts
        return (k @ self._pair_weights) @ k.T + np.outer(near, near) * (own[:, None] + partner[None, :])

    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        """Slowdown S >= 1 of a[k] next to b[k], for every k."""
        profiles, ia, ib = distinct(a, b, "predict")
        if not profiles:
            return np.zeros(0)
        if len(profiles) ** 2 <= 4 * len(ia):  # few distinct jobs: the whole table, then look pairs up
            return self.predict_matrix(profiles)[ia, ib]
        parts = self._parts(profiles)
        return self._predict_parts(profiles, parts, ia, profiles, parts, ib)

    def _predict_parts(self, a: Sequence[SoloProfile], a_parts: tuple, ia: np.ndarray, b: Sequence[SoloProfile],
                       b_parts: tuple, ib: np.ndarray) -> np.ndarray:
        """Slowdown of a[ia[k]] next to b[ib[k]], the two lists given with their `_parts` (computed once each)."""
        k, own, _, near = a_parts
        k_b, _, partner, near_b = b_parts
        kw = k @ self._pair_weights
        corr = np.einsum("ij,ij->i", kw[ia], k_b[ib]) + near[ia] * near_b[ib] * (own[ia] + partner[ib])
        prior = self.prior.predict([a[i] for i in ia], [b[j] for j in ib])
        return np.maximum(1.0, prior * np.exp(corr))

    def predict_matrix(self, profiles: Sequence[SoloProfile]) -> np.ndarray:
        """S[i, j]: slowdown of profiles[i] next to profiles[j]."""
        if not profiles:
            return np.zeros((0, 0))
        return self._matrix(profiles)

    def _matrix(self, profiles: Sequence[SoloProfile], parts: tuple | None = None) -> np.ndarray:
        # In place: at the planner's few hundred profiles an (n, n) temporary costs about as much as its arithmetic.
        s = self._table(profiles, parts)  # a new array
        np.exp(s, out=s)
        s *= self.prior.predict_matrix(profiles)
        return np.maximum(s, 1.0, out=s)

    def admission_margins(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        """Margin on the floor per pair (`admission.margins`): from the pair's predicted worst normalized throughput
        and the thresholds of its kind of shift (an unseen GPU type; else an unseen family; else seen)."""
        profiles, ia, ib = distinct(a, b, "admission_margins")
        return self.scorer(profiles).margins(ia, ib)

    def _unseen_families(self, profiles: Sequence[SoloProfile]) -> np.ndarray:
        """Whether each profile's model family is one training never saw (the family thresholds apply)."""
        known = set(self.encoder.families)
        return np.array([p.model_family not in known for p in profiles], dtype=bool)

    def _margins_of(self, worst: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Margin of each pair from its predicted worst normalized throughput `worst` (any shape); `new` (same
        shape): whether the pair holds a job of a family training never saw. Elementwise, so one call per
        threshold set over all the pairs it applies to."""
        t = self.admission
        if self.gpu is not None and not self.seen_gpu(self.gpu):
            direction = shift_direction(self.gpu, self.gpu_types)
            return margins(worst, t[f"gpu_{direction}" if direction else "gpu"])
        if new.all():  # common in the planner: its jobs' families are rarely training's
            return margins(worst, t["family"])
        out = margins(worst, t["seen"])
        if new.any():
            out[new] = margins(worst[new], t["family"])
        return out

    def scorer(self, profiles: Sequence[SoloProfile]) -> _Scorer:
        """Slowdowns and margins of pairs of `profiles` by index (what the planner's pair cache asks)."""
        return _Scorer(self, list(profiles))

    # -- online learning (interference.online) ------------------------------------------
    def fine_tune(self, observations: Sequence[Colocation], epochs: int = 0, lr: float = 0.0) -> None:
        """Refits the correction, in place, on its training samples (as trained or loaded) plus `observations`
        (the learner's replay: reference data, already among them, and new observations), same config, prior
        and encoder; `epochs` and `lr` are the MLP's and are not used. A call replaces the previous call's
        additions. The GPU types counted as seen, the held-out error and the margins stay as trained."""
        smp = samples_of(observations)
        if len(smp.log_s) < 2:
            return
        jobs = self.encoder.encode([*smp.selves, *smp.partners], [*smp.gpus, *smp.gpus])
        n = len(smp.selves)
        target = smp.log_s - np.log(self.prior.predict(smp.selves, smp.partners))
        self.restore(self._base.plus(jobs, np.arange(n), np.arange(n, 2 * n), smp.gpus, target).refit(self.config))

    def state(self) -> Fitted:
        """What `fine_tune` changes, for rollback."""
        return self.fitted

    def restore(self, state: Fitted) -> None:
        self.fitted = state
        self._pair_weights = self._weights(self.gpu)

    # -- files -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        f = self.fitted
        return {"format": FILE_FORMAT, "version": FILE_VERSION, "config": asdict(self.config),
                "prior": {"default_sm": self.prior.default_sm, "default_bw": self.prior.default_bw,
                          "kappa": self.prior.kappa},
                "encoder": {"numeric": list(self.encoder.numeric), "mean": list(self.encoder.mean),
                            "std": list(self.encoder.std), "families": list(self.encoder.families),
                            "ref_log_bw": None if math.isnan(self.encoder.ref_log_bw) else self.encoder.ref_log_bw},
                "training_mean_norm": self.training_mean_norm, "gpu_types": list(self.gpu_types),
                "heldout": self.heldout, "margins": self.margins,
                "admission": {"floors": list(FLOORS), **{k: to_json(v) for k, v in self.admission.items()}},
                "train": {"jobs": _jobs_dict(f.jobs), "self": f.self_idx.tolist(), "partner": f.partner_idx.tolist(),
                          "gpus": f.gpus, "alpha": f.alpha.tolist(), "target": f.target.tolist()}}

    def save(self, path: str | Path) -> None:
        """Writes the model as one JSON file (atomically: write, fsync, rename)."""
        write_atomically(path, json.dumps(self.to_dict()).encode())

    @classmethod
    def load(cls, path: str | Path) -> PriorCorrected:
        path = Path(path)
        try:
            blob = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelFileError(f"{path}: no such model file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelFileError(f"{path}: not a slurm-elastico predictor file ({type(exc).__name__})") from None
        check_header(blob, path, FILE_FORMAT, FILE_VERSION, OLDER_VERSIONS)
        try:
            if blob["version"] == 3 and set(blob["config"]) & {"batch", "linear"}:
                raise ValueError("a version-3 file with version-4 settings (batch, linear)")
            enc = blob["encoder"]
            encoder = Encoder(tuple(enc["numeric"]), tuple(map(float, enc["mean"])), tuple(map(float, enc["std"])),
                              tuple(enc["families"]),
                              math.nan if enc["ref_log_bw"] is None else float(enc["ref_log_bw"]))
            if encoder.numeric != NUMERIC:  # the batch weight and the linear part read NUMERIC's columns
                raise ValueError(f"features {encoder.numeric}, this slurm-elastico's are {NUMERIC}")
            t = blob["train"]
            fitted = Fitted(_jobs_from(t["jobs"]), np.array(t["self"], dtype=np.int64),
                            np.array(t["partner"], dtype=np.int64), list(map(str, t["gpus"])),
                            np.array(t["alpha"], dtype=float), np.array(t["target"], dtype=float))
            if not (len(fitted.alpha) == len(fitted.gpus) == len(fitted.self_idx) == len(fitted.partner_idx)
                    == len(fitted.target)):
                raise ValueError("training arrays of different lengths")
            if len(fitted.alpha) and max(fitted.self_idx.max(), fitted.partner_idx.max()) >= len(fitted.jobs.family):
                raise ValueError("a training sample names a job the file does not hold")
            if fitted.jobs.x.shape[1] != len(encoder.numeric):
                raise ValueError("training jobs have another number of features than the encoder")
            prior = ContentionModel(**{k: float(v) for k, v in blob["prior"].items()})
            heldout = {k: {m: float(x) for m, x in v.items()} for k, v in blob["heldout"].items()}
            adm = blob["admission"]
            if [round(float(f), 2) for f in adm["floors"]] != list(FLOORS):
                raise ValueError("admission thresholds on other floors than this slurm-elastico uses")
            admission = {k: from_json(adm[k]) for k in ADMISSION_KINDS}
            return cls(prior, encoder, KernelConfig(**blob["config"]), fitted, float(blob["training_mean_norm"]),
                       heldout, tuple(blob["gpu_types"]), admission)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"{path}: incomplete or inconsistent predictor file ({exc!r})") from None


class _Scorer:
    """Pairs of fixed profiles by index: every pair tabulated at once (`tabulate`), or the pairs asked for."""

    def __init__(self, model: PriorCorrected, profiles: list[SoloProfile]):
        self.model, self.profiles = model, profiles
        self.unseen = model._unseen_families(profiles)
        self.table: tuple[np.ndarray, np.ndarray] | None = None  # (slowdowns, margins), all pairs
        self._parts: tuple | None = None  # the profiles' encoding and kernels (`PriorCorrected._parts`), once

    def parts(self) -> tuple:
        if self._parts is None:
            self._parts = self.model._parts(self.profiles)
        return self._parts

    def tabulate(self, limit: int = 2_560_000) -> bool:
        """Fills the table of all pairs unless there are more than `limit`; whether it is filled."""
        n = len(self.profiles)
        if self.table is None and n * n <= limit:
            s = self.model._matrix(self.profiles, self.parts()) if n else np.zeros((0, 0))
            worst = np.maximum(s, s.T)  # the pair's worse job: 1 / the larger slowdown, in place
            self.table = (s, self.model._margins_of(np.divide(1.0, worst, out=worst),
                                                    self.unseen[:, None] | self.unseen))
        return self.table is not None

    def matrices(self) -> tuple[np.ndarray, np.ndarray]:
        """(slowdowns, margins) of every pair, [i, j] for profiles[i] next to profiles[j]; after `tabulate`."""
        assert self.table is not None, "matrices() before tabulate()"
        return self.table

    def against(self, ia: np.ndarray, partners: Sequence[SoloProfile]) -> np.ndarray:
        """Slowdown of profiles[ia[k]] next to partners[k], profiles the scorer does not hold (the planner's stand-in
        neighbours): its own profiles are not encoded again, the partners once each."""
        others, ib, _ = distinct(partners, partners, "against")
        return self.model._predict_parts(self.profiles, self.parts(), np.asarray(ia, dtype=np.int64), others,
                                         self.model._parts(others), ib)

    def _pairs(self, ia: np.ndarray, ib: np.ndarray) -> tuple[list[SoloProfile], list[SoloProfile]]:
        return [self.profiles[i] for i in ia], [self.profiles[j] for j in ib]

    def slowdown(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        if self.table is not None or len(self.profiles) ** 2 <= 4 * len(ia) and self.tabulate():
            return self.table[0][ia, ib]
        return self.model.predict(*self._pairs(ia, ib))

    def margins(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        if self.table is not None or len(self.profiles) ** 2 <= 4 * len(ia) and self.tabulate():
            return self.table[1][ia, ib]
        a, b = self._pairs(ia, ib)
        worst = 1.0 / np.maximum(self.model.predict(a, b), self.model.predict(b, a))
        return self.model._margins_of(worst, self.unseen[ia] | self.unseen[ib])


def _jobs_dict(j: Jobs) -> dict:
    return {"x": np.where(np.isnan(j.x), None, j.x).tolist(), "family": j.family.tolist(), "kind": j.kind.tolist(),
            "precision": j.precision.tolist()}


def _jobs_from(d: dict) -> Jobs:
    x = np.array([[math.nan if v is None else float(v) for v in row] for row in d["x"]], dtype=float)
    return Jobs(x.reshape(len(d["family"]), -1), np.array(d["family"], dtype=np.int64),
                np.array(d["kind"], dtype=np.int64), np.array(d["precision"], dtype=np.int64))


# -- held-out error and margins -------------------------------------------------------------------------------------
def heldout_error(pred_pairs: np.ndarray, true_pairs: np.ndarray) -> dict[str, float]:
    """MAPE and the over-prediction quantile of held-out pairs ((n, 2) normalized throughputs; fitting pairs only)."""
    fit = true_pairs.min(axis=1) > 0
    p, t = pred_pairs[fit], true_pairs[fit]
    if not len(t):
        return {"n_pairs": 0.0, "mape_norm": math.nan, "over_q": math.nan, "over_sum_q": math.nan}
    ratio = p.min(axis=1) / t.min(axis=1)  # predicted over true worst normalized throughput of each pair
    summed = p.sum(axis=1) / t.sum(axis=1)  # predicted over true combined speed of the pair (the gain rule's figure)
    q = 1.0 - FALSE_ADMISSION_TARGET
    return {"n_pairs": float(len(t)), "mape_norm": float(np.mean(np.abs(p - t) / t)),
            "over_q": float(np.quantile(ratio, q)), "over_sum_q": float(np.quantile(summed, q))}


def margins_from_heldout(heldout: dict[str, dict[str, float]]) -> dict[str, float]:
    """Margins of the rule that a shared GPU gains (combined speed of a pair > 1 + m): m = over_sum_q − 1 of the
    held-out folds of the matching shift, so about FALSE_ADMISSION_TARGET of pairs' combined speed is
    over-predicted by more than m. (Admission at a floor is calibrated per pair: `admission`.)

    gain_seen: k-fold; gain_family: leave-one-model-out (>= seen); gain_gpu: leave-one-GPU-out, or the
    family figure when training had one GPU type (>= seen). A missing figure gives the next one up."""
    def m(kind: str) -> float:
        q = heldout.get(kind, {}).get("over_sum_q", math.nan)
        return math.nan if math.isnan(q) else max(0.0, q - 1.0)

    seen = m("kfold")
    seen = 0.0 if math.isnan(seen) else seen
    family = m("leave-one-model-out")
    family = seen if math.isnan(family) else max(seen, family)
    gpu = m("leave-one-gpu-out")
    gpu = family if math.isnan(gpu) else max(seen, gpu)
    return {"gain_seen": seen, "gain_family": family, "gain_gpu": gpu}


# -- fitting --------------------------------------------------------------------------------------------------------
@dataclass
class _Kernels:
    """The training samples' kernel pieces for one config, computed once and sliced per fold."""

    job: np.ndarray  # k_job(self) · k_job(partner) (+ the linear part), (N, N)
    gpu: np.ndarray  # k_gpu, (N, N)
    # With a linear part: that part alone (N, N), each sample's self and partner among the distinct jobs, and
    # their squared distances (`_distance2`): a held-out sample's linear part is weighed by its jobs' `nearness`
    # to the fold's training jobs, as `PriorCorrected` weighs it.
    linear: np.ndarray | None = None
    self_job: np.ndarray | None = None
    partner_job: np.ndarray | None = None
    d2: np.ndarray | None = None


def _folds(observations: Sequence[Colocation], kind: str, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from slurm_elastico.interference.evaluation import split

    return [(np.array(tr, dtype=np.int64), np.array(te, dtype=np.int64))
            for _, tr, te in split(observations, kind, k=4, seed=seed)]


Cross = list[tuple[np.ndarray, np.ndarray]]  # per fold: (predicted, true) (n, 2) norms of its held-out pairs


def _pooled(cross: Cross) -> tuple[np.ndarray, np.ndarray]:
    if not cross:
        return np.zeros((0, 2)), np.zeros((0, 2))
    return np.concatenate([p for p, _ in cross]), np.concatenate([t for _, t in cross])


def _worst(cross: Cross) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per fold: (predicted, true) worst normalized throughput of each held-out pair (`admission.thresholds`)."""
    return [(p.min(axis=1), t.min(axis=1)) for p, t in cross]


def _cross(observations, smp: Samples, prior_log: np.ndarray, ker: _Kernels, cfg: KernelConfig,
           folds: Sequence[tuple[np.ndarray, np.ndarray]]) -> Cross:
    """Held-out (predicted, true) pair norms of each fold of `folds` (`_folds`; pairs that ran in the test part)."""
    out = []
    for tr_pairs, te_pairs in folds:
        tr = np.flatnonzero(np.isin(smp.pair, tr_pairs))
        te = np.flatnonzero(np.isin(smp.pair, te_pairs))
        if len(tr) < 2 or len(te) < 2:
            continue
        k = ker.job[np.ix_(tr, tr)] * ker.gpu[np.ix_(tr, tr)]
        alpha = _solve(k, smp.log_s[tr] - prior_log[tr], cfg.lam)
        job = ker.job[np.ix_(te, tr)]
        if ker.linear is not None:  # the test jobs' linear part, weighed by their nearness to the fold's training jobs
            near = nearness(ker.d2[:, np.unique(np.concatenate([ker.self_job[tr], ker.partner_job[tr]]))])
            weight = near[ker.self_job[te]] * near[ker.partner_job[te]]
            job = job + (weight[:, None] - 1.0) * ker.linear[np.ix_(te, tr)]
        log_s = prior_log[te] + (job * ker.gpu[np.ix_(te, tr)]) @ alpha
        norm = 1.0 / np.maximum(1.0, np.exp(log_s))
        # samples come in (a, b) order per pair, pairs in order: two samples make a pair
        out.append((norm.reshape(-1, 2),
                    np.array([[observations[i].norm_a, observations[i].norm_b] for i in smp.pair[te][::2]])))
    return out


def _sample_kernels(jobs: Jobs, self_idx: np.ndarray, partner_idx: np.ndarray, gpus: Sequence[str],
                    cfg: KernelConfig) -> _Kernels:
    """The kernel between samples (self jobs[self_idx], partner jobs[partner_idx], GPU type gpus), in its parts."""
    d2, same_family = _distance2(jobs, jobs, cfg)
    ku = _similarity(d2, same_family, cfg)
    types = sorted(set(gpus))
    g = np.array([types.index(x) for x in gpus], dtype=np.int64)
    job = ku[np.ix_(self_idx, self_idx)] * ku[np.ix_(partner_idx, partner_idx)]
    gpu = gpu_kernel(types, types, cfg)[np.ix_(g, g)]
    if not cfg.linear:
        return _Kernels(job, gpu)
    phi = linear_features(jobs)
    linear = cfg.linear * (phi[self_idx] @ phi[self_idx].T + phi[partner_idx] @ phi[partner_idx].T)
    return _Kernels(job + linear, gpu, linear, self_idx, partner_idx, d2)


def _kernels(smp: Samples, enc: Encoder, cfg: KernelConfig) -> _Kernels:
    jobs, idx = distinct_jobs(enc.encode([*smp.selves, *smp.partners], [*smp.gpus, *smp.gpus]))
    n = len(smp.selves)
    return _sample_kernels(jobs, idx[:n], idx[n:], smp.gpus, cfg)


def fit_transfer(observations: Sequence[Colocation], seed: int = 0,
                 grid: Sequence[KernelConfig] = GRID) -> PriorCorrected:
    """Chooses the config on held-out folds of `observations`, measures its held-out error, trains on all of it."""
    obs = list(observations)
    smp = samples_of(obs)
    if len(smp.log_s) < 4:
        raise MeasurementError(f"training needs at least 2 pairs that ran together; got {len(smp.log_s) // 2}")
    prior = fit_prior(smp)
    prior_log = np.log(prior.predict(smp.selves, smp.partners))
    enc = Encoder.fit([*smp.selves, *smp.partners], [*smp.gpus, *smp.gpus])
    families = {p.model_family for o in obs for p in (o.a, o.b) if p.model_family}
    select_kind = "leave-one-model-out" if len(families) >= 3 else "kfold"
    select_folds = _folds(obs, select_kind, seed)
    best = None
    for cfg in grid:
        ker = _kernels(smp, enc, cfg)
        cross = _cross(obs, smp, prior_log, ker, cfg, select_folds)
        err = heldout_error(*_pooled(cross))["mape_norm"] if cross else math.inf
        if best is None or err < best[0]:
            best = (err, cfg, ker, cross)
    assert best is not None
    _, cfg, ker, chosen = best
    crosses = {select_kind: chosen}
    if select_kind != "kfold":
        crosses["kfold"] = _cross(obs, smp, prior_log, ker, cfg, _folds(obs, "kfold", seed))
    if len({o.gpu_type for o in obs}) >= 2:
        gpu_folds = _folds(obs, "leave-one-gpu-out", seed)
        crosses["leave-one-gpu-out"] = _cross(obs, smp, prior_log, ker, cfg, gpu_folds)
        for direction in ("up", "down"):  # the folds whose test type is bigger (smaller) than all of their training's
            folds = [(tr, te) for tr, te in gpu_folds
                     if shift_direction(obs[te[0]].gpu_type, sorted({obs[i].gpu_type for i in tr})) == direction]
            if folds:
                crosses[f"gpu-{direction}"] = _cross(obs, smp, prior_log, ker, cfg, folds)
    heldout = {kind: heldout_error(*_pooled(c)) for kind, c in crosses.items() if kind in HELDOUT_KINDS}
    alpha = _solve(ker.job * ker.gpu, smp.log_s - prior_log, cfg.lam)
    jobs, idx = distinct_jobs(enc.encode([*smp.selves, *smp.partners], [*smp.gpus, *smp.gpus]))
    n = len(smp.selves)
    fitted = Fitted(jobs, idx[:n], idx[n:], list(smp.gpus), alpha, smp.log_s - prior_log)
    mean_norm = 1.0 / float(np.mean(np.exp(smp.log_s)))
    model = PriorCorrected(prior, enc, cfg, fitted, mean_norm, heldout, sorted(set(smp.gpus)),
                           admission_tables(crosses))
    model.calibration = crosses
    return model


def admission_tables(crosses: dict[str, Cross], target: float = ADMISSION_TARGET) -> dict[str, np.ndarray]:
    """Admission thresholds per kind of pair (`admission`), from the held-out folds of the matching shift.

    seen: k-fold, pooled. Unseen family: leave-one-model-out (k-fold with fewer than 3 families), pooled and
    the mean of its folds' rates. Unseen GPU type: the worst single fold of leave-one-GPU-out, or of
    leave-one-model-out (k-fold) when training had one GPU type. Never below the seen thresholds.

    gpu_up (gpu_down): an unseen type with more (less) memory bandwidth than every training type, from the
    leave-one-GPU-out folds that shifted the same way (`shift_direction`), worst single fold. Sharing costs a
    job less on a bigger GPU, which its kernels fill less: a model carried to a bigger type under-predicts its
    normalized throughput, to a smaller one over-predicts it, so the fold of the other direction would be the
    wrong one to calibrate on. Where training had no such fold: for a smaller type the gpu thresholds; for a
    bigger one the family thresholds, since its shift in level errs on the safe side and what remains is a
    shift in jobs."""
    seen = thresholds(_worst(crosses["kfold"]), target=target)
    family_cross = crosses.get("leave-one-model-out", crosses["kfold"])
    family = np.maximum(seen, thresholds(_worst(family_cross), by_group="mean", target=target))

    def worst_fold(cross: Cross) -> np.ndarray:
        return np.maximum(seen, thresholds(_worst(cross), by_group="worst", target=target))

    gpu = worst_fold(crosses.get("leave-one-gpu-out", family_cross))
    return {"seen": seen, "family": family, "gpu": gpu,
            "gpu_up": worst_fold(crosses["gpu-up"]) if "gpu-up" in crosses else family,
            "gpu_down": worst_fold(crosses["gpu-down"]) if "gpu-down" in crosses else gpu}


def format_transfer(model: PriorCorrected, out: str) -> str:
    """What `elastico iac train` says about a prior-corrected model it saved at `out`."""
    c, m = model.config, model.margins
    lines = [f"chosen: lam={c.lam:g} num_scale={c.num_scale:g} family_sim={c.family_sim:g} batch={c.batch:g} "
             f"linear={c.linear:g} (gpu_scale={c.gpu_scale:g}, shared={c.shared:g}); "
             f"prior defaults sm={model.prior.default_sm:g} bw={model.prior.default_bw:g}; saved {out}",
             f"trained on GPU types {', '.join(model.gpu_types)}; {len(model.encoder.families)} families; "
             f"features {', '.join(model.encoder.numeric)}", "held-out error (normalized throughput):"]
    for kind, e in model.heldout.items():
        lines.append(f"  {kind:<20} MAPE {e['mape_norm']:.1%} over {int(e['n_pairs'])} pairs; "
                     f"{1 - FALSE_ADMISSION_TARGET:.0%} of pairs over-predicted by at most {e['over_q'] - 1:+.0%}")
    bars = {k: model.admission[k][FLOORS.index(REPORT_FLOOR)] for k in ADMISSION_KINDS}
    lines.append(f"admission at floor {REPORT_FLOOR}: a pair's worse job predicted at least {bars['seen']:.2f} (seen), "
                 f"{bars['family']:.2f} (an unseen family), {bars['gpu']:.2f} (an unseen GPU type; one with more "
                 f"bandwidth than all trained on {bars['gpu_up']:.2f}, less {bars['gpu_down']:.2f}), so that at most "
                 f"{ADMISSION_TARGET:.0%} of held-out bad pairs pass; gain-rule margins {m['gain_seen']:.2f} / "
                 f"{m['gain_family']:.2f} / {m['gain_gpu']:.2f}")
    return "\n".join(lines)
