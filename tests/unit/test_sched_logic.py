"""The helper's epoch around the planner: journal, failures, rollback, recovery, lock (pure logic, scripted gateway).

The live tests (tests/slurm/test_sched_live.py) run the same code against Slurm.
"""

import dataclasses

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.errors import JobNotPendingError, SlurmError
from slurm_elastico.model import Action, ActionKind, GpuUse, JobState
from tests.synthetic import cluster, family, pending, running, snapshot, with_users
from slurm_elastico.helper.epoch import main_loop, run_once
from slurm_elastico.helper.journal import Journal, action_from_json, action_to_json
from slurm_elastico.store import Store

NOW = 1_000_000.0


class FakeGateway:
    """A gateway whose snapshot is fixed and whose actions fail as scripted; records what it did."""

    def __init__(self, snap, fail=lambda a: None):
        self.snap, self.fail, self.applied, self.released = snap, fail, [], []

    def snapshot(self):
        return self.snap

    def argv_for(self, action):
        return [["echo", action.kind.value, str(action.job_id)]]

    def apply(self, action):
        err = self.fail(action)
        if err is not None:
            raise err
        self.applied.append(action)

    def release(self, job_id):
        self.released.append(job_id)

    def forget_place(self, job_id):
        pass


class Fixed:
    def __init__(self, fams):
        self.fams = fams

    def families(self, job_ids):
        return {j: f for j, f in self.fams.items() if j in job_ids}, []


