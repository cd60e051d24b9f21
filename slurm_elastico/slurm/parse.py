"""Slurm's JSON output (22.05 openapi v0.0.38, 24.11 data_parser v0.0.42) to the model's types.

Pure functions of the text a command printed; the gateway runs the commands.
The schema is read from `meta` (22.05: `meta.plugin.type` "openapi/v0.0.38"
and `meta.Slurm`; 24.11: `meta.plugin.data_parser` "data_parser/v0.0.42" and
`meta.slurm`); an unknown one is a `ParseError`, never a guess.

Traps handled here (see the tests for the recorded output they come from):

- 24.11 prints most numbers as `{set, infinite, number}`; `number()` reads
  both forms, and Slurm's NO_VAL/INFINITE sentinels, as None.
- `job_state` is a string in 22.05 (a flag such as "REQUEUED" or
  "COMPLETING" replaces the base state) and a list in 24.11 (base state
  first, then flags); `job_state()` maps both to one `JobState`.
- Node `gres_used` is wrong for MPS on 22.05 ("mps:(null):1(IDX:0)"), so GPU
  use is rebuilt from the running jobs' `gres_detail` (`build_nodes`).
- 24.11 `gres_detail` for MPS, "mps:10(10/100,0/100,...)", lists *this job's*
  shares on each GPU of the node (not the GPU's total use: two jobs on GPU 0
  print 10/100 and 35/100 while the node's `gres_used` prints 45/100).
- 24.11 `sinfo --json` groups nodes (one record for "n2,n3,n4", with summed
  CPU counts); per-node allocation of a group of several busy nodes is only
  an even split, marked `approximate`. `scontrol show node --json` (24.11)
  gives exact per-node records and parses with the same function.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from slurm_elastico.errors import ParseError
from slurm_elastico.model import MPS_SHARES_PER_GPU, GpuUse, GpuView, JobState, JobView, NodeView, PartitionView
from slurm_elastico.slurm.gres import gres_counts, parse_gres_detail, parse_gres_list, parse_gres_request, parse_tres
from slurm_elastico.slurm.hostlist import compress_hostlist, expand_hostlist

__all__ = [
    "SCHEMA_V0038",
    "SCHEMA_V0042",
    "SUPPORTED_SCHEMAS",
    "NodeRecord",
    "SacctRecord",
    "build_nodes",
    "compress_hostlist",
    "expand_hostlist",
    "job_state",
    "number",
    "parse_sacct",
    "parse_sinfo",
    "parse_squeue",
    "partitions_from",
    "runs_by_job",
    "schema_of",
    "slurm_errors",
    "slurm_version",
]

SCHEMA_V0038 = "v0.0.38"
"""Slurm 22.05 (`openapi/v0.0.38`, `openapi/dbv0.0.38` for sacct)."""
SCHEMA_V0042 = "v0.0.42"
"""Slurm 24.11 (`data_parser/v0.0.42`)."""
SUPPORTED_SCHEMAS = (SCHEMA_V0038, SCHEMA_V0042)

_T = TypeVar("_T")

HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
"""`state_reason` of a job held by `scontrol hold`/`requeuehold` (user or admin)."""

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


# --------------------------------------------------------------------------
# Documents, schemas, typed field access
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Doc:
    source: str  # "squeue --json"
    schema: str
    data: dict[str, Any]


def _load(text: str, source: str) -> _Doc:
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ParseError(f"{source}: output is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ParseError(f"{source}: output is a JSON {type(data).__name__}, not an object")
    return _Doc(source, _detect_schema(data, source), data)


def _detect_schema(data: Mapping[str, Any], source: str) -> str:
    meta = data.get("meta")
    if not isinstance(meta, dict):
        raise ParseError(f"{source}: no 'meta' object, so the schema is unknown (supported: {', '.join(SUPPORTED_SCHEMAS)})")
    plugin = meta.get("plugin") if isinstance(meta.get("plugin"), dict) else {}
    found = [str(plugin.get(k)) for k in ("data_parser", "type") if plugin.get(k)]
    for text in found:
        m = re.search(r"v\d+\.\d+\.\d+", text)
        if m and m.group(0) in SUPPORTED_SCHEMAS:
            return m.group(0)
    what = " / ".join(repr(f) for f in found) or "nothing"
    raise ParseError(
        f"{source}: meta.plugin names {what}; supported schemas: "
        f"{', '.join(SUPPORTED_SCHEMAS)} (Slurm 22.05 and 24.11)"
    )


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


class _Fields:
    """Typed access to one JSON object; errors name the field, the command and the schema."""

    def __init__(self, obj: Any, path: str, doc: _Doc):
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

    def sub(self, key: str, required: bool = False) -> _Fields:
        value = self.raw(key, required)
        return _Fields({} if value is None else value, f"{self.path}.{key}", self.doc)

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


def schema_of(text: str) -> str:
    """The schema a command's JSON output uses ("v0.0.38" or "v0.0.42")."""
    return _load(text, "Slurm JSON").schema


