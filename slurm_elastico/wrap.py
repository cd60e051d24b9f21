"""The pure half of `elastico-submit` / `elastico-run`: sbatch argv splitting, the generated batch script, shape lookup.

`elastico-submit` takes sbatch's own command line plus `--family FILE`. It
must find where sbatch's options end and the user's script begins exactly as
sbatch (getopt_long) does, so the option table below says which options take
a value. It then writes a new batch script that sbatch stores with the job and
replays on every requeue: the user's `#SBATCH` header, then a few lines of
Python that hand an embedded payload (the user's script, its arguments, the
family spec, the wrapper's settings) to `elastico-run`. The payload is JSON
inside base64, so no user string is ever parsed by a shell or by Python's
tokenizer. Traps: getopt accepts unique prefixes of long options (`--req`),
short options cluster (`-HJname`), command-line options override `#SBATCH`
lines, so "did the user set it?" must look at all three sources (and SBATCH_*
variables).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import Family
from slurm_elastico.model import Shape as PlannedShape
from slurm_elastico.shapes.current import running_shape


PAYLOAD_VERSION = 1
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

# What sbatch reads from the environment for the options elastico-submit may add (man sbatch, INPUT ENVIRONMENT).
ENV_FOR = {
    "requeue": ("SBATCH_REQUEUE", "SBATCH_NO_REQUEUE"),
    "open-mode": ("SBATCH_OPEN_MODE",),
    "signal": ("SBATCH_SIGNAL",),
    "gres": ("SBATCH_GRES", "SBATCH_GPUS", "SBATCH_GPUS_PER_NODE", "SBATCH_GPUS_PER_TASK", "SBATCH_GPUS_PER_SOCKET"),
    "job-name": ("SBATCH_JOB_NAME",),
}
# Long names that mean "the user chose" each thing elastico-submit would otherwise add.
CHOSEN_BY = {
    "requeue": ("requeue", "no-requeue"),
    "open-mode": ("open-mode",),
    "signal": ("signal",),
    "gres": ("gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket"),
    "begin": ("begin",),
    "job-name": ("job-name",),
}


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


def chosen(what: str, options: Iterable[Option], env: Mapping[str, str]) -> bool:
    """Did the user choose `what` (a key of CHOSEN_BY) on the command line, in `#SBATCH` lines or through SBATCH_*?"""
    names = CHOSEN_BY[what]
    return any(o.name in names for o in options) or any(env.get(v) for v in ENV_FOR.get(what, ()))


@dataclass(frozen=True)
class Additions:
    """What elastico-submit adds to the sbatch command line, and notes for the user about what it did not add."""

    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()


def added_options(options: Sequence[Option], env: Mapping[str, str], *, share: int, window_s: int, lead_s: int,
                  job_name: str) -> Additions:
    """The options reshapes need that the user has not chosen themselves: theirs always win."""
    argv: list[str] = []
    notes: list[str] = []
    if not chosen("requeue", options, env):
        argv.append("--requeue")
    elif any(o.name == "no-requeue" for o in options) or env.get("SBATCH_NO_REQUEUE"):
        notes.append("--no-requeue: the helper cannot move this job to another share (it can still reshape it in place)")
    if not chosen("open-mode", options, env):
        argv.append("--open-mode=append")  # a requeued run must not truncate the output of the runs before it
    if not chosen("signal", options, env) and lead_s > 0:
        argv.append(f"--signal=B:USR1@{lead_s}")
    if not chosen("gres", options, env):
        argv.append(f"--gres=mps:{share}")
    else:
        notes.append("GRES chosen by the user: the job starts with it, not with its family's default share")
    if not chosen("begin", options, env) and window_s > 0:
        argv.append(f"--begin=now+{window_s}")
    if not chosen("job-name", options, env) and job_name:
        argv.append(f"--job-name={job_name}")  # sbatch names a job after its script; ours comes on stdin
    return Additions(tuple(argv), tuple(notes))


def signal_lead(options: Sequence[Option], default: int) -> int:
    """Seconds before the time limit the batch step is signalled: from the user's `--signal=...@N`, else `default`."""
    for o in reversed(options):
        if o.name == "signal" and o.value:
            m = re.search(r"@(\d+)$", o.value)
            if m:
                return int(m.group(1))
    return default


_SUBMITTED = re.compile(r"^Submitted batch job (\d+)")
_PARSABLE = re.compile(r"^(\d+)(;\S+)?$")


def job_id_from(line: str) -> int | None:
    """The job id in a line sbatch printed ("Submitted batch job N[ on cluster C]" or, with --parsable, "N[;C]")."""
    text = line.strip()
    m = _SUBMITTED.match(text) or _PARSABLE.match(text)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------------- the generated batch script


