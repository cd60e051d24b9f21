"""An adaptive family's shapes priced at the gradient noise scale its job measured (goodput mode, pure).

`shapes.enumerate` values a shape at another global batch B (knob `lr_scaling`) at the goodput the job is
sure of before it has measured anything: its steps/s at B times min(1, B/B0), in steps of the submitted
batch B0. Once the job reports its noise scale φ (`runtime.progress`, `grad_noise_scale`), one step at B is
worth `runtime.goodput.step_worth(φ, B, B0)` steps of B0, so the shape's goodput is its figure times
step_worth(φ, B, B0) / min(1, B/B0). Shapes at the submitted batch are left as they are (a step there is
worth exactly one). The planner then prices and allots these shapes like any other, with GPU count, type
and knobs, and a change of batch is a reshape that must pay its restart: the same way the simulator offers
them (`sim.families.at_epoch`, where the truth's measured efficiency curves play the job's reports).

What a job measures at such a shape (its progress over time, `helper.observe`) is goodput at the noise scale
of that moment; `to_figure` turns it back into the shape's figure (the worst-case goodput), so a measured
solo speed, which replaces a figure on a GPU type (`shapes.type_speed`), is priced at the current noise scale
once, like an estimated one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from slurm_elastico.model import Family, Shape
from slurm_elastico.runtime.goodput import step_worth


def other_batch(shape: Shape) -> tuple[int, int] | None:
    """(B, B0) of a shape at another global batch than the submitted one; None for any other shape."""
    if shape.knob("lr_scaling") is None:
        return None
    batch, base = shape.knob("global_batch"), shape.knob("base_batch")
    if not isinstance(batch, int) or not isinstance(base, int) or batch <= 0 or base <= 0 or batch == base:
        return None
    return batch, base


def at_noise_scale(family: Family, phi: float) -> Family:
    """`family` with every other-batch shape's goodput at the measured noise scale `phi` (module docstring).

    `phi` must be finite and non-negative (ValueError otherwise); a family without such shapes is returned
    as it is."""
    if not math.isfinite(phi) or phi < 0:
        raise ValueError(f"grad_noise_scale {phi!r} must be a finite number >= 0")
    shapes, changed = [], False
    for s in family.shapes:
        b = other_batch(s)
        if b is not None:
            batch, base = b
            s = dataclasses.replace(s, throughput=s.throughput * step_worth(phi, batch, base) / min(1.0, batch / base))
            changed = True
        shapes.append(s)
    return dataclasses.replace(family, shapes=tuple(shapes)) if changed else family


def to_figure(shape: Shape, phi: float | None) -> float:
    """The factor from progress per second measured at `shape` with noise scale `phi` to the shape's figure:
    min(1, B/B0) / step_worth(phi, B, B0) at another batch, 1 elsewhere. `phi` None (not measured yet) counts
    as 0, where a step at any batch is worth one of B0, as the job counts it before it has measured anything
    (`runtime.goodput.NoiseScale.gain`)."""
    b = other_batch(shape)
    if b is None:
        return 1.0
    batch, base = b
    phi = 0.0 if phi is None or not math.isfinite(phi) or phi < 0 else phi
    return min(1.0, batch / base) / step_worth(phi, batch, base)


def priced(families: Mapping[int, Family], noise: Mapping[int, float]) -> dict[int, Family]:
    """The families, each adaptive one at its job's measured noise scale (`noise`: job id -> φ) where known."""
    return {j: at_noise_scale(f, noise[j]) if j in noise else f for j, f in families.items()}
