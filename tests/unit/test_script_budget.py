"""helper.families' reading budget: new jobs' batch scripts read in a meaningful order until
`helper.script_read_budget_s` is spent, the rest left as submitted and read by the next epochs."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from slurm_elastico.config import Settings, from_mapping
from slurm_elastico.errors import ConfigError
from slurm_elastico.helper.epoch import render, run_once
from slurm_elastico.helper.families import ScriptFamilies, read_order, read_scripts
from slurm_elastico.helper.journal import Journal
from slurm_elastico.helper.shadow import ReadOnlyGateway, ShadowJournal
from tests.synthetic import cluster, pending, running, snapshot
from tests.unit.test_sched_logic import FakeGateway
from tests.unit.test_trust import Scripts, elastico_script, store  # noqa: F401 (fixture)

NOW = 1_000_000.0


class Ticking:
    """A clock that advances `step` seconds at each script read (a fake for the time `scontrol` takes)."""

    def __init__(self, step: float = 1.0):
        self.now, self.step, self.lock = 0.0, step, threading.Lock()

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        with self.lock:
            self.now += self.step


class TimedScripts(Scripts):
    def __init__(self, scripts, clock: Ticking):
        super().__init__(scripts)
        self.clock = clock

    def batch_script(self, job_id: int) -> str:
        self.clock.tick()
        return super().batch_script(job_id)


class ScriptGateway(FakeGateway):
    """The scripted epoch gateway, with the jobs' batch scripts (what `ScriptFamilies` reads)."""

    def __init__(self, snap, scripts: TimedScripts):
        super().__init__(snap)
        self.scripts = scripts

    def batch_script(self, job_id: int) -> str:
        return self.scripts.batch_script(job_id)


def queue():
    """Job 5 running; pending 4 (priority 10), 3 (priority 5), 1 and 2 (priority 1, 2 submitted first), 6 held."""
    return [pending(1, NOW - 50, priority=1), pending(2, NOW - 60, priority=1), pending(3, NOW - 10, priority=5),
            pending(4, NOW - 5, priority=10), running(5, "n0000", 0, 25, start=NOW - 100),
            pending(6, NOW - 500, priority=0, held=True)]


def test_running_jobs_are_read_first_then_pending_ones_by_priority_then_submit_time():
    assert [j.job_id for j in read_order(queue())] == [5, 4, 3, 2, 1, 6]


@pytest.mark.parametrize("workers", [1, 4])
def test_no_read_starts_once_the_budget_is_spent_and_the_first_reads_are_those_in_order(workers):
    clock = Ticking()
    scripts = TimedScripts({j: f"#!/bin/sh\n# {j}\n" for j in range(1, 21)}, clock)
    order = [7, 3, 12, 1, 20, 5, 9, 2, 11, 4, 6, 8, 10, 13, 14, 15, 16, 17, 18, 19]
    got = read_scripts(scripts, order, workers=workers, budget_s=4.5, clock=clock)
    # each read takes 1 s: reads start at 0, 1, 2, 3, 4 s; with several workers, up to that many more may have
    # started before the clock passed the budget
    assert 5 <= len(got) <= 5 + workers - 1 < len(order)
    assert list(got) == order[:len(got)] and sorted(scripts.reads) == sorted(got)
    assert got[12] == "#!/bin/sh\n# 12\n"
    unlimited = TimedScripts(scripts.scripts, Ticking())
    assert set(read_scripts(unlimited, order, workers=workers, budget_s=0.0, clock=unlimited.clock)) == set(order)


def test_a_budget_smaller_than_one_read_still_reads_one_script_per_epoch():
    clock = Ticking(step=10.0)
    scripts = TimedScripts({1: "a", 2: "b"}, clock)
    assert read_scripts(scripts, [2, 1], workers=1, budget_s=0.001, clock=clock) == {2: "b"}


def test_the_jobs_left_unread_are_counted_and_read_by_the_next_epochs_each_once_in_order(store):  # noqa: F811
    clock = Ticking()
    scripts = TimedScripts({j: elastico_script() for j in range(1, 7)}, clock)
    src = ScriptFamilies(store, scripts, 16000, read_budget_s=1.5, monotonic=clock, workers=1)
    snap = snapshot(cluster(2), queue())
    rounds = []
    for _ in range(4):
        before = len(scripts.reads)
        src.admit(snap, dry_run=False)
        rounds.append((scripts.reads[before:], src.deferred, sorted(src.families(set(range(1, 7)))[0])))
    assert rounds == [([5, 4], 4, [4, 5]), ([3, 2], 2, [2, 3, 4, 5]), ([1, 6], 0, [1, 2, 3, 4, 5, 6]),
                      ([], 0, [1, 2, 3, 4, 5, 6])]
    # a job that arrives later with a higher priority is read before the older ones still waiting
    late = ScriptFamilies(store, scripts, 16000, read_budget_s=1.5, monotonic=clock, workers=1)
    store.execute("DELETE FROM job_admission WHERE job_id IN (1, 2, 6)")
    scripts.scripts[7] = elastico_script()
    before = len(scripts.reads)
    late.admit(snapshot(cluster(2), [*queue(), pending(7, NOW, priority=99)]), dry_run=False)
    assert scripts.reads[before:] == [7, 2] and late.deferred == 2


