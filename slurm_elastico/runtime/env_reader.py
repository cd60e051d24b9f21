"""Reading typed environment variables while collecting every problem, so one error names them all.

Split from `runtime.shape` (the shape variables) and used by `runtime.dist` too (torch's env:// variables).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from slurm_elastico.errors import ConfigError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class EnvReader:
    """Reads typed variables and collects problems instead of stopping at the first."""

    def __init__(self, env: Mapping[str, str], source: str = "job environment (ELASTICO_* variables)"):
        self.env = env
        self.source = source
        self.problems: list[str] = []

    def integer(self, name: str, required: bool = True, minimum: int = 1) -> int | None:
        raw = self.env.get(name)
        if raw is None or raw == "":
            if required:
                self.problems.append(f"{name} is not set (an integer >= {minimum})")
            return None
        try:
            value = int(raw.strip())
        except ValueError:
            self.problems.append(f"{name}={raw!r} is not an integer (an integer >= {minimum})")
            return None
        if value < minimum:
            self.problems.append(f"{name}={raw!r} is below {minimum}")
            return None
        return value

    def fraction(self, name: str) -> float | None:
        raw = self.env.get(name)
        if raw is None or raw == "":
            return None
        try:
            return float(raw.strip())
        except ValueError:
            self.problems.append(f"{name}={raw!r} is not a number (a float in (0, 1])")
            return None

    def choice(self, name: str, allowed: tuple[str, ...], default: str | None = None) -> str | None:
        raw = self.env.get(name)
        if raw is None or raw == "":
            if default is None:
                self.problems.append(f"{name} is not set (one of {', '.join(allowed)})")
            return default
        if raw.strip().lower() not in allowed:
            self.problems.append(f"{name}={raw!r} is not one of {', '.join(allowed)}")
            return None
        return raw.strip().lower()

    def flag(self, name: str) -> bool | None:
        raw = self.env.get(name)
        if raw is None or raw == "":
            self.problems.append(f"{name} is not set (1 or 0)")
            return None
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        self.problems.append(f"{name}={raw!r} is not a boolean (one of {', '.join(_TRUE + _FALSE)})")
        return None

    def json_object(self, name: str) -> dict[str, object]:
        raw = self.env.get(name)
        if raw is None or raw.strip() == "":
            return {}
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            self.problems.append(f"{name} is not valid JSON ({exc.msg} at char {exc.pos}); expected a JSON object")
            return {}
        if not isinstance(value, dict):
            self.problems.append(f"{name} is JSON {type(value).__name__}, expected a JSON object")
            return {}
        return value

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.source, self.problems)
