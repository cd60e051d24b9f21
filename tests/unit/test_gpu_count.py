"""A job's GPU request from recorded squeue output (22.05, 24.11) and the per-version refusals (pure logic)."""

import json
from pathlib import Path

import pytest

from slurm_elastico.errors import InvalidActionError
from slurm_elastico.slurm.gpu_count import GpuCountMismatch, GpuRequest, GpuUpdate, check_change, request_of
from slurm_elastico.slurm.gpu_count import verify as verify_update


def verify(text, job_id, gpus, nodes, argv):
    """The read-back of an untyped update of `gpus` GPUs over `nodes` (`GpuUpdate` as `plan_update` makes it)."""
    return verify_update(text, job_id, GpuUpdate(argv, GpuRequest("gpu", gpus // len(nodes), len(nodes), nodes)))

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def test_requests_read_from_both_versions():
    v22 = (DATA / "22.05/squeue_json_gpu_count_running_2x2.json").read_text()
    assert request_of(v22, 20) == GpuRequest("gpu", 2, 2, ("n2", "n3"))
    assert request_of(v22, 19) == GpuRequest("gpus", 1, 1, ())  # submitted with --gpus=1
    # The 22.05 trap, recorded: job 3 shows TresPerNode=gres/gpu:2 but ran on one GPU; job 4 shows TresPerJob.
    assert request_of(v22, 3).count == 2
    v24 = (DATA / "24.11/squeue_json_gpu_count_held_2x2.json").read_text()
    assert request_of(v24, 5) == GpuRequest("gpu", 2, 2, ("n2", "n3"))
    with pytest.raises(InvalidActionError, match="job 999 is not in squeue"):
        request_of(v24, 999)


def test_versions_decide_what_may_change():
    mps, per_job, gpu = GpuRequest("mps", 50, 1, ()), GpuRequest("gpus", 1, 1, ()), GpuRequest("gpu", 1, 1, ())
    for req in (mps, per_job):
        with pytest.raises(InvalidActionError, match="Slurm 22.05.8 refuses"):
            check_change("22.05.8", 7, req)
        check_change("24.11.5", 7, req)  # verified: 24.11 switches them
    check_change("22.05.8", 7, gpu)
    with pytest.raises(InvalidActionError, match="not MAJOR.MINOR"):
        check_change("unknown", 7, gpu)


def test_verify_names_what_was_asked_and_what_slurm_holds():
    text = (DATA / "22.05/squeue_json_gpu_count_held_2x2.json").read_text()
    assert verify(text, 20, 4, ("n2", "n3"), ["x"]) == GpuRequest("gpu", 2, 2, ("n2", "n3"))
    with pytest.raises(GpuCountMismatch, match=r"asked Slurm for gpu:4 × 2 node\(s\) on n2,n3, it holds gpu:2"):
        verify(text, 20, 8, ("n2", "n3"), ["x"])


def test_a_requeued_job_on_22_05_is_read_by_its_requested_node_count():
    """22.05 recorded: job 1 ran on one node with gpu:1, was requeued held and updated to `Gres=gpu:2 NumNodes=2-2
    NodeList=n2,n3`; its `node_count` still says 1 (its last run) while `tres_req_str` says node=2, gres/gpu=4."""
    text = (DATA / "22.05/squeue_json_gpu_count_requeued_held_2x2.json").read_text()
    job = json.loads(text)["jobs"][0]
    assert (job["job_id"], job["node_count"], job["restart_cnt"]) == (1, 1, 1)  # the stale field, as recorded
    assert "node=2," in job["tres_req_str"]
    assert verify(text, 1, 4, ("n2", "n3"), ["x"]) == GpuRequest("gpu", 2, 2, ("n2", "n3"))
    with pytest.raises(GpuCountMismatch, match=r"asked Slurm for gpu:2 × 1 node\(s\) on n2, it holds gpu:2 × 2"):
        verify(text, 1, 2, ("n2",), ["x"])
    # Without a TRES string the node count falls back to `node_count`, so a stale one is still refused.
    job["tres_req_str"] = ""
    with pytest.raises(GpuCountMismatch, match=r"it holds gpu:2 × 1 node\(s\) on n2,n3"):
        verify(json.dumps({**json.loads(text), "jobs": [job]}), 1, 4, ("n2", "n3"), ["x"])
