"""The family key that lets a training job's global batch adapt (goodput mode), checked apart from `spec`.

    batch:
      adaptive: true        # opt in; without the key (or with false) the global batch is fixed
      min: 64               # the smallest global batch the job may run at
      max: 1024             # the largest
      lr_scaling: adascale  # adascale (default) | sqrt | linear: how the learning rate follows the batch

The submitted `global_batch` must lie in [min, max]; the job's work stays its
`steps` at the submitted batch, counted as statistical progress (Pollux's
definition, `runtime.goodput`). Shapes at another global batch carry the knobs
`global_batch` (that batch) and `lr_scaling` (the rule), the vocabulary the
planner and the simulator read; shapes at the submitted batch carry neither
`lr_scaling` nor a different `global_batch`. Only training families may adapt.
Which optimizer a rule supports is known only in the job (`runtime.goodput`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slurm_elastico.runtime.goodput import DEFAULT_RULE, LR_RULES

BATCH_KEYS = ("adaptive", "min", "max", "lr_scaling")
MAX_BATCH = 2**20


@dataclass(frozen=True)
class BatchRule:
    """An adaptive family's allowed global batches [low, high] and its learning-rate rule."""

    low: int
    high: int
    lr_scaling: str = DEFAULT_RULE

    def batches(self, base: int) -> tuple[int, ...]:
        """The other global batches offered: base × 2^k (k ≠ 0) within [low, high], smallest first.

        Powers of two keep every offered batch a multiple or a divisor of the submitted one, so the submitted
        micro-batches and GPU counts divide it as they divide the submitted batch (or divide it exactly)."""
        out = []
        b = base
        while b % 2 == 0 and b // 2 >= self.low:
            b //= 2
            out.append(b)
        b = base
        while b * 2 <= self.high:
            b *= 2
            out.append(b)
        return tuple(sorted(out))


def other_batch_name(batch: int, name: str) -> str:
    """The name of a shape at another global batch: `gb<batch>-<the shape's name at the submitted batch>`
    (as the simulator names its goodput shapes)."""
    return f"gb{batch}-{name}"


def batch_rule_of(data: Mapping[str, Any], kind: str, global_batch: int,
                  bad: Callable[[str, str], None]) -> BatchRule | None:
    """The family's `batch` rule (None: fixed global batch), every problem reported through `bad(key, message)`.

    `global_batch` is the submitted batch (0 when it is itself wrong: the range is then not checked against it).
    """
    if "batch" not in data:
        return None
    raw = data["batch"]
    if kind != "train":
        bad("batch", f"only a training family may adapt its batch, and this one is kind {kind}; "
                     "allowed: drop the batch key (an inference job answers a fixed set of requests)")
        return None
    if not isinstance(raw, Mapping):
        bad("batch", f"expected a mapping with {', '.join(BATCH_KEYS)}, got {raw!r}")
        return None
    found = True
    for key in raw:
        if key not in BATCH_KEYS:
            bad(f"batch.{key}", f"unknown key; allowed: {', '.join(BATCH_KEYS)}")
            found = False
    adaptive = raw.get("adaptive", False)
    if not isinstance(adaptive, bool):
        bad("batch.adaptive", f"expected true or false, got {adaptive!r}")
        return None
    if "adaptive" not in raw and raw:
        bad("batch.adaptive", f"missing: {', '.join(f'batch.{k}' for k in raw)} has no effect without it; allowed: "
                              "adaptive: true (the batch adapts within min and max), adaptive: false (fixed, the "
                              "rest kept for later), or drop the batch key")
        return None
    bounds: dict[str, int] = {}
    for key in ("min", "max"):
        if key not in raw:
            if adaptive:
                bad(f"batch.{key}", f"required when batch.adaptive is true; a global batch, an integer 1 to {MAX_BATCH}")
                found = False
            continue
        v = raw[key]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_BATCH:
            bad(f"batch.{key}", f"{v!r} is not a positive integer global batch; allowed: an integer 1 to {MAX_BATCH}")
            found = False
            continue
        bounds[key] = v
    rule = raw.get("lr_scaling", DEFAULT_RULE)
    if rule not in LR_RULES:
        bad("batch.lr_scaling", f"{rule!r} is not allowed; allowed: {', '.join(LR_RULES)} (default {DEFAULT_RULE})")
        found = False
    if len(bounds) == 2 and bounds["min"] > bounds["max"]:
        bad("batch.min", f"{bounds['min']} is above batch.max {bounds['max']}; allowed: min <= max")
        found = False
    elif global_batch and len(bounds) == 2 and not bounds["min"] <= global_batch <= bounds["max"]:
        bad("batch", f"the submitted global_batch {global_batch} is outside [batch.min {bounds['min']}, "
                     f"batch.max {bounds['max']}]; allowed: a range that holds it (the job's work is counted "
                     "in steps of the submitted batch)")
        found = False
    if not adaptive or not found or len(bounds) < 2:
        return None
    return BatchRule(bounds["min"], bounds["max"], rule)
