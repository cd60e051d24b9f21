"""Gateway sequencing and error typing, through a scripted runner (pure logic; the live tests use Slurm)."""

import pytest

from slurm_elastico.errors import InvalidActionError, JobNotPendingError, SlurmError, UnknownJobError
from slurm_elastico.model import Action, ActionKind, JobState
from slurm_elastico.slurm.answers import classify
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.gpu_count import GpuCountMismatch
from slurm_elastico.slurm.runner import Completed


class ScriptedRunner:
    """Answers each argv by the first matching rule; records every call."""

    def __init__(self, rules):
        self.rules = rules
        self.calls = []

    def __call__(self, argv, *, timeout=None):
        self.calls.append(list(argv))
        for match, rc, out, err in self.rules:
            if match(argv):
                return Completed(tuple(argv), rc, out, err)
        return Completed(tuple(argv), 0, "", "")


def test_classify_types_errors():
    unk = Completed(("scontrol", "update"), 1, "", "slurm_update error: Invalid job id specified")
    pend = Completed(("scontrol", "update"), 1, "", "slurm_update error: Job is no longer pending execution")
    other = Completed(("scontrol", "update"), 1, "", "Access/permission denied")
    with pytest.raises(UnknownJobError):
        classify(unk)
    with pytest.raises(JobNotPendingError) as e:
        classify(pend)
    assert e.value.argv == ("scontrol", "update") and e.value.returncode == 1 and "pending" in e.value.stderr
    with pytest.raises(SlurmError) as e2:
        classify(other)
    assert type(e2.value) is SlurmError and "permission" in str(e2.value)
    ok = Completed(("x",), 0, "out", "")
    assert classify(ok) is ok


RUNNING_2205 = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "slurm" / "22.05" / "squeue_running.json"
"""Recorded 22.05 squeue: job 23 runs on n1 at mps:35 (user root)."""


def test_requeue_releases_and_gives_back_its_place_even_when_update_fails():
    runner = ScriptedRunner([
        (lambda a: a[0] == "squeue", 0, RUNNING_2205.read_text(), ""),
        (lambda a: a[:2] == ["scontrol", "update"] and a[-1].startswith("Gres="), 1, "", "Invalid generic resource (gres) specification"),
    ])
    gw = SlurmGateway(runner, sleep=lambda s: None)
    gw.wait_state = lambda job_id, states, timeout_s: None  # the job is held at once in this script
    with pytest.raises(SlurmError, match="gres"):
        gw.requeue_with_share(23, 30)
    assert runner.calls[1][:3] == ["scontrol", "create", "reservation"]  # its place kept before the hold
    assert "Nodes=n1" in runner.calls[1] and "Users=root" in runner.calls[1]
    assert runner.calls[2] == ["scontrol", "requeuehold", "23"]
    assert runner.calls[-3:] == [["scontrol", "release", "23"], ["scontrol", "update", "JobId=23", "Reservation="],
                                 ["scontrol", "delete", "ReservationName=elastico-requeue-23"]]
    # Released on its old request into its place and with StartTime=now, so it runs again at once, not after
    # Slurm's ~120 s BeginTime (measured on 22.05) or its own place's timeout.
    assert runner.calls[-5:-2] == [["scontrol", "update", "JobId=23", "Reservation=elastico-requeue-23"],
                                   ["scontrol", "update", "JobId=23", "StartTime=now"], ["scontrol", "release", "23"]]


def test_a_place_slurm_refuses_twice_leaves_the_requeue_as_before():
    runner = ScriptedRunner([
        (lambda a: a[0] == "squeue", 0, RUNNING_2205.read_text(), ""),
        (lambda a: a[:3] == ["scontrol", "create", "reservation"], 1, "",
         "Error creating the reservation: Duplicate reservation name"),
    ])
    gw = SlurmGateway(runner, sleep=lambda s: None)
    gw.wait_state = lambda job_id, states, timeout_s: None
    gw.requeue_with_share(23, 30)
    # the stale one forgotten (deleted), tried again; refused again: requeued without a place
    assert [c[1] for c in runner.calls[1:4]] == ["create", "delete", "create"]
    assert [c[1] for c in runner.calls[4:]] == ["requeuehold", "update", "update", "release"]
    assert not any(c[2:3] == ["JobId=23"] and c[3].startswith("Reservation=") for c in runner.calls)


