"""A job's speed on a GPU type where it has not run: what it measured elsewhere, scaled by a roofline mix of specs.

Why: on a mixed cluster the planner chooses the type too, and a job has run
on one type or none. A guess from the specs alone is far off for a job that
is bound by its host or its kernel launches, so the estimate always starts
from what the job itself measured (its progress reports, per shape) and only
the *ratio* between types comes from the specs (`gpu_types`).

The ratio (`ratio`), a roofline mix (Williams, Waterman and Patterson,
"Roofline", CACM 2009) of the spec ratios: of one step on the source type a
share `1 - g` does not depend on the GPU (host, data loading, kernel-launch
gaps); of the GPU-bound rest a share `c` is compute bound (scales with the
peak at the job's precision) and `1 - c` memory-bandwidth bound. So

    speed_dst / speed_src = 1 / ((1 - g) + g * (c * F_src/F_dst + (1 - c) * B_src/B_dst))

which grows with every figure of the destination and falls with the
source's. `PRIOR_MIX` gives g and c per kind and precision; none is fitted
to any measurement set (see its docstring for where each comes from).

Uncertainty (`Estimate.sigma`, a relative sigma, in log space): the
half-range of the ratio over the plausible mixes (`G_RANGE` x `C_RANGE`,
read as a 95 % range, so half of it is about 1 sigma), plus `SIGMA_FLOOR`
for what no spec says (another host, driver, clocks). Types with equal
figures get the floor; the further apart the specs, the wider the range. The
planner can discount an uncertain estimate with `Estimate.conservative()`
(the `CONSERVATIVE_Q` quantile of the log-normal).

Online correction, the rule (`estimate`):
1. a type the job has measured (a shape's solo progress there) is that
   measurement, sigma `MEASURED_SIGMA`: it replaces the estimate outright;
2. with two or more measured types, `g` is refitted to the job's own measured
   ratios (least squares in log space over `FIT_GRID`; c stays the prior's),
   so what one new type showed rescales every unmeasured type; the fit's
   residual (RMS of the log errors) adds to each sigma, and the sigma's range
   then spans only `C_RANGE` (g is no longer a guess);
3. each measured type predicts the unmeasured one through `ratio`; the
   predictions are averaged in log space weighted by 1/sigma^2, and the sigma
   kept is the smallest one's (the predictions share the job's errors, so
   averaging does not make them independent evidence).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist

from slurm_elastico.shapes.gpu_types import GpuSpec


@dataclass(frozen=True)
class Mix:
    """Shares of a step: `gpu` bound by the GPU at all (g), and of that `compute` bound by its peak (c)."""

    gpu: float
    compute: float


PRIOR_MIX: dict[tuple[str, str], Mix] = {
    ("train", "fp32"): Mix(0.9, 0.7),
    ("train", "half"): Mix(0.9, 0.4),
    ("infer", "half"): Mix(0.95, 0.2),
}
"""Judgement priors, not fitted. g = 0.9 for training: a tenth of a step for the host (input pipeline, optimizer
step launch, Python), the order of magnitude profilers show for well-fed jobs. c = 0.7 in fp32: convolutions and
matmuls dominate FP32 training time. In fp16/bf16 the matmuls run on tensor cores several times faster while
normalisation and element-wise kernels only halve their bytes; NVIDIA's mixed-precision training guide reports 2-3x
whole-step speed-ups on Volta for an 8x tensor-core peak, which leaves about half of the GPU time outside the matmuls
(c = 0.4). Inference decode reads the weights and KV cache once per token and is bandwidth bound (Kwon et al.,
vLLM, SOSP 2023), c = 0.2 for prefill's share, g = 0.95 (the engine batches on the GPU)."""

G_RANGE = (0.5, 1.0)
"""Plausible GPU-bound shares: from half (a small model whose step is mostly launch gaps) to all of it."""
C_RANGE = (0.0, 1.0)
"""Plausible compute-bound shares of the GPU time: any."""
SIGMA_FLOOR = 0.08
"""Relative sigma between two GPUs of identical figures: clocks, cooling, host and driver (a few percent each)."""
MEASURED_SIGMA = 0.03
"""Relative sigma of a measured speed: reports over tens of seconds, step-time noise of a few percent."""
CONSERVATIVE_Q = 0.2
"""The quantile `Estimate.conservative` gives: four times in five the true speed is above it."""
FIT_GRID = tuple(i / 100 for i in range(101))
"""Values of g tried when the job measured two or more types."""


@dataclass(frozen=True)
class Estimate:
    """A speed and its relative uncertainty (sigma of the log), and whether it was measured on that type."""

    value: float
    sigma: float
    measured: bool = False

    def quantile(self, q: float) -> float:
        """The speed at quantile `q` of a log-normal around `value` with `sigma`."""
        return self.value * math.exp(_z(q) * self.sigma)

    def conservative(self, q: float = CONSERVATIVE_Q) -> float:
        """A speed the job beats with probability 1 - q: what a planner that discounts uncertainty plans with."""
        return self.quantile(q)

    def covers(self, truth: float, k: float = 1.0) -> bool:
        """Is `truth` within k sigma (in log space) of the estimate?"""
        return abs(math.log(truth / self.value)) <= k * self.sigma


