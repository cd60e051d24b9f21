"""Held-out splits of co-location observations: k-fold, leave-one-model-out, leave-one-GPU-out.

Folds are of pair indices, so the two directions of one pair never straddle train and test. The MLP's
evaluation (`evaluation`) and the prior-corrected predictor's model selection (`transfer.fit`) both split
here; this module needs no torch, so neither does training the prior-corrected predictor.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.measurements import Colocation

SPLITS = ("kfold", "leave-one-model-out", "leave-one-gpu-out")
Fold = tuple[str, list[int], list[int]]  # (name, train pair indices, test pair indices)


def split(observations: Sequence[Colocation], kind: str, k: int = 5, seed: int = 0) -> list[Fold]:
    """Folds of pair indices for `kind` (one of `SPLITS`)."""
    n = len(observations)
    if kind == "kfold":
        order = np.random.default_rng(seed).permutation(n)
        folds = [sorted(order[i::k].tolist()) for i in range(k)]
        return [(f"fold {i + 1}/{k}", sorted(set(range(n)) - set(f)), f) for i, f in enumerate(folds) if f]
    if kind == "leave-one-model-out":
        families = sorted({p.model_family for o in observations for p in (o.a, o.b) if p.model_family})
        out = []
        for fam in families:
            test = [i for i, o in enumerate(observations) if fam in (o.a.model_family, o.b.model_family)]
            out.append((fam, [i for i in range(n) if i not in set(test)], test))
        return out
    if kind == "leave-one-gpu-out":
        gpus = sorted({o.gpu_type for o in observations})
        return [(f"test {g}", [i for i, o in enumerate(observations) if o.gpu_type != g],
                 [i for i, o in enumerate(observations) if o.gpu_type == g]) for g in gpus]
    raise MeasurementError(f"unknown split {kind!r}; choose one of {', '.join(SPLITS)}")
