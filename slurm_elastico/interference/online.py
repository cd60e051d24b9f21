"""Online refinement: learn from slowdowns observed on the cluster, roll back when it makes things worse.

After each epoch that observed co-location slowdowns (`slurm_elastico.observe`)
the helper calls `refine`: a learner over the model's reference data and the
earlier observations, then `OnlineLearner.observe` of the new ones; the
helper replaces the model file (atomically) only when the update is kept.
The model is fine-tuned on a bounded replay buffer
(trusted reference data, e.g. what it was trained on, then new observations)
so old knowledge is not forgotten. Two held-out sets judge the update: one
from the reference data, fixed, and one of every `holdout_every`-th new
observation. If the error on either grows by more than `tolerance`
(relative) plus `slack` (absolute), the previous weights are restored. The fixed reference part is
what catches poisoned input: bad measurements (a crashed job, a broken
monitor) fit themselves, so only trusted data shows the damage. The trap:
when the hardware itself changes, the reference goes stale; build a new
learner with fresh reference data then. Fine-tuning never widens the model's
`Coverage`: pairs on a GPU type it was not trained on stay on the cautious
view (`MlpPredictor.on_gpu`) until it is retrained with `elastico iac train`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slurm_elastico.interference.measurements import Colocation, samples
from slurm_elastico.interference.predictor import MlpPredictor


@dataclass(frozen=True)
class UpdateResult:
    accepted: bool  # False: the update was rolled back
    error_before: float  # MAPE of normalized throughput on the reference held-out set, before the update
    error_after: float  # ... after it (before any rollback)
    recent_before: float  # the same on held-out new observations (NaN while there are none)
    recent_after: float
    replay_size: int


def holdout_error(model: MlpPredictor, observations: Sequence[Colocation]) -> float:
    """MAPE of the predicted normalized throughput on the fitting pairs (both directions)."""
    selves, partners, norms, _ = samples(observations)
    if not norms:
        return float("nan")
    truth = np.array(norms)
    return float(np.mean(np.abs(1.0 / model.predict(selves, partners) - truth) / truth))


class OnlineLearner:
    """Refines `model` in place from new observations, with a bounded replay buffer and held-out rollback."""

    def __init__(self, model: MlpPredictor, reference: Sequence[Colocation], replay_size: int = 2000,
                 holdout_size: int = 500, holdout_every: int = 5, epochs: int = 40, lr: float = 3e-3,
                 tolerance: float = 0.10, slack: float = 0.01):
        if holdout_every < 2:
            raise ValueError(f"holdout_every must be >= 2 (one in N goes to the held-out set), got {holdout_every}")
        self.model = model
        self.replay: deque[Colocation] = deque(maxlen=replay_size)
        self.reference: deque[Colocation] = deque(maxlen=holdout_size)
        self.recent: deque[Colocation] = deque(maxlen=holdout_size)
        self.holdout_every = holdout_every
        self.epochs = epochs
        self.lr = lr
        self.tolerance = tolerance
        self.slack = slack  # absolute MAPE slack: a 7 % -> 8 % wobble on a small set is noise, not drift
        self._seen = 0
        self._route([o for o in reference if o.fits], self.reference)

    def _route(self, observations: Sequence[Colocation], holdout: deque) -> None:
        for obs in observations:
            self._seen += 1
            (holdout if self._seen % self.holdout_every == 0 else self.replay).append(obs)

    def _worse(self, before: float, after: float) -> bool:
        return after > before * (1.0 + self.tolerance) + self.slack  # NaN (empty set) is never worse

    def remember(self, observations: Sequence[Colocation]) -> None:
        """Adds earlier observations without training (a helper that restarts rebuilds its learner this way)."""
        self._route([o for o in observations if o.fits], self.recent)

    def observe(self, observations: Sequence[Colocation]) -> UpdateResult:
        """Adds new observations, fine-tunes, and keeps the new weights only if both held-out errors hold."""
        self._route([o for o in observations if o.fits], self.recent)
        before = holdout_error(self.model, self.reference), holdout_error(self.model, self.recent)
        saved = self.model.state()
        self.model.fine_tune(list(self.replay), self.epochs, self.lr)
        after = holdout_error(self.model, self.reference), holdout_error(self.model, self.recent)
        accepted = not (self._worse(before[0], after[0]) or self._worse(before[1], after[1]))
        if not accepted:
            self.model.restore(saved)
        return UpdateResult(accepted, before[0], after[0], before[1], after[1], len(self.replay))


def refine(model: MlpPredictor, reference: Sequence[Colocation], earlier: Sequence[Colocation],
           new: Sequence[Colocation], **learner_args) -> UpdateResult:
    """One online update of `model` in place: replay = reference + `earlier` + `new`, judged as `observe` does."""
    learner = OnlineLearner(model, reference, **learner_args)
    learner.remember(earlier)
    return learner.observe(new)
