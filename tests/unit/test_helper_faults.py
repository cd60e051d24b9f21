"""Faults around the helper, as pure logic: Slurm outages, recovery from Slurm's state, backoff, the helper lock.

The live tests (tests/slurm/test_helper_faults_live.py) do the same against the real cluster: a helper
SIGKILLed right after its requeuehold, slurmctld stopped under `--interval`, two helpers.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.errors import (ConfigError, ElasticoError, JobNotPendingError, ParseError, SlurmError,
                                   SlurmTimeout, SlurmUnavailable, UnknownJobError)
from slurm_elastico.helper.epoch import BACKOFF_CAP_S, backoff_s, main_loop, run_once
from slurm_elastico.helper.executor import execute
from slurm_elastico.helper.journal import Journal, MemoryJournal
from slurm_elastico.helper.lock import HelperBusy, helper_lock
from slurm_elastico.helper.observer import ProgressObserver
from slurm_elastico.helper.recovery import Step, decide, recover
from slurm_elastico.model import Action, ActionKind, GpuUse, JobState
from slurm_elastico.slurm.conf import cluster_name, read_cluster_name
from slurm_elastico.slurm.answers import check_answer, classify
from slurm_elastico.slurm.gateway import REVOKE_GAP_S, SlurmGateway
from slurm_elastico.slurm.runner import Completed
from slurm_elastico.store import Store
from tests.synthetic import cluster, family, pending, running, snapshot, with_users

NOW = 1_000_000.0
DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
SQUEUE_OUTAGE = (DATA / "22.05" / "squeue_outage.json").read_text()  # slurmctld stopped: exit 0, errors, no jobs
SINFO_OUTAGE = (DATA / "22.05" / "sinfo_outage.json").read_text()


# ----------------------------------------------------------------------------- the gateway: outage or answer


def done(argv, rc=0, out="", err=""):
    return Completed(tuple(argv), rc, out, err)


@pytest.mark.parametrize("result,kind,says", [
    (done(["squeue", "--all", "--json"], out=SQUEUE_OUTAGE), SlurmUnavailable, "slurm_load_jobs: Failed while looking"),
    (done(["sinfo", "--json"], out=SINFO_OUTAGE), SlurmUnavailable, "Unspecified error"),
    (done(["squeue", "--all", "--json"], rc=1, err="slurm_load_jobs error: Socket timed out"), SlurmUnavailable,
     r"did not answer \(exit 1\)"),
    (done(["squeue", "--all", "--json"], out=""), SlurmUnavailable, "not JSON"),
    (done(["squeue", "--all", "--json"], out='{"meta": {"plugin": {"type": "openapi/v0.0.38"'), SlurmUnavailable,
     "not JSON"),
    (done(["squeue", "--all", "--json"], out="[]"), SlurmUnavailable, "not an object"),
    (done(["squeue", "--json", "--jobs=9"], rc=1, err="slurm_load_jobs error: Invalid job id specified"),
     UnknownJobError, "Invalid job id"),
    (done(["squeue", "--json", "--jobs=9"],
          out=SQUEUE_OUTAGE.replace("Failed while looking for jobs", "Invalid job id specified")),
     UnknownJobError, "Invalid job id"),
    (done(["squeue", "--all", "--json"], out='{"meta": {"plugin": {"type": "openapi/v0.0.99"}}, "jobs": []}'),
     ParseError, "supported: v0.0.38"),  # drift is not an outage: it must be fixed, not waited out
])
def test_a_read_without_an_answer_is_an_outage_never_an_empty_cluster(result, kind, says):
    with pytest.raises(ElasticoError, match=says) as err:
        check_answer(result)
    assert type(err.value) is kind


def test_a_read_that_answered_is_returned():
    ok = done(["squeue", "--all", "--json"], out=(DATA / "22.05" / "squeue_running.json").read_text())
    assert check_answer(ok) is ok


@pytest.mark.parametrize("stderr,kind", [
    ("slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)", SlurmUnavailable),
    ("Unexpected message received for job 1\nslurm_suspend error: Unexpected message received", SlurmUnavailable),
    ("slurm_update error: Invalid job id specified", UnknownJobError),
    ("slurm_update error: Job is no longer pending execution", JobNotPendingError),
    ("slurm_update error: Access/permission denied", SlurmError),
])
def test_an_action_refused_for_want_of_a_controller_is_an_outage(stderr, kind):
    with pytest.raises(SlurmError) as err:
        classify(done(["scontrol", "release", "1"], rc=1, err=stderr))
    assert type(err.value) is kind


def test_a_timeout_is_an_outage_with_its_exit_code():
    exc = SlurmTimeout(["squeue"], 30)
    assert isinstance(exc, SlurmUnavailable) and exc.exit_code == 75 and "30 s" in str(exc)


class Replies:
    """A runner answering by command name; records every call."""

    def __init__(self, **by_command):
        self.by_command, self.calls = by_command, []

    def __call__(self, argv, *, timeout=None):
        self.calls.append(list(argv))
        rc, out, err = self.by_command.get(argv[0], (0, "", ""))
        return done(argv, rc, out, err)


def test_snapshot_raises_on_the_recorded_2205_outage_and_reads_no_further():
    runner = Replies(squeue=(0, SQUEUE_OUTAGE, ""), sinfo=(0, SINFO_OUTAGE, ""))
    with pytest.raises(SlurmUnavailable, match="slurm_load_jobs"):
        SlurmGateway(runner).snapshot()
    assert runner.calls == [["squeue", "--all", "--json"]]


def test_release_of_a_job_held_by_another_process_waits_the_revocation_gap():
    slept = []
    runner = Replies()
    SlurmGateway(runner, sleep=slept.append, clock=lambda: NOW).release(5)
    # the place a dead helper kept for it (`slurm.places.Places.kept`) deleted first, so it does not wait for it
    assert slept == [REVOKE_GAP_S] and runner.calls == [["scontrol", "delete", "ReservationName=elastico-requeue-5"],
                                                        ["scontrol", "release", "5"]]


# ----------------------------------------------------------------------------- recovery from Slurm's state

HELD = dataclasses.replace(pending(1), held=True)
STOPPING = dataclasses.replace(pending(1), state=JobState.COMPLETING)  # right after requeuehold (22.05, measured)
RUNNING = running(1, "n0000", 0, 25)
WAITING = pending(1)
RESHAPE = Action(ActionKind.RESHAPE_RUNNING, 1, "reshape", share=100)
PREEMPT = Action(ActionKind.PREEMPT, 1, "preempt")
RESUME = Action(ActionKind.RESUME, 1, "resume", nodes=("n0000",))
SHARE = Action(ActionKind.SET_SHARE, 1, "share", share=50)


@pytest.mark.parametrize("action,job,step", [
    (RESHAPE, HELD, Step.COMPLETE), (RESHAPE, STOPPING, Step.KEEP), (RESHAPE, RUNNING, Step.CLOSE),
    (RESHAPE, WAITING, Step.CLOSE), (RESHAPE, None, Step.CLOSE),
    (PREEMPT, HELD, Step.CLOSE), (PREEMPT, STOPPING, Step.KEEP), (PREEMPT, RUNNING, Step.CLOSE),
    (RESUME, HELD, Step.COMPLETE), (RESUME, WAITING, Step.CLOSE), (RESUME, None, Step.CLOSE),
    (SHARE, HELD, Step.CLOSE), (SHARE, STOPPING, Step.CLOSE), (SHARE, WAITING, Step.CLOSE),
])
def test_what_an_open_row_needs_by_the_jobs_state(action, job, step):
    assert decide(action, job).step is step


class Slurm:
    """A scripted gateway: a snapshot to return, actions that fail as told; records what it did."""

    def __init__(self, jobs, fail=lambda what, job_id: None):
        self.snap = snapshot(cluster(1), list(jobs))
        self.fail, self.did = fail, []

    def snapshot(self):
        err = self.fail("snapshot", 0)
        if err is not None:
            raise err
        return self.snap

    def argv_for(self, action):
        return [["scontrol", action.kind.value, str(action.job_id)]]

    def apply(self, action):
        self._do(action.kind.value, action.job_id, *(v for v in (action.share, action.gpus, action.nodes) if v))

    def release(self, job_id):
        self._do("release", job_id)

    def forget_place(self, job_id):
        self.forgot = [*getattr(self, "forgot", []), job_id]

    def _do(self, what, job_id, *values):
        err = self.fail(what, job_id)
        if err is not None:
            raise err
        self.did.append((what, job_id, *values))


@pytest.fixture
def journal(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        yield Journal(store)


def rows(journal):
    return [(r["job_id"], r["kind"], r["status"], r["error"]) for r in journal.store.query("SELECT * FROM journal ORDER BY id")]


def test_a_reshape_interrupted_while_its_job_checkpoints_is_kept_open_then_completed(journal):
    # The helper died right after its requeuehold: the job is still COMPLETING (checkpointing).
    journal.plan(NOW, RESHAPE)
    gw = Slurm([STOPPING])
    notes = recover(gw, journal, gw.snap, NOW + 1)
    assert gw.did == [] and [a for _, a in journal.unsettled()] == [RESHAPE]
    assert "still stopping" in notes[0] and rows(journal)[0][2:] == ("planned", f"open: {notes[0].split(': ', 1)[1]}")
    # Next epoch: Slurm shows it pending and held. The reshape is finished, not abandoned.
    gw = Slurm([HELD])
    notes = recover(gw, journal, gw.snap, NOW + 30)
    assert gw.did == [("set_share", 1, 100), ("start_now", 1), ("release", 1)]
    assert not journal.unsettled() and rows(journal)[0][2] == "recovered"
    assert notes[0].startswith("job 1: released (share 100, StartTime=now)") and rows(journal)[0][3] in notes[0]


def test_every_interrupted_reshape_gives_back_the_place_kept_for_it(journal):
    # The helper died after the release: the job runs inside the reservation that kept its place, which would
    # kill it when it ends; recovery takes it out (a preemption keeps no place).
    journal.plan(NOW, RESHAPE)
    journal.plan(NOW, dataclasses.replace(PREEMPT, job_id=2))
    gw = Slurm([RUNNING, dataclasses.replace(HELD, job_id=2)])
    recover(gw, journal, gw.snap, NOW + 30)
    assert gw.forgot == [1] and gw.did == [] and not journal.unsettled()


def test_a_place_slurm_will_not_give_up_keeps_its_row_open_and_the_other_rows_are_settled(journal):
    """One reservation Slurm refused to delete made recovery raise, every epoch: the epoch failed, nothing was
    planned, and a held job's interrupted resume behind it was never completed."""
    journal.plan(NOW, dataclasses.replace(RESHAPE, job_id=2))
    journal.plan(NOW, Action(ActionKind.RESUME, 1, "resume"))

    class Refusing(Slurm):
        def forget_place(self, job_id):
            raise SlurmError(["scontrol", "delete", f"ReservationName=elastico-requeue-{job_id}"], 1, "",
                             "Error deleting the reservation: Access/permission denied")

    gw = Refusing([HELD, dataclasses.replace(HELD, job_id=2)])
    notes = recover(gw, journal, gw.snap, NOW + 30)
    assert gw.did == [("resume", 1)]  # the resume completed; job 2 is not released into its place
    assert [a.job_id for _, a in journal.unsettled()] == [2]
    assert "was not given up" in notes[0] and "Access/permission denied" in notes[0]


