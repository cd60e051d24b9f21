"""sbatch's options as sbatch reads them: the command line of `elastico-submit` and the `#SBATCH` lines.

`elastico-submit` takes sbatch's own command line plus `--family FILE`. It
must find where sbatch's options end and the user's script begins exactly as
sbatch (getopt_long) does, so the option table below says which options take
a value. Traps: getopt accepts unique prefixes of long options (`--req`),
short options cluster (`-HJname`), command-line options override `#SBATCH`
lines, so "did the user set it?" must look at all three sources (and SBATCH_*
variables: `slurm_elastico.jobwrap.additions`).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_elastico.errors import ConfigError

FAMILY_OPTION = "--family"

# sbatch options that take no value (getopt no_argument), by long name.
LONG_FLAGS = frozenset({
    "contiguous", "help", "hold", "ignore-pbs", "no-requeue", "overcommit", "oversubscribe", "parsable", "quiet",
    "reboot", "requeue", "spread-job", "test-only", "usage", "use-min-nodes", "verbose", "version", "wait",
})
# Options whose value is optional: it counts only when written `--name=value` (getopt optional_argument).
LONG_OPTIONAL = frozenset({"exclusive", "export", "get-user-env", "nice", "no-kill", "propagate", "wrap"})
# Options that take a value, `--name=value` or `--name value`.
LONG_WITH_VALUE = frozenset({
    "account", "acctg-freq", "array", "batch", "bb", "bbf", "begin", "chdir", "cluster-constraint", "clusters",
    "comment", "constraint", "container", "container-id", "core-spec", "cores-per-socket", "cpu-freq",
    "cpus-per-gpu", "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "error",
    "export-file", "extra", "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node",
    "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint", "input", "job-name", "kill-on-invalid-dep",
    "licenses", "mail-type", "mail-user", "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus",
    "network", "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node",
    "ntasks-per-socket", "open-mode", "output", "partition", "power", "prefer", "priority", "profile", "qos",
    "reservation", "resv-ports", "segment", "signal", "sockets-per-node", "spread-segments", "switches",
    "thread-spec", "threads-per-core", "time", "time-min", "tmp", "tres-bind", "tres-per-task", "uid",
    "wckey", "exclude",
})
LONG_ALL = LONG_FLAGS | LONG_OPTIONAL | LONG_WITH_VALUE
# Short options: letter -> long name; those in SHORT_WITH_VALUE take a value (`-Jx`, `-J x`).
SHORT = {
    "a": "array", "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task", "C": "constraint",
    "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile", "G": "gpus", "h": "help", "H": "hold",
    "i": "input", "J": "job-name", "k": "no-kill", "L": "licenses", "m": "distribution", "M": "clusters",
    "n": "ntasks", "N": "nodes", "o": "output", "O": "overcommit", "p": "partition", "q": "qos", "Q": "quiet",
    "s": "oversubscribe", "S": "core-spec", "t": "time", "v": "verbose", "V": "version", "w": "nodelist",
    "W": "wait", "x": "exclude",
}
SHORT_WITH_VALUE = frozenset("aAbBcCdDeFGiJLmMnNopqStwx")


@dataclass(frozen=True)
class Option:
    """One sbatch option as given: its long name (prefixes resolved) and value (None for a flag)."""

    name: str
    value: str | None = None


@dataclass(frozen=True)
class SubmitArgs:
    """`elastico-submit`'s command line split the way sbatch splits it."""

    sbatch_argv: tuple[str, ...]
    """The user's sbatch options, verbatim, without `--family` (and without the script and its arguments)."""
    options: tuple[Option, ...]
    family: str | None
    script: str | None
    script_args: tuple[str, ...] = ()


def resolve_long(name: str) -> str:
    """The option `name` stands for: itself if known, else the one known option it is a unique prefix of."""
    if name in LONG_ALL:
        return name
    matches = [n for n in LONG_ALL if n.startswith(name)]
    return matches[0] if len(matches) == 1 else name


def split_argv(argv: Sequence[str]) -> SubmitArgs:
    """Split `[sbatch options] [--family FILE] script [args]` as sbatch's getopt would; raises ConfigError on a dangling option."""
    sbatch: list[str] = []
    options: list[Option] = []
    family: str | None = None
    problems: list[str] = []
    i = 0
    argv = list(argv)
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            i += 1
            break
        if tok == ":":  # heterogeneous job component separator: more options follow
            sbatch.append(tok)
            i += 1
            continue
        if tok.startswith("--") and len(tok) > 2:
            body = tok[2:]
            raw_name, eq, value = body.partition("=")
            if raw_name == FAMILY_OPTION[2:]:  # ours; exact spelling only, so no sbatch option can be taken for it
                if family is not None:  # which one was meant? sbatch's last-wins would hide the other
                    problems.append("--family given more than once; allowed: one family file per job")
                if eq:
                    family = value
                    i += 1
                elif i + 1 < len(argv):
                    family = argv[i + 1]
                    i += 2
                else:
                    problems.append("--family needs a file name")
                    i += 1
                continue
            name = resolve_long(raw_name)
            if eq:
                options.append(Option(name, value))
                sbatch.append(tok)
                i += 1
            elif name in LONG_WITH_VALUE:
                if i + 1 >= len(argv):
                    problems.append(f"option --{raw_name} needs a value")
                    sbatch.append(tok)
                    i += 1
                else:
                    options.append(Option(name, argv[i + 1]))
                    sbatch += [tok, argv[i + 1]]
                    i += 2
            else:  # a flag, an optional-value option written bare, or an option sbatch itself will judge
                options.append(Option(name))
                sbatch.append(tok)
                i += 1
            continue
        if tok.startswith("-") and len(tok) > 1:
            consumed = 1
            j = 1
            while j < len(tok):
                letter = tok[j]
                name = SHORT.get(letter, letter)
                if letter in SHORT_WITH_VALUE:
                    rest = tok[j + 1:]
                    if rest:
                        options.append(Option(name, rest))
                    elif i + 1 < len(argv):
                        options.append(Option(name, argv[i + 1]))
                        consumed = 2
                    else:
                        problems.append(f"option -{letter} needs a value")
                    break
                options.append(Option(name))
                j += 1
            sbatch += argv[i:i + consumed]
            i += consumed
            continue
        break  # the first operand is the script
    if problems:
        raise ConfigError("elastico-submit command line", problems)
    script = argv[i] if i < len(argv) else None
    rest = tuple(argv[i + 1:]) if script is not None else ()
    return SubmitArgs(tuple(sbatch), tuple(options), family, script, rest)


def header_lines(script_text: str) -> list[str]:
    """The leading comment block sbatch reads directives from (shebang excluded), up to the first command line."""
    lines = script_text.splitlines()
    out: list[str] = []
    for line in lines[1:] if lines and lines[0].startswith("#!") else lines:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        out.append(line)
    return out


def directive_options(script_text: str) -> tuple[Option, ...]:
    """The options of the script's `#SBATCH` lines, parsed like the command line (unparsable lines are left to sbatch)."""
    argv: list[str] = []
    for line in header_lines(script_text):
        stripped = line.strip()
        if stripped.startswith("#SBATCH") and (len(stripped) == 7 or stripped[7].isspace()):
            try:
                argv += shlex.split(stripped[7:], comments=True)
            except ValueError:
                continue
    try:
        return split_argv(argv + ["script"]).options
    except ConfigError:
        return ()
