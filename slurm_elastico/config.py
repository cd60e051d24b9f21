"""Settings from `elastico.yaml`: read once into one typed, frozen object.

Every problem (unknown key, wrong type, value out of range) is collected and
raised together as one `ConfigError` that names each bad key and lists the
valid ones, so an administrator fixes the file in one pass.

Sections are dataclasses; each field's type and its `range`/`choices`
metadata are the schema. Adding a setting is adding a field.

`load` also checks the paths the settings name against this host's file
system (`check_paths`): a state_dir that is a file, or a slurm.conf that does
not exist, is refused at once, naming the key, rather than failing later in a
helper epoch, a report or a submission with a message that names no setting.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_elastico import inputs
from slurm_elastico.errors import ConfigError

ENV_VAR = "ELASTICO_CONFIG"
DEFAULT_PATHS = (Path("/etc/slurm-elastico/elastico.yaml"),)
MAX_TEXT = 4096
"""The longest text setting (a path: Linux's PATH_MAX)."""


def _opt(default: Any, *, lo: float | None = None, hi: float | None = None, choices: tuple | None = None, help: str = ""):
    return field(default=default, metadata={"lo": lo, "hi": hi, "choices": choices, "help": help})


@dataclass(frozen=True)
class SlurmSettings:
    conf: str = _opt("", help="SLURM_CONF for every Slurm command; empty = Slurm's default")
    timeout_s: float = _opt(30.0, lo=1, hi=600, help="timeout of each Slurm command")
    partition: str = _opt("", help="partition the helper manages; empty = all, each job on its own partitions' nodes")


@dataclass(frozen=True)
class GpuTypeSettings:
    """One GPU type of a mixed cluster (`gpu.types.a100`): what Slurm does not know of it."""

    memory_mib: int = _opt(0, lo=1, hi=16 * 1024 * 1024, help="memory of each GPU of this type (required)")
    shares_per_gpu: int = _opt(0, lo=0, hi=100, help="MPS shares of one GPU of this type as gres.conf sets "
                               "them: 0 or gpu.shares_per_gpu (every GPU of the cluster must have the same; per-type "
                               "counts are not supported yet)")
    like: str = _opt("", help="for a type the public GPU table does not know (slurm_elastico.shapes.gpu_types): a "
                     "known type whose figures (peak TFLOPS, memory bandwidth, compute capability) it shares, for "
                     "its speed and precision estimates; empty = the table's entry of the type's own name")


TYPE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
"""A GPU type as Slurm's gres names it (`gpu:a100:4`, `gpu:rtx_2080ti:2`, `gpu:a100-80:1`)."""
TYPE_KEY = "TYPE"
"""How `valid_keys` writes the name of a type in `gpu.types.TYPE.memory_mib`."""


@dataclass(frozen=True)
class GpuSettings:
    memory_mib: int = _opt(81920, lo=1, hi=16 * 1024 * 1024, help="memory of each GPU (Slurm does not know it); on "
                           "a mixed cluster, of a GPU whose gres names no type")
    shares_per_gpu: int = _opt(100, lo=1, hi=100, help="MPS shares of one GPU as configured in gres.conf")
    type: str = _opt("", help="GPU type as the interference model's training data names it (v100, k80, p100...); "
                     "one it never saw gets its cautious view; empty = unknown: the model as is")
    types: dict[str, GpuTypeSettings] = field(default_factory=dict, metadata={
        "help": "the GPU types of a mixed cluster, by the name Slurm's gres gives them (`Gres=gpu:a100:4` → a100), "
                "each with its memory; empty = every GPU has gpu.memory_mib. When set, a node whose gres names "
                "another type is refused, naming it"})

    def type_settings(self, gpu_type: str) -> GpuTypeSettings | None:
        """The settings of `gpu_type`, by its exact name (Slurm's type names are case-sensitive: a job asking
        `gpu:A100:1` is refused where the nodes have `gpu:a100:4`); None if not named."""
        return self.types.get(gpu_type)

    def memory_of(self, gpu_type: str) -> int:
        """Memory (MiB) of one GPU of `gpu_type`: gpu.memory_mib when the type is "" or `types` is empty.

        `ConfigError` for a type `types` does not name, listing those it names."""
        if not gpu_type or not self.types:
            return self.memory_mib
        found = self.type_settings(gpu_type)
        if found is None:
            raise ConfigError("gpu.types", [f"GPU type {gpu_type!r} has no memory configured; gpu.types names "
                                            f"{', '.join(sorted(self.types))}: add gpu.types.{gpu_type}.memory_mib"])
        return found.memory_mib

    def type_memory(self) -> dict[str, int]:
        """{type: memory MiB} of every configured type (what the gateway and the families read)."""
        return {name: t.memory_mib for name, t in self.types.items()}


@dataclass(frozen=True)
class PlannerSettings:
    policy: str = _opt("elastico", help="planning policy from the registry")
    rounds: int = _opt(30, lo=1, hi=10000, help="shadow-pricing rounds per epoch")
    step: float = _opt(0.5, lo=0, hi=1000, help="subgradient step size")
    fairness: str = _opt("waiting", choices=("waiting", "remaining", "equal"), help="how w_j is set")
    reshape_cost_s: float = _opt(60.0, lo=0, hi=7 * 86400, help="checkpoint-and-restart cost of reshaping a running job")
    hysteresis: float = _opt(0.1, lo=0, hi=10, help="relative gain a reshape must exceed beyond its cost")
    reserve_queue_head: bool = _opt(True, help="reserve capacity for the head of the queue")


@dataclass(frozen=True)
class InterferenceSettings:
    model: str = _opt("", help="path of a trained predictor; empty = the contention model")
    floor: float = _opt(0.6, lo=0, hi=1, help="co-located speed below this fraction of solo is refused")
    reference: str = _opt("", help="measurement CSV the model was trained on; with a model, slowdowns observed on the "
                                   "cluster refine it online, judged against this data (empty: only recorded)")
    adapt_online: bool = _opt(False, help="with a model: adapt it to gpu.type from the pairs measured on this cluster "
                              "(few-shot: offset, scale, per-job corrections; margins from its own error, the untrained "
                              "constant only before the first measured pair); every co-located pair the helper "
                              "observes feeds it, and it replaces refining the model with interference.reference")
    probe_budget: float = _opt(0.0, lo=0, hi=1, help="with adapt_online: the share of the GPU type's time the helper "
                               "may spend probing pairs never measured on this cluster (tried at the model's word, "
                               "undone after one measurement when they lose; interference.probe_budget); 0 = never")


@dataclass(frozen=True)
class SubmitSettings:
    placement_window_s: int = _opt(30, lo=0, hi=3600, help="elastico-submit adds --begin=now+this so the helper can shape the pending job first; 0 = none")
    signal_lead_s: int = _opt(120, lo=0, hi=86400, help="elastico-submit adds --signal=B:USR1@this: checkpoint this long before the time limit")
    grace_s: float = _opt(20.0, lo=1, hi=3600, help="elastico-run waits this long after SIGTERM for the checkpoint, then kills; keep it below KillWait")


@dataclass(frozen=True)
class HelperSettings:
    mode: str = _opt("act", choices=("act", "shadow"), help="act: the helper changes jobs through Slurm; shadow: it "
                     "plans full epochs and journals what it would do, changing nothing in Slurm (elastico report "
                     "--shadow); elastico sched --shadow / --act override it")
    script_read_budget_s: float = _opt(2.0, lo=0, hi=3600, help="seconds an epoch may spend starting reads of new "
                                       "jobs' batch scripts (their families): running jobs first, then pending ones "
                                       "by Slurm priority; the jobs left are read by the next epochs and left as "
                                       "submitted until then; 0 = no limit (every new job read in its first epoch)")


@dataclass(frozen=True)
class Settings:
    state_dir: str = _opt("/var/lib/slurm-elastico", help="store, journal and checkpoints")
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    gpu: GpuSettings = field(default_factory=GpuSettings)
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    interference: InterferenceSettings = field(default_factory=InterferenceSettings)
    submit: SubmitSettings = field(default_factory=SubmitSettings)
    helper: HelperSettings = field(default_factory=HelperSettings)

    @property
    def store_path(self) -> Path:
        return Path(self.state_dir) / "elastico.sqlite"


def valid_keys(cls: type = Settings, prefix: str = "") -> list[str]:
    """Every dotted key the file may set, for error messages and `elastico config`."""
    keys: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            keys += valid_keys(t, f"{prefix}{f.name}.")
        elif _entry_class(t) is not None:
            keys += valid_keys(_entry_class(t), f"{prefix}{f.name}.{TYPE_KEY}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def _check_value(key: str, value: Any, typ: Any, meta: dict, problems: list[str]) -> Any:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        typ = next(a for a in typing.get_args(typ) if a is not type(None))
    if typ is bool:
        ok = isinstance(value, bool)
    elif typ is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        value = float(value) if ok else value
    elif typ is str:
        ok = isinstance(value, str)
        if ok and len(value) > MAX_TEXT:
            problems.append(f"{key}: {len(value)} characters; allowed: at most {MAX_TEXT}")
            return None
    else:  # pragma: no cover - every field above is one of these
        raise TypeError(f"unsupported setting type {typ!r} for {key}")
    if not ok:
        finite = " (finite)" if typ is float else ""
        problems.append(f"{key}: expected {typ.__name__}{finite}, got {type(value).__name__} {inputs.clip(repr(value))}")
        return None
    if meta.get("choices") and value not in meta["choices"]:
        problems.append(f"{key}: {value!r} is not one of {', '.join(map(repr, meta['choices']))}")
    lo, hi = meta.get("lo"), meta.get("hi")
    allowed = (f"from {lo} to {hi}" if lo is not None and hi is not None
               else f"at least {lo}" if lo is not None else f"at most {hi}")
    if lo is not None and value < lo:
        problems.append(f"{key}: {value!r} is below the minimum {lo}; allowed: {allowed}")
    if hi is not None and value > hi:
        problems.append(f"{key}: {value!r} is above the maximum {hi}; allowed: {allowed}")
    return value


def _build(cls: type, data: Any, prefix: str, problems: list[str]) -> Any:
    if not isinstance(data, dict):
        problems.append(f"{prefix.rstrip('.') or '(top level)'}: expected a mapping, got {type(data).__name__}")
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            valid = ", ".join(valid_keys(cls, prefix))
            problems.append(f"{dotted}: unknown key; valid keys here: {valid}")
            continue
        typ = hints[key]
        if dataclasses.is_dataclass(typ):
            kwargs[key] = _build(typ, value, f"{dotted}.", problems)
        elif _entry_class(typ) is not None:
            kwargs[key] = _build_entries(_entry_class(typ), value, dotted, problems)
        else:
            checked = _check_value(dotted, value, typ, dict(fields[key].metadata), problems)
            if checked is not None:
                kwargs[key] = checked
    return cls(**kwargs)


def _entry_class(typ: Any) -> type | None:
    """The settings class of a `dict[str, <settings class>]` field (gpu.types), else None."""
    args = typing.get_args(typ)
    if typing.get_origin(typ) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return args[1]
    return None


def _build_entries(cls: type, data: Any, key: str, problems: list[str]) -> dict[str, Any]:
    """A mapping of names to `cls` settings (gpu.types): each name a GPU type as Slurm writes it, each entry
    checked like a section; a field without a default (its minimum above 0) must be given."""
    if not isinstance(data, dict):
        problems.append(f"{key}: expected a mapping of GPU type to its settings (e.g. {{a100: {{memory_mib: "
                        f"40960}}}}), got {type(data).__name__} {inputs.clip(repr(data))}")
        return {}
    out: dict[str, Any] = {}
    for name, value in data.items():
        if not isinstance(name, str) or not TYPE_NAME.match(name):
            problems.append(f"{key}: {inputs.clip(repr(name))} is not a GPU type name; allowed: letters, digits, "
                            "_ . - (as in Slurm's Gres=gpu:a100:4)")
            continue
        entry = _build(cls, {} if value is None else value, f"{key}.{name}.", problems)
        for f in dataclasses.fields(cls) if value is None or isinstance(value, dict) else ():
            lo = f.metadata.get("lo")
            if f.name not in (value or {}) and lo is not None and getattr(entry, f.name) < lo:
                problems.append(f"{key}.{name}.{f.name}: missing; allowed: a number from {lo} to "
                                f"{f.metadata['hi']}, which every GPU type needs")
        out[name] = entry
    return out


def _type_figure_problems(types: dict[str, GpuTypeSettings]) -> list[str]:
    """Each configured GPU type must have public figures (the table, or `like:` a type it has): checked here, so a
    type the helper cannot estimate is said by `elastico config`, not found later in every family built."""
    from slurm_elastico.shapes.gpu_types import resolve  # the table, imported only when types are configured

    problems = []
    declared = {name: {"like": t.like} for name, t in types.items() if t.like}
    for name in types:
        try:
            resolve(name, declared)
        except ConfigError as exc:
            problems += [p if p.startswith("gpu.types.") else f"gpu.types.{p}" for p in exc.problems]
    return problems


def from_mapping(data: Any, source: str = "<settings>") -> Settings:
    """Build `Settings` from parsed YAML, raising one `ConfigError` listing every problem."""
    problems: list[str] = []
    settings = _build(Settings, {} if data is None else data, "", problems)
    problems += _type_figure_problems(settings.gpu.types)
    for name, t in settings.gpu.types.items():
        if 0 < t.shares_per_gpu <= 100 and t.shares_per_gpu != settings.gpu.shares_per_gpu:  # (out of range: said)
            # the planner, the gateway and elastico-submit count every GPU's shares by gpu.shares_per_gpu
            problems.append(f"gpu.types.{name}.shares_per_gpu: {t.shares_per_gpu} differs from gpu.shares_per_gpu "
                            f"({settings.gpu.shares_per_gpu}); allowed: 0 or {settings.gpu.shares_per_gpu} (every GPU "
                            "must have the same MPS shares: per-type counts are not supported yet)")
    if settings.interference.probe_budget > 0 and not settings.interference.adapt_online:
        problems.append(f"interference.probe_budget: {settings.interference.probe_budget:g} without "
                        "interference.adapt_online; allowed: 0, or a budget with adapt_online: true (probes are what "
                        "the adapting model learns from)")
    if problems:
        raise ConfigError(source, problems)
    return settings


def load(path: str | os.PathLike | None = None) -> Settings:
    """Load settings from `path`, `$ELASTICO_CONFIG`, or the default path; defaults if none exists.

    The paths the settings name are checked on this host (`check_paths`), so a wrong one is refused here and not
    when the helper, a report or a submission first uses it."""
    if path is None:
        env = os.environ.get(ENV_VAR)
        candidates = [Path(env)] if env else list(DEFAULT_PATHS)
        path = next((p for p in candidates if p.exists()), None)
        if path is None:
            if env:
                raise ConfigError(env, [f"${ENV_VAR} names a file that does not exist"])
            settings = Settings()
            _raise_path_problems(settings, "the default settings (no settings file)")
            return settings
    settings = from_mapping(inputs.read_yaml(path, "settings file"), str(path))
    _raise_path_problems(settings, str(path))
    return settings


STATE_DIR_ALLOWED = "allowed: a directory, or a path that can be created as one"
SLURM_CONF_ALLOWED = "allowed: the path of the cluster's slurm.conf (a regular file), or empty for Slurm's default"


def check_paths(settings: Settings) -> list[str]:
    """The problems of the paths `settings` name, as this host's file system has them (empty: none).

    state_dir must be a directory or a path whose nearest existing parent is one (the helper creates the rest);
    slurm.conf, when set, an existing regular file: otherwise every Slurm command fails later, with a message about
    Slurm's configuration that names no setting. Whether the helper's user may write the state directory is
    checked where the helper starts (`helper.private`): `elastico config` may run as another user.
    """
    problems = []
    if not settings.state_dir:
        problems.append(f"state_dir: empty; {STATE_DIR_ALLOWED}")
    else:
        problems += _directory_problems("state_dir", Path(settings.state_dir))
    if settings.slurm.conf:
        conf = Path(settings.slurm.conf)
        what = _what_is(conf)
        if what != "is a regular file":
            problems.append(f"slurm.conf: {conf} {what}; {SLURM_CONF_ALLOWED}")
    return problems


def _raise_path_problems(settings: Settings, source: str) -> None:
    problems = check_paths(settings)
    if problems:
        raise ConfigError(source, problems)


def _directory_problems(key: str, path: Path) -> list[str]:
    """`key: ...` when `path` is not a directory and cannot be created as one (a parent is a file, say)."""
    what = _what_is(path)
    if what in ("is a directory", UNCHECKED):  # a path this user may not look into is the helper's to judge
        return []
    if what != "does not exist":
        return [f"{key}: {path} {what}; {STATE_DIR_ALLOWED}"]
    for parent in path.parents:
        above = _what_is(parent)
        if above in ("is a directory", UNCHECKED):
            return []
        if above != "does not exist":
            return [f"{key}: {path} cannot be created: {parent} {above}; {STATE_DIR_ALLOWED}"]
    return []  # pragma: no cover - a relative path ends at ".", an absolute one at "/"


UNCHECKED = "cannot be checked (permission denied)"


def _what_is(path: Path) -> str:
    """What `path` is, in words that follow its name: 'is a regular file', 'does not exist', ... (symlinks followed)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "does not exist"
    except PermissionError:
        return UNCHECKED
    except OSError as exc:
        return f"cannot be checked ({exc.strerror or exc})"
    except ValueError:
        return "is no path (it holds a NUL character)"
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return f"is {name}"
    return "is neither a regular file nor a directory"  # pragma: no cover - every kind Linux has is above