def test_recovery_waits_for_slurm_keeping_the_row_open(journal):
    journal.plan(NOW, RESHAPE)
    gw = Slurm([HELD], fail=lambda what, j: SlurmUnavailable(["scontrol"], 1, "Unable to contact slurm controller")
               if what == "release" else None)
    with pytest.raises(SlurmUnavailable):
        recover(gw, journal, gw.snap, NOW + 30)
    assert [a for _, a in journal.unsettled()] == [RESHAPE]


def test_a_release_slurm_refuses_is_tried_again_and_a_gone_job_closes_its_row(journal):
    journal.plan(NOW, RESHAPE)
    journal.plan(NOW, dataclasses.replace(RESHAPE, job_id=2))
    held2 = dataclasses.replace(HELD, job_id=2)
    gw = Slurm([HELD, held2], fail=lambda what, j: (SlurmError(["scontrol"], 1, "Access/permission denied") if j == 1
                                                     else UnknownJobError(["scontrol"], 1, "Invalid job id"))
               if what == "release" else None)
    notes = recover(gw, journal, gw.snap, NOW + 30)
    assert [a.job_id for _, a in journal.unsettled()] == [1]
    assert "tried again next epoch" in notes[0] and "gone" in notes[1]


def test_a_share_slurm_refuses_still_releases_the_job(journal):
    journal.plan(NOW, RESHAPE)
    gw = Slurm([HELD], fail=lambda what, j: SlurmError(["scontrol"], 1, "Invalid generic resource")
               if what == "set_share" else None)
    notes = recover(gw, journal, gw.snap, NOW + 30)
    assert gw.did == [("start_now", 1), ("release", 1)] and "share 100 was refused" in notes[0]
    assert not journal.unsettled()


