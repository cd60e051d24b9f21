"""How spec messages write values (ranges' ends, divisors, lists of names) and read YAML's numeric text.

Split from `spec` to keep it readable; private helpers of the spec checks, not an API.
"""

from __future__ import annotations

from typing import Any


def _bound(x: float) -> str:
    """A range's end as written: 1048576, not 1.04858e+06."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def _divisors(n: int, limit: int = 24) -> str:
    d = [d for d in range(1, n + 1) if n % d == 0]
    return ", ".join(map(str, d[:limit])) + (", ..." if len(d) > limit else "")


def _yaml_float(v: Any) -> Any:
    """PyYAML reads `25.6e6` (no dot-sign in the exponent) as text; take it as the number it means."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


def _some(names: set[str], limit: int = 12) -> str:
    shown = sorted(names)
    text = ", ".join(shown[:limit])
    return text + (f", ... ({len(shown)} in all)" if len(shown) > limit else "")