def slurm_version(text: str) -> str:
    """Slurm's release ("22.05.8") from the `meta` of any command's JSON output."""
    doc = _load(text, "Slurm JSON")
    meta = _Fields(doc.data["meta"], "meta", doc)
    key = "Slurm" if doc.schema == SCHEMA_V0038 else "slurm"
    slurm = meta.sub(key, required=True)
    release = slurm.text("release")
    if release:
        return release
    version = slurm.sub("version", required=True)
    parts = [str(version.raw(k, required=True)) for k in ("major", "minor", "micro")]
    return f"{parts[0]}.{parts[1].zfill(2)}.{parts[2]}"


def slurm_errors(text: str) -> tuple[str, ...]:
    """The messages of Slurm's top-level `errors` list (empty when the command succeeded)."""
    doc = _load(text, "Slurm JSON")
    out = []
    for err in _Fields(doc.data, "", doc).items("errors"):
        if isinstance(err, dict):
            out.append(str(err.get("description") or err.get("error") or err))
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


def _state_of(f: _Fields, key: str) -> tuple[JobState, bool]:
    value = f.raw(key, required=True)
    try:
        return job_state(value)
    except ValueError as exc:
        raise f.error(key, str(exc)) from None


# --------------------------------------------------------------------------
# squeue / scontrol show job
# --------------------------------------------------------------------------


def _memory_mib(f: _Fields, cpus: int, node_count: int) -> int:
    """Memory per node: memory_per_node, else per-CPU x CPUs per node, else the requested TRES.

    22.05 prints memory_per_node as null and 24.11 as 0 when the job took the
    default; the requested `mem=` TRES is then the only record (for the job,
    so it is divided by the node count).
    """
    per_node = f.integer("memory_per_node") or 0
    if per_node > 0:
        return per_node
    per_cpu = f.integer("memory_per_cpu") or 0
    if per_cpu > 0:
        return per_cpu * math.ceil(cpus / max(1, node_count))
    for key in ("tres_alloc_str", "tres_req_str"):
        mem = f.parsed(key, parse_tres).get("mem", 0)
        if mem > 0:
            return mem // max(1, node_count)
    return 0


def _job(f: _Fields) -> JobView:
    state, held_flag = _state_of(f, "job_state")
    reason = f.text("state_reason")
    priority = f.integer("priority")  # None when absent: not a hold
    nodes = f.parsed("nodes", expand_hostlist)
    node_count = f.integer("node_count") or max(1, len(nodes))
    cpus = f.integer("cpus") or 1
    gres = f.parsed("tres_per_node", parse_gres_request)
    if gres is None and node_count <= 1:
        # --gpus=N asks per job; on one node that is the per-node request.
        gres = f.parsed("tres_per_job", parse_gres_request)
    # gres_detail has one entry per allocated node, in node order.
    alloc: list[tuple[str, int, int]] = []
    for k, (node, detail) in enumerate(zip(nodes, f.strs("gres_detail"))):
        try:
            holds = parse_gres_detail(detail)
        except ParseError as exc:
            raise f.error(f"gres_detail[{k}]", f"= {detail!r}: {exc}") from None
        alloc.extend((node, h.index, 0 if h.whole else h.shares) for h in holds)
    limit = f.integer("time_limit")
    return JobView(
        job_id=f.integer("job_id", required=True),  # type: ignore[arg-type]
        name=f.text("name", required=True),
        user=f.text("user_name", required=True),
        partition=f.text("partition", required=True),
        state=state,
        reason="" if reason == "None" else reason,
        held=state is JobState.PENDING
        and (held_flag or f.raw("hold") is True or priority == 0 or reason in HELD_REASONS),
        gres=gres,
        nodes=nodes,
        gpu_indices=tuple(sorted({i for n, i, _ in alloc if nodes and n == nodes[0]})),
        cpus=cpus,
        memory_mib=_memory_mib(f, cpus, node_count),
        submit_time=f.time("submit_time"),
        start_time=f.time("start_time"),
        end_time=f.time("end_time"),
        time_limit_s=None if limit is None else limit * 60,
        restarts=f.integer("restart_cnt", 0) or 0,
        priority=priority or 0,
        requeue=bool(f.raw("requeue")),
        comment=f.text("comment"),
        admin_comment=f.text("admin_comment"),
        gpu_alloc=tuple(alloc),
        work_dir=f.text("current_working_directory"),
    )