def test_an_interrupted_gpu_count_reshape_is_completed_with_its_gpus_and_nodes(journal):
    # Killed after its requeuehold: the held job still asks its old GPU count. Released as it is, it would run
    # at the old count under a comment naming the new shape, and the next plan would requeue it a second time.
    journal.plan(NOW, Action(ActionKind.RESHAPE_RUNNING, 1, "grow", gpus=4, nodes=("n0001",)))
    gw = Slurm([HELD])
    notes = recover(gw, journal, gw.snap, NOW + 30)
    assert gw.did == [("set_gpus", 1, 4, ("n0001",)), ("start_now", 1), ("release", 1)]
    assert notes[0].startswith("job 1: released (4 GPU(s) on n0001, StartTime=now)") and not journal.unsettled()


def test_an_interrupted_share_reshape_is_completed_with_its_node_pin_and_a_refused_count_still_releases(journal):
    journal.plan(NOW, dataclasses.replace(RESHAPE, nodes=("n0000",)))
    journal.plan(NOW, Action(ActionKind.RESHAPE_RUNNING, 2, "grow", gpus=2))
    gw = Slurm([HELD, dataclasses.replace(HELD, job_id=2)], fail=lambda what, j: SlurmError(
        ["scontrol"], 1, "Requested node configuration is not available") if what == "set_gpus" else None)
    notes = recover(gw, journal, gw.snap, NOW + 30)
    assert gw.did == [("set_share", 1, 100), ("set_nodes", 1, ("n0000",)), ("start_now", 1), ("release", 1),
                      ("start_now", 2), ("release", 2)]
    assert notes[0].startswith("job 1: released (share 100, node n0000, StartTime=now)")
    assert "2 GPU(s) was refused" in notes[1] and not journal.unsettled()


