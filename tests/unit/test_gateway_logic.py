"""Gateway sequencing and error typing, through a scripted runner (pure logic; the live tests use Slurm)."""

import pytest

from slurm_elastico.errors import InvalidActionError, JobNotPendingError, SlurmError, UnknownJobError
from slurm_elastico.model import Action, ActionKind
from slurm_elastico.slurm.gateway import SlurmGateway, classify
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


def test_requeue_releases_even_when_update_fails():
    runner = ScriptedRunner([
        (lambda a: a[:2] == ["scontrol", "update"] and a[-1].startswith("Gres="), 1, "", "Invalid generic resource (gres) specification"),
    ])
    gw = SlurmGateway(runner, sleep=lambda s: None)
    gw.wait_state = lambda job_id, states, timeout_s: None  # the job is held at once in this script
    with pytest.raises(SlurmError, match="gres"):
        gw.requeue_with_share(12, 30)
    assert runner.calls[0] == ["scontrol", "requeuehold", "12"]
    assert runner.calls[-1] == ["scontrol", "release", "12"]


def test_requeue_validates_before_holding():
    runner = ScriptedRunner([])
    gw = SlurmGateway(runner)
    with pytest.raises(InvalidActionError):
        gw.requeue_with_share(12, 500)
    assert runner.calls == []


def test_dry_run_argv_matches_reshape_sequence():
    gw = SlurmGateway(ScriptedRunner([]))
    act = Action(ActionKind.RESHAPE_RUNNING, 8, "faster", share=50, nodes=("n2",))
    assert gw.argv_for(act) == [
        ["scontrol", "requeuehold", "8"],
        ["scontrol", "update", "JobId=8", "Gres=mps:50"],
        ["scontrol", "update", "JobId=8", "NodeList=n2"],
        ["scontrol", "update", "JobId=8", "StartTime=now"],
        ["scontrol", "release", "8"],
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


@pytest.mark.parametrize("action", [
    Action(ActionKind.SET_GPUS, 7, "t", gpus=4, nodes=("n1",)),
    Action(ActionKind.RESHAPE_RUNNING, 7, "t", gpus=4, nodes=("n1",)),
])
def test_a_gpu_count_change_is_refused_before_any_command_runs(action):
    runner = ScriptedRunner([])
    with pytest.raises(InvalidActionError, match="GPU count"):
        SlurmGateway(runner, sleep=lambda s: None).apply(action)
    assert runner.calls == []  # nothing reached Slurm: no job requeued and left held