def parse_squeue(text: str) -> tuple[JobView, ...]:
    """Jobs from `squeue --json` (both schemas) or `scontrol show job --json` (24.11).

    `held` is true only for a PENDING job that needs a release: priority 0,
    a JobHeld* reason, 24.11's `hold`, or a REQUEUE_HOLD state. A "None"
    reason becomes "".
    """
    doc = _load(text, "squeue --json")
    top = _Fields(doc.data, "", doc)
    jobs = top.items("jobs", required=True)
    return tuple(_job(_Fields(j, f"jobs[{i}]", doc)) for i, j in enumerate(jobs))


# --------------------------------------------------------------------------
# sinfo / scontrol show node
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRecord:
    """One node's base facts as sinfo printed them, before the jobs' GPU use is added.

    `gpus`/`mps_total` come from the configured `gres` ("gpu:4,mps:400").
    `tres_used` is the node's TRES in use (right for MPS on 22.05, unlike
    `gres_used`). `approximate` marks allocation figures split evenly over a
    24.11 sinfo group of several nodes.
    """

    name: str
    state: str
    partitions: tuple[str, ...]
    cpus: int
    alloc_cpus: int
    real_memory: int
    alloc_memory: int
    gres: str = ""
    gpus: int = 0
    mps_total: int = 0
    tres_used: dict[str, int] = field(default_factory=dict, hash=False)
    gres_used: str = ""
    partition_states: tuple[tuple[str, str], ...] = ()
    approximate: bool = False


def _node_state(words: Iterable[str]) -> str:
    """["IDLE", "DRAIN"] -> "idle+drain" (lower case, like sinfo; '+' like scontrol)."""
    out: list[str] = []
    for w in words:
        w = w.strip().lower()
        if w and w not in out:
            out.append(w)
    return "+".join(out) or "unknown"


def _node(f: _Fields) -> NodeRecord:
    """A per-node record: 22.05 `sinfo --json` or 24.11 `scontrol show node --json`."""
    gres = f.text("gres")
    gpus, mps = f.parsed("gres", gres_counts)
    return NodeRecord(
        name=f.text("name", required=True),
        state=_node_state(f.strs("state") + f.strs("state_flags")),
        partitions=f.strs("partitions"),
        cpus=f.integer("cpus", required=True),  # type: ignore[arg-type]
        alloc_cpus=f.integer("alloc_cpus", 0) or 0,
        real_memory=f.integer("real_memory", 0) or 0,
        alloc_memory=f.integer("alloc_memory", 0) or 0,
        gres=gres,
        gpus=gpus,
        mps_total=mps,
        tres_used=f.parsed("tres_used", parse_tres),
        gres_used=f.text("gres_used"),
    )


def _group(f: _Fields) -> list[NodeRecord]:
    """The nodes of one 24.11 `sinfo --json` group, which sums CPU counts over its nodes."""
    names: list[str] = []
    listed = f.sub("nodes", required=True)
    listed.raw("nodes", required=True)
    for entry in listed.strs("nodes"):
        try:
            names.extend(expand_hostlist(entry))
        except ParseError as exc:
            raise listed.error("nodes", f"= {entry!r}: {exc}") from None
    if not names:
        return []
    count = len(names)
    cpus, memory, gres_f = f.sub("cpus"), f.sub("memory"), f.sub("gres")
    part = f.sub("partition")
    part_name = part.text("name")
    part_state = _node_state(part.sub("partition").strs("state")).upper() if part_name else ""
    cmin, cmax = cpus.integer("minimum", 0), cpus.integer("maximum", 0)
    per_node_cpus = cmax if cmin == cmax else (cpus.integer("total", 0) or 0) // count
    alloc_cpus = cpus.integer("allocated", 0) or 0
    mmin, mmax = memory.integer("minimum", 0), memory.integer("maximum", 0)
    alloc_mem = memory.integer("allocated", 0) or 0
    approximate = cmin != cmax or mmin != mmax or (count > 1 and (alloc_cpus > 0 or alloc_mem > 0))
    gres, used = gres_f.text("total"), gres_f.text("used")
    gpus, mps = gres_f.parsed("total", gres_counts)
    tres_used: dict[str, int] = {}
    if count == 1:
        # 24.11's gres used is right (22.05's is not, and has no groups).
        tres_used = {"cpu": alloc_cpus, "mem": alloc_mem}
        for item in gres_f.parsed("used", parse_gres_list):
            if item.name in ("gpu", "mps"):
                key = f"gres/{item.name}"
                tres_used[key] = tres_used.get(key, 0) + item.count
        tres_used = {k: v for k, v in tres_used.items() if v}
    return [
        NodeRecord(
            name=name,
            state=_node_state(f.sub("node").strs("state")),
            partitions=(part_name,) if part_name else (),
            cpus=per_node_cpus or 0,
            alloc_cpus=alloc_cpus // count,
            real_memory=mmax or 0,
            alloc_memory=alloc_mem // count,
            gres=gres,
            gpus=gpus,
            mps_total=mps,
            tres_used=tres_used,
            gres_used=used if count == 1 else "",
            partition_states=((part_name, part_state),) if part_name else (),
            approximate=approximate,
        )
        for name in names
    ]


