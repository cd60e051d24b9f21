"""Slurm's JSON documents: schema detection, typed field access and the value forms shared by every parser.

Each parser (`jobs`, `nodes`, `accounting`) loads a command's output with
`load`, which reads the schema from `meta` (22.05: `meta.plugin.type`
"openapi/v0.0.38" and `meta.Slurm`; 24.11: `meta.plugin.data_parser`
"data_parser/v0.0.42" and `meta.slurm`; 26.05: "data_parser/v0.0.45", read
as v0.0.42: it only adds and drops fields the parsers do not read). Any other
schema, a newer one included, is a `ParseError` naming the command that
printed it, the schema and the Slurm release it came from: never a guess,
since a field that changed its form would otherwise be read wrong. `Fields`
gives typed access whose errors name the field, the command and the schema.

Traps handled here (see tests/unit/test_parse.py for the recorded output):

- 24.11 prints most numbers as `{set, infinite, number}`; `number()` reads
  both forms, and Slurm's NO_VAL/INFINITE sentinels, as None.
- `job_state` is a string in 22.05 (a flag such as "REQUEUED" or
  "COMPLETING" replaces the base state) and a list in 24.11 (base state
  first, then flags); `job_state()` maps both to one `JobState` (squeue and
  sacct alike).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from slurm_elastico.errors import NotJsonError, ParseError
from slurm_elastico.model import JobState

__all__ = [
    "SCHEMA_V0038",
    "SCHEMA_V0042",
    "SCHEMA_V0045",
    "SCHEMA_RELEASES",
    "SUPPORTED_SCHEMAS",
    "Doc",
    "Fields",
    "job_state",
    "load",
    "number",
    "schema_of",
    "slurm_errors",
    "slurm_version",
    "state_of",
]

SCHEMA_V0038 = "v0.0.38"
"""Slurm 22.05 (`openapi/v0.0.38`, `openapi/dbv0.0.38` for sacct)."""
SCHEMA_V0042 = "v0.0.42"
"""Slurm 24.11 (`data_parser/v0.0.42`)."""
SCHEMA_V0045 = "v0.0.45"
"""Slurm 26.05 (`data_parser/v0.0.45`): the v0.0.42 fields the parsers read, unchanged (recorded output in
tests/data/slurm/26.05); it drops `power` and adds `submit_line`, `step_id` and `sluid`, none of them read."""
SUPPORTED_SCHEMAS = (SCHEMA_V0038, SCHEMA_V0042, SCHEMA_V0045)
SCHEMA_RELEASES = {SCHEMA_V0038: "22.05", SCHEMA_V0042: "24.11", SCHEMA_V0045: "26.05"}
"""The Slurm release each supported schema was recorded from."""

_T = TypeVar("_T")

# Slurm's "no value" and "infinite" sentinels (uint32 and uint64).
_SENTINELS = frozenset({0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF})

_BASE_STATES = frozenset(
    {"PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
     "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)
# What a job whose state prints only as a flag (22.05 prints the flag instead of
# the base state) is, for planning: it still holds its allocation, or it waits.
_FLAG_STATES = {
    "CONFIGURING": JobState.RUNNING,
    "POWER_UP_NODE": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "STAGE_OUT": JobState.COMPLETING,
    "REQUEUE_FED": JobState.PENDING,
}
_HOLD_FLAGS = frozenset({"REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD"})


@dataclass(frozen=True)
class Doc:
    """One command's output: where it came from ("squeue --json"), its schema and its data."""

    source: str
    schema: str
    data: dict[str, Any]


