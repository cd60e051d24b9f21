"""Strict JSON for everything the commands print or write: no `NaN` or `Infinity` tokens.

Python's `json.dumps` writes a float that is not finite as `NaN`, `Infinity`
or `-Infinity`: JavaScript literals that are not JSON, which `jq` and strict
parsers refuse. A figure that is not a number (a mean over no finished job, a
correlation of a constant) is written as `null` instead, and numpy scalars and
arrays (which `json` refuses) as plain numbers and lists. Internal files that
only this package reads back (journal rows, lock holders) keep `json.dumps`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["dumps", "finite"]


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float (nan, ±inf) replaced by None, recursively; numpy values made plain.

    Mappings and sequences are copied (tuples become lists, as JSON has only one array); a numpy scalar or array
    becomes the Python number or (nested) list it holds. Mapping keys are kept, but a numpy scalar key becomes the
    Python scalar. Anything else is returned as is, for `json.dumps` (or its `default`) to judge.
    """
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, type(None))):  # bool is an int
        return obj
    if _is_numpy(obj):
        return finite(obj.tolist())  # a scalar's tolist() is the Python scalar
    if isinstance(obj, Mapping):
        return {(k.tolist() if _is_numpy(k) else k): finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def _is_numpy(obj: Any) -> bool:
    """A numpy scalar or array, told apart without importing numpy (the submit and run commands never load it)."""
    return type(obj).__module__ == "numpy" and hasattr(obj, "tolist")


def dumps(obj: Any, *, default: Callable[[Any], Any] | None = None, **kw: Any) -> str:
    """`json.dumps(finite(obj), allow_nan=False, **kw)`: strict JSON, a non-finite float written as null.

    What `default` returns for an object json cannot write is made finite too. `allow_nan` cannot be passed: the
    point of this function is that it is always False.
    """
    if "allow_nan" in kw:
        raise TypeError("jsonout.dumps writes strict JSON: allow_nan cannot be set")
    strict_default = None if default is None else (lambda o: finite(default(o)))
    return json.dumps(finite(obj), allow_nan=False, default=strict_default, **kw)