@dataclass(frozen=True)
class Payload:
    """What every (re)start of the job needs, carried inside the batch script (no shared filesystem assumed)."""

    script: bytes
    script_name: str
    args: tuple[str, ...]
    family_spec: str
    family_source: str
    gpu_memory_mib: int
    grace_s: float
    signal_lead_s: int
    slurm_conf: str = ""

    def encode(self) -> str:
        data = {
            "version": PAYLOAD_VERSION,
            "script": base64.b64encode(self.script).decode("ascii"),
            "script_name": self.script_name,
            "args": list(self.args),
            "family_spec": self.family_spec,
            "family_source": self.family_source,
            "gpu_memory_mib": self.gpu_memory_mib,
            "grace_s": self.grace_s,
            "signal_lead_s": self.signal_lead_s,
            "slurm_conf": self.slurm_conf,
        }
        text = json.dumps(data, ensure_ascii=True, sort_keys=True)
        return base64.b64encode(text.encode("ascii")).decode("ascii")

    @classmethod
    def decode(cls, blob: str) -> Payload:
        try:
            data = json.loads(base64.b64decode(blob.encode("ascii"), validate=True))
            if data.get("version") != PAYLOAD_VERSION:
                raise ConfigError("embedded payload", [f"version {data.get('version')!r}; this elastico-run reads {PAYLOAD_VERSION}"])
            return cls(
                script=base64.b64decode(data["script"], validate=True),
                script_name=str(data["script_name"]),
                args=tuple(str(a) for a in data["args"]),
                family_spec=str(data["family_spec"]),
                family_source=str(data["family_source"]),
                gpu_memory_mib=int(data["gpu_memory_mib"]),
                grace_s=float(data["grace_s"]),
                signal_lead_s=int(data["signal_lead_s"]),
                slurm_conf=str(data.get("slurm_conf", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError("embedded payload", [f"unreadable ({type(exc).__name__}: {exc}); was it made by elastico-submit?"]) from None


_CHUNK = 76


def batch_script(interpreter: str, user_script: str, payload: Payload) -> str:
    """The script sbatch receives: our interpreter, the user's `#SBATCH` header, then Python that runs elastico-run.

    The body holds only fixed text and a base64 literal ([A-Za-z0-9+/=]), so
    nothing the user wrote can change what it does.
    """
    if not os.path.isabs(interpreter) or any(c.isspace() for c in interpreter):
        raise ConfigError("elastico-submit", [f"the Python interpreter path {interpreter!r} must be absolute and contain no spaces (a #! line cannot carry them)"])
    blob = payload.encode()
    chunks = "\n".join(f'    "{blob[i:i + _CHUNK]}"' for i in range(0, len(blob), _CHUNK))
    header = "\n".join(header_lines(user_script))
    return (
        f"#!{interpreter}\n"
        # Python reads an encoding declaration on line 2: ours, so header bytes that are not UTF-8, or a
        # header mentioning "coding:", cannot stop the script from compiling. The body is ASCII.
        + "# -*- coding: latin-1 -*-\n"
        + (header + "\n" if header else "")
        + "# Generated by elastico-submit: runs the embedded job script under elastico-run.\n"
        + "import signal\n"
        + "import sys\n"
        + "# Until elastico-run's handler is in, a reshape or time-limit SIGUSR1 must not kill the job.\n"
        + "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
        + "from slurm_elastico.cli.run import run_embedded\n"
        + "PAYLOAD = (\n"
        + chunks + "\n"
        + ")\n"
        + "sys.exit(run_embedded(PAYLOAD))\n"
    )


def payload_from_script(text: str) -> Payload:
    """The payload inside a script `batch_script` made (for tests and `elastico-run --show`)."""
    m = re.search(r"^PAYLOAD = \(\n(.*?)\n\)$", text, re.S | re.M)
    if not m:
        raise ConfigError("batch script", ["no elastico payload found"])
    blob = "".join(re.findall(r'"([A-Za-z0-9+/=]*)"', m.group(1)))
    return Payload.decode(blob)


def shebang_argv(script: bytes, path: str) -> list[str]:
    """The argv that runs `path` the way the kernel would from its `#!` line (works on noexec temp dirs too).

    Linux passes everything after the interpreter as one argument; so do we.
    """
    first = script.split(b"\n", 1)[0]
    if not first.startswith(b"#!"):
        raise ConfigError(path, ["the job script must start with a #! line (sbatch requires one too)"])
    line = first[2:].decode("utf-8", errors="surrogateescape").strip()
    if not line:
        raise ConfigError(path, ["the #! line names no interpreter"])
    interp, _, arg = line.partition(" ")
    arg = arg.strip()
    return [interp, arg, path] if arg else [interp, path]


# ---------------------------------------------------------------------------- the job's shape


def choose_shape(family: Family, candidates: Sequence[PlannedShape], admin_comment: str,
                 held_share: int | None = None) -> tuple[PlannedShape, str]:
    """The shape to run and where it came from: `shapes.current.running_shape`, the rule the planner follows too.

    `candidates` is every shape of the spec that fits the GPU (a superset of the
    pruned family), so a shape named by hand or by an older plan is honoured too.
    """
    return running_shape(candidates, family.default_shape, admin_comment, held_share)