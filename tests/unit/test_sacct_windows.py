"""history.windows: accounting read a time window at a time answers what one sacct call over the period answers."""

from __future__ import annotations

import random
import time

from slurm_elastico.history import windows
from slurm_elastico.model import JobState
from slurm_elastico.slurm.accounting import SacctRecord
from slurm_elastico.slurm.commands import sacct_json

NOW = 1_800_000_000


def run(job_id, submit, eligible, end, state=JobState.COMPLETED) -> SacctRecord:
    return SacctRecord(job_id=job_id, name="j", user="u", state=state, submit_time=submit, eligible_time=eligible,
                       start_time=None if end is None else eligible, end_time=end)


class FakeSacct:
    """sacct's selection (Slurm 22.05 and 24.11, as measured): every run eligible before the window's end that
    ended at or after its start (or has not ended); with --state=CANCELLED, cancelled runs that ended in it."""

    def __init__(self, runs):
        self.runs, self.calls = runs, []

    def __call__(self, a: str, b: str, states: str):
        lo, hi = windows.parse_when(a, NOW), windows.parse_when(b, NOW)
        self.calls.append((lo, hi, states))
        if states == "CANCELLED":
            got = [r for r in self.runs if r.state is JobState.CANCELLED and r.end_time and lo <= r.end_time <= hi]
        else:
            got = [r for r in self.runs if r.eligible_time and r.eligible_time < hi
                   and (r.end_time is None or r.end_time >= lo)]
        return tuple(got), tuple(f"job {r.job_id}: bad" for r in got if r.job_id % 97 == 0)


def history(n: int, seed: int) -> list[SacctRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        submit = NOW - rng.randrange(0, 7 * 86400)
        if i % 10 == 0:  # cancelled while it waited for its --begin time: it ended before it became eligible
            out.append(run(i + 1, submit, submit + rng.randrange(60, 20000), submit + rng.randrange(0, 50),
                           JobState.CANCELLED))
        elif i % 10 == 1:  # still running or pending
            out.append(run(i + 1, submit, submit + rng.randrange(0, 600), None, JobState.RUNNING))
        else:
            elig = submit + rng.randrange(0, 600)
            out.append(run(i + 1, submit, elig, elig + rng.randrange(1, 30000)))
    return out


def test_the_windows_together_answer_what_one_call_answers_and_each_stays_small():
    for seed in range(3):
        sacct = FakeSacct(history(3000, seed))
        one, one_bad = sacct("now-7days", "now", "")
        sacct.calls.clear()
        seen, bad = windows.read(sacct, "now-7days", "now", target=300, now=NOW)
        assert sorted((r.job_id, r.submit_time) for r in seen) == sorted((r.job_id, r.submit_time) for r in one)
        assert len(seen) == len({(r.job_id, r.submit_time) for r in seen})  # a run spanning windows kept once
        assert set(one_bad) <= set(bad) and len(bad) == len(set(bad))
        cancelled = {f"job {r.job_id}: bad" for r in sacct.runs if r.state is JobState.CANCELLED}
        assert set(bad) - set(one_bad) <= cancelled  # the cancelled pass's unreadable records are counted
        first_pass = [c for c in sacct.calls if c[2] == ""]
        assert len(first_pass) > 5
        assert first_pass[0][0] == NOW - 7 * 86400 and first_pass[-1][1] == NOW
        assert all(a[1] == b[0] for a, b in zip(first_pass, first_pass[1:]))  # no gap between windows


def test_without_the_cancelled_pass_a_boundary_loses_runs_cancelled_before_eligible():
    sacct = FakeSacct([run(1, NOW - 6 * 86400, NOW - 100, NOW - 6 * 86400 + 5, JobState.CANCELLED)])
    only_first = lambda a, b, states: sacct(a, b, states) if states == "" else ((), ())  # noqa: E731
    lost, _ = windows.read(only_first, "now-7days", "now", first_s=600, now=NOW)
    found, _ = windows.read(sacct, "now-7days", "now", first_s=600, now=NOW)
    assert sacct("now-7days", "now", "")[0] and not lost and [r.job_id for r in found] == [1]


def test_a_run_read_twice_keeps_the_newest_answer():
    calls = []

    def fetch(a, b, states):
        calls.append(states)
        if states:
            return (), ()
        end = None if len(calls) == 1 else NOW - 10  # running in the first window, ended by the last
        return (run(7, NOW - 900, NOW - 900, end, JobState.RUNNING if end is None else JobState.COMPLETED),), ()

    seen, _ = windows.read(fetch, "now-1hour", "now", first_s=600, now=NOW)
    assert [(r.job_id, r.state) for r in seen] == [(7, JobState.COMPLETED)]


def test_dates_it_cannot_read_make_one_call_and_progress_ends_at_one():
    calls, marks = [], []
    fetch = lambda a, b, states: calls.append((a, b, states)) or ((), ())  # noqa: E731
    windows.read(fetch, "2026-01-01T00:00:00+01", "now", progress=lambda f, n: marks.append(f), now=NOW)
    assert calls == [("2026-01-01T00:00:00+01", "now", "")] and marks == [1.0]
    calls.clear(), marks.clear()
    windows.read(fetch, "now-2days", "now", progress=lambda f, n: marks.append(f), now=NOW)
    assert len(calls) > 2 and marks[-1] == 1.0 and marks == sorted(marks)


def test_sacct_date_syntax_and_window_lengths():
    assert windows.parse_when("now", NOW) == NOW
    assert windows.parse_when("now-7days", NOW) == NOW - 7 * 86400
    assert windows.parse_when("now+2hours", NOW) == NOW + 7200
    assert windows.parse_when("now-30", NOW) == NOW - 30
    assert windows.parse_when("now-3fortnights", NOW) is None
    assert windows.parse_when("2026-12-05T04:00", NOW) == int(time.mktime(time.strptime("2026-12-05T04:00",
                                                                                         "%Y-%m-%dT%H:%M")))
    assert windows.parse_when("yesterday", NOW) is None
    assert windows.parse_when(windows.sacct_time(NOW - 5), NOW) == NOW - 5
    assert windows.next_span(600, 0, 2000) == 2400  # empty: four times longer at most
    assert windows.next_span(600, 8000, 2000) == 150  # crowded: a quarter
    assert windows.next_span(600, 1000, 2000) == 1200
    assert windows.next_span(60, 10**6, 2000) == windows.MIN_SPAN_S
    assert "--state=CANCELLED" in sacct_json(start="a", end="b", states="CANCELLED")
    assert not any(a.startswith("--state") for a in sacct_json(start="a", end="b"))