def load(text: str, source: str) -> Doc:
    """The JSON object a command printed, with its schema.

    `NotJsonError` when the text is no JSON object at all (a command that did not answer), `ParseError` when
    its schema is unknown (drift).
    """
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise NotJsonError(f"{source}: output is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise NotJsonError(f"{source}: output is a JSON {type(data).__name__}, not an object")
    return Doc(source, _detect_schema(data, source), data)


def _supported() -> str:
    return ", ".join(f"{schema} (Slurm {SCHEMA_RELEASES[schema]})" for schema in SUPPORTED_SCHEMAS)


def _detect_schema(data: Mapping[str, Any], source: str) -> str:
    meta = data.get("meta")
    if not isinstance(meta, dict):
        raise ParseError(f"{source}: no 'meta' object, so the schema is unknown (supported: {_supported()})")
    plugin = meta.get("plugin") if isinstance(meta.get("plugin"), dict) else {}
    found = [str(plugin.get(k)) for k in ("data_parser", "type") if plugin.get(k)]
    for text in found:
        m = re.search(r"v\d+\.\d+\.\d+", text)
        if m and m.group(0) in SUPPORTED_SCHEMAS:
            return m.group(0)
    what = " / ".join(repr(f) for f in found) or "nothing"
    release = _release_of(meta)
    made_by = f" (Slurm {release})" if release else ""
    raise ParseError(
        f"{source}: its JSON output uses schema {what}{made_by} (meta.plugin), which this version of "
        f"slurm-elastico does not read; supported: {_supported()}. An unknown schema is refused, not guessed at: "
        f"a field that changed its form would be read wrong"
    )


def _release_of(meta: Mapping[str, Any]) -> str:
    """Slurm's release from `meta`, as well as it can be read from a document of any schema ("" when not)."""
    for key in ("slurm", "Slurm"):
        slurm = meta.get(key)
        if not isinstance(slurm, dict):
            continue
        if isinstance(slurm.get("release"), str) and slurm["release"]:
            return slurm["release"]
        version = slurm.get("version")
        if isinstance(version, dict) and all(isinstance(version.get(k), (int, str)) for k in ("major", "minor", "micro")):
            return f"{version['major']}.{str(version['minor']).zfill(2)}.{version['micro']}"
    return ""


def number(value: Any) -> int | float | None:
    """A Slurm number in either form: plain (22.05) or `{set, infinite, number}` (24.11).

    None when unset, infinite, null, or one of Slurm's NO_VAL/INFINITE
    sentinels; raises TypeError for anything that is not a number.
    """
    if value is None:
        return None
    if isinstance(value, dict):
        if "number" not in value:
            raise TypeError(f"object without 'number': {value!r}")
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value["number"]
        if value is None:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r} is not a number")
    if value in _SENTINELS:
        return None
    return value


class Fields:
    """Typed access to one JSON object; errors name the field, the command and the schema."""

    def __init__(self, obj: Any, path: str, doc: Doc):
        if not isinstance(obj, dict):
            raise ParseError(f"{doc.source} ({doc.schema}): {path} is a {type(obj).__name__}, not an object")
        self.obj, self.path, self.doc = obj, path, doc

    def error(self, key: str, problem: str) -> ParseError:
        return ParseError(f"{self.doc.source} ({self.doc.schema}): {self.path}.{key} {problem}")

    def raw(self, key: str, required: bool = False) -> Any:
        if key not in self.obj:
            if required:
                raise self.error(key, "is missing")
            return None
        return self.obj[key]

    def sub(self, key: str, required: bool = False) -> Fields:
        value = self.raw(key, required)
        return Fields({} if value is None else value, f"{self.path}.{key}", self.doc)

    def num(self, key: str, required: bool = False) -> int | float | None:
        value = self.raw(key, required)
        try:
            return number(value)
        except TypeError as exc:
            raise self.error(key, f"is not a number: {exc}") from None

    def integer(self, key: str, default: int | None = None, required: bool = False) -> int | None:
        value = self.num(key, required)
        if value is None and required:
            raise self.error(key, "is null or unset")
        return default if value is None else int(value)

    def text(self, key: str, default: str = "", required: bool = False) -> str:
        value = self.raw(key, required)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"is a {type(value).__name__}, not a string")
        return value

    def strs(self, key: str) -> tuple[str, ...]:
        """A list of strings; a lone string counts as a one-item list."""
        value = self.raw(key)
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, "is not a list of strings")
        return tuple(value)

    def items(self, key: str, required: bool = False) -> list[Any]:
        value = self.raw(key, required)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(key, f"is a {type(value).__name__}, not a list")
        return value

    def parsed(self, key: str, parse: Callable[[str], _T]) -> _T:
        """A string field run through a string parser; its errors gain the field's path."""
        value = self.text(key)
        try:
            return parse(value)
        except ParseError as exc:
            raise self.error(key, f"= {value!r}: {exc}") from None

    def time(self, key: str) -> int | None:
        """Unix seconds; 0 and unset are None."""
        value = self.integer(key)
        return value if value else None