def test_a_reshape_carried_out_is_not_failed_by_a_slow_restart():
    # Held, updated, released with its new share: a restart slower than RESTART_TIMEOUT_S is logged, the place
    # given up (job out of it, deleted), and the reshape returns, so the executor keeps the new shape's comment.
    runner = ScriptedRunner([(lambda a: a[0] == "squeue", 0, RUNNING_2205.read_text(), "")])
    gw = SlurmGateway(runner, sleep=lambda s: None)

    def wait_state(job_id, states, timeout_s):
        if JobState.PENDING not in states:
            raise SlurmError(["squeue"], 0, "", f"job {job_id} did not reach running within {timeout_s:g} s")
    gw.wait_state = wait_state
    gw.requeue_with_share(23, 30)
    assert [c[:2] + c[2:3] for c in runner.calls[-3:]] == [["scontrol", "release", "23"],
                                                           ["scontrol", "update", "JobId=23"],
                                                           ["scontrol", "delete", "ReservationName=elastico-requeue-23"]]
    assert runner.calls[-2][3] == "Reservation="


DELETE = ["scontrol", "delete", "ReservationName=elastico-requeue-7"]
OUT_OF_IT = ["scontrol", "update", "JobId=7", "Reservation="]


@pytest.mark.parametrize("says, calls", [
    ("", [DELETE]),  # deleted: the job was not in it
    ("Error deleting the reservation: Requested reservation is invalid", [DELETE]),  # none: the job's own
    # reservation, a site's or its user's, is left alone
])
def test_forgetting_a_place_never_takes_the_job_out_of_another_reservation(says, calls):
    runner = ScriptedRunner([(lambda a: a == DELETE, 1 if says else 0, "", says)])
    SlurmGateway(runner).forget_place(7)
    assert runner.calls == calls


def test_forgetting_a_place_with_the_job_in_it_takes_it_out_then_deletes():
    deletes = iter([(1, "Error deleting the reservation: Requested reservation is in use"), (0, "")])
    calls = []

    def run(argv, *, timeout=None):
        calls.append(list(argv))
        rc, err = next(deletes) if list(argv) == DELETE else (0, "")
        return Completed(tuple(argv), rc, "", err)
    SlurmGateway(run).forget_place(7)
    assert calls == [DELETE, OUT_OF_IT, DELETE]


def test_a_place_still_in_use_once_the_job_is_out_is_left_to_end():
    calls = []

    def run(argv, *, timeout=None):
        calls.append(list(argv))
        busy = "Error deleting the reservation: Requested reservation is in use"
        return Completed(tuple(argv), 1 if list(argv) == DELETE else 0, "", busy if list(argv) == DELETE else "")
    SlurmGateway(run).forget_place(7)  # another job was put into it: the job is out, nothing raised
    assert calls == [DELETE, OUT_OF_IT, DELETE]


def test_a_place_slurm_will_not_delete_is_an_error_not_silence():
    runner = ScriptedRunner([(lambda a: a == DELETE, 1, "", "Error deleting the reservation: Access/permission denied")])
    with pytest.raises(SlurmError, match="permission denied"):
        SlurmGateway(runner).forget_place(7)
    assert runner.calls == [DELETE]


def test_requeue_validates_before_holding():
    runner = ScriptedRunner([])
    gw = SlurmGateway(runner)
    with pytest.raises(InvalidActionError):
        gw.requeue_with_share(12, 500)
    assert runner.calls == []


def test_dry_run_argv_matches_reshape_sequence():
    gw = SlurmGateway(ScriptedRunner([(lambda a: a[0] == "squeue", 0, RUNNING_2205.read_text(), "")]))
    act = Action(ActionKind.RESHAPE_RUNNING, 23, "faster", share=50, nodes=("n2",))
    assert gw.argv_for(act) == [
        ["scontrol", "create", "reservation", "ReservationName=elastico-requeue-23", "StartTime=now", "Duration=5",
         "Nodes=n2", "Users=root", "Flags=IGNORE_JOBS,NO_HOLD_JOBS_AFTER_END"],
        ["scontrol", "requeuehold", "23"],
        ["scontrol", "update", "JobId=23", "Gres=mps:50"],
        ["scontrol", "update", "JobId=23", "NodeList=n2"],
        ["scontrol", "update", "JobId=23", "Reservation=elastico-requeue-23"],
        ["scontrol", "update", "JobId=23", "StartTime=now"],
        ["scontrol", "release", "23"],
        ["scontrol", "update", "JobId=23", "Reservation="],
        ["scontrol", "delete", "ReservationName=elastico-requeue-23"],
    ]


def test_action_without_value_refused():
    gw = SlurmGateway(ScriptedRunner([]))
    with pytest.raises(InvalidActionError, match="lacks"):
        gw.apply(Action(ActionKind.SET_SHARE, 3, "no share"))