@pytest.fixture
def journal(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        yield Journal(store)


def statuses(journal):
    return [(r["job_id"], r["kind"], r["status"]) for r in journal.store.query("SELECT * FROM journal ORDER BY id")]


def test_a_failed_share_update_skips_the_jobs_other_actions_and_restores_its_comment(journal):
    fam = family((50, 0.8, 1000), (100, 1.0, 1000))
    snap = snapshot(cluster(1), [pending(1, NOW - 60), pending(2, NOW - 60)])
    gw = FakeGateway(snap, fail=lambda a: JobNotPendingError(("scontrol",), 1, "Job is no longer pending execution")
                     if a.job_id == 1 and a.kind is ActionKind.SET_SHARE else None)
    result = run_once(gw, Settings(), Fixed({1: fam, 2: fam}), None, journal, NOW)
    by_job = {}
    for o in result.outcomes:
        by_job.setdefault(o.action.job_id, []).append((o.action.kind, o.status))
    assert by_job[1] == [(ActionKind.SET_ADMIN_COMMENT, "done"), (ActionKind.SET_SHARE, "failed"),
                         (ActionKind.SET_NODES, "skipped")]
    assert all(s == "done" for _, s in by_job[2])
    restore = [a for a in gw.applied if a.job_id == 1 and a.kind is ActionKind.SET_ADMIN_COMMENT]
    assert [a.text for a in restore][-1] == ""  # the comment the job had before the epoch
    assert (1, "set_share", "failed") in statuses(journal)


def test_a_failed_reshape_stays_planned_and_the_next_epoch_releases_the_held_job(journal):
    fam = family((25, 0.3, 1000), (100, 1.0, 1000), work=10000.0)
    nodes = with_users(cluster(1), {("n0000", 0): (GpuUse(1, 25),)})
    job = running(1, "n0000", 0, 25, start=NOW - 100, shape="mps25-0")
    gw = FakeGateway(snapshot(nodes, [job]), fail=lambda a: SlurmError(("scontrol", "release"), 1, "timeout")
                     if a.kind is ActionKind.RESHAPE_RUNNING else None)
    first = run_once(gw, Settings(), Fixed({1: fam}), None, journal, NOW)
    assert [o.status for o in first.outcomes if o.action.kind is ActionKind.RESHAPE_RUNNING] == ["failed"]
    assert (1, "reshape_running", "planned") in statuses(journal)
    # The job was left held by the failed sequence: the next epoch finds the row and releases it.
    import dataclasses

    held = dataclasses.replace(job, state=pending(1).state, held=True, nodes=(), gpu_indices=(), gpu_alloc=())
    gw.snap = snapshot(cluster(1), [held])
    gw.fail = lambda a: None
    second = run_once(gw, Settings(), Fixed({}), None, journal, NOW + 60)
    assert gw.released == [1] and any("released" in r for r in second.recovered)
    assert (1, "reshape_running", "recovered") in statuses(journal)


def test_dry_run_issues_nothing(journal):
    fam = family((100, 1.0, 1000))
    gw = FakeGateway(snapshot(cluster(1), [pending(1)]))
    result = run_once(gw, Settings(), Fixed({1: fam}), None, None, NOW, dry_run=True)
    assert result.outcomes and all(o.status == "dry-run" and o.argv for o in result.outcomes)
    assert gw.applied == []


def test_the_epoch_json_lists_where_the_plan_puts_each_job_and_at_what_speed(journal):
    import json

    from slurm_elastico import jsonout

    fam = family((50, 1.0, 1000), (100, 1.6, 1000))
    result = run_once(FakeGateway(snapshot(cluster(2), [pending(1), pending(2)])), Settings(), Fixed({1: fam, 2: fam}),
                      None, None, NOW, dry_run=True)
    out = json.loads(jsonout.dumps(result.to_dict()))
    assert out["placements"] == [{"job_id": p.job_id, "shape": p.shape, "node": p.node, "gpu": p.gpu, "share": p.share,
                                  "throughput": p.throughput} for p in result.plan.placements]
    assert sorted(p["job_id"] for p in out["placements"]) == [1, 2]
    assert all(p["node"] == "n0000" and p["throughput"] > 0 for p in out["placements"]), out["placements"]
    assert list(out)[-1] == "slurm_changes"  # still the last key (docs/admin/shadow.md)


@pytest.mark.parametrize("tz, expected", [("UTC0", "2026-12-04T05:16:39+00:00"),
                                          ("EST+5", "2026-12-04T00:16:39-05:00")])
def test_the_epoch_line_gives_a_readable_local_time_with_its_offset(monkeypatch, tz, expected):
    import time

    from slurm_elastico.helper.epoch import render

    monkeypatch.setenv("TZ", tz)
    time.tzset()
    try:
        fam = family((100, 1.0, 1000))
        result = run_once(FakeGateway(snapshot(cluster(1), [pending(1)])), Settings(), Fixed({1: fam}), None, None,
                          1796361399.0, dry_run=True)
        first = render(result).splitlines()[0]
    finally:
        monkeypatch.undo()
        time.tzset()
    assert first.startswith(f"epoch at {expected}: "), first
    assert result.to_dict()["at"] == 1796361399.0  # scripts keep Unix seconds


def test_journal_round_trips_actions():
    a = Action(ActionKind.RESHAPE_RUNNING, 7, "why", share=50, nodes=("n1",), shape="s")
    assert action_from_json(action_to_json(a)) == a


def test_loop_survives_a_bad_epoch_and_counts_it():
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 1:
            raise SlurmError(("squeue",), 1, "slurmctld down")

    assert main_loop(step, 0.0, 3, sleep=lambda s: None) == 1
    assert len(calls) == 3


def test_recovery_never_releases_a_job_a_preemption_held(journal):
    # An epoch died after Tiresias' requeuehold (PREEMPT) and mid-reshape of another job: both are held. Only the
    # reshape's hold was a step on the way back to running; the preemption's hold is the point, and stays.
    import dataclasses

    from slurm_elastico.helper.recovery import recover

    held = [dataclasses.replace(pending(j), held=True) for j in (1, 2)]
    journal.plan(NOW, Action(ActionKind.PREEMPT, 1, "preempted"))
    journal.plan(NOW, Action(ActionKind.RESHAPE_RUNNING, 2, "reshape", share=50))
    gw = FakeGateway(snapshot(cluster(1), held))
    notes = recover(gw, journal, gw.snap, NOW + 60)
    assert gw.released == [2]
    assert any("job 1" in n and "stays held" in n for n in notes)
    assert (1, "preempt", "recovered") in statuses(journal) and not journal.unsettled()


def test_a_comment_that_cannot_be_put_back_is_said_in_the_failed_actions_error():
    from slurm_elastico.errors import UnknownJobError
    from slurm_elastico.helper.executor import execute
    from slurm_elastico.helper.journal import MemoryJournal

    class Gone:
        def argv_for(self, action):
            return [["echo"]]

        def apply(self, action):
            if action.kind is ActionKind.SET_SHARE or action.reason.startswith("restore"):
                raise UnknownJobError(["scontrol"], 1, "Invalid job id specified")

    acts = [Action(ActionKind.SET_ADMIN_COMMENT, 1, "t", text="elastico:shape=x"), Action(ActionKind.SET_SHARE, 1, "t", share=50)]
    out = execute(acts, Gone(), MemoryJournal(), NOW, comments={1: "site data"})
    assert out[1].status == "failed" and "could not be put back" in out[1].error


def test_a_job_gone_before_its_reshape_fails_that_action_not_the_epoch():
    from slurm_elastico.errors import UnknownJobError
    from slurm_elastico.helper.executor import execute
    from slurm_elastico.helper.journal import MemoryJournal

    class Reads:  # the real gateway's argv_for reads a reshaped job (its owner and nodes, for its place)
        applied = []

        def argv_for(self, action):
            if action.job_id == 1 and action.kind is ActionKind.RESHAPE_RUNNING:
                raise UnknownJobError(["squeue"], 1, "Invalid job id specified")
            return [["scontrol"]]

        def apply(self, action):
            if action.job_id == 1 and action.kind is ActionKind.RESHAPE_RUNNING:
                raise UnknownJobError(["squeue"], 1, "Invalid job id specified")
            self.applied.append(action)

    acts = [Action(ActionKind.RESHAPE_RUNNING, 1, "t", share=50, nodes=("n1",)), Action(ActionKind.SIGNAL, 2, "t", signal="USR1")]
    out = execute(acts, Reads(), MemoryJournal(), NOW)
    assert [o.status for o in out] == ["failed", "done"] and [a.job_id for a in Reads.applied] == [2]
    assert out[0].argv == () and "Invalid job id" in out[0].error


def test_the_admin_comment_keeps_a_sites_parts_and_a_job_without_a_family_gets_no_action(journal):
    import dataclasses

    fam = family((50, 0.8, 1000), (100, 1.0, 1000))
    site = dataclasses.replace(pending(1, NOW - 60), admin_comment="site:acct=7")
    snap = snapshot(cluster(1), [site, pending(2, NOW - 60)])
    gw = FakeGateway(snap)
    result = run_once(gw, Settings(), Fixed({1: fam}), None, journal, NOW)
    comment = next(a.text for a in gw.applied if a.kind is ActionKind.SET_ADMIN_COMMENT)
    assert comment.startswith("elastico:shape=") and comment.endswith(",site:acct=7")
    assert {a.job_id for a in gw.applied} == {1} and result.managed == (1,)
    assert dict(result.predicted).keys() == {1} and dict(result.predicted)[1] >= 1.0


@pytest.mark.parametrize("policy", ["tiresias", "gavel"])
def test_a_policy_that_puts_a_job_outside_its_partitions_gets_no_action_for_it(journal, policy):
    # These peers' policies place a job of partition b on a's idle node n0000; Slurm would take NodeList=n0000 and
    # the job would never start. The epoch drops the job's actions and says why; elastico keeps it on b's node.
    import dataclasses

    nodes = tuple(dataclasses.replace(n, partitions=(p,)) for n, p in zip(cluster(2, gpus_per_node=1), "ab"))
    fam = family((100, 1.0, 1000))
    snap = snapshot(nodes, [dataclasses.replace(pending(1), partition="b")])
    settings = Settings()
    peer = dataclasses.replace(settings, planner=dataclasses.replace(settings.planner, policy=policy))
    gw = FakeGateway(snap)
    result = run_once(gw, peer, Fixed({1: fam}), None, journal, NOW)
    assert gw.applied == [] and not result.outcomes
    assert "job 1: no action, the plan put it on a node outside the partitions it was submitted to" in " ".join(
        result.plan.notes)
    result = run_once(gw, settings, Fixed({1: fam}), None, journal, NOW)
    assert [a.nodes for a in gw.applied if a.kind is ActionKind.SET_NODES] == [("n0001",)]


class Reading(FakeGateway):
    """A FakeGateway that also answers what Slurm shows of a job now (`job`), as the real gateway does."""

    def __init__(self, snap, view, fail=lambda a: None):
        super().__init__(snap, fail)
        self.view, self.forgot = view, []

    def job(self, job_id):
        return self.view

    def forget_place(self, job_id):
        self.forgot.append(job_id)


def _plan_for(kind, comment):
    from slurm_elastico.helper.executor import keep_others_comments

    return keep_others_comments([Action(ActionKind.SET_ADMIN_COMMENT, 1, "p", text=comment),
                                 Action(kind, 1, "p", share=100 if kind is ActionKind.RESHAPE_RUNNING else None)],
                                {1: "site=x"})


def test_a_preemption_that_times_out_after_its_hold_keeps_the_mark_and_its_row(journal):
    """`requeuehold` done, the job still COMPLETING after the wait: the preemption was settled failed and its
    AdminComment put back, mark `elastico:held=1` included; nothing ever resumed the held job."""
    from slurm_elastico.helper.executor import execute

    job = running(1, "n0000", 0, 100, start=NOW - 100)
    stopping = dataclasses.replace(job, state=JobState.COMPLETING)
    gw = Reading(snapshot(cluster(1), [job]), stopping,
                 fail=lambda a: SlurmError(("squeue",), 0, "", "job 1 did not reach PENDING within 120 s")
                 if a.kind is ActionKind.PREEMPT else None)
    out = execute(_plan_for(ActionKind.PREEMPT, "elastico:shape=s,elastico:held=1"), gw, journal, NOW,
                  comments={1: "site=x"})
    assert [o.status for o in out] == ["done", "failed"] and "may be held" in out[1].error
    assert [a.text for a in gw.applied if a.kind is ActionKind.SET_ADMIN_COMMENT] == [
        "elastico:shape=s,elastico:held=1,site=x"]  # not put back
    assert (1, "preempt", "planned") in statuses(journal)


def test_a_reshape_refused_before_its_hold_is_settled_and_a_later_hold_not_released(journal):
    """`requeuehold` refused: the job still runs. The row stayed open, and when an administrator held the job
    before the next epoch, recovery released it (a hold the helper never placed)."""
    from slurm_elastico.helper.executor import execute

    job = running(1, "n0000", 0, 25, start=NOW - 100)
    gw = Reading(snapshot(cluster(1), [job]), job,
                 fail=lambda a: SlurmError(("scontrol", "requeuehold", "1"), 1, "Requeue of job not allowed")
                 if a.kind is ActionKind.RESHAPE_RUNNING else None)
    out = execute(_plan_for(ActionKind.RESHAPE_RUNNING, "elastico:shape=s"), gw, journal, NOW, comments={1: "site=x"})
    assert [o.status for o in out] == ["done", "failed"]
    assert [a.text for a in gw.applied if a.kind is ActionKind.SET_ADMIN_COMMENT][-1] == "site=x"  # put back
    assert (1, "reshape_running", "failed") in statuses(journal)
    held = dataclasses.replace(job, state=JobState.PENDING, held=True, nodes=(), gpu_indices=(), gpu_alloc=())
    gw.snap, gw.fail = snapshot(cluster(1), [held]), (lambda a: None)
    run_once(gw, Settings(), Fixed({}), None, journal, NOW + 60)
    assert gw.released == []


def test_a_reshape_carried_out_whose_place_was_not_given_up_is_done_and_recovery_gives_it_up(journal):
    from slurm_elastico.errors import PlaceNotGivenUp
    from slurm_elastico.helper.executor import execute

    job = running(1, "n0000", 0, 100, start=NOW - 100)
    gw = Reading(snapshot(cluster(1), [job]), job,
                 fail=lambda a: PlaceNotGivenUp(("scontrol", "delete"), 1, "Access/permission denied",
                                                "job 1 was reshaped and released, but its place was not given up")
                 if a.kind is ActionKind.RESHAPE_RUNNING else None)
    out = execute(_plan_for(ActionKind.RESHAPE_RUNNING, "elastico:shape=s"), gw, journal, NOW, comments={1: "site=x"})
    assert [o.status for o in out] == ["done", "done"] and "not given up" in out[1].error
    assert [a.text for a in gw.applied if a.kind is ActionKind.SET_ADMIN_COMMENT] == ["elastico:shape=s,site=x"]
    gw.fail = lambda a: None
    run_once(gw, Settings(), Fixed({}), None, journal, NOW + 60)
    assert gw.forgot == [1] and (1, "reshape_running", "recovered") in statuses(journal) and gw.released == []
