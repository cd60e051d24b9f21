"""Goodput mode's arithmetic: the gradient noise scale, statistical efficiency, progress and learning-rate rules.

Pure numbers, no torch: the training loop (`runtime.train`) measures squared
gradient norms and hands them here; this module keeps the smoothed estimates,
says how much a step was worth and by how much to scale the learning rate.

Definitions (Pollux, Qiao et al., OSDI 2021, section 3.1; AdaptDL's
`gradient_noise_scale.py` and `scaling_rules.py`, whose estimator this follows):

- G is the true gradient, Σ the per-sample gradient covariance. The gradient
  noise scale is φ = tr(Σ) / |G|², in samples.
- Statistical efficiency of a step at global batch B relative to the
  submitted batch B0: E(B) = (φ + B0) / (φ + B). A step of B samples is worth
  B·E(B)/B0 steps at B0; that ratio is AdaScale's *gain*,
  gain(r) = (var + sqr) / (var / r + sqr) with r = B / B0, sqr = |G|² and
  var = tr(Σ)/B0 (the variance of a B0-sample gradient). The two agree:
  (tr Σ/B0 + |G|²) / (tr Σ/B + |G|²) = B (φ + B0) / (B0 (φ + B)).
  So `progress` grows by gain(r) per step, in steps of the submitted batch;
  at B = B0 the gain is exactly 1 and progress is the step count.

Estimator (unbiased, from n ≥ 2 gradients of the same step, each the mean
over b samples, n·b = B): with `local` the mean of the n squared norms and
`total` the squared norm of their mean,

    |G|²  ≈ (n·total − local) / (n − 1)
    tr(Σ)/B0 ≈ (local − total) · r / (n − 1)          (r = B / B0)

The n gradients are the micro-batches of every rank (accumulation × ranks).
A step with one gradient (one micro-batch on one rank) uses the previous
step's gradient as the second one (AdaptDL's differenced estimate, biased
because the parameters moved in between); the first unbiased step after such
steps starts the averages afresh. Both are smoothed by a bias-corrected
exponential average with factor 0.999^r per step (AdaptDL's), so a larger
batch, which carries more information, moves the average more.

Learning-rate rules (the factor multiplies each parameter group's `lr` for
one optimizer step): `adascale` = gain(r) for SGD, gain(r)^0.5 for Adam,
AdamW and RMSprop (AdaptDL's AdamScale variant: adaptive optimizers scale
by the square root); `sqrt` = √r; `linear` = r (SGD only: Goyal et al.'s rule,
which overshoots with adaptive optimizers). Progress is counted by the gain
under every rule: it measures what the samples were worth, not how the step
was taken.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LR_RULES = ("adascale", "sqrt", "linear")
"""The `batch.lr_scaling` values a family may name; `adascale` is the default."""
DEFAULT_RULE = "adascale"

SMOOTHING = 0.999
"""Per-step factor of the exponential averages at r = 1 (AdaptDL's)."""
MIN_VAR = 1e-6
"""Floor of the variance estimate in the gain (AdaptDL's), so a noise-free start gives gain 1, not 0/0."""

SGD_LIKE = ("SGD",)
ADAPTIVE = ("Adam", "AdamW", "RMSprop")
SUPPORTED: dict[str, tuple[str, ...]] = {
    "adascale": SGD_LIKE + ADAPTIVE,
    "sqrt": SGD_LIKE + ADAPTIVE,
    "linear": SGD_LIKE,
}
"""Torch optimizer class names each rule supports (subclasses count as their base)."""


def efficiency(phi: float, batch: float, base: float) -> float:
    """E(B) = (φ + B0) / (φ + B): what one sample at global batch `batch` is worth relative to one at `base`.

    φ = inf (no signal measured yet, all noise) gives 1; φ = 0 (no noise) gives B0/B."""
    if batch <= 0 or base <= 0:
        raise ValueError(f"batches must be positive, got batch={batch}, base={base}")
    if math.isinf(phi):
        return 1.0
    return (phi + base) / (phi + batch)


def step_worth(phi: float, batch: float, base: float) -> float:
    """Steps of the submitted batch that one step at `batch` is worth: (B / B0) · E(B)."""
    return batch / base * efficiency(phi, batch, base)


def optimizer_rule_problem(rule: str, optimizer: Any) -> str | None:
    """Why `rule` cannot scale `optimizer`'s learning rate (None: it can), naming what is allowed."""
    if rule not in LR_RULES:
        return f"batch.lr_scaling {rule!r} is not allowed; allowed: {', '.join(LR_RULES)}"
    names = [c.__name__ for c in type(optimizer).__mro__]
    if not any(n in SUPPORTED[rule] for n in names):
        return (f"batch.lr_scaling {rule!r} does not support the optimizer {type(optimizer).__name__}; "
                f"allowed with {rule}: torch.optim {', '.join(SUPPORTED[rule])}"
                + ("; sqrt also takes Adam, AdamW and RMSprop" if rule == "linear" else ""))
    bad = [i for i, g in enumerate(optimizer.param_groups)
           if isinstance(g.get("lr"), bool) or not isinstance(g.get("lr"), (int, float))]
    if bad:
        return (f"batch.lr_scaling {rule!r}: parameter group(s) {bad} have no numeric lr "
                "(a tensor lr cannot be scaled step by step); allowed: a float lr")
    return None


def _adaptive(optimizer: Any) -> bool:
    return any(c.__name__ in ADAPTIVE for c in type(optimizer).__mro__)


@dataclass
class NoiseScale:
    """Smoothed estimates of |G|² (`sqr`) and tr(Σ)/B0 (`var`) and the statistical progress made with them.

    Mutable, owned by one training run; `to_state()` / `from_state()` carry it
    in the checkpoint so a resume continues with exactly the same numbers.
    Starts as AdaptDL does: sqr 1, var 0 (gain 1 at any batch until measured).
    """

    base_batch: int
    sqr: float = 1.0
    var: float = 0.0
    sqr_biased: float = 0.0
    var_biased: float = 0.0
    unbias: float = 0.0
    biased: bool = False
    """The averages hold differenced (one-gradient) estimates."""
    progress: float = 0.0
    """Statistical progress: steps of `base_batch` the steps so far were worth (sum of their gains)."""
    samples: int = 0
    """Samples the job has used (the position in its data stream)."""
    steps: int = 0
    """Optimizer steps taken, at whatever batch."""
    measured: bool = False
    """At least one estimate has entered the averages."""

    def __post_init__(self) -> None:
        if not isinstance(self.base_batch, int) or isinstance(self.base_batch, bool) or self.base_batch < 1:
            raise ValueError(f"base_batch={self.base_batch!r} must be an integer >= 1")

    # -- estimates

    def gain(self, batch: float) -> float:
        """AdaScale's gain at global batch `batch`: (var + sqr) / (var / r + sqr), r = batch / base; 1 at the base."""
        r = batch / self.base_batch
        var, sqr = max(self.var, MIN_VAR), max(self.sqr, 0.0)
        return (var + sqr) / (var / r + sqr)

    @property
    def phi(self) -> float | None:
        """The gradient noise scale φ = tr(Σ)/|G|² in samples, from the same floored estimates the gain uses (so
        `step_worth(phi, B, B0)` is the gain a step at B is counted); None before any measurement, inf when the
        estimate of |G|² is not above 0 (noise swamps the signal: a step at any batch counts B/B0 steps)."""
        if not self.measured:
            return None
        var, sqr = max(self.var, MIN_VAR), max(self.sqr, 0.0)
        return var * self.base_batch / sqr if sqr > 0 else math.inf

    def lr_factor(self, rule: str, batch: float, optimizer: Any = None) -> float:
        """The factor `rule` applies to the learning rate for a step at `batch` (module docstring)."""
        r = batch / self.base_batch
        if rule == "adascale":
            g = self.gain(batch)
            return math.sqrt(g) if optimizer is not None and _adaptive(optimizer) else g
        if rule == "sqrt":
            return math.sqrt(r)
        if rule == "linear":
            return r
        raise ValueError(f"lr rule {rule!r} is not one of {', '.join(LR_RULES)}")

    def observe(self, local_sqr: float, total_sqr: float, count: int, batch: int) -> bool:
        """Fold one step's gradient statistics into the averages; False (nothing changed) when they are unusable.

        `local_sqr`: mean squared norm of the `count` gradients (each over batch / count samples);
        `total_sqr`: squared norm of their mean (the step's gradient). With count 1 the caller passes the
        differenced pair (this and the previous step's gradient) as count 2 and `biased=True` via
        `observe_differenced`.
        """
        return self._fold(local_sqr, total_sqr, count, batch, biased=False)

    def observe_differenced(self, local_sqr: float, total_sqr: float, batch: int) -> bool:
        """`observe` for two consecutive steps' gradients (one gradient per step): a biased estimate."""
        return self._fold(local_sqr, total_sqr, 2, 2 * batch, biased=True)

    def _fold(self, local_sqr: float, total_sqr: float, count: int, batch: int, biased: bool) -> bool:
        if count < 2 or not (math.isfinite(local_sqr) and math.isfinite(total_sqr)):
            return False
        if self.biased and not biased:  # the first unbiased estimate replaces the differenced ones
            self.sqr_biased = self.var_biased = self.unbias = 0.0
        self.biased = biased
        r = batch / self.base_batch
        grad_sqr = (count * total_sqr - local_sqr) / (count - 1)
        grad_var = (local_sqr - total_sqr) * r / (count - 1)
        theta = SMOOTHING**r
        self.sqr_biased = theta * self.sqr_biased + (1 - theta) * grad_sqr
        self.var_biased = theta * self.var_biased + (1 - theta) * grad_var
        self.unbias = theta * self.unbias + (1 - theta)
        self.sqr = self.sqr_biased / self.unbias
        self.var = self.var_biased / self.unbias
        self.measured = True
        return True

    # -- accounting

    def count_step(self, batch: int) -> float:
        """Count one optimizer step at `batch` with the current estimates; returns what it was worth."""
        worth = self.gain(batch)
        self.progress += worth
        self.samples += batch
        self.steps += 1
        return worth

    def to_state(self) -> dict[str, Any]:
        """Plain numbers for the checkpoint (loads with weights_only=True)."""
        return {k: getattr(self, k) for k in _FIELDS}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> NoiseScale:
        return cls(**{k: state[k] for k in _FIELDS if k in state})


_FIELDS = ("base_batch", "sqr", "var", "sqr_biased", "var_biased", "unbias", "biased", "progress", "samples",
           "steps", "measured")


def done(progress: float, work: float) -> bool:
    """Whether `progress` (steps of the submitted batch) has reached the job's `work`.

    A tolerance of 1e-9 steps per step absorbs the rounding of the running sum (at the submitted batch every
    gain is exactly 1.0 and the sum is exact)."""
    return progress >= work - 1e-9 * max(work, 1.0)