def test_an_interrupted_resume_of_a_held_job_is_completed(journal):
    journal.plan(NOW, RESUME)
    gw = Slurm([HELD])
    recover(gw, journal, gw.snap, NOW + 30)
    assert gw.did == [("resume", 1, ("n0000",))] and not journal.unsettled()


# ----------------------------------------------------------------------------- the epoch around an outage


class Fixed:
    def __init__(self, fams):
        self.fams = fams

    def families(self, job_ids):
        return {j: f for j, f in self.fams.items() if j in job_ids}, []


FAM = family((25, 0.3, 1000), (100, 1.0, 1000), work=10000.0)


def reshapable():
    """One job running at 25 shares that the planner moves to a whole GPU (see test_sched_logic)."""
    nodes = with_users(cluster(1), {("n0000", 0): (GpuUse(1, 25),)})
    return snapshot(nodes, [running(1, "n0000", 0, 25, start=NOW - 100, shape="mps25-0")])


def test_an_outage_plans_nothing_settles_nothing_and_observes_nothing(journal):
    journal.plan(NOW, RESHAPE)
    observed = []
    gw = Slurm([], fail=lambda what, j: SlurmUnavailable(["squeue"], 0, "slurm_load_jobs: Failed")
               if what == "snapshot" else None)
    with pytest.raises(SlurmUnavailable):
        run_once(gw, Settings(), Fixed({1: FAM}), None, journal, NOW + 60,
                 observer=lambda *a: observed.append(a) or ({}, a[1], []))
    assert observed == [] and gw.did == [] and [a for _, a in journal.unsettled()] == [RESHAPE]


