"""`elastico-submit`'s command line: sbatch's own, split as sbatch splits it, plus `--family FILE`.

sbatch's grammar (which options take a value, prefixes, clustered short
options, `#SBATCH` lines) is `slurm.sbatch_options`; this module adds the one
option that is ours, spelled exactly (`--family`), so no sbatch option can be
taken for it and it never reaches sbatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_elastico.errors import ConfigError
from slurm_elastico.slurm.sbatch_options import Option, split

FAMILY_OPTION = "--family"


@dataclass(frozen=True)
class SubmitArgs:
    """`elastico-submit`'s command line split the way sbatch splits it."""

    sbatch_argv: tuple[str, ...]
    """The user's sbatch options, verbatim, without `--family` (and without the script and its arguments)."""
    options: tuple[Option, ...]
    family: str | None
    script: str | None
    script_args: tuple[str, ...] = ()


def split_argv(argv: Sequence[str]) -> SubmitArgs:
    """Split `[sbatch options] [--family FILE] script [args]` as sbatch's getopt would; raises ConfigError on a dangling option."""
    line = split(argv, own=frozenset({FAMILY_OPTION[2:]}))
    problems: list[str] = []
    if len(line.own) > 1:  # which one was meant? sbatch's last-wins would hide the other
        problems.append("--family given more than once; allowed: one family file per job")
    if any(o.value is None for o in line.own):
        problems.append("--family needs a file name")
    problems += line.problems
    if problems:
        raise ConfigError("elastico-submit command line", problems)
    family = line.own[-1].value if line.own else None
    return SubmitArgs(line.sbatch_argv, line.options, family, line.script, line.script_args)