@functools.lru_cache(maxsize=16)
def _z(q: float) -> float:
    """The standard normal's quantile q (the planner asks the same one for every shape: computed once)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"a quantile is in (0, 1), not {q!r}")
    return NormalDist().inv_cdf(q)


def discounted(throughput: float, sigma: float, q: float = CONSERVATIVE_Q) -> float:
    """A shape's throughput at quantile q of its uncertainty (`Shape.throughput_sigma`): what a planner that
    discounts estimates carried over from other GPU types plans with; the throughput itself when sigma is 0."""
    return Estimate(throughput, sigma).quantile(q) if sigma > 0 else throughput


def precision_class(kind: str, precision: str) -> str:
    """The precision that sets the compute peak: fp32, or "half" (fp16/bf16 tensor cores); inference is half."""
    return "half" if kind == "infer" or precision in ("fp16", "bf16") else "fp32"


def prior_mix(kind: str, precision: str) -> Mix:
    return PRIOR_MIX.get((kind, precision_class(kind, precision)), PRIOR_MIX[("train", "fp32")])


def _peak(spec: GpuSpec, cls: str) -> float:
    """The compute peak of a precision class: fp32, or the best tensor rate (fp16 where bf16 is missing)."""
    return spec.fp32_tflops if cls == "fp32" else max(spec.fp16_tflops, spec.bf16_tflops) or spec.fp32_tflops


def ratio(src: GpuSpec, dst: GpuSpec, cls: str, mix: Mix) -> float:
    """speed on `dst` / speed on `src` for a step of `mix` at precision class `cls` (see the module text)."""
    f = _peak(src, cls) / _peak(dst, cls)
    b = src.mem_bw_gbs / dst.mem_bw_gbs
    return 1.0 / ((1.0 - mix.gpu) + mix.gpu * (mix.compute * f + (1.0 - mix.compute) * b))


@functools.lru_cache(maxsize=4096)
def spread_sigma(src: GpuSpec, dst: GpuSpec, cls: str, mix: Mix, fitted: bool = False, residual: float = 0.0) -> float:
    """The relative sigma of `ratio`: half the log-range over the plausible mixes, the floor and a fit residual."""
    gs = (mix.gpu,) if fitted else G_RANGE
    centre = math.log(ratio(src, dst, cls, mix))
    far = max(abs(math.log(ratio(src, dst, cls, Mix(g, c))) - centre) for g in gs for c in C_RANGE)
    return math.sqrt(SIGMA_FLOOR ** 2 + (far / 2.0) ** 2 + residual ** 2)


def fit_gpu_share(measured: Mapping[str, float], specs: Mapping[str, GpuSpec], cls: str, prior: Mix) -> tuple[Mix, float]:
    """(the mix with g refitted to the measured ratios, the RMS log residual); the prior with 0 for one type."""
    types = sorted(measured)
    pairs = [(a, b) for i, a in enumerate(types) for b in types[i + 1:]]
    if not pairs:
        return prior, 0.0

    def err(g: float) -> float:
        m = Mix(g, prior.compute)
        return sum((math.log(measured[b] / measured[a]) - math.log(ratio(specs[a], specs[b], cls, m))) ** 2
                   for a, b in pairs)

    best = min(FIT_GRID, key=lambda g: (err(g), abs(g - prior.gpu)))
    return Mix(best, prior.compute), math.sqrt(err(best) / len(pairs))


def estimate(measured: Mapping[str, float], target: str, specs: Mapping[str, GpuSpec], kind: str,
             precision: str, mix: Mix | None = None) -> Estimate:
    """The speed of one shape on GPU type `target` from its measured speeds per type (the rule in the module text).

    `measured` maps type -> speed (work units/s, > 0) where the job ran this shape; `specs` has every type named.
    Raises ValueError without a measurement: the caller falls back to the family's own estimate then.
    """
    good = {t: v for t, v in measured.items() if v > 0 and math.isfinite(v)}
    if target in good:
        return Estimate(good[target], MEASURED_SIGMA, True)
    if not good:
        raise ValueError(f"no measured speed to scale to {target!r}")
    cls = precision_class(kind, precision)
    prior = mix or prior_mix(kind, precision)
    fitted, residual = fit_gpu_share(good, specs, cls, prior)
    refit = len(good) > 1
    logs, weights, sigmas = [], [], []
    for t, v in sorted(good.items()):
        s = spread_sigma(specs[t], specs[target], cls, fitted, refit, residual)
        logs.append(math.log(v * ratio(specs[t], specs[target], cls, fitted)))
        weights.append(1.0 / s ** 2)
        sigmas.append(s)
    value = math.exp(sum(w * x for w, x in zip(weights, logs)) / sum(weights))
    return Estimate(value, min(sigmas))


def from_reference(speed: float, reference: GpuSpec, target: GpuSpec, kind: str, precision: str) -> Estimate:
    """A speed known (declared or estimated) for `reference` scaled to `target`: one anchor, the prior mix."""
    unit = _transfer(reference, target, kind, precision)
    return Estimate(speed * unit.value, unit.sigma)


@functools.lru_cache(maxsize=4096)
def _transfer(reference: GpuSpec, target: GpuSpec, kind: str, precision: str) -> Estimate:
    """`from_reference` of a unit speed, once per pair of types (a family asks it for every shape)."""
    if reference == target:
        return Estimate(1.0, SIGMA_FLOOR)
    return estimate({"from": 1.0}, "to", {"from": reference, "to": target}, kind, precision)