def test_no_new_action_for_a_job_whose_interrupted_action_is_still_open(journal):
    gw = Slurm([])
    gw.snap = reshapable()
    planned = run_once(gw, Settings(), Fixed({1: FAM}), None, MemoryJournal(), NOW, dry_run=True)
    assert any(o.action.job_id == 1 for o in planned.outcomes)  # without an open row, the plan acts on job 1
    stopping = dataclasses.replace(gw.snap.jobs[0], state=JobState.COMPLETING)
    journal.plan(NOW - 60, RESHAPE)
    gw.snap = dataclasses.replace(gw.snap, jobs=(stopping,))
    result = run_once(gw, Settings(), Fixed({1: FAM}), None, journal, NOW)
    assert gw.did == [] and result.outcomes == () and len(journal.unsettled()) == 1
    assert any("job 1" in r and "still stopping" in r for r in result.recovered)


def test_a_job_recovery_just_released_gets_no_new_action_while_slurm_starts_it(journal):
    # Killed after the requeuehold of a reshape to 100 shares, long ago (outside the in-flight window of its
    # epoch): this epoch's recovery releases it, and Slurm has not started it when the plan is made.
    waiting = dataclasses.replace(pending(1, share=100), reason="BeginTime")
    gw = Slurm([HELD])
    gw.release = lambda job_id: (gw._do("release", job_id), setattr(gw, "snap", snapshot(cluster(1), [waiting])))
    journal.plan(NOW - 600, RESHAPE)
    result = run_once(gw, Settings(), Fixed({1: FAM}), None, journal, NOW)
    assert gw.did == [("set_share", 1, 100), ("start_now", 1), ("release", 1)] and result.outcomes == ()
    assert any("job 1: no new action, an earlier epoch started it" in n for n in result.plan.notes)
    dry = run_once(gw, Settings(), Fixed({1: FAM}), None, MemoryJournal(), NOW, dry_run=True)
    assert any(o.action.job_id == 1 for o in dry.outcomes)  # without that row the plan would act on it again


def test_slurm_that_stops_answering_mid_epoch_ends_the_plan_and_leaves_the_row_open():
    journal = MemoryJournal()
    acts = [Action(ActionKind.SET_SHARE, 1, "t", share=50), Action(ActionKind.SET_SHARE, 2, "t", share=50)]
    gw = Slurm([], fail=lambda what, j: SlurmUnavailable(["scontrol"], 1, "Unable to contact slurm controller")
               if j == 1 else None)
    out = execute(acts, gw, journal, NOW)
    assert [o.status for o in out] == ["unanswered", "skipped"] and gw.did == []
    assert [a for a in journal.open.values()] == [acts[0]]


# ----------------------------------------------------------------------------- backoff


def test_backoff_doubles_from_the_interval_up_to_the_cap_and_resets():
    assert [backoff_s(10, k) for k in range(4)] == [10, 20, 40, 80]
    assert backoff_s(10, 50) == BACKOFF_CAP_S and backoff_s(600, 3) == 600


def test_the_loop_backs_off_through_an_outage_and_says_when_slurm_is_back():
    answers = ["down", "down", "down", "up", "up"]
    slept, lines = [], []

    def step():
        if answers.pop(0) == "down":
            raise SlurmUnavailable(["squeue", "--all", "--json"], 0, "slurm_load_jobs: Failed while looking for jobs")
        return None

    failures = main_loop(step, 5.0, 5, sleep=slept.append, log=lambda level, line: lines.append(line))
    assert failures == 3
    assert [round(s) for s in slept] == [10, 20, 40, 5]
    assert sum("Slurm is unavailable; planned nothing" in line for line in lines) == 3
    assert "next try in 10 s" in lines[0] and "next try in 40 s" in lines[2]
    assert any("answers again after 3 epoch(s)" in line for line in lines)


