"""Shadow mode (`elastico sched --shadow`): full epochs, journaled with their predicted gain, nothing changed in Slurm.

The guarantee is structural: the executor's gateway refuses every call that is not a read, and the runner under it
refuses every command that is not a read. These tests drive real epochs (`run_once`, `Service.step`) through a
gateway that records every call; the live test (tests/slurm/test_shadow_live.py) runs one against Slurm.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from slurm_elastico import jsonout
from slurm_elastico.config import ConfigError, Settings, load
from slurm_elastico.errors import ElasticoError, ShadowRefused
from slurm_elastico.helper.epoch import render, run_once
from slurm_elastico.helper.journal import Journal
from slurm_elastico.helper.metrics import Metrics
from slurm_elastico.helper.service import Service
from slurm_elastico.helper.shadow import (READS, ReadOnlyGateway, ShadowJournal, decisions, parse_when,
                                          predicted_gains, render_report, shadow_report)
from slurm_elastico.model import Action, ActionKind, GpuUse
from slurm_elastico.slurm import commands
from slurm_elastico.slurm.readonly import GuardedRunner, is_read
from slurm_elastico.slurm.runner import Completed
from slurm_elastico.store import Store
from tests.synthetic import cluster, family, pending, running, snapshot, with_users

NOW = 1_000_000.0

MUTATORS = ("apply", "release", "forget_place", "signal", "set_share", "set_nodes", "set_gpus", "requeue",
            "requeue_with_share", "requeue_with_gpus", "preempt", "resume", "set_admin_comment", "wait_state")


class Recorder:
    """A gateway that records every call; its mutating methods would 'change' the cluster (they only record)."""

    def __init__(self, snap):
        self.snap, self.calls = snap, []

    def snapshot(self):
        self.calls.append(("snapshot",))
        return self.snap

    def argv_for(self, action):
        self.calls.append(("argv_for", action.job_id))
        return commands.argv_for(action)

    def __getattr__(self, name):
        if name in MUTATORS:
            return lambda *a, **k: self.calls.append((name, *a))
        raise AttributeError(name)


class Fixed:
    def __init__(self, fams):
        self.fams = fams

    def families(self, job_ids):
        return {j: f for j, f in self.fams.items() if j in job_ids}, []


def mutations(gw: Recorder) -> list:
    return [c for c in gw.calls if c[0] in MUTATORS]


def busy_cluster():
    """Two pending jobs the plan shapes and starts, and a running job on a quarter GPU it reshapes."""
    fam = family((25, 0.3, 1000), (50, 0.8, 1000), (100, 1.0, 1000), work=100000.0)
    nodes = with_users(cluster(2), {("n0000", 0): (GpuUse(3, 25),)})
    jobs = [pending(1, NOW - 600), pending(2, NOW - 300),
            dataclasses.replace(running(3, "n0000", 0, 25, start=NOW - 100, shape="mps25-0"), requeue=True)]
    return snapshot(nodes, jobs, NOW), {1: fam, 2: fam, 3: fam}


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "s.sqlite") as s:
        yield s


# ---------------------------------------------------------------- the command guard


def test_every_command_that_changes_slurm_is_refused_and_every_read_passes():
    act = Action(ActionKind.RESHAPE_RUNNING, 7, "r", share=50, nodes=("n1",))
    changes = [commands.set_share(7, 50), commands.set_nodes(7, ("n1",)), commands.requeue(7), commands.requeue_hold(7),
               commands.start_now(7), commands.release(7), commands.signal(7, "USR1"), commands.cancel((7,)),
               commands.set_admin_comment(7, "x"), commands.reserve_place(7, ("n1",), "u", 5),
               commands.set_reservation(7, "p"), commands.delete_place(7), commands.sbatch(["--wrap=true"]),
               *commands.argv_for(act), ["scontrol", "hold", "7"], ["scontrol", "write", "batch_script", "7", "f.sh"],
               ["sacctmgr", "-i", "add", "user", "x"], []]
    reads = [commands.squeue_json(), commands.squeue_ids(), commands.squeue_job_json(7), commands.nodes_json("24.11"),
             commands.nodes_json("22.05"), commands.sacct_json(), commands.batch_script(7),
             ["scontrol", "show", "job", "--json"], ["/usr/bin/scontrol", "--version"]]
    assert [a for a in changes if is_read(a)] == []
    assert [a for a in reads if not is_read(a)] == []


def test_the_guarded_runner_refuses_a_change_before_it_runs_and_counts_what_it_ran():
    ran = []

    def runner(argv, *, timeout=None):
        ran.append(tuple(argv))
        return Completed(tuple(argv), 0, "{}", "")

    shadow, acting = GuardedRunner(runner, allow_changes=False), GuardedRunner(runner, allow_changes=True)
    shadow(commands.squeue_json())
    with pytest.raises(ShadowRefused, match="scontrol update JobId=7 StartTime=now.*allowed in shadow mode"):
        shadow(commands.start_now(7))
    assert ran == [tuple(commands.squeue_json())]  # the update never reached the subprocess
    assert (shadow.reads, shadow.changes, len(shadow.refused)) == (1, 0, 1)
    acting(commands.start_now(7))
    assert (acting.reads, acting.changes, acting.refused) == (0, 1, [])


def test_the_read_only_gateway_passes_reads_and_refuses_everything_else_without_calling_it():
    snap, _ = busy_cluster()
    inner = Recorder(snap)
    gw = ReadOnlyGateway(inner)
    assert gw.snapshot() is snap
    for name in MUTATORS + ("cancel", "something_added_later"):
        with pytest.raises(ShadowRefused, match=f"refused the gateway's {name}"):
            getattr(gw, name)(Action(ActionKind.START_NOW, 5, "r"))
    assert mutations(inner) == [] and len(gw.refused) == len(MUTATORS) + 2
    assert not {"apply", "release", "forget_place"} & READS


# ---------------------------------------------------------------- the epoch


def test_a_shadow_epoch_with_pending_actions_calls_no_mutating_method_and_journals_what_acting_would_do(store):
    snap, fams = busy_cluster()
    acting_gw = Recorder(snap)
    acting = run_once(acting_gw, Settings(), Fixed(fams), None, Journal(store), NOW)
    assert len(mutations(acting_gw)) == len(acting.outcomes) > 0  # the acting helper would act here

    inner = Recorder(snap)
    shadow_gw = ReadOnlyGateway(inner)
    result = run_once(shadow_gw, Settings(), Fixed(fams), None, ShadowJournal(store), NOW, shadow=True)
    assert mutations(inner) == [] and shadow_gw.refused == []
    assert [o.action for o in result.outcomes] == [o.action for o in acting.outcomes]  # the same decisions
    assert {o.status for o in result.outcomes} == {"shadow"} and result.mode == "shadow"
    kinds = {a.kind for a in (o.action for o in result.outcomes)}
    assert ActionKind.RESHAPE_RUNNING in kinds and ActionKind.SET_SHARE in kinds
    rows = store.query("SELECT job_id, kind, argv, gain_s FROM shadow_journal ORDER BY id")
    assert [(r["job_id"], r["kind"]) for r in rows] == [(o.action.job_id, o.action.kind.value) for o in result.outcomes]
    assert all(json.loads(r["argv"]) for r in rows)  # the exact commands the acting helper would run
    # The acting journal holds only the acting epoch's rows: the shadow epoch wrote none.
    assert store.query("SELECT COUNT(*) AS n FROM journal")[0]["n"] == len(acting.outcomes)
    out = result.to_dict()
    assert json.loads(jsonout.dumps(out))["actions"] and all("predicted_gain_s" in a for a in out["actions"])
    assert "shadow epoch (nothing changed in Slurm)" in render(result)


def test_the_next_shadow_epoch_plans_from_the_cluster_as_it_is_not_as_if_the_actions_happened(store):
    snap, fams = busy_cluster()
    gw = ReadOnlyGateway(Recorder(snap))
    first = run_once(gw, Settings(), Fixed(fams), None, ShadowJournal(store), NOW, shadow=True)
    second = run_once(gw, Settings(), Fixed(fams), None, ShadowJournal(store), NOW + 5, shadow=True)
    # An acting helper would leave the started jobs alone for a while (in flight); a shadow one started nothing.
    def what(result):
        return [dataclasses.replace(o.action, reason="") for o in result.outcomes]

    assert what(second) == what(first)
    assert not any("in flight" in n or "earlier epoch started it" in n for n in second.plan.notes)
    rows = store.query("SELECT epoch, job_id, kind, action, reason, gain_s FROM shadow_journal ORDER BY id")
    found = decisions(rows)
    assert len(found) == len(first.outcomes) and all(d.epochs == 2 for d in found)  # repeated proposals count once


def test_a_shadow_epoch_after_an_acting_one_leaves_alone_what_the_acting_helper_just_started(store):
    snap, fams = busy_cluster()
    acting = run_once(Recorder(snap), Settings(), Fixed(fams), None, Journal(store), NOW)
    started = {o.action.job_id for o in acting.outcomes if o.action.kind is ActionKind.RESHAPE_RUNNING}
    assert started == {3}
    # Five seconds on, Slurm has requeued job 3 and not started it yet: pending, released
    snap = snapshot(cluster(2), [pending(1, NOW - 600), pending(2, NOW - 300), pending(3, NOW - 100)], NOW + 5)
    shadow = run_once(ReadOnlyGateway(Recorder(snap)), Settings(), Fixed(fams), None, ShadowJournal(store), NOW + 5,
                      shadow=True)
    assert not started & {o.action.job_id for o in shadow.outcomes}
    assert all(any(n.startswith(f"job {j}: no new action, an earlier epoch started it") for n in shadow.plan.notes)
               for j in started)
    # ...as the acting helper itself does in that epoch (the shadow epoch wrote nothing it reads)
    again = run_once(Recorder(snap), Settings(), Fixed(fams), None, Journal(store), NOW + 5)
    assert [o.action for o in shadow.outcomes] == [o.action for o in again.outcomes]


def test_shadow_mode_refuses_the_acting_journal_and_a_dry_run(store):
    snap, fams = busy_cluster()
    with pytest.raises(ValueError, match="shadow journal"):
        run_once(ReadOnlyGateway(Recorder(snap)), Settings(), Fixed(fams), None, Journal(store), NOW, shadow=True)
    with pytest.raises(ValueError, match="shadow journal"):
        run_once(ReadOnlyGateway(Recorder(snap)), Settings(), Fixed(fams), None, ShadowJournal(store), NOW,
                 shadow=True, dry_run=True)


def test_an_acting_journal_never_reads_shadow_rows_as_its_history(store):
    snap, fams = busy_cluster()
    run_once(ReadOnlyGateway(Recorder(snap)), Settings(), Fixed(fams), None, ShadowJournal(store), NOW, shadow=True)
    journal = Journal(store)
    assert journal.unsettled() == [] and journal.recent(0.0) == []
    assert not hasattr(ShadowJournal(store), "unsettled")  # it can never stand in for the acting journal


class Sneaky(Fixed):
    """A family source that tries to change Slurm and swallows the refusal (a defect shadow mode must surface)."""

    def __init__(self, fams, gateway):
        super().__init__(fams)
        self.gateway = gateway

    def families(self, job_ids):
        try:
            self.gateway.apply(Action(ActionKind.START_NOW, 1, "sneaky"))
        except ElasticoError:
            pass
        return super().families(job_ids)


def test_a_refusal_swallowed_on_the_way_still_fails_the_shadow_epoch(store):
    snap, fams = busy_cluster()
    inner = Recorder(snap)
    gw = ReadOnlyGateway(inner)
    metrics = Metrics(mode="shadow")
    service = Service(Settings(), gw, Sneaky(fams, gw), None, ShadowJournal(store), None, store, metrics,
                      lambda level, line: None, shadow=True)
    with pytest.raises(ShadowRefused, match="asked to change Slurm and was refused"):
        service.step()
    assert mutations(inner) == []
    assert 'elastico_epochs_total{mode="shadow",result="failed"} 1.0' in metrics.render()


def test_the_service_reports_zero_slurm_changes_and_labels_its_metrics(store):
    snap, fams = busy_cluster()
    guard = GuardedRunner(lambda argv, *, timeout=None: Completed(tuple(argv), 0, "", ""), allow_changes=False)
    metrics = Metrics(mode="shadow")
    service = Service(Settings(), ReadOnlyGateway(Recorder(snap)), Fixed(fams), None, ShadowJournal(store), None,
                      store, metrics, lambda level, line: None, shadow=True, commands=guard)
    result = service.step()
    assert result.slurm_changes == 0 and result.to_dict()["slurm_changes"] == 0 and result.outcomes
    text = metrics.render()
    assert 'elastico_actions_total{kind="set_share",mode="shadow",outcome="shadow"}' in text
    assert "elastico_predicted_gain_seconds{mode=\"shadow\"}" in text
    assert 'mode="shadow"' not in Metrics().render()  # an acting helper's series are as they were


# ---------------------------------------------------------------- predicted gain


def test_the_predicted_gain_is_the_remaining_time_saved_net_of_the_restart():
    snap, fams = busy_cluster()
    result = run_once(Recorder(snap), Settings(), Fixed(fams), None, None, NOW, dry_run=True)
    gains = predicted_gains(result.plan, snap, fams, {3: 40000.0}, NOW, 60.0, 100)
    place = {p.job_id: p for p in result.plan.placements}
    # Job 3 runs at 0.3 (its 25 % shape) with 60,000 units left; the plan moves it at a 60 s restart.
    assert 3 in gains and gains[3] == pytest.approx(60000 / 0.3 - 60000 / place[3].throughput - 60.0)
    # A pending job: without the helper it would run its default shape (the fastest at most GPU, 1.0).
    assert gains[1] == pytest.approx(100000 / 1.0 - 100000 / place[1].throughput)
    assert all(g is None or math.isfinite(g) for g in gains.values())


# ---------------------------------------------------------------- the report


def test_the_report_counts_each_decision_once_takes_each_jobs_first_gain_and_names_the_jobs(store):
    journal = ShadowJournal(store)
    start = Action(ActionKind.START_NOW, 1, "r")
    reshape = Action(ActionKind.RESHAPE_RUNNING, 2, "r", share=50, nodes=("n1",))
    for epoch in (100.0, 160.0, 220.0):  # the same proposals in three consecutive epochs
        journal.record(epoch, start, [["scontrol"]], 30.0)
        journal.record(epoch, reshape, [["scontrol"]], 600.0)
    journal.record(400.0, Action(ActionKind.PREEMPT, 3, "r"), [], None)
    # job 1 again after a gap, still waiting to start: the acting helper would have started it at the first
    # proposal, so this is the same decision
    journal.record(500.0, start, [["scontrol"]], 10.0)
    summary = shadow_report(store, 0.0, 1000.0)
    assert summary["actions"] == {"total": 3, "by_kind": {"preempt": 1, "reshape_running": 1, "start_now": 1},
                                  "proposals": 8}
    assert summary["jobs_touched"] == [1, 2, 3]
    gain = summary["predicted_gain_s"]
    # Job 1's later proposal predicts its whole gain again (nothing happened in between): its first gain counts.
    assert (gain["jobs"], gain["total"], gain["jobs_without_prediction"]) == (2, 630.0, [3])
    assert shadow_report(store, 300.0, 450.0)["jobs_touched"] == [3]
    assert "actions it would have taken: 3" in render_report(summary)
    json.loads(jsonout.dumps(summary))


def test_report_times_read_as_sacct_writes_them_and_a_bad_one_says_what_is_allowed():
    assert parse_when("now", 1000.0) == 1000.0
    assert parse_when("now-7days", 1_000_000.0) == 1_000_000.0 - 7 * 86400
    assert parse_when("now-30minutes", 10_000.0) == 10_000.0 - 1800
    assert parse_when("2026-12-01T08:00+00:00", 0.0) == 1796112000.0
    with pytest.raises(ValueError, match="--start 'yesterday': allowed: now, now-N"):
        parse_when("yesterday", 0.0)


# ---------------------------------------------------------------- the switch


def test_one_config_key_switches_shadow_and_act_and_acting_stays_the_default(tmp_path):
    assert Settings().helper.mode == "act"
    p = tmp_path / "elastico.yaml"
    p.write_text(f"state_dir: {tmp_path}/state\nhelper:\n  mode: shadow\n")
    assert load(str(p)).helper.mode == "shadow"
    p.write_text(f"state_dir: {tmp_path}/state\nhelper:\n  mode: watch\n")
    with pytest.raises(ConfigError, match="helper.mode: 'watch' is not one of 'act', 'shadow'"):
        load(str(p))


# ---------------------------------------------------------------- what the observer keeps


def test_a_shadow_observer_records_real_progress_but_judges_no_pair_and_keeps_the_samples_for_acting(tmp_path):
    from slurm_elastico.helper.observer import ProgressObserver
    from tests.unit.test_probe_revert import FAM, PROFILE, T0, Margin, steps, write

    d1, d2, epochs = steps(tmp_path)
    with Store(tmp_path / "s.sqlite") as store:
        shadow = ProgressObserver(store, "p100", Margin(0.2), shadow=True)
        for s, done1, done2, at in epochs:
            write(d1, d2, done1, done2, at)
            progress, _, _ = shadow(s, {1: FAM, 2: FAM}, dry_run=False)
        assert progress == {1: 73, 2: 25}
        assert {r["job_id"] for r in store.query("SELECT job_id FROM progress_reading")} == {1, 2}
        assert store.query("SELECT COUNT(*) AS n FROM solo_rate")[0]["n"] > 0
        # The pair that does not pay (the acting observer reverts it at this margin) is neither judged nor refused:
        assert shadow.reverted == [] and store.query("SELECT COUNT(*) AS n FROM pair_refusal")[0]["n"] == 0
        assert not shadow.refusals.refused(PROFILE, PROFILE, T0 + 41)
        assert store.query("SELECT COUNT(*) AS n FROM pair_rate")[0]["n"] > 0  # its samples wait for acting
        acting = ProgressObserver(store, "p100", Margin(0.2))
        s, done1, done2, at = epochs[-1]
        write(d1, d2, done1 + 1, done2 + 1, at + 1)
        acting(s, {1: FAM, 2: FAM}, dry_run=False)
        assert [v.jobs for v in acting.reverted] == [(1, 2)]  # the acting helper judges what shadow observed


def test_a_shadow_epochs_json_log_line_is_info_unless_the_acting_helper_would_be_refused(store, capsys):
    from slurm_elastico.cli.sched import Output
    from slurm_elastico.helper.executor import Outcome

    snap, fams = busy_cluster()
    result = run_once(ReadOnlyGateway(Recorder(snap)), Settings(), Fixed(fams), None, ShadowJournal(store), NOW,
                      shadow=True)
    Output(False, "json").epoch(result)
    refused = dataclasses.replace(result, outcomes=(Outcome(result.outcomes[0].action, "shadow", "would be refused"),))
    Output(False, "json").epoch(refused)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["level"], line["slurm_changes"], line["mode"]) for line in lines] == [("info", None, "shadow"),
                                                                                        ("warning", None, "shadow")]


def test_a_proposal_after_an_epoch_that_did_not_make_it_is_a_new_decision(store):
    journal = ShadowJournal(store)
    share = Action(ActionKind.SET_SHARE, 1, "r", share=50)  # a pending job's share, not its start
    for at in (100.0, 160.0, 220.0):
        journal.epoch(at, 0 if at == 160.0 else 1)
        if at != 160.0:
            journal.record(at, share, [["scontrol"]], 30.0)
    summary = shadow_report(store, 0.0, 1000.0)
    assert summary["actions"]["total"] == 2 and summary["epochs_run"] == 3 and summary["epochs_with_actions"] == 2
    assert [d["epochs"] for d in summary["decisions"]] == [1, 1]


def test_a_jobs_proposals_that_end_its_state_are_one_decision_each_kind_until_it_is_ended_otherwise(store):
    journal = ShadowJournal(store)
    for at, node in ((100.0, "n1"), (160.0, "n2"), (280.0, "n1")):  # the target flips; a gap at 220
        journal.epoch(at, 2)
        journal.record(at, Action(ActionKind.SET_NODES, 1, "r", nodes=(node,)), [["scontrol"]], 30.0)
        journal.record(at, Action(ActionKind.START_NOW, 1, "r"), [["scontrol"]], 30.0)
    journal.epoch(220.0, 0)
    for at in (340.0, 400.0):  # it runs (Slurm started it): reshapes to two targets
        journal.epoch(at, 1)
        journal.record(at, Action(ActionKind.RESHAPE_RUNNING, 1, "r", share=50 if at < 400 else 100), [], 5.0)
    journal.epoch(460.0, 2)  # requeued by someone else, waiting again: a new start
    journal.record(460.0, Action(ActionKind.SET_NODES, 1, "r", nodes=("n1",)), [["scontrol"]], 30.0)
    journal.record(460.0, Action(ActionKind.START_NOW, 1, "r"), [["scontrol"]], 30.0)
    journal.epoch(520.0, 1)  # a pending job's share alone, in two epochs with two targets: two decisions
    journal.record(520.0, Action(ActionKind.SET_SHARE, 2, "r", share=25), [], None)
    journal.epoch(580.0, 1)
    journal.record(580.0, Action(ActionKind.SET_SHARE, 2, "r", share=50), [], None)
    got = shadow_report(store, 0.0, 1000.0)["actions"]
    assert got["by_kind"] == {"reshape_running": 1, "set_nodes": 2, "set_share": 2, "start_now": 2}, got
    assert got["proposals"] == 12


class Unanswering(Recorder):
    def __init__(self, snap, error):
        super().__init__(snap)
        self.error = error

    def argv_for(self, action):
        self.calls.append(("argv_for", action.job_id))
        raise self.error


def test_slurm_not_answering_in_a_shadow_epoch_is_an_outage_not_refusals(store):
    from slurm_elastico.errors import SlurmTimeout

    snap, fams = busy_cluster()
    inner = Unanswering(snap, SlurmTimeout(("squeue", "--json"), 30))
    result = run_once(ReadOnlyGateway(inner), Settings(), Fixed(fams), None, ShadowJournal(store), NOW, shadow=True)
    statuses = [o.status for o in result.outcomes]
    assert statuses[0] == "unanswered" and set(statuses[1:]) == {"skipped"} and len(statuses) > 1
    assert len([c for c in inner.calls if c[0] == "argv_for"]) == 1  # no timeout waited again per action
    assert result.outage and "did not finish" in result.outage
    assert store.query("SELECT COUNT(*) AS n FROM shadow_journal")[0]["n"] == 0
    assert shadow_report(store, 0.0, 2 * NOW)["epochs_without_slurm"] == 1


def test_a_job_that_left_the_queue_is_not_journaled_as_a_refusal(store):
    from slurm_elastico.errors import UnknownJobError

    snap, fams = busy_cluster()
    inner = Unanswering(snap, UnknownJobError(("squeue", "--jobs=3"), 1, "Invalid job id specified"))
    result = run_once(ReadOnlyGateway(inner), Settings(), Fixed(fams), None, ShadowJournal(store), NOW, shadow=True)
    assert not result.outage and {o.status for o in result.outcomes} == {"shadow"}
    assert all("left Slurm's queue" in o.error and "would be refused" not in o.error for o in result.outcomes)


def test_a_running_job_slowed_by_a_newcomer_on_its_gpu_counts_in_the_gain(store):
    """A pending job placed on the GPU of a running job the plan leaves alone: the running job's loss is counted."""
    from slurm_elastico.model import Placement, Plan

    fam = family((50, 1.0, 1000), (100, 1.0, 1000), work=1000.0)
    nodes = with_users(cluster(1), {("n0000", 0): (GpuUse(3, 50),)})
    jobs = [pending(1, NOW - 60), running(3, "n0000", 0, 50, start=NOW, shape="mps50-0")]
    snap = snapshot(nodes, jobs, NOW)
    plan = Plan(actions=(Action(ActionKind.START_NOW, 1, "r"),),
                placements=(Placement(1, "n0000", 0, "mps50-0", 50, 0.8), Placement(3, "n0000", 0, "mps50-0", 50, 0.8)))
    gains = predicted_gains(plan, snap, {1: fam, 3: fam}, {}, NOW, 0.0, 100)
    assert gains[3] == pytest.approx(1000 / 1.0 - 1000 / 0.8)  # a loss of 250 s, alone now
    # Already beside another job: its speed now is not known here, so no figure rather than a wrong one.
    shared = with_users(cluster(1), {("n0000", 0): (GpuUse(3, 50), GpuUse(4, 25))})
    jobs2 = [*jobs, running(4, "n0000", 0, 25, start=NOW)]
    assert predicted_gains(plan, snapshot(shared, jobs2, NOW), {1: fam, 3: fam}, {}, NOW, 0.0, 100)[3] is None

    journal = ShadowJournal(store)
    journal.record(NOW, plan.actions[0], [["scontrol"]], 5.0)
    journal.epoch(NOW, 1, "", {3: gains[3]})
    gain = shadow_report(store, 0.0, 2 * NOW)["predicted_gain_s"]
    assert gain["co_runners_slowed"] == 1 and gain["total"] == pytest.approx(5.0 + gains[3])
    assert gain["negative"] == 1


