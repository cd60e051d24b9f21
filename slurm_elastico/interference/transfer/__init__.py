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

The modules, in the order they build on one another: `encoding` (a job's
features, GPU types by bandwidth), `kernel` (the correction's kernel and its
solve), `training` (the samples, the fitted prior, the fitted weights),
`calibration` (held-out error, admission thresholds and gain margins),
`modelfile` (the JSON model file), `model` (`PriorCorrected`: predictions, views,
online refits) and `fit` (`fit_transfer`: config choice on held-out folds,
then the model; `format_transfer`).
"""