DATA = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "slurm"


class ReplayRunner:
    """Answers squeue / node listing from recorded files of one Slurm version."""

    def __init__(self, version, squeue, nodes):
        self.files = {"squeue": DATA / version / squeue, "nodes": DATA / version / nodes}
        self.calls = []

    def __call__(self, argv, *, timeout=None):
        self.calls.append(list(argv))
        key = "squeue" if argv[0] == "squeue" else "nodes"
        return Completed(tuple(argv), 0, self.files[key].read_text(), "")


@pytest.mark.parametrize("version,squeue,nodes,node_cmd", [
    ("22.05", "squeue_running.json", "sinfo_busy.json", ["sinfo", "--json"]),
    ("24.11", "squeue_json.json", "scontrol_show_node_json.json", ["scontrol", "show", "node", "--json"]),
])
def test_snapshot_from_recorded_output_uses_two_calls(version, squeue, nodes, node_cmd):
    runner = ReplayRunner(version, squeue, nodes)
    snap = SlurmGateway(runner, clock=lambda: 123.0).snapshot()
    assert runner.calls == [["squeue", "--all", "--json"], node_cmd]
    assert snap.slurm_version.startswith(version) and snap.taken_at == 123.0
    assert len(snap.nodes) == 4 and len(snap.gpus) == 16
    assert all(j.state.active for j in snap.jobs)
    if version == "22.05":
        # job 24 holds GPU 0 of n1 and n2 whole; job 23's 35 shares sit on n1 GPU 0 too (22.05 allows it)
        assert snap.node("n1").gpus[0].held_whole and snap.node("n2").gpus[0].shares_used == 100
        assert snap.job(19).state.value == "PENDING" and snap.job(19).mps_share == 30
    else:
        g0 = snap.node("n1").gpus[0]
        assert g0.shares_used == 45 and set(g0.job_ids) == {1, 13}
    assert {p.name for p in snap.partitions} == {"debug"}


def test_start_now_action():
    runner = ScriptedRunner([])
    gw = SlurmGateway(runner)
    act = Action(ActionKind.START_NOW, 4, "placed")
    assert gw.argv_for(act) == [["scontrol", "update", "JobId=4", "StartTime=now"]]
    gw.apply(act)
    assert runner.calls == [["scontrol", "update", "JobId=4", "StartTime=now"]]


def _squeue_answers(sample):
    """A runner answering every `squeue` with a recorded sample and every other command with success."""
    text = (DATA / sample).read_text()
    return ScriptedRunner([(lambda a: a[0] == "squeue", 0, text, "")])


def test_set_gpus_updates_then_reads_the_request_back():
    # 22.05's job 20 holds gpu:2 on each of n2,n3 (recorded after this very update).
    runner = _squeue_answers("22.05/squeue_json_gpu_count_held_2x2.json")
    act = Action(ActionKind.SET_GPUS, 20, "t", gpus=4, nodes=("n2", "n3"))
    update = ["scontrol", "update", "JobId=20", "Gres=gpu:2", "NumNodes=2-2", "NodeList=n2,n3"]
    assert SlurmGateway(runner).argv_for(act) == [update]
    SlurmGateway(runner).apply(act)
    assert [c[0] for c in runner.calls] == ["squeue", "scontrol", "squeue"] and runner.calls[1] == update


@pytest.mark.parametrize("sample", ["22.05/squeue_json_gpu_count_held_2x2.json", "24.11/squeue_json_gpu_count_held_2x2.json"])
def test_a_request_that_reads_back_otherwise_is_a_mismatch_naming_both(sample):
    job = 20 if sample.startswith("22.05") else 5
    runner = _squeue_answers(sample)
    with pytest.raises(GpuCountMismatch) as e:
        SlurmGateway(runner).set_gpus(job, 2, ("n4",))
    assert "asked Slurm for gpu:2 × 1 node(s) on n4" in str(e.value) and "it holds gpu:2 × 2 node(s) on n2,n3" in str(e.value)


@pytest.mark.parametrize(("job", "why"), [(21, "MPS share"), (19, "--gpus=1")])
def test_slurm_22_05_refuses_gpu_counts_it_would_refuse_or_ignore_before_any_update(job, why):
    sample = "22.05/squeue_json_gpu_count_mps_held.json" if job == 21 else "22.05/squeue_json_gpu_count_running_2x2.json"
    runner = _squeue_answers(sample)
    with pytest.raises(InvalidActionError) as e:
        SlurmGateway(runner, sleep=lambda s: None).apply(Action(ActionKind.RESHAPE_RUNNING, job, "t", gpus=2))
    assert why in str(e.value) and "22.05" in str(e.value)
    assert [c[0] for c in runner.calls] == ["squeue"]  # read only: nothing requeued, updated or left held


