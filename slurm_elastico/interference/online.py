"""Online refinement: learn from slowdowns observed on the cluster, roll back when it makes things worse.

After each epoch that observed co-location slowdowns (`slurm_elastico.helper.observe`)
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
The prior-corrected predictor (`transfer.model.PriorCorrected`) is refined the same
way, without torch: its `fine_tune` refits the correction on the replay (its
margins and the GPU types it counts as seen stay as trained; observations on
the cluster's GPU type weigh fully there).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from slurm_elastico.interference.measurements import Colocation, samples
from slurm_elastico.interference.scoring import view_for

if TYPE_CHECKING:  # the learner needs predict, fine_tune, state and restore, not torch
    from slurm_elastico.interference.predictor import MlpPredictor
    from slurm_elastico.interference.transfer.model import PriorCorrected

    Refinable = MlpPredictor | PriorCorrected


@dataclass(frozen=True)
class UpdateResult:
    accepted: bool  # False: the update was rolled back
    error_before: float  # MAPE of normalized throughput on the reference held-out set, before the update
    error_after: float  # ... after it (before any rollback)
    recent_before: float  # the same on held-out new observations (NaN while there are none)
    recent_after: float
    replay_size: int


def holdout_error(model: Refinable, observations: Sequence[Colocation]) -> float:
    """MAPE of the predicted normalized throughput on the fitting pairs (both directions), each GPU type's
    pairs asked of the model's view of that type (`on_gpu`), as the planner asks it."""
    errors = []
    for gpu in sorted({o.gpu_type for o in observations}):
        selves, partners, norms, _ = samples([o for o in observations if o.gpu_type == gpu])
        if norms:
            truth = np.array(norms)
            errors.append(np.abs(1.0 / view_for(model, gpu).predict(selves, partners) - truth) / truth)
    return float(np.mean(np.concatenate(errors))) if errors else float("nan")


class OnlineLearner:
    """Refines `model` in place from new observations, with a bounded replay buffer and held-out rollback.

    The replay is the reference data's training part (kept whole: new observations never push it out)
    plus the newest `replay_size` observations. Which observations are held out is decided by a key when
    one is given (e.g. the store's row id: the same row is held out in every epoch), else by arrival order.
    `baseline_error` (e.g. the reference error of the model as first trained) caps drift across updates:
    the reference error must hold against the lower of it and the error before this update.
    """

    def __init__(self, model: Refinable, reference: Sequence[Colocation], replay_size: int = 2000,
                 holdout_size: int = 500, holdout_every: int = 5, epochs: int = 40, lr: float = 3e-3,
                 tolerance: float = 0.10, slack: float = 0.01, baseline_error: float | None = None):
        if holdout_every < 2:
            raise ValueError(f"holdout_every must be >= 2 (one in N goes to the held-out set), got {holdout_every}")
        self.model = model
        self.anchor: list[Colocation] = []
        self.replay: deque[Colocation] = deque(maxlen=replay_size)
        self.reference: deque[Colocation] = deque(maxlen=holdout_size)
        self.recent: deque[Colocation] = deque(maxlen=holdout_size)
        self.holdout_every = holdout_every
        self.epochs = epochs
        self.lr = lr
        self.tolerance = tolerance
        self.slack = slack  # absolute MAPE slack: a 7 % -> 8 % wobble on a small set is noise, not drift
        self.baseline_error = baseline_error
        self._seen = 0
        for i, obs in enumerate(o for o in reference if o.fits):
            (self.reference if (i + 1) % holdout_every == 0 else self.anchor).append(obs)

    def _route(self, observations: Sequence[Colocation], keys: Sequence[int] | None) -> None:
        for i, obs in enumerate(observations):
            if not obs.fits:
                continue
            self._seen += 1
            key = keys[i] if keys is not None else self._seen
            (self.recent if key % self.holdout_every == 0 else self.replay).append(obs)

    def _worse(self, before: float, after: float) -> bool:
        return after > before * (1.0 + self.tolerance) + self.slack  # NaN (empty set) is never worse

    def remember(self, observations: Sequence[Colocation], keys: Sequence[int] | None = None) -> None:
        """Adds earlier observations without training (a helper that restarts rebuilds its learner this way)."""
        self._route(observations, keys)

    def observe(self, observations: Sequence[Colocation], keys: Sequence[int] | None = None,
                on_accept: Callable[[], None] | None = None) -> UpdateResult:
        """Adds new observations, fine-tunes, and keeps the new weights only if both held-out errors hold.

        `on_accept` (e.g. saving the model) runs before the update is final: if it raises, or training
        does, the previous weights are restored and the error is raised.
        """
        self._route(observations, keys)
        before = holdout_error(self.model, self.reference), holdout_error(self.model, self.recent)
        ref_bar = before[0] if self.baseline_error is None else min(before[0], self.baseline_error)
        saved = self.model.state()
        try:
            self.model.fine_tune(self.anchor + list(self.replay), self.epochs, self.lr)
            after = holdout_error(self.model, self.reference), holdout_error(self.model, self.recent)
            accepted = not (self._worse(ref_bar, after[0]) or self._worse(before[1], after[1]))
            if accepted and on_accept is not None:
                on_accept()
        except BaseException:
            self.model.restore(saved)
            raise
        if not accepted:
            self.model.restore(saved)
        return UpdateResult(accepted, before[0], after[0], before[1], after[1], len(self.anchor) + len(self.replay))


def refine(model: Refinable, reference: Sequence[Colocation], earlier: Sequence[tuple[int, Colocation]],
           new: Sequence[tuple[int, Colocation]], save: Callable[[], None] | None = None,
           **learner_args) -> UpdateResult:
    """One online update of `model` in place from (key, observation) pairs: replay = reference + earlier + new,
    held out by key, judged as `OnlineLearner.observe` does; `save` runs when the update is kept."""
    learner = OnlineLearner(model, reference, **learner_args)
    learner.remember([o for _, o in earlier], [k for k, _ in earlier])
    return learner.observe([o for _, o in new], [k for k, _ in new], on_accept=save)
