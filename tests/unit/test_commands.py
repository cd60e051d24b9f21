"""Argv builders: exact commands, validation before anything runs, hostile strings kept whole."""

import pytest
from hypothesis import given, strategies as st

from slurm_elastico.errors import InvalidActionError
from slurm_elastico.model import Action, ActionKind
from slurm_elastico.slurm import commands

HOSTILE = ["it's \"quoted\"", "a; rm -rf /", "$(touch pwned)", "`id`", "line1\nline2", "ünïcødé ✓ 日本", "x' OR '1'='1", "--batch"]


def test_set_share_uses_gres_never_tres_per_node():
    argv = commands.set_share(42, 25)
    assert argv == ["scontrol", "update", "JobId=42", "Gres=mps:25"]
    assert not any("TresPerNode" in a for a in argv)


@pytest.mark.parametrize("share", [0, -1, 101, 500, 2.5, "50", True, None])
def test_bad_share_refused(share):
    with pytest.raises(InvalidActionError, match="1 to 100"):
        commands.set_share(1, share)


def test_share_range_follows_shares_per_gpu():
    assert commands.set_share(1, 200, shares_per_gpu=200)[-1] == "Gres=mps:200"
    with pytest.raises(InvalidActionError, match="1 to 50"):
        commands.set_share(1, 60, shares_per_gpu=50)


@pytest.mark.parametrize("job", [0, -3, "12", 1.0, True, None])
def test_bad_job_id_refused(job):
    with pytest.raises(InvalidActionError, match="positive integer"):
        commands.release(job)


def test_signal_batch_and_full():
    assert commands.signal(7, "USR1") == ["scancel", "--signal=USR1", "--batch", "7"]
    assert commands.signal(7, "SIGTERM", whole_job=True) == ["scancel", "--signal=TERM", "--full", "7"]
    with pytest.raises(InvalidActionError, match="USR1"):
        commands.signal(7, "USR1; reboot")


def test_cancel_lists_each_job():
    assert commands.cancel([7, 12]) == ["scancel", "7", "12"]
    with pytest.raises(InvalidActionError, match="positive integer"):
        commands.cancel([7, "8; reboot"])


@pytest.mark.parametrize("text", HOSTILE)
def test_admin_comment_is_one_argv_element(text):
    argv = commands.set_admin_comment(9, text)
    assert argv[:3] == ["scontrol", "update", "JobId=9"]
    assert argv[3] == f"AdminComment={text}" and len(argv) == 4


def test_admin_comment_rejects_nul():
    with pytest.raises(InvalidActionError, match="NUL"):
        commands.set_admin_comment(9, "a\x00b")


def test_nodes_validated():
    assert commands.set_nodes(3, ("n1", "n2")) == ["scontrol", "update", "JobId=3", "NodeList=n1,n2"]
    with pytest.raises(InvalidActionError, match="node name"):
        commands.set_nodes(3, ("n1; id",))


def test_requeue_sequence_builders():
    assert commands.requeue_hold(5) == ["scontrol", "requeuehold", "5"]
    assert commands.start_now(5) == ["scontrol", "update", "JobId=5", "StartTime=now"]
    assert commands.release(5) == ["scontrol", "release", "5"]


@given(st.integers(min_value=1, max_value=100))
def test_every_valid_share_builds(share):
    assert commands.set_share(1, share)[-1] == f"Gres=mps:{share}"


def test_node_listing_follows_version():
    assert commands.nodes_json("22.05.8") == ["sinfo", "--json"]
    assert commands.nodes_json("24.11.5") == ["scontrol", "show", "node", "--json"]


def test_gpu_count_argv_is_the_form_verified_on_22_05_and_24_11():
    assert commands.set_gpu_count(5, 4, ("n2", "n3")) == [
        "scontrol", "update", "JobId=5", "Gres=gpu:2", "NumNodes=2-2", "NodeList=n2,n3"]
    assert commands.set_gpu_count(5, 4, ("n[2-3]",))[4] == "NumNodes=2-2"  # a hostlist counts its nodes
    assert commands.set_gpu_count(5, 1, ()) == ["scontrol", "update", "JobId=5", "Gres=gpu:1", "NumNodes=1-1", "NodeList="]
    reshape = commands.gpu_count_argv(Action(ActionKind.RESHAPE_RUNNING, 5, "t", gpus=2, nodes=("n1",)))
    assert reshape == [["scontrol", "requeuehold", "5"], commands.set_gpu_count(5, 2, ("n1",)),
                       ["scontrol", "update", "JobId=5", "StartTime=now"], ["scontrol", "release", "5"]]


@pytest.mark.parametrize(("gpus", "nodes", "message"), [
    (0, (), "integer >= 1"), (True, (), "integer >= 1"), (3, ("n1", "n2"), "do not split evenly over 2 nodes"),
    (2, ("n1;rm",), "not a valid Slurm node name"),
])
def test_bad_gpu_counts_are_refused_with_the_reason(gpus, nodes, message):
    with pytest.raises(InvalidActionError, match=message):
        commands.set_gpu_count(5, gpus, nodes)


def test_a_requeued_jobs_place_is_a_reservation_of_its_nodes_for_its_owner():
    argv = commands.reserve_place(7, ("n1", "n2"), "alice", 3)
    assert argv == ["scontrol", "create", "reservation", "ReservationName=elastico-requeue-7", "StartTime=now",
                    "Duration=3", "Nodes=n1,n2", "Users=alice", "Flags=IGNORE_JOBS,NO_HOLD_JOBS_AFTER_END"]
    assert commands.set_reservation(7, "") == ["scontrol", "update", "JobId=7", "Reservation="]
    assert commands.delete_place(7) == ["scontrol", "delete", "ReservationName=elastico-requeue-7"]
    with pytest.raises(InvalidActionError, match="at least one node"):
        commands.reserve_place(7, (), "alice", 3)
    with pytest.raises(InvalidActionError, match="not a valid user name"):
        commands.reserve_place(7, ("n1",), "alice,bob", 3)
    # sssd sites' fully qualified names: every reshape of such a user's job failed before its hold
    assert commands.reserve_place(7, ("n1",), "alice@corp.example", 3)[7] == "Users=alice@corp.example"
    for bad in ("alice bob", "a=b", "-alice", "@alice"):
        with pytest.raises(InvalidActionError, match="not a valid user name"):
            commands.reserve_place(7, ("n1",), bad, 3)
    with pytest.raises(InvalidActionError, match="whole number of minutes"):
        commands.reserve_place(7, ("n1",), "alice", 0)
    with pytest.raises(InvalidActionError, match="not a valid Slurm node name"):
        commands.reserve_place(7, ("n1 n2",), "alice", 1)


def test_a_job_update_names_the_job_and_refuses_a_bad_id():
    assert commands.update_job(7, "Comment=x") == ["scontrol", "update", "JobId=7", "Comment=x"]
    with pytest.raises(InvalidActionError, match="job id must be a positive integer"):
        commands.update_job(0)


def test_srun_spreads_the_ranks_evenly_over_the_nodes():
    argv = commands.srun_tasks(["python", "-m", "x"], 8, 2)
    assert argv[:4] == ["srun", "--ntasks=8", "--ntasks-per-node=4", "--nodes=2"]
    assert argv[-3:] == ["python", "-m", "x"]


def test_sbatch_is_the_program_unless_another_is_given():
    assert commands.sbatch(["-p", "debug"]) == ["sbatch", "-p", "debug"]
    assert commands.sbatch([], "/opt/fake/sbatch") == ["/opt/fake/sbatch"]
