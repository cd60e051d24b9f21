"""Online refinement: learn from slowdowns observed on the cluster, roll back when it makes things worse.

After each epoch the helper hands the observed co-location slowdowns to
`OnlineLearner.observe`. Every `holdout_every`-th new observation goes to a
bounded held-out set, the others to a bounded replay buffer; both start from
trusted reference data (e.g. what the model was trained on) so the replay
keeps old knowledge from being forgotten and the held-out check can notice
drift. The model is fine-tuned on the replay buffer; if its held-out error
then grows by more than `tolerance` (relative), the previous weights are
restored. Bad measurements (a crashed job, a mislabelled pair) thus cannot
quietly poison the planner.
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
    error_before: float  # held-out MAPE of normalized throughput before the update
    error_after: float  # ... after it (before any rollback)
    replay_size: int
    holdout_size: int


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
                 tolerance: float = 0.10):
        if holdout_every < 2:
            raise ValueError(f"holdout_every must be >= 2 (one in N goes to the held-out set), got {holdout_every}")
        self.model = model
        self.replay: deque[Colocation] = deque(maxlen=replay_size)
        self.holdout: deque[Colocation] = deque(maxlen=holdout_size)
        self.holdout_every = holdout_every
        self.epochs = epochs
        self.lr = lr
        self.tolerance = tolerance
        self._seen = 0
        self._route([o for o in reference if o.fits])

    def _route(self, observations: Sequence[Colocation]) -> None:
        for obs in observations:
            self._seen += 1
            (self.holdout if self._seen % self.holdout_every == 0 else self.replay).append(obs)

    def observe(self, observations: Sequence[Colocation]) -> UpdateResult:
        """Adds new observations, fine-tunes, and keeps the new weights only if the held-out error holds."""
        self._route([o for o in observations if o.fits])
        before = holdout_error(self.model, self.holdout)
        saved = self.model.state()
        self.model.fine_tune(list(self.replay), self.epochs, self.lr)
        after = holdout_error(self.model, self.holdout)
        accepted = not (after > before * (1.0 + self.tolerance))  # NaN (empty holdout) accepts
        if not accepted:
            self.model.restore(saved)
        return UpdateResult(accepted, before, after, len(self.replay), len(self.holdout))