def test_a_dry_run_continues_where_the_last_one_stopped_and_writes_nothing(store):  # noqa: F811
    clock = Ticking()
    scripts = TimedScripts({j: elastico_script() for j in range(1, 7)}, clock)
    src = ScriptFamilies(store, scripts, 16000, read_budget_s=2.5, monotonic=clock, workers=1)
    snap = snapshot(cluster(2), queue())
    src.admit(snap, dry_run=True)
    assert (scripts.reads, src.deferred) == ([5, 4, 3], 3)
    src.admit(snap, dry_run=True)
    assert (scripts.reads[3:], src.deferred) == ([2, 1, 6], 0)
    assert store.query("SELECT * FROM job_admission") == []


@pytest.mark.parametrize("mode", ["act", "shadow"])
def test_an_epoch_acts_only_on_jobs_it_has_read_and_says_how_many_it_left_for_later(store, mode):  # noqa: F811
    clock = Ticking()
    jobs = [dataclasses.replace(j, priority=10 - j.job_id) for j in (pending(i, NOW - 60) for i in range(1, 7))]
    scripts = TimedScripts({j.job_id: elastico_script() for j in jobs}, clock)
    inner = ScriptGateway(snapshot(cluster(4), jobs), scripts)
    src = ScriptFamilies(store, inner, 16000, read_budget_s=2.5, monotonic=clock, workers=1)
    shadow = mode == "shadow"
    gw = ReadOnlyGateway(inner) if shadow else inner
    journal = ShadowJournal(store) if shadow else Journal(store)
    first = run_once(gw, Settings(), src, None, journal, NOW, shadow=shadow)
    acted = {o.action.job_id for o in first.outcomes}
    assert scripts.reads == [1, 2, 3] and first.deferred == 3 and first.managed == (1, 2, 3)
    assert acted and acted <= {1, 2, 3}  # jobs 4-6 keep their Slurm state untouched this epoch
    assert {a.job_id for a in inner.applied} <= {1, 2, 3} and (shadow is (inner.applied == []))
    note = "families not read yet: 3 job(s), deferred to later epochs"
    assert any(n.startswith(note) for n in first.plan.notes) and note in render(first)
    assert first.to_dict()["families_deferred"] == 3
    second = run_once(gw, Settings(), src, None, journal, NOW + 30, shadow=shadow)
    assert scripts.reads == [1, 2, 3, 4, 5, 6] and second.deferred == 0 and second.managed == (1, 2, 3, 4, 5, 6)
    assert not any(n.startswith("families not read yet") for n in second.plan.notes)


@pytest.mark.parametrize("value, problem", [
    (-1, "helper.script_read_budget_s: -1.0 is below the minimum 0; allowed: from 0 to 3600"),
    (86400, "helper.script_read_budget_s: 86400.0 is above the maximum 3600; allowed: from 0 to 3600"),
    ("2s", "helper.script_read_budget_s: expected float (finite), got str '2s'"),
    (float("nan"), "helper.script_read_budget_s: expected float (finite), got float nan"),
    (True, "helper.script_read_budget_s: expected float (finite), got bool True"),
])
def test_a_bad_budget_is_refused_naming_the_key_and_what_is_allowed(value, problem):
    with pytest.raises(ConfigError) as err:
        from_mapping({"helper": {"script_read_budget_s": value}})
    assert err.value.problems == (problem,)


def test_the_helper_reads_with_the_budget_its_settings_give(tmp_path):
    from slurm_elastico.helper.metrics import Metrics
    from slurm_elastico.helper.service import open_service

    assert Settings().helper.script_read_budget_s > 0  # bounded by default
    settings = from_mapping({"state_dir": str(tmp_path), "helper": {"script_read_budget_s": 0.25}})
    service = open_service(settings, None, families_dir=None, dry_run=False, metrics=Metrics(), metrics_file=None,
                           log=lambda level, line: None)
    try:
        assert service.families.read_budget_s == 0.25
    finally:
        service.store.close()
