"""The demo's shadow pass (`cluster.demo_shadow`): the records a shadow epoch must leave alone, the paired epochs'
order and bookkeeping, and the comparison of the shadow journal with the acting epochs' actions. The pass itself
runs on the real local cluster in `elastico demo --shadow-pass`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from types import SimpleNamespace

import pytest

from slurm_elastico.cluster import demo_figures, demo_shadow
from slurm_elastico.cluster.demo_checks import DemoError
from slurm_elastico.store import Store

PENDING = {"JobId": "7", "JobState": "PENDING", "Reason": "BeginTime", "Priority": "4294901759", "NumNodes": "1-1",
           "TimeLimit": "UNLIMITED",
           "EligibleTime": "2026-12-05T10:00:30", "TresPerNode": "gres:gpu:1", "AdminComment": None,
           "Restarts": "0", "ReqNodeList": "(null)"}


@pytest.fixture(autouse=True)
def no_settling_wait(monkeypatch):
    monkeypatch.setattr(demo_shadow, "SETTLE_S", 0.0)


def record(**fields) -> dict:
    return {k: v for k, v in {**PENDING, **fields}.items() if v is not None}


def test_what_slurm_does_by_itself_is_not_a_change_and_what_a_command_does_is():
    started = record(JobState="RUNNING", Reason="None", NumNodes="1", Priority="4294901758",
                     EligibleTime="2026-12-05T10:00:31", TimeLimit="365-00:00:00")
    assert demo_shadow.changes({7: record()}, {7: started}) == {}  # Slurm started it: its own fields moved
    assert demo_shadow.changes({7: record()}, {}) == {}  # ended and purged: nothing to compare
    assert demo_shadow.changes({7: record()}, {7: record(AdminComment="elastico:shape=mb8")}) == {
        7: ["AdminComment None -> elastico:shape=mb8"]}
    assert demo_shadow.changes({7: record()}, {7: record(TresPerNode="gres:mps:50")}) == {
        7: ["TresPerNode gres:gpu:1 -> gres:mps:50"]}
    assert demo_shadow.changes({7: record()}, {7: record(EligibleTime="2026-12-05T10:00:05")}) == {
        7: ["EligibleTime 2026-12-05T10:00:30 -> 2026-12-05T10:00:05"]}  # StartTime=now on a waiting job
    assert demo_shadow.changes({7: record()}, {7: record(NumNodes="2-2")}) == {7: ["NumNodes 1-1 -> 2-2"]}
    held = record(Reason="JobHeldAdmin", Priority="0")
    assert demo_shadow.changes({7: record()}, {7: held}) == {7: ["Reason BeginTime -> JobHeldAdmin"]}
    running = record(JobState="RUNNING", Reason="None", NumNodes="1")
    requeued = record(JobState="PENDING", Reason="JobHeldAdmin", Restarts="1", Priority="0")
    assert demo_shadow.changes({7: running}, {7: requeued}) == {
        7: ["Restarts 0 -> 1", "JobState RUNNING -> PENDING", "Reason None -> JobHeldAdmin"]}
    # scontrol requeuehold, as 22.05 shows it at once: completing, restarted, held
    shadow_requeue = record(JobState="COMPLETING", Reason="job_requeued_in_held_state", Restarts="1", Priority="0")
    assert demo_shadow.changes({7: running}, {7: shadow_requeue}) == {
        7: ["Restarts 0 -> 1", "Reason None -> job_requeued_in_held_state"]}
    # an acting requeue followed through by Slurm while the shadow epoch ran: held and completing, then pending
    completing = record(JobState="COMPLETING", Reason="JobHeldAdmin", Restarts="1", Priority="0")
    assert demo_shadow.changes({7: completing}, {7: record(Reason="JobHeldAdmin", Restarts="1", Priority="0")}) == {}


def test_the_jobs_slurm_moved_are_those_submitted_ended_or_in_another_state():
    before = {7: record(), 8: record(JobId="8"), 9: record(JobId="9", JobState="RUNNING")}
    after = {7: record(AdminComment="x"), 9: record(JobId="9", JobState="COMPLETING"), 10: record(JobId="10")}
    assert demo_shadow.moved(before, after) == [8, 9, 10]
    assert demo_shadow.moved(before, before) == []
    # after the shadow epoch, while the acting one ran: job 11 ended by itself, job 12 was requeued by the acting
    # epoch (its restart counted), job 13 was started by it
    running = {i: record(JobId=str(i), JobState="RUNNING", Reason="None") for i in (11, 12)}
    later = {11: record(JobId="11", JobState="COMPLETED", Reason="None"),
             12: record(JobId="12", JobState="COMPLETING", Reason="job_requeued_in_held_state", Restarts="1"),
             13: record(JobId="13", JobState="RUNNING", Reason="None")}
    assert demo_shadow.moved(running | {13: record(JobId="13")}, running | {13: record(JobId="13")}, later,
                             [(13, "start_now"), (12, "preempt")]) == [11]
    assert demo_shadow.moved(running, running, {12: later[12]}) == [11]  # gone is ended
    waiting = {13: record(JobId="13")}
    assert demo_shadow.moved(waiting, waiting, {13: later[13]}, [(13, "set_admin_comment")]) == [13]  # backfill
    assert demo_shadow.moved(waiting, waiting, {13: later[13]}, [(13, "start_now")]) == []  # the acting epoch


def test_job_records_read_every_job_from_scontrol_and_a_failure_stops_the_pass():
    line = ("JobId=12 JobName=demo-shadow-t0 UserId=root(0) Priority=88 JobState=PENDING Reason=BeginTime "
            "Command=/x/train_paced.py TRES=cpu=1,node=1,gres/gpu=1 AllocNode:Sid=h:1 TresPerNode=gres:gpu:1")
    seen = []

    def runner(argv):
        seen.append(argv)
        return SimpleNamespace(returncode=0, stdout=f"{line}\n{line.replace('JobId=12', 'JobId=13')}\n", stderr="")

    got = demo_shadow.job_records(runner)
    assert seen == [["scontrol", "show", "job", "--oneliner"]] and sorted(got) == [12, 13]
    assert got[12]["TRES"] == "cpu=1,node=1,gres/gpu=1" and got[12]["TresPerNode"] == "gres:gpu:1"
    assert demo_shadow.job_records(lambda argv: SimpleNamespace(returncode=0, stdout="No jobs in the system\n",
                                                                stderr="")) == {}
    with pytest.raises(DemoError, match=r"scontrol show job failed \(1\): slurm_load_jobs error"):
        demo_shadow.job_records(lambda argv: SimpleNamespace(returncode=1, stdout="",
                                                             stderr="slurm_load_jobs error\n"))


class Epochs:
    """Stands for the pair's epochs (`Pairing.epoch`): each mode answers the next (exit code, epoch JSON) given,
    and Slurm's records change as that epoch's `changes` say."""

    def __init__(self, shadow: list, acting: list, slurm: "Slurm"):
        self.epochs = {"shadow": shadow, "act": acting}
        self.slurm, self.ran = slurm, []

    def __call__(self, mode):
        self.ran.append(mode)
        code, epoch = self.epochs[mode].pop(0)
        self.slurm.moved_by(mode, epoch)
        return epoch, code


class Slurm:
    """`scontrol show job --oneliner` of job 7, changed by what an epoch did (`changes` of its epoch JSON)."""

    def __init__(self):
        self.fields = dict(PENDING)

    def moved_by(self, mode, epoch):
        self.fields.update((epoch or {}).get("changes", {}))

    def __call__(self, argv):
        line = " ".join(f"{k}={v}" for k, v in self.fields.items() if v is not None)
        return SimpleNamespace(returncode=0, stdout=line + "\n", stderr="")


def epoch(at: float, *actions: tuple[int, str, str], changes: dict | None = None) -> dict:
    return {"at": at, "actions": [{"job_id": j, "kind": k, "status": s} for j, k, s in actions],
            "slurm_changes": 0, **({"changes": changes} if changes else {})}


def pairing(shadow: list, acting: list, log=None) -> tuple[demo_shadow.Pairing, Epochs]:
    slurm = Slurm()
    epochs = Epochs(shadow, acting, slurm)
    return demo_shadow.Pairing(epochs, slurm, log), epochs


def test_a_pair_is_a_shadow_epoch_checked_around_then_an_acting_epoch():
    paired, fake = pairing([(0, epoch(10.0, (7, "set_share", "shadow")))],
                           [(0, epoch(11.0, (7, "set_share", "done"), (7, "release", "failed"),
                                      changes={"TresPerNode": "gres:mps:50"}))])
    pair = paired.pair()
    assert fake.ran == ["shadow", "act"]
    assert pair.shadow_at == 10.0 and pair.acting_at == 11.0 and pair.acting == [(7, "set_share")]
    assert pair.changed == {} and pair.logged == [] and pair.acting_changed == 1 and not pair.outage
    assert pair.moved == [] and not pair.acting_failed
    assert demo_shadow.Pair.from_dict(json.loads(json.dumps(dataclasses.asdict(pair)))) == pair  # as the child sends it


def test_a_shadow_epoch_that_changes_a_job_or_logs_a_change_is_caught(tmp_path):
    log = tmp_path / "slurmctld.log"
    log.write_text("[t] _slurm_rpc_update_job: complete JobId=3 uid=0\n")  # before the epoch: not its doing
    paired, fake = pairing([(0, epoch(10.0, changes={"AdminComment": "elastico:shape=mb8"}))], [(1, None)], log)

    def logging_epoch(mode):
        got = fake(mode)
        if mode == "shadow":
            with open(log, "a") as f:
                f.write("[t] _update_job: setting admin_comment to elastico:shape=mb8 for JobId=7\n")
        return got

    paired.epoch = logging_epoch
    pair = paired.pair()
    assert pair.changed == {7: ["AdminComment None -> elastico:shape=mb8"]}
    assert pair.logged == ["[t] _update_job: setting admin_comment to elastico:shape=mb8 for JobId=7"]
    assert pair.acting_failed and pair.acting == [] and pair.acting_at is None


def test_a_failed_shadow_epoch_ends_the_pass_and_an_outage_is_recorded():
    paired, fake = pairing([(75, epoch(10.0)), (70, None)], [(0, epoch(11.0))])
    assert paired.pair().outage
    with pytest.raises(DemoError, match=r"a shadow epoch failed \(exit 70\)"):
        paired.pair()
    assert fake.ran == ["shadow", "act", "shadow"]  # no acting epoch after a failed shadow one


class Child:
    """Stands for `subprocess` in demo_shadow: each run of `demo_pair` answers the next (exit code, pair, stderr)."""

    CompletedProcess = subprocess.CompletedProcess
    DEVNULL = subprocess.DEVNULL

    def __init__(self, answers: list):
        self.answers, self.ran = answers, []

    def run(self, argv, **kwargs):
        self.ran.append(argv)
        code, pair, err = self.answers.pop(0)
        out = "" if pair is None else json.dumps(dataclasses.asdict(pair)) + "\n"
        return subprocess.CompletedProcess(argv, code, out, err)


def a_pair(at: float, **kw) -> demo_shadow.Pair:
    return demo_shadow.Pair(at, 0, {}, [], at + 0.5, [(7, "set_share")], 1, **kw)


def test_the_thread_runs_pairs_until_stopped_and_keeps_an_error_for_the_driver(tmp_path, monkeypatch):
    paired = demo_shadow.PairedHelper({"ELASTICO_CONFIG": "x"}, 0.01, tmp_path, tmp_path / "ctld.log", python="py")
    child = Child([(0, a_pair(0.0), ""), (0, a_pair(1.0, acting_failed=True), ""), (0, a_pair(2.0), ""),
                   (3, None, "note\na shadow epoch failed (exit 70); see its log, shadow.log\n")])
    monkeypatch.setattr(demo_shadow, "subprocess", child)
    paired.start()
    paired._thread.join(timeout=10)
    paired.stop()
    assert child.ran[0] == ["py", "-m", "slurm_elastico.cluster.demo_pair", str(tmp_path), str(tmp_path / "ctld.log")]
    assert [p.shadow_at for p in paired.pairs] == [0.0, 1.0, 2.0] and paired.acting_failed == 1
    assert [json.loads(ln)["shadow_at"] for ln in (tmp_path / "pairs.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert isinstance(paired.error, DemoError)
    assert str(paired.error).startswith("a paired epoch failed (exit 3): a shadow epoch failed (exit 70)")
    assert (tmp_path / "pairs.err").read_text() == "note\na shadow epoch failed (exit 70); see its log, shadow.log\n"


def test_the_journal_is_compared_with_the_acting_epoch_after_each_shadow_epoch(tmp_path):
    from slurm_elastico.helper.shadow import ShadowJournal
    from slurm_elastico.model import Action, ActionKind

    pairs = [demo_shadow.Pair(100.25, 0, {}, [], 101.0, [(7, "set_share"), (7, "set_admin_comment")], 1),
             demo_shadow.Pair(103.5, 0, {}, [], 104.0, [(8, "set_nodes")], 1, moved=[9]),
             demo_shadow.Pair(106.75, 0, {}, [], 107.0, [], 0)]
    with Store(tmp_path / "s.sqlite") as store:
        journal = ShadowJournal(store)
        journal.record(100.25, Action(ActionKind.SET_SHARE, 7, "r", share=50), [], None)
        journal.record(100.25, Action(ActionKind.SET_ADMIN_COMMENT, 7, "r", text="c"), [], None)
        journal.record(103.5, Action(ActionKind.SET_NODES, 9, "r", nodes=("n3",)), [], None)  # another job than acted on
        journal.record(106.75, Action(ActionKind.SET_SHARE, 8, "r", share=25), [], None)  # proposed, not taken
        rows = demo_shadow.journal_pairs(store, pairs)
    assert rows == [[(7, "set_share"), (7, "set_admin_comment")], [(9, "set_nodes")], [(8, "set_share")]]
    got = demo_shadow.matched(pairs, rows)
    assert got == {"acting": 3, "journaled": 4, "matched": 2, "share_matched": 2 / 3, "not_taken": 2,
                   "misses_where_slurm_moved_a_job": 2}  # the second pair's two; the third's is unexplained
    assert "of these 1 + 2 misses, 2 fell in pairs where Slurm" in demo_figures.matched_line(got)
    assert demo_shadow.matched([], [])["share_matched"] is None


def test_a_pair_starts_once_slurm_has_settled_and_holds_the_submissions_back(tmp_path, monkeypatch):
    states = iter(["PENDING", "RUNNING", "RUNNING", "RUNNING"])
    reads = []

    def runner(argv):
        reads.append(next(states, "RUNNING"))
        return SimpleNamespace(returncode=0, stdout=f"JobId=7 JobState={reads[-1]} Reason=None\n", stderr="")

    paired = demo_shadow.Pairing(lambda mode: (None, 0), runner)
    assert paired.settled()[7]["JobState"] == "RUNNING" and reads == ["PENDING", "RUNNING", "RUNNING"]
    flapping = iter(["PENDING", "RUNNING"] * 20)
    paired.runner = lambda argv: SimpleNamespace(returncode=0, stdout=f"JobId=7 JobState={next(flapping)}\n",
                                                 stderr="")
    paired.settled()
    assert next(flapping) == ("PENDING", "RUNNING")[demo_shadow.SETTLE_READS % 2]  # at most SETTLE_READS reads

    locked = []
    helper = demo_shadow.PairedHelper({}, 3.0, tmp_path)
    child = Child([(0, a_pair(10.0), "")])
    real_run = child.run

    def run(argv, **kwargs):
        locked.append(helper.quiet.locked())
        return real_run(argv, **kwargs)

    monkeypatch.setattr(child, "run", run)
    monkeypatch.setattr(demo_shadow, "subprocess", child)
    assert helper.pair() == a_pair(10.0)
    assert locked == [True] and not helper.quiet.locked()


def test_the_acting_epoch_plans_on_the_shadow_epochs_read_once_then_reads_slurm_again():
    from slurm_elastico.cluster.demo_pair import OneRead

    reads = iter(range(10))
    gateway = SimpleNamespace(snapshot=lambda: f"read {next(reads)}", batch_script=lambda job_id: f"#!{job_id}")
    shadow, acting = OneRead(gateway), OneRead(gateway)
    assert shadow.snapshot() == "read 0" and shadow.last == "read 0"
    acting.given = shadow.last
    assert acting.snapshot() == "read 0"  # the shadow epoch's read, not Slurm's
    assert acting.snapshot() == "read 1" and acting.last == "read 1"  # recovery's second read is Slurm's
    assert acting.batch_script(7) == "#!7"


def test_the_pair_process_refuses_a_wrong_command_line(capsys):
    from slurm_elastico.cluster import demo_pair

    assert demo_pair.main([]) == 2
    assert "usage: python -m slurm_elastico.cluster.demo_pair WORK" in capsys.readouterr().err


def test_the_pair_process_gives_the_acting_epoch_the_shadow_epochs_read_and_prints_the_pair(tmp_path, monkeypatch,
                                                                                           capsys):
    import contextlib

    from slurm_elastico.cluster import demo_pair
    from slurm_elastico.helper import service
    from slurm_elastico.slurm import gateway

    reads = iter(range(10))
    live = SimpleNamespace(snapshot=lambda: f"read {next(reads)}")
    seen = {}

    def open_helper(cfg, *, shadow, metrics, log, around):
        gateway, mode = around(live), "shadow" if shadow else "act"

        def step():
            seen[mode] = gateway.snapshot()
            log("info", f"note: {mode} epoch")
            status = "shadow" if shadow else "done"
            return SimpleNamespace(outage="", to_dict=lambda: epoch(10.0 if shadow else 10.5, (7, "set_share", status)))

        return SimpleNamespace(step=step)

    monkeypatch.setattr(service, "open_helper", open_helper)
    monkeypatch.setattr(gateway, "gateway_from", lambda cfg: SimpleNamespace(runner=Slurm()))
    monkeypatch.setattr(service, "held", lambda cfg: contextlib.nullcontext())
    monkeypatch.setattr(demo_pair.config, "load", lambda path: SimpleNamespace())
    assert demo_pair.main([str(tmp_path), ""]) == 0
    assert seen == {"shadow": "read 0", "act": "read 0"}  # one read of Slurm for both epochs
    pair = demo_shadow.Pair.from_dict(json.loads(capsys.readouterr().out.splitlines()[-1]))
    assert pair.shadow_at == 10.0 and pair.acting == [(7, "set_share")] and not pair.acting_failed
    assert "note: shadow epoch" in (tmp_path / "shadow.log").read_text()
    assert '"status": "done"' in (tmp_path / "sched.log").read_text()
