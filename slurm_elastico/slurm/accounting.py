"""Job runs from `sacct --json` (22.05 openapi/dbv0.0.38, 24.11 data_parser/v0.0.42) as `SacctRecord`s.

Pure functions of the text sacct printed; the gateway runs it. `sacct -D`
lists each run of a requeued job apart, each with its own allocation;
`runs_by_job` puts them back together in time order. TRES are lists of
`{type, name, count}`, comments `{administrator, job, system}`, and
`state.current` is a string in 22.05 and a list in 24.11.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from slurm_elastico.errors import ParseError
from slurm_elastico.model import JobState
from slurm_elastico.slurm.hostlist import expand_hostlist
from slurm_elastico.slurm.schema import Fields, load, state_of

__all__ = ["SacctRecord", "parse_sacct", "parse_sacct_each", "runs_by_job"]


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
    eligible_time: int | None = None
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
    account: str = ""
    array_job_id: int | None = None
    """The array's job id for a task of an array job (its own `job_id` is the task's); None otherwise."""
    array_task_id: int | None = None
    array_pending: tuple[int, ...] = ()
    """For an array's record that no task has split off yet (`array_task_id` None): the task ids it stands for."""
    het_job_id: int | None = None
    """The leader's job id for a component of a heterogeneous job; None otherwise."""
    het_job_offset: int | None = None

    @property
    def requeued(self) -> bool:
        return self.state is JobState.REQUEUED


def _tres_list(f: Fields, key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, t in enumerate(f.items(key)):
        item = Fields(t, f"{f.path}.{key}[{i}]", f.doc)
        kind, name = item.text("type", required=True), item.text("name")
        count = item.integer("count")
        if count is None or count < 0:  # energy: null (22.05) or -2 (24.11)
            continue
        out[f"{kind}/{name}" if name else kind] = count
    return out


def _sacct_job(f: Fields) -> SacctRecord:
    state_f = f.sub("state", required=True)
    state, _ = state_of(state_f, "current")
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
        eligible_time=time_f.time("eligible"),
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
        account=f.text("account"),
        array_job_id=f.sub("array").integer("job_id") or None,  # 0: not an array job
        array_task_id=f.sub("array").integer("task_id"),
        array_pending=f.sub("array").parsed("task", array_tasks),
        het_job_id=f.sub("het").integer("job_id") or None,
        het_job_offset=f.sub("het").integer("job_offset"),
    )


def array_tasks(text: str) -> tuple[int, ...]:
    """The task ids an array record's `task` field names: a hex bitmap (`0x7`: tasks 0, 1, 2; 22.05) or ranges
    (`0-2,5`, `0-10:2`, an optional `%N` limit); empty for none. `ParseError` naming what is allowed."""
    text = (text or "").strip()
    if not text:
        return ()
    try:
        if text.lower().startswith("0x"):
            bits = int(text, 16)
            return tuple(i for i in range(bits.bit_length()) if bits >> i & 1)
        out: list[int] = []
        for part in text.split("%", 1)[0].split(","):
            span, _, step = part.partition(":")
            first, _, last = span.partition("-")
            out += range(int(first), int(last or first) + 1, int(step or 1))
        return tuple(out)
    except ValueError:
        raise ParseError(f"not an array's task list; allowed: a hex bitmap (0x7) or ranges (0-2,5 or 0-10:2, "
                         "with an optional %N)") from None


def parse_sacct(text: str, source: str = "sacct --json") -> tuple[SacctRecord, ...]:
    """Job runs from `sacct --json` (both schemas), in the order sacct printed them."""
    doc = load(text, source)
    top = Fields(doc.data, "", doc)
    return tuple(_sacct_job(Fields(j, f"jobs[{i}]", doc)) for i, j in enumerate(top.items("jobs", required=True)))


def parse_sacct_each(text: str, source: str = "sacct --json") -> tuple[tuple[SacctRecord, ...], tuple[str, ...]]:
    """Job runs from `sacct --json`, a record that cannot be read set aside: (the records, one line per bad record
    naming its job id where it has one and the field). The document itself (its schema, its job list) must
    read, or `ParseError`."""
    doc = load(text, source)
    top = Fields(doc.data, "", doc)
    good, bad = [], []
    for i, j in enumerate(top.items("jobs", required=True)):
        try:
            good.append(_sacct_job(Fields(j, f"jobs[{i}]", doc)))
        except ParseError as exc:
            job = j.get("job_id") if isinstance(j, dict) else None
            bad.append(f"job {job if isinstance(job, int) else '(no job_id)'}: {exc}")
    return tuple(good), tuple(bad)


def bad_record_job(line: str) -> int | None:
    """The job id a line of `parse_sacct_each`'s bad records names (None: the record had no job id)."""
    m = re.match(r"job (\d+): ", line)
    return int(m.group(1)) if m else None


def runs_by_job(records: Iterable[SacctRecord]) -> dict[int, tuple[SacctRecord, ...]]:
    """Each job's runs in time order (sacct -D prints a requeued job's runs apart, not always in order)."""
    runs: dict[int, list[SacctRecord]] = {}
    for r in records:
        runs.setdefault(r.job_id, []).append(r)
    key = lambda r: (r.submit_time or 0, r.start_time or 0)  # noqa: E731
    return {job_id: tuple(sorted(rs, key=key)) for job_id, rs in runs.items()}
