"""From held-out pairs to the model's caution: its held-out error, admission thresholds and gain margins.

The held-out pairs are `fit`'s folds (`Cross`: per fold, the predicted and true normalized throughputs of its
test pairs). `heldout_error` is what the model file reports per kind of fold; `admission_tables` the thresholds
per floor for each kind of shift (`admission`); `margins_from_heldout` the margins of the rule that a shared
GPU gains.
"""

from __future__ import annotations

import math

import numpy as np

from slurm_elastico.interference.admission import TARGET as ADMISSION_TARGET
from slurm_elastico.interference.admission import thresholds

FALSE_ADMISSION_TARGET = 0.10  # the share of held-out pairs whose truth may fall below prediction / (1 + margin)
HELDOUT_KINDS = ("kfold", "leave-one-model-out", "leave-one-gpu-out")  # the splits a model file reports
ADMISSION_KINDS = ("seen", "family", "gpu", "gpu_up", "gpu_down")  # its sets of admission thresholds

Cross = list[tuple[np.ndarray, np.ndarray]]  # per fold: (predicted, true) (n, 2) norms of its held-out pairs


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


def _worst(cross: Cross) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per fold: (predicted, true) worst normalized throughput of each held-out pair (`admission.thresholds`)."""
    return [(p.min(axis=1), t.min(axis=1)) for p, t in cross]


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
