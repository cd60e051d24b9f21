"""The thin runner: the one place a Slurm command is executed.

Always an argv list, never a shell: job names and comments are user input.
Every call has a timeout; one that runs out is `SlurmTimeout`, a kind of
`SlurmUnavailable` (an overloaded or unreachable controller). It only runs:
what an exit code or an output means is the gateway's to judge
(`gateway.classify`, `gateway.check_answer`). It is passed into the gateway
(never patched), so a test or the simulator can hand in another runner with
the same signature.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from slurm_elastico.errors import SlurmNotFound, SlurmTimeout

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], *, timeout: float | None = None) -> Completed: ...


class SubprocessRunner:
    """Runs argv with a timeout; `env` adds variables such as SLURM_CONF."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S):
        self.env = dict(env or {})
        self.timeout = timeout

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None) -> Completed:
        argv = tuple(str(a) for a in argv)
        limit = self.timeout if timeout is None else timeout
        env = {**os.environ, **self.env} if self.env else None
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, errors="surrogateescape", timeout=limit, env=env,
                stdin=subprocess.DEVNULL, check=False,
            )
        except subprocess.TimeoutExpired as exc:
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise SlurmTimeout(argv, limit, err) from None
        except FileNotFoundError:
            raise SlurmNotFound(argv, None, "", f"`{argv[0]}` is not installed or not on PATH") from None
        return Completed(argv, proc.returncode, proc.stdout, proc.stderr)

