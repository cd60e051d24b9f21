"""What the correction is trained on and what it keeps: the samples, the prior fitted to them, the weights.

`samples_of` turns observed pairs into samples (both directions of each pair; a measured speed-up trains as no
slowdown); `fit_prior` chooses the contention model's defaults for unmeasured counters; `Fitted` holds the
training samples through their distinct jobs with the kernel weights solved for them (`refit`), and grows by
the observations of online learning (`plus`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slurm_elastico.interference.base import ContentionModel, SoloProfile
from slurm_elastico.interference.measurements import Colocation, samples
from slurm_elastico.interference.transfer.encoding import Jobs, distinct_jobs
from slurm_elastico.interference.transfer.kernel import KernelConfig, sample_kernels, solve

PRIOR_SM = tuple(np.round(np.arange(0.30, 1.001, 0.05), 2))
PRIOR_BW = tuple(np.round(np.arange(0.10, 0.901, 0.10), 2))


@dataclass
class Samples:
    """Both directions of every fitting pair: self, partner, GPU type, observed log S (>= 0), index of the pair."""

    selves: list[SoloProfile]
    partners: list[SoloProfile]
    gpus: list[str]
    log_s: np.ndarray
    pair: np.ndarray


def samples_of(observations: Sequence[Colocation]) -> Samples:
    """The samples of `observations`' pairs that ran together, both directions of each."""
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
        ker = sample_kernels(self.jobs, self.self_idx, self.partner_idx, self.gpus, cfg)
        return Fitted(self.jobs, self.self_idx, self.partner_idx, self.gpus,
                      solve(ker.job * ker.gpu, self.target, cfg.lam), self.target)

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