def test_every_shadow_epoch_warns_of_a_job_the_acting_helper_left_mid_requeue(store):
    snap, fams = busy_cluster()
    Journal(store).plan(NOW - 30, Action(ActionKind.RESHAPE_RUNNING, 3, "r", share=50, nodes=("n0000",)))
    guard = GuardedRunner(lambda argv, *, timeout=None: Completed(tuple(argv), 0, "", ""), allow_changes=False)
    service = Service(Settings(), ReadOnlyGateway(Recorder(snap)), Fixed(fams), None, ShadowJournal(store), None,
                      store, Metrics(mode="shadow"), lambda level, line: None, shadow=True, commands=guard)
    for _ in range(2):
        warnings = service.step().warnings
        assert any("left 1 journal row(s) open (jobs 3)" in w and "stays held" in w for w in warnings), warnings
    assert len(Journal(store).unsettled()) == 1  # read, never settled by the shadow helper


def test_open_service_refuses_shadow_mode_without_a_runner_that_refuses_changes(tmp_path):
    from slurm_elastico.helper.service import open_service

    settings = dataclasses.replace(Settings(), state_dir=str(tmp_path))
    for commands in (None, GuardedRunner(lambda argv, *, timeout=None: None, allow_changes=True)):
        with pytest.raises(ValueError, match="refuses changes"):
            open_service(settings, Recorder(None), families_dir=None, dry_run=False, metrics=Metrics(),
                         metrics_file=None, log=lambda level, line: None, shadow=True, commands=commands)