def test_slurm_24_11_lets_an_mps_job_move_to_whole_gpus():
    # job 8 was submitted with --gres=mps:50 and updated to Gres=gpu:2 on 24.11 (recorded).
    runner = _squeue_answers("24.11/squeue_json_gpu_count_mps_to_gpu_held.json")
    SlurmGateway(runner).set_gpus(8, 2)
    assert runner.calls[1] == ["scontrol", "update", "JobId=8", "Gres=gpu:2", "NumNodes=1-1", "NodeList="]


class ReleasedRunner(ScriptedRunner):
    """squeue answers `before` until the job is released, `after` from then on; everything else succeeds."""

    def __init__(self, before: str, after: str):
        super().__init__([])
        self.texts = [(DATA / before).read_text(), (DATA / after).read_text()]

    def __call__(self, argv, *, timeout=None):
        self.calls.append(list(argv))
        released = any(c[:2] == ["scontrol", "release"] for c in self.calls)
        return Completed(tuple(argv), 0, self.texts[released] if argv[0] == "squeue" else "", "")


def test_a_gpu_reshape_holds_updates_checks_and_releases_in_order():
    # job 20 pending, gpu:2 on n2,n3 until released; running there after
    runner = ReleasedRunner("22.05/squeue_json_gpu_count_held_2x2.json", "22.05/squeue_json_gpu_count_running_2x2.json")
    gw = SlurmGateway(runner, sleep=lambda s: None)
    gw.apply(Action(ActionKind.RESHAPE_RUNNING, 20, "t", gpus=4, nodes=("n2", "n3")))
    assert [c[:2] for c in runner.calls] == [["squeue", "--all"], ["squeue", "--all"], ["scontrol", "create"],
                                              ["scontrol", "requeuehold"], ["squeue", "--all"],
                                              ["scontrol", "update"], ["squeue", "--all"], ["scontrol", "update"],
                                              ["scontrol", "update"], ["scontrol", "release"], ["squeue", "--all"],
                                              ["scontrol", "update"], ["scontrol", "delete"]]
    assert "Nodes=n2,n3" in runner.calls[2]
    assert runner.calls[7][-1] == "Reservation=elastico-requeue-20" and runner.calls[8][-1] == "StartTime=now"
    assert runner.calls[11][-1] == "Reservation="  # taken out once squeue shows it running again


def test_an_uneven_split_is_refused_before_any_command_runs():
    runner = ScriptedRunner([])
    with pytest.raises(InvalidActionError, match="do not split evenly over 2 nodes"):
        SlurmGateway(runner).apply(Action(ActionKind.SET_GPUS, 7, "t", gpus=3, nodes=("n1", "n2")))
    assert runner.calls == []


def test_accounting_that_matched_no_job_is_an_empty_answer_and_any_other_error_an_outage():
    """Recorded: 22.05's `sacct --json` over a window with no job exits 0 with one `errors` entry
    (slurmdb_jobs_get "Nothing found"); that is no job, while other errors (slurmdbd down) stay an outage."""
    from slurm_elastico.errors import SlurmUnavailable

    data = RUNNING_2205.parent
    empty = (data / "sacct_nothing_found.json").read_text()
    gw = SlurmGateway(ScriptedRunner([(lambda a: a[0] == "sacct", 0, empty, "")]))
    assert gw.sacct(start="2020-01-01", end="2020-01-02") == ()
    down = empty.replace('"Nothing found with query"', '"Unable to connect to database"').replace(
        '"Nothing found"', '"Unable to connect to database"')
    for text in (down, empty.replace('"slurmdb_jobs_get"', '"slurm_load_jobs"')):
        with pytest.raises(SlurmUnavailable, match="no trustworthy data"):
            SlurmGateway(ScriptedRunner([(lambda a: a[0] == "sacct", 0, text, "")])).sacct()
    with pytest.raises(SlurmUnavailable):
        SlurmGateway(ScriptedRunner([(lambda a: a[0] == "sacct", 1, empty, "sacct: error: Problem talking to the database")])).sacct()
    assert len(gw.sacct()) == 0 and len(SlurmGateway(ScriptedRunner([
        (lambda a: a[0] == "sacct", 0, (data / "sacct.json").read_text(), "")])).sacct()) > 0
