"""The correction's kernel: how alike two jobs, two pairs and two GPU types are, and the ridge solve on it.

    k = [k_job(a, a') · k_job(b, b') + linear · (φ(a)·φ(a') + φ(b)·φ(b'))] · k_gpu(gpu, gpu')

(the package docstring says why each part is there). `KernelConfig` holds the hyper-parameters `fit` chooses;
`sample_kernels` builds the kernel between training samples in its parts, which `fit` slices per held-out fold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slurm_elastico.interference.specs import spec_of
from slurm_elastico.interference.transfer.encoding import NUMERIC, Jobs

LINEAR = ("log_steps_per_bw", "sm_util", "membw_util", "mem_used_gib", "mps_share")  # monotone demand features
LINEAR_CLIP = 3.0  # standard deviations: how far the linear part extrapolates
_BATCH = NUMERIC.index("log_batch")
_LINEAR = [NUMERIC.index(n) for n in LINEAR]


@dataclass(frozen=True)
class KernelConfig:
    """The correction's hyper-parameters (`fit.GRID`: those `fit_transfer` chooses from)."""

    lam: float = 0.1  # noise variance on log S residuals (ridge)
    num_scale: float = 1.0  # length scale of the standardized numeric features
    family_sim: float = 0.3  # kernel factor between different (or unknown) model families
    gpu_scale: float = 1.0  # length scale of the GPU spec vector (ln units)
    shared: float = 0.5  # part of the correction taken to hold on every GPU type
    batch: float = 1.0  # weight of log batch in the distance of two jobs (0: batches are not compared)
    linear: float = 0.0  # prior variance of the correction's additive linear part (`LINEAR`); 0: none


def job_kernel(a: Jobs, b: Jobs, cfg: KernelConfig) -> np.ndarray:
    """(len(a), len(b)) similarity of jobs, in (0, 1]."""
    return similarity(*distance2(a, b, cfg), cfg)


def similarity(d2: np.ndarray, same_family: np.ndarray, cfg: KernelConfig) -> np.ndarray:
    """`job_kernel` from `distance2`'s answer (callers that also need the distances compute them once)."""
    return np.exp(-0.5 * d2) * np.where(same_family, 1.0, cfg.family_sim)


def distance2(a: Jobs, b: Jobs, cfg: KernelConfig) -> tuple[np.ndarray, np.ndarray]:
    """(squared distance of every job of `a` to every job of `b` apart from their families, whether they share a
    known family)."""
    d2 = np.zeros((len(a.family), len(b.family)))
    for j in range(a.x.shape[1]):
        weight = cfg.batch if j == _BATCH else 1.0
        if weight == 0.0:
            continue
        xa, xb = a.x[:, j][:, None], b.x[:, j][None, :]
        na, nb = np.isnan(xa), np.isnan(xb)
        if not (na.any() or nb.any()):  # (the same sum without the masks: the planner's epoch encodes every shape)
            d2 += weight * ((xa - xb) / cfg.num_scale) ** 2
            continue
        # (the same sum where one side never measured it, as the planner's shapes their batch and the training
        # pairs their counters: 0 + (na ^ nb), the other side's measured mask)
        if na.all() or nb.all():
            d2 += weight * ~(nb if na.all() else na)
            continue
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
    """exp(−d²/2) of each job's distance (`distance2`, rows) to its nearest training job (columns), families
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
class Kernels:
    """The training samples' kernel pieces for one config, computed once and sliced per fold."""

    job: np.ndarray  # k_job(self) · k_job(partner) (+ the linear part), (N, N)
    gpu: np.ndarray  # k_gpu, (N, N)
    # With a linear part: that part alone (N, N), each sample's self and partner among the distinct jobs, and
    # their squared distances (`distance2`): a held-out sample's linear part is weighed by its jobs' `nearness`
    # to the fold's training jobs, as `PriorCorrected` weighs it.
    linear: np.ndarray | None = None
    self_job: np.ndarray | None = None
    partner_job: np.ndarray | None = None
    d2: np.ndarray | None = None


def sample_kernels(jobs: Jobs, self_idx: np.ndarray, partner_idx: np.ndarray, gpus: Sequence[str],
                   cfg: KernelConfig) -> Kernels:
    """The kernel between samples (self jobs[self_idx], partner jobs[partner_idx], GPU type gpus), in its parts."""
    d2, same_family = distance2(jobs, jobs, cfg)
    ku = similarity(d2, same_family, cfg)
    types = sorted(set(gpus))
    g = np.array([types.index(x) for x in gpus], dtype=np.int64)
    job = ku[np.ix_(self_idx, self_idx)] * ku[np.ix_(partner_idx, partner_idx)]
    gpu = gpu_kernel(types, types, cfg)[np.ix_(g, g)]
    if not cfg.linear:
        return Kernels(job, gpu)
    phi = linear_features(jobs)
    linear = cfg.linear * (phi[self_idx] @ phi[self_idx].T + phi[partner_idx] @ phi[partner_idx].T)
    return Kernels(job + linear, gpu, linear, self_idx, partner_idx, d2)


def solve(k: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """(K + lam·I)⁻¹ y by Cholesky (K is a product of positive semi-definite kernels, so K + lam·I is definite)."""
    from scipy.linalg import cho_factor, cho_solve

    return cho_solve(cho_factor(k + lam * np.eye(len(y)), lower=True, check_finite=False), y, check_finite=False)