def schema_of(text: str, source: str = "Slurm JSON") -> str:
    """The schema a command's JSON output uses (one of `SUPPORTED_SCHEMAS`); `source` names the command in errors."""
    return load(text, source).schema


def slurm_version(text: str, source: str = "Slurm JSON") -> str:
    """Slurm's release ("22.05.8") from the `meta` of any command's JSON output; `source` names the command in
    errors."""
    doc = load(text, source)
    meta = Fields(doc.data["meta"], "meta", doc)
    key = "Slurm" if doc.schema == SCHEMA_V0038 else "slurm"
    slurm = meta.sub(key, required=True)
    release = slurm.text("release")
    if release:
        return release
    version = slurm.sub("version", required=True)
    parts = [str(version.raw(k, required=True)) for k in ("major", "minor", "micro")]
    return f"{parts[0]}.{parts[1].zfill(2)}.{parts[2]}"


def slurm_errors(text: str) -> tuple[str, ...]:
    """The messages of Slurm's top-level `errors` list (empty when the command succeeded).

    Each is the entry's description (else its error text), after the Slurm call that failed when the entry
    names one: 22.05's squeue prints `{"description": "Failed while looking for jobs", "source":
    "slurm_load_jobs", ...}` while slurmctld is down, and exits 0.
    """
    doc = load(text, "Slurm JSON")
    out = []
    for err in Fields(doc.data, "", doc).items("errors"):
        if isinstance(err, dict):
            message = str(err.get("description") or err.get("error") or err)
            source = err.get("source")
            out.append(f"{source}: {message}" if isinstance(source, str) and source else message)
        else:
            out.append(str(err))
    return tuple(out)


def job_state(value: str | Sequence[str]) -> tuple[JobState, bool]:
    """(state, held-by-flag) from a 22.05 string or a 24.11 list such as ["PENDING", "REQUEUED"].

    COMPLETING and REQUEUED win over the base state, as 22.05 prints them;
    REQUEUE_HOLD and SPECIAL_EXIT mean a pending job that needs a release.
    """
    tokens = [value] if isinstance(value, str) else list(value)
    if not tokens or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"job state {value!r} is not a string or a list of strings")
    flags = {t.upper() for t in tokens}
    if "COMPLETING" in flags:
        return JobState.COMPLETING, False
    if "REQUEUED" in flags:
        return JobState.REQUEUED, False
    if flags & _HOLD_FLAGS:
        return JobState.PENDING, True
    for token in tokens:
        if token.upper() in _BASE_STATES:
            return JobState.parse(token), False
    for token in tokens:
        if token.upper() in _FLAG_STATES:
            return _FLAG_STATES[token.upper()], False
    return JobState.parse("COMPLETED" if tokens[0].upper() == "COMPLETE" else tokens[0]), False


def state_of(f: Fields, key: str) -> tuple[JobState, bool]:
    """`job_state` of field `key`; its errors name the field."""
    value = f.raw(key, required=True)
    try:
        return job_state(value)
    except ValueError as exc:
        raise f.error(key, str(exc)) from None
