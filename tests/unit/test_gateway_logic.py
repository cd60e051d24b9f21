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
