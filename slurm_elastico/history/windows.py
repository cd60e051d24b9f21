"""Accounting read in time windows: `sacct --json` over a long period, a piece at a time.

Why: sacct builds its whole JSON answer in memory before printing it; for
10,000 jobs that is about 70 MB of text and over 1 GiB in sacct itself
(Slurm 22.05), and as much again while Python reads it. Asked for a shorter
window at a time, each answer stays small.

sacct's `--starttime S --endtime E` lists every job run that was in some
state during [S, E], so a run that spans windows (a long job, one pending
across them) comes back in each: runs are kept once, by job id and submit
time (a requeued job's runs each have their own submit time), the last
answer winning (it is the newest state). The union of the windows' answers
is then what one call over the whole period answers, but for one kind of run:
sacct takes a run when it became eligible before E and ended at or after S,
and a job cancelled while it waited for its --begin time ended before it
became eligible; a window boundary between those two times loses it. A
second pass over the same windows, for CANCELLED runs (which sacct takes by
their end time), finds those; of its answers only such runs, eligible before
the period's end, are added. The window length
adapts: it starts at `first_s` and is scaled each time so a window holds
about `target` runs (at most four times longer or shorter per step).

`parse_when` reads the subset of sacct's date syntax it can turn into a time
(`now`, `now-7days`, ISO dates and times); for anything else `read` makes one
call over the whole period, as before.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator

from slurm_elastico.slurm.accounting import SacctRecord, bad_record_job

Fetch = Callable[[str, str, str], tuple[tuple[SacctRecord, ...], tuple[str, ...]]]
"""(start, end in sacct's date syntax, states: "" for all or e.g. "CANCELLED") -> (records, bad record lines), e.g.
`gateway.sacct_each(start=, end=, states=)`."""
Progress = Callable[[float, int], None]
"""progress(fraction of the period read, runs so far)."""

UNITS = {"": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "min": 60, "mins": 60, "minute": 60,
         "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400,
         "w": 604800, "week": 604800, "weeks": 604800}
_NOW = re.compile(r"now(?:([+-])(\d+)([a-z]*))?", re.I)
_ISO = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S")
MIN_SPAN_S = 60


def parse_when(text: str, now: float) -> int | None:
    """`text` in sacct's date syntax as a Unix time (local time, as sacct reads it); None when not one of `now`,
    `now[+-]N[unit]` (seconds, minutes, hours, days, weeks) or an ISO date / date and time."""
    text = text.strip()
    m = _NOW.fullmatch(text)
    if m:
        if not m.group(1):
            return int(now)
        unit = UNITS.get(m.group(3).lower())
        if unit is None:
            return None
        return int(now) + (1 if m.group(1) == "+" else -1) * int(m.group(2)) * unit
    for fmt in _ISO:
        try:
            return int(time.mktime(time.strptime(text, fmt)))
        except ValueError:
            continue
    return None


def sacct_time(t: int) -> str:
    """A Unix time as sacct reads it (ISO, local time)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def next_span(span: int, count: int, target: int) -> int:
    """The next window's length: scaled so it would have held about `target` runs, at most 4x either way."""
    scaled = span * target / max(count, 1)
    return max(MIN_SPAN_S, int(min(span * 4, max(span / 4, scaled))))


def spans(start: int, end: int, first_s: int, target: int = 2000) -> Generator[tuple[int, int], int, None]:
    """Consecutive windows (a, b) covering [start, end]; after each, the caller sends the runs it found."""
    a, span = start, max(MIN_SPAN_S, first_s)
    while True:
        b = min(end, a + span)
        count = yield a, b
        if b >= end:
            return
        span = next_span(span, count or 0, target)
        a = b


def read(fetch: Fetch, since: str, until: str, *, progress: Progress | None = None, target: int = 2000,
         first_s: int = 600, now: float | None = None) -> tuple[tuple[SacctRecord, ...], tuple[str, ...]]:
    """What `fetch(since, until)` answers, asked a window at a time (see the module); one call when the dates
    are not ones `parse_when` reads or the period is empty."""
    now = time.time() if now is None else now
    start, end = parse_when(since, now), parse_when(until, now)
    if start is None or end is None or end <= start:
        records, bad = fetch(since, until, "")
        if progress:
            progress(1.0, len(records))
        return records, bad
    runs: dict[tuple[int, int | None], SacctRecord] = {}
    bad: dict[str, None] = {}
    done: list[tuple[int, int]] = []
    windows = spans(start, end, first_s, target=target)
    a, b = next(windows)
    while True:
        records, lines = fetch(_when(a, start, since), _when(b, end, until), "")
        for r in records:
            runs.pop((r.job_id, r.submit_time), None)  # re-inserted last: the newest answer, in time order
            runs[(r.job_id, r.submit_time)] = r
        bad.update(dict.fromkeys(lines))
        done.append((a, b))
        if progress:
            progress(0.9 * (b - start) / (end - start), len(runs))
        try:
            a, b = windows.send(len(records))
        except StopIteration:
            break
    if len(done) > 1:  # the second pass (see the module): cancelled before they became eligible
        first = {job for job, _ in runs}
        for i, (a, b) in enumerate(done):
            records, lines = fetch(_when(a, start, since), _when(b, end, until), "CANCELLED")
            for r in records:
                if (r.job_id, r.submit_time) not in runs and never_eligible(r, end):
                    runs[(r.job_id, r.submit_time)] = r
            # an unreadable record cannot say when it became eligible: counted unless the first pass read its job
            bad.update(dict.fromkeys(x for x in lines if x not in bad and bad_record_job(x) not in first))
            if progress:
                progress(0.9 + 0.1 * (i + 1) / len(done), len(runs))
    return tuple(runs.values()), tuple(bad)


def never_eligible(r: SacctRecord, end: int) -> bool:
    """A run that ended before it became eligible, eligible before `end`: one a window boundary can lose."""
    return (r.eligible_time is not None and r.end_time is not None and r.end_time < r.eligible_time
            and r.eligible_time < end)


def _when(t: int, edge: int, text: str) -> str:
    """The period's own text at its edges (sacct reads it as the user wrote it), else `t` as sacct reads it."""
    return text if t == edge else sacct_time(t)
