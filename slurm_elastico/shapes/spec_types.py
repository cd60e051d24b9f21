"""The family keys about GPU types, checked apart from `spec` (which holds the rest): `gpu_types` and typed names.

A family may limit its job to some GPU types (`gpu_types: [a100, v100]`, the
words the cluster's gres uses, e.g. `gpu:a100:4`); on a cluster of several
types its shapes are enumerated per type (`shapes.typed`) and named
`<shape>@<type>`. A `declared:` entry may name such a typed shape to give the
figures measured on that type. The cluster's types are not known when a spec
is parsed, so a listed type is only checked for its form here; a family none
of whose types the cluster has is refused when it is enumerated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

TYPE_SEP = "@"
"""Between a shape's name and its GPU type: `mb64-bf16-mps50@a100`."""
TYPE_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
"""A GPU type as Slurm's gres names it (gres.conf `Type=`): letters, digits, `_ . -`, at most 64."""
MAX_TYPES = 64


def typed_name(name: str, gpu_type: str) -> str:
    """`name@gpu_type`, or `name` for "" (a one-type cluster's shapes keep the names they always had)."""
    return f"{name}{TYPE_SEP}{gpu_type}" if gpu_type else name


def split_name(name: str) -> tuple[str, str]:
    """(shape name without its type, the type or "") of a possibly typed name."""
    base, _, gpu_type = name.partition(TYPE_SEP)
    return base, gpu_type


def gpu_types_of(data: Mapping[str, Any], bad: Callable[[str, str], None]) -> tuple[str, ...]:
    """The family's `gpu_types` limit (() = any type), each problem reported through `bad(key, message)`."""
    if "gpu_types" not in data:
        return ()
    v = data["gpu_types"]
    allowed = "a non-empty list of distinct GPU type names as the cluster's gres writes them (e.g. [a100, v100])"
    if not isinstance(v, list) or not v or len(v) > MAX_TYPES:
        bad("gpu_types", f"expected {allowed}, at most {MAX_TYPES}, got {v!r}")
        return ()
    out = []
    for i, item in enumerate(v):
        if not isinstance(item, str) or not TYPE_WORD.match(item):
            bad(f"gpu_types[{i}]", f"{item!r} is not a GPU type name; allowed: letters, digits, '_', '.', '-' "
                                   "(at most 64, starting with a letter or digit), as in gpu:a100:4")
            return ()
        out.append(item)
    lowered = [t.lower() for t in out]
    if len(set(lowered)) != len(lowered):
        bad("gpu_types", f"types repeat: {sorted({t for t in lowered if lowered.count(t) > 1})}; allowed: each once")
        return ()
    return tuple(out)


def declared_name_problem(name: str, names: set[str], limit: tuple[str, ...]) -> str | None:
    """Why a `declared:` key is not a shape of the family (None: it is), typed names (`shape@type`) included."""
    base, gpu_type = split_name(str(name))
    if names and base not in names:
        return "no such shape"
    if TYPE_SEP in str(name) and not TYPE_WORD.match(gpu_type):
        return f"{gpu_type!r} after {TYPE_SEP!r} is not a GPU type name"
    if gpu_type and limit and gpu_type.lower() not in {t.lower() for t in limit}:
        return f"GPU type {gpu_type!r} is not in the family's gpu_types {list(limit)}"
    return None
