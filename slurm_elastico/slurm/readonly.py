"""The command guard: which Slurm commands only read, and a runner that refuses every other one.

Shadow mode (`elastico sched --shadow`) must change nothing in Slurm. Rather
than trusting every code path to check a flag, the helper's runner is wrapped
in `GuardedRunner(runner, allow_changes=False)`: a command that is not on the
read list below never reaches the subprocess. The list is an allow list, so a
command added later is refused in shadow mode until someone decides it only
reads. The same runner counts the commands that change something when they
are allowed (the acting helper's `slurm_changes` per epoch).

Reads: `squeue`, `sinfo`, `sacct`, `scontrol show ...`, `scontrol write
batch_script JOB -` (to standard output: with a file name it writes a file),
and any command asked only for `--version`/`-V`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from slurm_elastico.errors import ShadowRefused
from slurm_elastico.slurm.runner import Completed, Runner

READ_COMMANDS = frozenset({"squeue", "sinfo", "sacct"})
"""Commands that only read whatever their options."""


def is_read(argv: Sequence[str]) -> bool:
    """True when `argv` only reads Slurm's state (see the module's docstring); every other command changes it."""
    argv = [str(a) for a in argv]
    if not argv:
        return False
    name = argv[0].rsplit("/", 1)[-1]
    if len(argv) == 2 and argv[1] in ("--version", "-V"):
        return True
    if name in READ_COMMANDS:
        return True
    if name == "scontrol":
        words = [a for a in argv[1:] if a == "-" or not a.startswith("-")]
        if words[:1] == ["show"]:
            return True
        return len(words) == 4 and words[:2] == ["write", "batch_script"] and words[3] == "-"
    return False


class GuardedRunner:
    """`runner` with the guard: in shadow mode (`allow_changes` False) a command that changes Slurm raises
    `ShadowRefused` before it runs. Counts `reads`, `changes` (run) and `refused` (every refusal, even one a
    caller caught: the helper checks it after each shadow epoch). Safe to call from several threads (the helper
    reads batch scripts a few at once, `helper.families.read_scripts`): the counts are kept under a lock."""

    def __init__(self, runner: Runner, *, allow_changes: bool):
        self.runner = runner
        self.allow_changes = allow_changes
        self.reads = 0
        self.changes = 0
        self.refused: list[tuple[str, ...]] = []
        self._lock = threading.Lock()

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None) -> Completed:
        read = is_read(argv)
        with self._lock:
            if read:
                self.reads += 1
            elif self.allow_changes:
                self.changes += 1
            else:
                self.refused.append(tuple(str(a) for a in argv))
        if not read and not self.allow_changes:
            raise ShadowRefused(f"shadow mode refused `{' '.join(map(str, argv))}`: it would change Slurm; "
                                "allowed in shadow mode: squeue, sinfo, sacct, scontrol show, "
                                "scontrol write batch_script JOB -")
        return self.runner(argv, timeout=timeout)
