"""sbatch's options as sbatch reads them: its command line and the `#SBATCH` lines of a batch script.

A wrapper that takes sbatch's own command line (`elastico-submit`) must find
where sbatch's options end and the script begins exactly as sbatch
(getopt_long) does, so the option table below says which options take a
value. Traps: getopt accepts unique prefixes of long options (`--req`), short
options cluster (`-HJname`), command-line options override `#SBATCH` lines,
so "did the user set it?" must look at all three sources (and SBATCH_*
variables: `slurm_elastico.jobwrap.additions`).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

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
class CommandLine:
    """A command line split the way sbatch splits it: its options, then the script and the script's arguments."""

    sbatch_argv: tuple[str, ...]
    """sbatch's options, verbatim, without the caller's own (and without the script and its arguments)."""
    options: tuple[Option, ...]
    own: tuple[Option, ...] = ()
    """The caller's own options (`split`'s `own`), in order; value None where the line ends before it."""
    script: str | None = None
    script_args: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    """Options that need a value the line does not give."""


def split(argv: Sequence[str], own: frozenset[str] = frozenset()) -> CommandLine:
    """Split `[options] script [args]` as sbatch's getopt would; each long option named in `own` (exact spelling
    only, so no sbatch option can be taken for it) takes a value and is the caller's, not sbatch's."""
    sbatch: list[str] = []
    options: list[Option] = []
    ours: list[Option] = []
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
            if raw_name in own:
                if eq:
                    ours.append(Option(raw_name, value))
                    i += 1
                elif i + 1 < len(argv):
                    ours.append(Option(raw_name, argv[i + 1]))
                    i += 2
                else:
                    ours.append(Option(raw_name))
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
    script = argv[i] if i < len(argv) else None
    rest = tuple(argv[i + 1:]) if script is not None else ()
    return CommandLine(tuple(sbatch), tuple(options), tuple(ours), script, rest, tuple(problems))


def resolve_long(name: str) -> str:
    """The option `name` stands for: itself if known, else the one known option it is a unique prefix of."""
    if name in LONG_ALL:
        return name
    matches = [n for n in LONG_ALL if n.startswith(name)]
    return matches[0] if len(matches) == 1 else name


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
    line = split(argv + ["script"])
    return () if line.problems else line.options


GPU_REQUEST_OPTIONS = ("gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket")
"""The options that can name a GPU type: `--gres=gpu:TYPE:N` and `--gpus[-per-...]=TYPE:N`."""


def gpu_types_requested(options: Sequence[Option]) -> tuple[str, ...]:
    """The GPU types the options ask for, in order, each once; () when no request names one (any type).

    sbatch keeps the last value of each option, so only that one counts. `--gres` is a list of
    `name[:type][:count]` (`gpu:a100:2`, `gpu:a100`, `gres/gpu:v100:1`; `gpu:2` names no type, nor does `mps:50`);
    the `--gpus*` options are lists of `[type:]count` (`a100:2,v100:1`).
    """
    last = {o.name: o.value for o in options if o.name in GPU_REQUEST_OPTIONS and o.value}
    found: list[str] = []
    for name, value in last.items():
        for entry in str(value).split(","):
            parts = [p.strip() for p in entry.strip().split(":")]
            if name == "gres":
                if parts[0].removeprefix("gres/") != "gpu" or len(parts) < 2:
                    continue
                gpu_type = parts[1] if len(parts) == 3 or not parts[1].isdigit() else ""
            else:
                gpu_type = parts[0] if len(parts) == 2 else ""
            if gpu_type and gpu_type not in found:
                found.append(gpu_type)
    return tuple(found)