def _merge(a: NodeRecord, b: NodeRecord) -> NodeRecord:
    """One node listed in two partitions' groups: same node, union of partitions."""
    parts = a.partitions + tuple(p for p in b.partitions if p not in a.partitions)
    states = a.partition_states + tuple(s for s in b.partition_states if s not in a.partition_states)
    return replace(a, partitions=parts, partition_states=states)


def parse_sinfo(text: str) -> tuple[NodeRecord, ...]:
    """Node records from `sinfo --json` (22.05 `nodes`, 24.11 `sinfo` groups) or 24.11 `scontrol show node --json`."""
    doc = _load(text, "sinfo --json")
    top = _Fields(doc.data, "", doc)
    records: list[NodeRecord] = []
    if "sinfo" in doc.data:
        for i, group in enumerate(top.items("sinfo")):
            records.extend(_group(_Fields(group, f"sinfo[{i}]", doc)))
    elif "nodes" in doc.data:
        records = [_node(_Fields(n, f"nodes[{i}]", doc)) for i, n in enumerate(top.items("nodes"))]
    else:
        raise top.error("sinfo", "and .nodes are both missing: no node records")
    merged: dict[str, NodeRecord] = {}
    for r in records:
        merged[r.name] = _merge(merged[r.name], r) if r.name in merged else r
    return tuple(merged.values())


def build_nodes(
    records: Iterable[NodeRecord],
    jobs: Iterable[JobView],
    shares_per_gpu: int = MPS_SHARES_PER_GPU,
    gpu_memory_mib: int = 0,
) -> tuple[NodeView, ...]:
    """Nodes with per-GPU users, from node records and the active jobs' `gpu_alloc`.

    Each GPU's MPS total is the node's MPS count over its GPU count (Slurm
    splits `Count` evenly; a remainder is dropped), or `shares_per_gpu` when
    the node has no MPS. A GPU held by a `gpu:N` job is a whole user even when
    MPS jobs share it (22.05 allows that). Holds on GPUs or nodes the records
    do not have (squeue and sinfo run moments apart) are left out.
    """
    holds: dict[tuple[str, int], list[GpuUse]] = {}
    for job in jobs:
        if not job.state.active:
            continue
        for node, index, shares in job.gpu_alloc:
            use = GpuUse(job.job_id, shares, whole=shares == 0)
            holds.setdefault((node, index), []).append(use)
    out = []
    for r in records:
        per_gpu = r.mps_total // r.gpus if r.gpus and r.mps_total else shares_per_gpu
        gpus = tuple(
            GpuView(node=r.name, index=i, shares_total=per_gpu, users=tuple(holds.get((r.name, i), ())))
            for i in range(r.gpus)
        )
        out.append(
            NodeView(
                name=r.name,
                state=r.state,
                partitions=r.partitions,
                cpus=r.cpus,
                cpus_alloc=r.alloc_cpus,
                memory_mib=r.real_memory,
                memory_alloc_mib=r.alloc_memory,
                gpus=gpus,
                gpu_memory_mib=gpu_memory_mib,
            )
        )
    return tuple(out)