# ----------------------------------------------------------------------------- one helper per cluster


def test_cluster_name_from_slurm_conf_text():
    text = textwrap.dedent("""\
        # ClusterName=commented
        clustername = First   # a comment
        SlurmctldHost=h
        ClusterName=Second
    """)
    assert cluster_name(text) == "second"
    assert cluster_name("SlurmctldHost=h\n#ClusterName=x\n") is None


def test_a_slurm_conf_without_cluster_name_is_a_clear_error(tmp_path):
    conf = tmp_path / "slurm.conf"
    with pytest.raises(ConfigError, match="cannot read .*slurm.conf"):
        read_cluster_name(str(conf))
    conf.write_text("SlurmctldHost=h\n")
    with pytest.raises(ConfigError, match="sets no ClusterName"):
        read_cluster_name(str(conf))
    conf.write_text("ClusterName=alpha\n")
    assert read_cluster_name(str(conf)) == "alpha"


def test_one_helper_per_cluster_whatever_its_state_directory(tmp_path):
    run = tmp_path / "run"
    with helper_lock("alpha", tmp_path / "a", run):
        with pytest.raises(HelperBusy, match=rf"cluster 'alpha' \(pid {os.getpid()}, state directory") as err:
            with helper_lock("alpha", tmp_path / "b", run):
                pass
        assert err.value.pid == os.getpid()
        with pytest.raises(HelperBusy, match="uses the state directory"):
            with helper_lock("beta", tmp_path / "a", run):
                pass
        with helper_lock("beta", tmp_path / "b", run):  # another cluster, another state dir: allowed
            pass
    with helper_lock("alpha", tmp_path / "b", run):  # the first one ended: its locks went with it
        pass


def test_the_lock_is_held_by_another_process_for_its_life_and_names_its_pid(tmp_path):
    run, state = tmp_path / "run", tmp_path / "state"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from slurm_elastico.helper.lock import helper_lock\n"
         f"with helper_lock('alpha', {str(tmp_path / 'other')!r}, {str(run)!r}):\n"
         "    print('held', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(HelperBusy, match=f"pid {holder.pid}") as err:
            with helper_lock("alpha", state, run):
                pass
        assert err.value.pid == holder.pid
    finally:
        holder.kill()
        holder.wait(timeout=10)
    with helper_lock("alpha", state, run):  # a killed holder leaves no stale lock
        pass


@pytest.mark.parametrize("name", ["", "../etc", "a b", "x" * 200])
def test_a_cluster_name_that_cannot_name_a_file_is_refused(tmp_path, name):
    with pytest.raises(ConfigError, match="cannot name a lock file"):
        with helper_lock(name, tmp_path / "s", tmp_path / "run"):
            pass


def test_a_run_directory_that_cannot_be_made_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="RuntimeDirectory=slurm-elastico"):
        with helper_lock("alpha", tmp_path / "s", blocker / "run"):
            pass


# ----------------------------------------------------------------------------- the observer keeps what it learned


def test_a_snapshot_without_nodes_forgets_nothing(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.execute("INSERT INTO progress_reading VALUES (?,?,?,?,?,?)", (7, 10.0, NOW, 0, "", NOW))
        observer = ProgressObserver(store, "p100")
        empty = snapshot((), [])
        _, _, notes = observer(empty, {}, False)
        assert [r["job_id"] for r in store.query("SELECT job_id FROM progress_reading")] == [7]
        assert any("nothing learned is forgotten" in n for n in notes)
        observer(snapshot(cluster(1), []), {}, False)  # a cluster that answered without job 7: it is gone
        assert store.query("SELECT job_id FROM progress_reading") == []
