"""The parsers on output recorded from a real Slurm 26.05 cluster (data_parser/v0.0.45), no cluster needed.

Recorded by `etc/dev/record-slurm-json tests/data/slurm/26.05` on a local cluster of 4 nodes x 4 fake GPUs
(MPS 100 per GPU): its docstring lists the jobs it runs, and `jobs.json` says which id each one got. The
expected values below are what those jobs asked for and what was done to them, so a field that 26.05 prints
in another form than 24.11 fails here rather than being read wrong.

Seen in this recording and not asserted as a rule: 26.05's sacct printed every comment empty (the jobs were
still running or had none; 24.11's recording, of finished runs, had them), and left the held job out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_elastico.errors import ParseError
from slurm_elastico.model import GpuUse, GresRequest, JobState
from slurm_elastico.slurm import commands
from slurm_elastico.slurm.accounting import parse_sacct, runs_by_job
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.jobs import parse_squeue
from slurm_elastico.slurm.nodes import parse_sinfo
from slurm_elastico.slurm.runner import Completed
from slurm_elastico.slurm.schema import SCHEMA_V0045, schema_of, slurm_version
from slurm_elastico.slurm.snapshot import build_nodes

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm" / "26.05"
KEY = json.loads((DATA / "jobs.json").read_text())
ID = KEY["jobs"]
NODES = ("n1", "n2", "n3", "n4")


def text(name: str) -> str:
    return (DATA / name).read_text()


def jobs(name: str) -> dict:
    return {j.job_id: j for j in parse_squeue(text(name), name)}


RECORDINGS = ["squeue_json.json", "squeue_json_states_all_finished.json", "scontrol_show_job_json.json",
              "scontrol_show_node_json.json", "sinfo_json.json", "sacct_json.json"]


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_recording_is_26_05_and_its_schema_is_read(name):
    assert schema_of(text(name)) == SCHEMA_V0045 == "v0.0.45"
    assert slurm_version(text(name)).startswith("26.05.") and slurm_version(text(name)) == KEY["slurm"]
    assert json.loads(text(name))["meta"]["plugin"]["data_parser"] == "data_parser/v0.0.45"


@pytest.mark.parametrize("name", RECORDINGS)
def test_nothing_of_the_recording_machine_is_left(name):
    raw = text(name)
    assert "/tmp/" not in raw and "elastico-record-" not in raw
    assert {n.get("operating_system", "Linux") for n in json.loads(raw).get("nodes", [])} <= {"Linux"}
    assert json.loads(raw)["meta"]["slurm"]["cluster"] == "lab"


@pytest.mark.parametrize("name", ["squeue_json.json", "scontrol_show_job_json.json"])
def test_running_jobs_their_gpus_and_shares(name):
    got = jobs(name)
    m10, m35, gang, req = got[ID["mps10"]], got[ID["mps35"]], got[ID["gang"]], got[ID["requeued"]]
    assert (m10.state, m10.gres, m10.requeue, m10.time_limit_s) == (JobState.RUNNING, GresRequest("mps", 10), True, 300)
    assert m10.user == "root" and m10.partition == "debug" and m10.work_dir == "/srv/lab/rt"
    assert m10.gpu_alloc == (("n1", 0, 10),) and m10.gpu_indices == (0,)
    assert (m35.gres, m35.comment, m35.time_limit_s) == (GresRequest("mps", 35), "c", 525600 * 60)  # the partition's
    assert m35.gpu_alloc == (("n1", 0, 35),)  # all_sharing: the first GPU with room, beside mps10
    assert gang.state is JobState.RUNNING and gang.gres == GresRequest("gpu", 2) and len(gang.nodes) == 2
    assert len(gang.gpu_alloc) == 4 and all(share == 0 for _, _, share in gang.gpu_alloc)  # whole GPUs
    assert (req.state, req.restarts, req.gres) == (JobState.RUNNING, 1, GresRequest("mps", 25))
    assert (req.comment, req.admin_comment) == ("reshape:gen=1", "elastico:50to25")
    assert [share for _, _, share in req.gpu_alloc] == [25]
    for job in (m10, m35, gang, req):
        assert job.start_time and job.submit_time and job.start_time >= job.submit_time and not job.held


@pytest.mark.parametrize("name", ["squeue_json.json", "scontrol_show_job_json.json"])
def test_pending_jobs_held_and_waiting(name):
    got = jobs(name)
    held, big = got[ID["held"]], got[ID["toobig"]]
    assert held.state is JobState.PENDING and held.held and held.reason == "JobHeldUser" and held.priority == 0
    assert (held.comment, held.admin_comment) == ("hello", "adm") and held.gres is None and held.start_time is None
    assert big.state is JobState.PENDING and not big.held and big.gres == GresRequest("gpu", 4)
    assert big.nodes == () and big.gpu_alloc == () and big.reason  # Resources or Priority: it waits for GPUs
    assert big.priority > 0


def test_squeue_lists_active_jobs_and_scontrol_the_finished_too():
    active = jobs("squeue_json.json")
    assert ID["done"] not in active and ID["cancelled"] not in active
    every = jobs("scontrol_show_job_json.json")
    assert every[ID["done"]].state is JobState.COMPLETED and every[ID["cancelled"]].state is JobState.CANCELLED
    assert set(ID.values()) <= every.keys()


def test_the_gateway_sees_the_finished_job_through_its_one_job_query():
    argv = commands.squeue_job_json(ID["done"])
    recorded = text("squeue_json_states_all_finished.json")

    def runner(got, *, timeout=None):
        assert list(got) == argv, f"unexpected command {got}"
        return Completed(tuple(got), 0, recorded, "")

    view = SlurmGateway(runner, sleep=lambda s: None).job(ID["done"])
    assert view.state is JobState.COMPLETED and not view.state.active and view.gres == GresRequest("gpu", 1)


def test_nodes_from_scontrol_show_node_and_sinfo():
    by_node = parse_sinfo(text("scontrol_show_node_json.json"), "scontrol show node --json")
    assert tuple(r.name for r in by_node) == NODES
    for r in by_node:
        assert (r.cpus, r.gpus, r.mps_total, r.partitions, r.gres) == (8, 4, 400, ("debug",), "gpu:4,mps:400")
        assert r.slurmd_start_time and not r.approximate
    n1 = by_node[0]
    assert n1.state == "mixed" and n1.tres_used["gres/mps"] == 10 + 35 + 25
    assert sum(r.alloc_cpus for r in by_node) == 5  # mps10, mps35, gang (2 nodes), requeued: 1 CPU each
    by_sinfo = parse_sinfo(text("sinfo_json.json"))
    assert tuple(r.name for r in by_sinfo) == NODES
    assert {r.name: (r.cpus, r.gpus, r.mps_total) for r in by_sinfo} == {r.name: (r.cpus, r.gpus, r.mps_total)
                                                                           for r in by_node}


def test_per_gpu_use_is_built_from_the_jobs():
    records = parse_sinfo(text("scontrol_show_node_json.json"))
    nodes = {n.name: n for n in build_nodes(records, parse_squeue(text("squeue_json.json")))}
    g0 = nodes["n1"].gpus[0]
    assert set(g0.users) >= {GpuUse(ID["mps10"], 10), GpuUse(ID["mps35"], 35)}
    whole = [(n.name, g.index) for n in nodes.values() for g in n.gpus if g.held_whole]
    assert len(whole) == 4 and all(GpuUse(ID["gang"], 0, whole=True) in nodes[n].gpus[i].users for n, i in whole)


def test_sacct_each_run_of_the_requeued_job_with_its_share():
    runs = runs_by_job(parse_sacct(text("sacct_json.json")))
    first, second = runs[ID["requeued"]]
    assert first.state is JobState.REQUEUED and second.state is JobState.RUNNING
    assert (first.tres_alloc["gres/mps"], second.tres_alloc["gres/mps"]) == (50, 25)
    assert (first.restarts, second.restarts) == (0, 1)
    assert first.time_limit_s == 525600 * 60 and second.time_limit_s is None  # 26.05: unset on the running run
    done = runs[ID["done"]][0]
    assert done.state is JobState.COMPLETED and done.exit_code == 0 and done.tres_alloc["gres/gpu"] == 1
    assert done.end_time and done.start_time and done.end_time >= done.start_time
    assert runs[ID["cancelled"]][-1].state is JobState.CANCELLED
    assert runs[ID["toobig"]][0].start_time is None and runs[ID["toobig"]][0].tres_req["gres/gpu"] == 16
    assert runs[ID["gang"]][0].tres_alloc["gres/gpu"] == 4 and len(runs[ID["gang"]][0].nodes) == 2


def test_a_field_in_another_form_is_an_error_naming_the_command_and_schema():
    doc = json.loads(text("scontrol_show_node_json.json"))
    doc["nodes"][0]["cpus"] = "eight"
    with pytest.raises(ParseError, match=r"^scontrol show node --json \(v0\.0\.45\): nodes\[0\]\.cpus is not a number"):
        parse_sinfo(json.dumps(doc), "scontrol show node --json")
