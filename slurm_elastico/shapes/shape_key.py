"""What a family's shapes depend on, as a key: families that differ only in their work share their shapes.

A user's sweep submits many jobs of one model with their own step or request counts (or names, or throughput
floors); their shapes (the cross product, the memory fit, the Pareto front, the default) are the same, and
enumerating them is most of what building a family costs. `shape_key` is everything a `Family`'s shapes are
built from: the spec without `WORK_FIELDS`, and the arguments of the build (memory, GPU types, profiles,
measurements, anchor, figures). Two builds with equal keys give equal shapes (the key keeps types and order:
1 and 1.0, or two orders of one mapping, are other keys).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from typing import Any

from slurm_elastico.shapes.spec import FamilySpec

WORK_FIELDS = ("source", "work", "throughput_floor", "name")
"""`FamilySpec` fields no shape depends on: where it came from (error messages only), the work, the floor, the
name. The `Family` takes them from its own spec (`total_work`, `throughput_floor`, `name`)."""


def shape_key(spec: FamilySpec, *build: Any) -> Hashable:
    """The spec's fields but `WORK_FIELDS`, and `build` (the other arguments of the family's build), frozen."""
    own = tuple((f.name, _frozen(getattr(spec, f.name))) for f in dataclasses.fields(spec) if f.name not in WORK_FIELDS)
    return own, tuple(_frozen(b) for b in build)


def _frozen(value: Any) -> Hashable:
    """`value` as a hashable that is equal only for the same types, values and order; a value of a type not
    known here gets a key equal to nothing (no sharing)."""
    if value is None or isinstance(value, (bool, int, str)):
        return type(value), value
    if isinstance(value, float):
        return float, repr(value)  # -0.0 and 0.0 stay apart
    if isinstance(value, Mapping):
        return type(value), tuple((_frozen(k), _frozen(v)) for k, v in value.items())
    if isinstance(value, (tuple, list, frozenset, set)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return type(value), tuple(_frozen(v) for v in items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value), tuple((f.name, _frozen(getattr(value, f.name))) for f in dataclasses.fields(value))
    return object()