def partitions_from(records: Iterable[NodeRecord]) -> tuple[PartitionView, ...]:
    """Partitions in first-seen order with their nodes; state "UP" unless a 24.11 group said otherwise."""
    nodes: dict[str, list[str]] = {}
    states: dict[str, str] = {}
    for r in records:
        for p in r.partitions:
            nodes.setdefault(p, [])
            if r.name not in nodes[p]:
                nodes[p].append(r.name)
        for p, s in r.partition_states:
            if s:
                states[p] = s
    return tuple(PartitionView(name=p, nodes=tuple(ns), state=states.get(p, "UP")) for p, ns in nodes.items())


# --------------------------------------------------------------------------
# sacct
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class SacctRecord:
    """One run of a job from `sacct --json` (`-D` lists each run of a requeued job).

    TRES are {"cpu": 1, "mem": 4000, "gres/mps": 25, ...} (mem in MiB); a run
    ended by a requeue has state REQUEUED (22.05 "REQUEUED", 24.11
    ["PENDING", "REQUEUED"]). `restarts` is None on 22.05, which lacks it.
    """

    job_id: int
    name: str
    user: str
    state: JobState
    reason: str = ""
    partition: str = ""
    nodes: tuple[str, ...] = ()
    submit_time: int | None = None
    start_time: int | None = None
    end_time: int | None = None
    elapsed_s: int = 0
    time_limit_s: int | None = None
    restarts: int | None = None
    tres_alloc: dict[str, int] = field(default_factory=dict, hash=False)
    tres_req: dict[str, int] = field(default_factory=dict, hash=False)
    comment: str = ""
    admin_comment: str = ""
    system_comment: str = ""
    exit_status: str = ""
    exit_code: int | None = None
    exit_signal: int | None = None

    @property
    def requeued(self) -> bool:
        return self.state is JobState.REQUEUED


def _tres_list(f: _Fields, key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, t in enumerate(f.items(key)):
        item = _Fields(t, f"{f.path}.{key}[{i}]", f.doc)
        kind, name = item.text("type", required=True), item.text("name")
        count = item.integer("count")
        if count is None or count < 0:  # energy: null (22.05) or -2 (24.11)
            continue
        out[f"{kind}/{name}" if name else kind] = count
    return out


def _sacct_job(f: _Fields) -> SacctRecord:
    state_f = f.sub("state", required=True)
    state, _ = _state_of(state_f, "current")
    reason = state_f.text("reason")
    time_f, tres_f, comment_f, exit_f = f.sub("time"), f.sub("tres"), f.sub("comment"), f.sub("exit_code")
    limit = time_f.integer("limit")
    signal_f = exit_f.sub("signal")
    signal = signal_f.integer("signal_id") if "signal_id" in signal_f.obj else signal_f.integer("id")
    status = exit_f.strs("status")
    return SacctRecord(
        job_id=f.integer("job_id", required=True),  # type: ignore[arg-type]
        name=f.text("name"),
        user=f.text("user"),
        state=state,
        reason="" if reason == "None" else reason,
        partition=f.text("partition"),
        nodes=f.parsed("nodes", expand_hostlist),
        submit_time=time_f.time("submission"),
        start_time=time_f.time("start"),
        end_time=time_f.time("end"),
        elapsed_s=time_f.integer("elapsed", 0) or 0,
        time_limit_s=None if limit is None else limit * 60,
        restarts=f.integer("restart_cnt"),
        tres_alloc=_tres_list(tres_f, "allocated"),
        tres_req=_tres_list(tres_f, "requested"),
        comment=comment_f.text("job"),
        admin_comment=comment_f.text("administrator"),
        system_comment=comment_f.text("system"),
        exit_status=status[0] if status else "",
        exit_code=exit_f.integer("return_code"),
        exit_signal=signal,
    )


def parse_sacct(text: str) -> tuple[SacctRecord, ...]:
    """Job runs from `sacct --json` (both schemas), in the order sacct printed them."""
    doc = _load(text, "sacct --json")
    top = _Fields(doc.data, "", doc)
    return tuple(_sacct_job(_Fields(j, f"jobs[{i}]", doc)) for i, j in enumerate(top.items("jobs", required=True)))


def runs_by_job(records: Iterable[SacctRecord]) -> dict[int, tuple[SacctRecord, ...]]:
    """Each job's runs in time order (sacct -D prints a requeued job's runs apart, not always in order)."""
    runs: dict[int, list[SacctRecord]] = {}
    for r in records:
        runs.setdefault(r.job_id, []).append(r)
    key = lambda r: (r.submit_time or 0, r.start_time or 0)  # noqa: E731
    return {job_id: tuple(sorted(rs, key=key)) for job_id, rs in runs.items()}
