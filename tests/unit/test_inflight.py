"""The in-flight guard (helper.inflight) and the journals' recent rows it reads ('done' and 'recovered')."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.helper.epoch import run_once
from slurm_elastico.helper.inflight import SETTLE_S, in_flight
from slurm_elastico.helper.journal import Journal, MemoryJournal
from slurm_elastico.model import Action, ActionKind, JobState
from slurm_elastico.store import Store
from tests.synthetic import cluster, family, pending, running, snapshot

NOW = 1_000_000.0
START = Action(ActionKind.START_NOW, 1, "start it")


def test_a_job_started_last_epoch_and_still_pending_is_in_flight():
    assert in_flight([(NOW - 1, START)], [pending(1)], NOW) == {1}


@pytest.mark.parametrize("job", [running(1, "n0000", 0, 100), pending(1, held=True),
                                 dataclasses.replace(pending(1), state=JobState.COMPLETED)])
def test_a_job_that_runs_ended_or_was_held_since_is_not(job):
    assert in_flight([(NOW - 1, START)], [job], NOW) == set()


@pytest.mark.parametrize("at", [NOW - SETTLE_S - 0.5, NOW + 0.5])  # before the window; after now
def test_only_an_action_within_the_window_counts(at):
    assert in_flight([(at, START)], [pending(1)], NOW) == set()
    assert in_flight([(at, START)], [pending(1)], NOW, settle_s=SETTLE_S + 1) == ({1} if at < NOW else set())


def test_an_action_recovery_completed_in_this_very_epoch_counts():
    assert in_flight([(NOW, Action(ActionKind.RESUME, 1, "resume"))], [pending(1)], NOW) == {1}


@pytest.mark.parametrize("kind,expected", [(ActionKind.RESUME, {1}), (ActionKind.RESHAPE_RUNNING, {1}),
                                           (ActionKind.SET_SHARE, set()), (ActionKind.SET_NODES, set()),
                                           (ActionKind.PREEMPT, set())])
def test_only_actions_that_end_with_starttime_now_put_a_job_in_flight(kind, expected):
    assert in_flight([(NOW - 1, Action(kind, 1, "t", share=50))], [pending(1)], NOW) == expected


def test_a_negative_window_is_refused_naming_it():
    with pytest.raises(ValueError, match="settle_s -1: must be a number of seconds >= 0"):
        in_flight([], [], NOW, settle_s=-1)


@pytest.fixture(params=["store", "memory"])
def journal(request, tmp_path):
    if request.param == "memory":
        yield MemoryJournal()
        return
    with Store(tmp_path / "s.sqlite") as store:
        yield Journal(store)


def test_both_journals_give_the_done_rows_since_a_time(journal):
    old, new, failed = (journal.plan(t, dataclasses.replace(START, job_id=j)) for t, j in
                        ((NOW - 100, 1), (NOW - 2, 2), (NOW - 1, 3)))
    journal.settle(old, "done", NOW - 100)
    journal.settle(new, "done", NOW - 2)
    journal.settle(failed, "failed", NOW - 1, "refused")
    journal.plan(NOW - 1, dataclasses.replace(START, job_id=4))  # still open
    assert [(at, a.job_id) for at, a in journal.recent(NOW - 10)] == [(NOW - 2, 2)]
    # A row a crash left open, settled by recovery: at its settling, when recovery may have released the job.
    stale = journal.plan(NOW - 300, dataclasses.replace(START, job_id=5))
    journal.settle(stale, "recovered", NOW - 1, "released (StartTime=now)")
    assert [(at, a.job_id) for at, a in journal.recent(NOW - 10)] == [(NOW - 2, 2), (NOW - 1, 5)]


class Gateway:
    """Slurm that accepts every action and starts nothing yet: the job stays pending."""

    def __init__(self, snap):
        self.snap, self.did = snap, []

    def snapshot(self):
        return self.snap

    def argv_for(self, action):
        return [["scontrol", action.kind.value, str(action.job_id)]]

    def apply(self, action):
        self.did.append((action.kind, action.job_id))

    def release(self, job_id):
        self.did.append(("release", job_id))


class Fixed:
    def __init__(self, fams):
        self.fams = fams

    def families(self, job_ids):
        return {j: f for j, f in self.fams.items() if j in job_ids}, []


def test_the_next_epoch_leaves_a_job_slurm_is_starting_alone_and_plans_it_after_the_window(journal):
    waiting = dataclasses.replace(pending(1, share=25), reason="BeginTime")  # elastico-submit's placement window
    gw = Gateway(snapshot(cluster(1), [waiting]))
    fams = Fixed({1: family((25, 0.5, 1000), (100, 1.0, 1000))})
    first = run_once(gw, Settings(), fams, None, journal, NOW)
    kinds = [o.action.kind for o in first.outcomes]
    assert ActionKind.START_NOW in kinds and all(o.status == "done" for o in first.outcomes), first.outcomes
    gw.did.clear()
    second = run_once(gw, Settings(), fams, None, journal, NOW + 1)  # Slurm has not started it yet
    assert gw.did == [] and second.outcomes == ()
    assert any("job 1: no new action, an earlier epoch started it" in n for n in second.plan.notes)
    later = run_once(gw, Settings(), fams, None, journal, NOW + SETTLE_S + 1)  # it did not start: planned again
    assert [o.action.kind for o in later.outcomes] == kinds
