"""Parsers of Slurm's JSON output, on output recorded from real 22.05, 24.11 and 26.05 clusters (26.05's own
cases: test_parse_2605.py).

The expected values were read off the recorded files in tests/data/slurm/.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_elastico.errors import ParseError
from slurm_elastico.model import GpuUse, GresRequest, JobState
from slurm_elastico.slurm.gres import GpuHold, gres_counts, parse_gres_detail, parse_gres_request, parse_tres
from slurm_elastico.slurm.hostlist import expand_hostlist
from slurm_elastico.slurm.accounting import parse_sacct, runs_by_job
from slurm_elastico.slurm.jobs import parse_squeue
from slurm_elastico.slurm.nodes import parse_sinfo
from slurm_elastico.slurm.schema import (
    SCHEMA_V0038,
    SCHEMA_V0042,
    SCHEMA_V0045,
    job_state,
    number,
    schema_of,
    slurm_errors,
    slurm_version,
)
from slurm_elastico.slurm.snapshot import build_nodes, partitions_from

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"


def text(version: str, name: str) -> str:
    return (DATA / version / name).read_text()


def data(version: str, name: str) -> dict:
    return json.loads(text(version, name))


def jobs_by_id(version: str, name: str) -> dict:
    return {j.job_id: j for j in parse_squeue(text(version, name))}


# --------------------------------------------------------------------------
# meta: version and schema
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version,name,release,schema",
    [
        ("22.05", "squeue.json", "22.05.8", SCHEMA_V0038),
        ("22.05", "sacct.json", "22.05.8", SCHEMA_V0038),  # openapi/dbv0.0.38
        ("24.11", "squeue_json.json", "24.11.5", SCHEMA_V0042),
        ("24.11", "sinfo_json.json", "24.11.5", SCHEMA_V0042),
        ("26.05", "scontrol_show_node_json.json", "26.05.5", SCHEMA_V0045),
        ("26.05", "sacct_json.json", "26.05.5", SCHEMA_V0045),
    ],
)
def test_version_and_schema_from_meta(version, name, release, schema):
    assert slurm_version(text(version, name)) == release
    assert schema_of(text(version, name)) == schema


def test_version_built_from_numbers_when_release_is_missing():
    doc22 = data("22.05", "sinfo.json")
    del doc22["meta"]["Slurm"]["release"]
    assert slurm_version(json.dumps(doc22)) == "22.05.8"  # ints 22, 5, 8
    doc24 = data("24.11", "sinfo_json.json")
    del doc24["meta"]["slurm"]["release"]
    assert slurm_version(json.dumps(doc24)) == "24.11.5"  # strings "24", "11", "5"


def test_slurm_errors_lists_the_messages():
    assert slurm_errors(text("22.05", "squeue.json")) == ()
    doc = data("24.11", "squeue_json.json")
    doc["errors"] = [{"description": "Invalid job id specified", "error_number": 2017}]
    assert slurm_errors(json.dumps(doc)) == ("Invalid job id specified",)


# --------------------------------------------------------------------------
# squeue, 22.05
# --------------------------------------------------------------------------


def test_squeue_2205_running_mps_jobs():
    jobs = jobs_by_id("22.05", "squeue_json.json")
    assert sorted(jobs) == list(range(1, 14))
    j1 = jobs[1]
    assert (j1.name, j1.user, j1.partition, j1.state) == ("job.sh", "root", "debug", JobState.RUNNING)
    assert j1.gres == GresRequest("mps", 10)
    assert j1.nodes == ("n1",) and j1.gpu_indices == (0,)
    assert j1.gpu_alloc == (("n1", 0, 10),)
    assert (j1.submit_time, j1.start_time, j1.end_time) == (1796007301, 1796007303, 1796007423)
    assert j1.time_limit_s == 120  # time_limit 2 (minutes)
    assert j1.reason == "" and not j1.held and j1.requeue
    assert j1.cpus == 1 and j1.memory_mib == 4000  # memory_per_node null: from tres_req_str mem=4000M
    j13 = jobs[13]
    assert j13.mps_share == 35 and j13.comment == "c" and j13.time_limit_s is None  # time_limit null
    assert jobs[7].gres == GresRequest("gpu", 3) and jobs[7].time_limit_s == 525600 * 60
    assert jobs[8].reason == "Resources" and jobs[8].nodes == () and jobs[8].gres is None


def test_squeue_2205_requeued_job_keeps_restart_count_and_comments():
    j = jobs_by_id("22.05", "squeue_json.json")[11]
    assert j.state is JobState.CANCELLED and j.restarts == 1
    assert (j.comment, j.admin_comment) == ("reshape:gen=1", "elastico:50to25")
    j16 = jobs_by_id("22.05", "squeue.json")[16]
    assert j16.restarts == 1 and j16.priority == 1000 and j16.state is JobState.RUNNING
    assert (j16.comment, j16.admin_comment) == ("reshape:mps=25;gen=2", "elastico:from=50,to=25")


def test_squeue_2205_held_only_while_pending():
    jobs = jobs_by_id("22.05", "squeue.json")
    held = jobs[19]  # PENDING, JobHeldUser, priority 0
    assert held.state is JobState.PENDING and held.held and held.reason == "JobHeldUser"
    assert held.priority == 0 and held.start_time is None and held.end_time is None  # 0 in the JSON
    assert held.gres == GresRequest("mps", 30)
    # Cancelled while held: the reason lingers, but there is nothing to release.
    assert jobs[13].reason == "JobHeldUser" and not jobs[13].held
    assert [j.job_id for j in jobs.values() if j.held] == [19]


def test_squeue_2205_gres_forms():
    jobs = jobs_by_id("22.05", "squeue.json")
    assert jobs[15].gres is None  # tres_per_node "gres:"
    assert jobs[10].gres is None  # ""
    assert jobs[11].gres == GresRequest("mps", 15)  # "gres/mps:15", after a TresPerNode= update
    assert jobs[9].gres == GresRequest("gpu", 2) and jobs[9].nodes == ("n1", "n2", "n3", "n4")
    assert jobs[9].memory_mib == 4000  # mem=16000M over 4 nodes


def test_squeue_2205_multi_node_gpu_job_has_one_detail_per_node():
    j = jobs_by_id("22.05", "squeue_running.json")[24]  # gres_detail ["gpu:1(IDX:0)", "gpu:1(IDX:0)"]
    assert j.nodes == ("n1", "n2") and j.whole_gpus == 1
    assert j.gpu_alloc == (("n1", 0, 0), ("n2", 0, 0))
    assert j.gpu_indices == (0,) and j.cpus == 2


# --------------------------------------------------------------------------
# squeue and scontrol show job, 24.11
# --------------------------------------------------------------------------


def test_squeue_2411_number_objects_and_state_lists():
    jobs = jobs_by_id("24.11", "squeue_json.json")
    assert sorted(jobs) == [1, 13]  # squeue lists active jobs only
    j1 = jobs[1]
    assert j1.state is JobState.RUNNING and j1.priority == 1
    assert j1.gres == GresRequest("mps", 10) and j1.gpu_alloc == (("n1", 0, 10),) and j1.gpu_indices == (0,)
    assert (j1.submit_time, j1.start_time, j1.end_time) == (1796007296, 1796007296, 1796007416)
    assert j1.time_limit_s == 120 and j1.memory_mib == 4000  # memory_per_node {number: 0}
    j13 = jobs[13]
    assert j13.gpu_alloc == (("n1", 0, 35),) and j13.time_limit_s is None  # time_limit unset


def test_scontrol_show_job_2411_lists_finished_jobs_too():
    jobs = jobs_by_id("24.11", "scontrol_show_job_json.json")
    assert sorted(jobs) == list(range(1, 14))
    assert jobs[9].state is JobState.COMPLETED and jobs[2].state is JobState.CANCELLED
    assert jobs[7].gres == GresRequest("gpu", 3) and jobs[7].reason == "Resources" and jobs[7].nodes == ()
    assert jobs[8].cpus == 4 and jobs[8].memory_mib == 4000  # mem=16000M, node_count 4
    assert jobs[11].restarts == 1 and jobs[11].admin_comment == "elastico:50to25"
    j12 = jobs[12]  # held, then cancelled: hold true, priority 0
    assert j12.reason == "JobHeldUser" and j12.priority == 0 and not j12.held
    assert (j12.comment, j12.admin_comment) == ("hello", "adm")


def test_squeue_2411_held_pending_job():
    doc = data("24.11", "scontrol_show_job_json.json")
    job = next(j for j in doc["jobs"] if j["job_id"] == 12)
    job["job_state"] = ["PENDING"]
    doc["jobs"] = [job]
    (held,) = parse_squeue(json.dumps(doc))
    assert held.state is JobState.PENDING and held.held
    # requeuehold shows as a REQUEUE_HOLD flag even with a priority and hold false
    job.update(job_state=["PENDING", "REQUEUE_HOLD"], hold=False, state_reason="None")
    job["priority"] = {"set": True, "infinite": False, "number": 7}
    (rq,) = parse_squeue(json.dumps(doc))
    assert rq.state is JobState.PENDING and rq.held and rq.reason == ""
    job.update(job_state=["PENDING"])
    (free,) = parse_squeue(json.dumps(doc))
    assert not free.held


# --------------------------------------------------------------------------
# Hostile text survives JSON unchanged
# --------------------------------------------------------------------------

HOSTILE = [
    'a"b\'c',
    "x; rm -rf / #",
    "$(reboot) `id` ${HOME}",
    "line1\nline2\r\n\ttab",
    "ünïcødé ☃ 作业 \u202e",
    "a\\b\\\\c",
    "",
]


@pytest.mark.parametrize("version,name", [("22.05", "squeue_json.json"), ("24.11", "squeue_json.json"),
                                          ("26.05", "squeue_json.json")])
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_names_and_comments_round_trip(version, name, value):
    doc = data(version, name)
    job = doc["jobs"][0]
    job.update(name=value, comment=value, admin_comment=value[::-1], user_name=value or "u")
    job0 = parse_squeue(json.dumps(doc))[0]
    assert job0.name == value and job0.comment == value and job0.admin_comment == value[::-1]
    assert job0.user == (value or "u")


# --------------------------------------------------------------------------
# sinfo and scontrol show node
# --------------------------------------------------------------------------


def test_sinfo_2205_nodes():
    records = parse_sinfo(text("22.05", "sinfo_busy.json"))
    assert [r.name for r in records] == ["n1", "n2", "n3", "n4"]
    n1 = records[0]
    assert (n1.state, n1.partitions, n1.cpus, n1.alloc_cpus, n1.real_memory) == ("mixed", ("debug",), 4, 2, 4000)
    assert (n1.gpus, n1.mps_total) == (4, 400)
    assert n1.tres_used == {"cpu": 2, "gres/gpu": 1, "gres/mps": 35}
    assert records[2].state == "idle" and records[2].tres_used == {}


def test_sinfo_2205_state_flags_join_the_state():
    doc = data("22.05", "sinfo.json")
    doc["nodes"][1]["state_flags"] = ["DRAIN"]
    records = parse_sinfo(json.dumps(doc))
    assert records[1].state == "idle+drain"
    assert not build_nodes(records, ())[1].usable and build_nodes(records, ())[0].usable


def test_sinfo_2411_groups_expand_to_nodes():
    records = parse_sinfo(text("24.11", "sinfo_json.json"))
    assert [r.name for r in records] == ["n1", "n2", "n3", "n4"]
    n1, n2 = records[0], records[1]
    assert (n1.state, n1.cpus, n1.alloc_cpus, n1.real_memory, n1.gpus, n1.mps_total) == ("mixed", 8, 2, 4000, 4, 400)
    assert n1.tres_used == {"cpu": 2, "gres/mps": 45} and not n1.approximate
    assert (n2.state, n2.cpus, n2.alloc_cpus) == ("idle", 8, 0) and not n2.approximate
    assert partitions_from(records)[0].nodes == ("n1", "n2", "n3", "n4")


def test_sinfo_2411_busy_group_of_several_nodes_is_approximate():
    doc = data("24.11", "sinfo_json.json")
    group = doc["sinfo"][1]  # n2, n3, n4
    group["node"]["state"] = ["MIXED"]
    group["cpus"]["allocated"] = 3
    n2 = parse_sinfo(json.dumps(doc))[1]
    assert n2.approximate and n2.alloc_cpus == 1 and n2.state == "mixed"


def test_sinfo_2411_node_in_two_partitions_is_one_record():
    doc = data("24.11", "sinfo_json.json")
    other = copy.deepcopy(doc["sinfo"][0])
    other["partition"]["name"] = "gpu"
    other["partition"]["partition"]["state"] = ["DOWN"]
    doc["sinfo"].append(other)
    records = parse_sinfo(json.dumps(doc))
    assert [r.name for r in records] == ["n1", "n2", "n3", "n4"]
    assert records[0].partitions == ("debug", "gpu")
    parts = {p.name: p for p in partitions_from(records)}
    assert parts["gpu"].nodes == ("n1",) and parts["gpu"].state == "DOWN" and parts["debug"].state == "UP"


def test_scontrol_show_node_2411_matches_sinfo():
    by_node = parse_sinfo(text("24.11", "scontrol_show_node_json.json"))
    by_sinfo = parse_sinfo(text("24.11", "sinfo_json.json"))
    for a, b in zip(by_node, by_sinfo):
        assert (a.name, a.state, a.cpus, a.alloc_cpus, a.real_memory, a.gpus, a.mps_total) == (
            b.name, b.state, b.cpus, b.alloc_cpus, b.real_memory, b.gpus, b.mps_total)
    assert by_node[0].tres_used == {"cpu": 2, "gres/mps": 45}


def test_slurmd_start_time_from_both_per_node_listings():
    # The local cluster waits on it: a slurmd it just launched counts once the controller has this launch's time.
    assert [r.slurmd_start_time for r in parse_sinfo(text("22.05", "sinfo_json.json"))] == [1796007300] * 4
    assert [r.slurmd_start_time for r in parse_sinfo(text("24.11", "scontrol_show_node_json.json"))] == [1796007268] * 4
    assert {r.slurmd_start_time for r in parse_sinfo(text("24.11", "sinfo_json.json"))} == {None}  # groups lack it


# --------------------------------------------------------------------------
# build_nodes: GPU use from the jobs, not from gres_used
# --------------------------------------------------------------------------


def test_build_nodes_2205_ignores_wrong_gres_used():
    records = parse_sinfo(text("22.05", "sinfo_json.json"))
    assert records[0].gres_used == "gpu:0,mps:(null):1(IDX:0)"  # the 22.05 trap: says 1
    nodes = build_nodes(records, parse_squeue(text("22.05", "squeue_json.json")), gpu_memory_mib=81920)
    n1 = nodes[0]
    assert [g.shares_total for g in n1.gpus] == [100, 100, 100, 100]  # mps:400 over gpu:4
    assert n1.gpus[0].users == (GpuUse(1, 10), GpuUse(13, 35))
    assert n1.gpus[0].shares_used == 45 == records[0].tres_used["gres/mps"]
    assert [g.shares_used for g in n1.gpus[1:]] == [0, 0, 0]
    assert n1.mps_total == 400 and n1.mps_used == 45 and n1.gpu_memory_mib == 81920
    assert (n1.cpus, n1.cpus_alloc, n1.memory_mib) == (8, 2, 4000)
    assert all(g.users == () for n in nodes[1:] for g in n.gpus)


def test_build_nodes_2205_whole_gpu_job_overlapping_mps_job():
    records = parse_sinfo(text("22.05", "sinfo_busy.json"))
    nodes = {n.name: n for n in build_nodes(records, parse_squeue(text("22.05", "squeue_running.json")))}
    g0 = nodes["n1"].gpus[0]  # job 23 mps:35 and job 24 gpu:1 on the same GPU (22.05 allows it)
    assert g0.users == (GpuUse(23, 35), GpuUse(24, 0, whole=True))
    assert g0.held_whole and g0.shares_used == 100 and g0.shares_free == 0
    assert nodes["n2"].gpus[0].job_ids == (24,) and nodes["n2"].gpus[0].held_whole
    assert nodes["n3"].mps_used == 0


def test_build_nodes_2411_per_job_shares():
    records = parse_sinfo(text("24.11", "sinfo_json.json"))
    nodes = build_nodes(records, parse_squeue(text("24.11", "squeue_json.json")))
    g0 = nodes[0].gpus[0]
    # gres_detail printed 10/100 and 35/100 for the two jobs: each job's own use,
    # since the node's gres_used prints their sum, 45/100.
    assert g0.users == (GpuUse(1, 10), GpuUse(13, 35)) and g0.shares_used == 45
    assert records[0].gres_used.endswith("mps:(null):45(45/100,0/100,0/100,0/100)")


def test_build_nodes_skips_finished_jobs_and_unknown_gpus():
    records = parse_sinfo(text("24.11", "sinfo_json.json"))
    jobs = parse_squeue(text("24.11", "squeue_json.json"))
    done = [j.__class__(**{**j.__dict__, "state": JobState.COMPLETED}) for j in jobs]
    assert build_nodes(records, done)[0].mps_used == 0
    stray = jobs[0].__class__(**{**jobs[0].__dict__, "gpu_alloc": (("n1", 9, 10), ("zz", 0, 10))})
    assert build_nodes(records, [stray])[0].mps_used == 0


def test_build_nodes_without_mps_uses_shares_per_gpu():
    doc = data("22.05", "sinfo.json")
    doc["nodes"][0]["gres"] = "gpu:tesla:2(S:0)"
    nodes = build_nodes(parse_sinfo(json.dumps(doc)), (), shares_per_gpu=50)
    assert [g.shares_total for g in nodes[0].gpus] == [50, 50]


# --------------------------------------------------------------------------
# sacct
# --------------------------------------------------------------------------


def test_sacct_2205_requeued_job_lists_each_run():
    runs = parse_sacct(text("22.05", "sacct_requeued_duplicates.json"))
    assert [(r.job_id, r.state) for r in runs] == [(22, JobState.REQUEUED), (22, JobState.CANCELLED)]
    first, second = runs
    assert first.requeued and first.tres_alloc == {"cpu": 1, "node": 1, "billing": 1, "gres/mps": 40}
    assert second.tres_alloc["gres/mps"] == 20 and second.reason == "JobHeldUser"
    assert (first.start_time, first.end_time, first.elapsed_s) == (1796006880, 1796006884, 4)
    assert first.restarts is None  # 22.05 sacct has no restart_cnt
    assert first.tres_req["mem"] == 4000


def test_sacct_2205_details():
    recs = parse_sacct(text("22.05", "sacct.json"))
    by_id = runs_by_job(recs)
    assert [r.state for r in by_id[22]] == [JobState.REQUEUED, JobState.CANCELLED]  # printed apart
    j10 = by_id[10][0]
    assert (j10.state, j10.exit_status, j10.exit_code, j10.exit_signal) == (JobState.CANCELLED, "SIGNALED", None, 15)
    assert j10.nodes == ("n1", "n2", "n3", "n4") and j10.tres_alloc["cpu"] == 16
    assert by_id[16][0].admin_comment == "elastico:from=50,to=25" and by_id[16][0].comment == ""
    assert by_id[21][0].tres_alloc["gres/gpu"] == 2
    assert by_id[17][0].time_limit_s == 120 and by_id[16][0].time_limit_s is None


def test_sacct_2411_runs_restarts_and_sentinels():
    recs = parse_sacct(text("24.11", "sacct_json_D_X_S_now_1hour.json"))
    runs = runs_by_job(recs)[11]
    assert [r.state for r in runs] == [JobState.REQUEUED, JobState.CANCELLED]  # ["PENDING", "REQUEUED"]
    assert [r.restarts for r in runs] == [0, 1]
    assert [r.tres_alloc["gres/mps"] for r in runs] == [50, 25]
    assert "energy" not in runs[0].tres_alloc  # count -2
    assert (runs[1].comment, runs[1].admin_comment) == ("reshape:gen=1", "elastico:50to25")
    assert runs[0].time_limit_s == 525600 * 60
    j7 = runs_by_job(recs)[7][0]  # never started
    assert j7.start_time is None and j7.nodes == () and j7.tres_alloc == {}  # start 4294967294
    assert j7.tres_req["gres/gpu"] == 3
    j1 = runs_by_job(recs)[1][0]
    assert j1.state is JobState.RUNNING and j1.end_time is None and j1.exit_code == 0 and j1.exit_status == "SUCCESS"
    assert len(parse_sacct(text("24.11", "sacct_json_X.json"))) == 12  # without -D: the last run only


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


def test_invalid_json_is_a_parse_error():
    with pytest.raises(ParseError, match="squeue --json: output is not JSON"):
        parse_squeue("squeue: error: Invalid user\n")
    with pytest.raises(ParseError, match="not an object"):
        parse_sinfo("[1, 2]")


def test_unknown_schema_names_what_it_found():
    doc = data("24.11", "squeue_json.json")
    doc["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.41"
    with pytest.raises(ParseError, match=r"^squeue --json: .*data_parser/v0\.0\.41.*\(Slurm 24\.11\.5\).*"
                                         r"v0\.0\.38 \(Slurm 22\.05\), v0\.0\.42 \(Slurm 24\.11\), "
                                         r"v0\.0\.45 \(Slurm 26\.05\)"):
        parse_squeue(json.dumps(doc))
    # A newer schema than any known is refused the same way, never read as the nearest older one.
    doc["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.46"
    doc["meta"]["slurm"] = {"version": {"major": "26", "minor": "11", "micro": "0"}}
    with pytest.raises(ParseError, match=r"^scontrol show node --json: .*v0\.0\.46.*\(Slurm 26\.11\.0\).*not read"):
        parse_sinfo(json.dumps(doc), "scontrol show node --json")
    del doc["meta"]
    with pytest.raises(ParseError, match="no 'meta'"):
        parse_squeue(json.dumps(doc))


@pytest.mark.parametrize("version,schema", [("22.05", "v0.0.38"), ("24.11", "v0.0.42"), ("26.05", "v0.0.45")])
def test_missing_field_names_field_and_schema(version, schema):
    doc = data(version, "squeue_json.json")
    del doc["jobs"][1]["job_id"]
    with pytest.raises(ParseError, match=rf"squeue --json \({schema}\): jobs\[1\]\.job_id is missing"):
        parse_squeue(json.dumps(doc))
    doc = data(version, "squeue_json.json")
    doc["jobs"][0]["priority"] = "high"
    with pytest.raises(ParseError, match=r"jobs\[0\]\.priority is not a number"):
        parse_squeue(json.dumps(doc))
    doc = data(version, "squeue_json.json")
    doc["jobs"][0]["job_state"] = []
    with pytest.raises(ParseError, match=r"jobs\[0\]\.job_state"):
        parse_squeue(json.dumps(doc))


def test_missing_lists_are_parse_errors():
    doc = data("22.05", "sinfo.json")
    del doc["nodes"]
    with pytest.raises(ParseError, match=r"\(v0\.0\.38\): \.sinfo and \.nodes are both missing"):
        parse_sinfo(json.dumps(doc))
    doc = data("24.11", "sacct_json_X.json")
    del doc["jobs"][0]["state"]
    with pytest.raises(ParseError, match=r"sacct --json \(v0\.0\.42\): jobs\[0\]\.state is missing"):
        parse_sacct(json.dumps(doc))
    doc = data("22.05", "sinfo.json")
    doc["nodes"][2]["name"] = 7
    with pytest.raises(ParseError, match=r"nodes\[2\]\.name is a int, not a string"):
        parse_sinfo(json.dumps(doc))


def test_bad_strings_inside_json_name_their_field():
    doc = data("24.11", "squeue_json.json")
    doc["jobs"][1]["gres_detail"] = ["mps:10(garbage)"]
    with pytest.raises(ParseError, match=r"\(v0\.0\.42\): jobs\[1\]\.gres_detail\[0\] = 'mps:10\(garbage\)'"):
        parse_squeue(json.dumps(doc))
    doc = data("22.05", "squeue_json.json")
    doc["jobs"][0]["nodes"] = "n[1-"
    with pytest.raises(ParseError, match=r"\(v0\.0\.38\): jobs\[0\]\.nodes = 'n\[1-'.*never closed"):
        parse_squeue(json.dumps(doc))
    doc = data("24.11", "sinfo_json.json")
    del doc["sinfo"][0]["nodes"]["nodes"]
    with pytest.raises(ParseError, match=r"sinfo\[0\]\.nodes\.nodes is missing"):
        parse_sinfo(json.dumps(doc))


def test_missing_priority_is_not_a_hold():
    doc = data("22.05", "squeue.json")
    job = next(j for j in doc["jobs"] if j["job_id"] == 19)
    job.update(state_reason="Priority")
    del job["priority"]
    doc["jobs"] = [job]
    (j,) = parse_squeue(json.dumps(doc))
    assert j.state is JobState.PENDING and not j.held and j.priority == 0


def test_extra_fields_are_tolerated():
    doc = data("24.11", "squeue_json.json")
    doc["jobs"][0]["brand_new_field"] = {"x": [1, 2]}
    doc["something_new"] = True
    assert parse_squeue(json.dumps(doc))[0].job_id == 1


# --------------------------------------------------------------------------
# Helpers: numbers, states
# --------------------------------------------------------------------------


def test_number_reads_both_forms():
    assert number(5) == 5 and number(0) == 0 and number(None) is None
    assert number({"set": True, "infinite": False, "number": 7}) == 7
    assert number({"set": False, "infinite": False, "number": 0}) is None
    assert number({"set": False, "infinite": True, "number": 0}) is None
    assert number(4294967294) is None and number(4294967295) is None and number(4294901759) == 4294901759
    with pytest.raises(TypeError):
        number(True)
    with pytest.raises(TypeError):
        number("3")


@pytest.mark.parametrize(
    "value,expected",
    [
        ("RUNNING", (JobState.RUNNING, False)),
        (["RUNNING"], (JobState.RUNNING, False)),
        ("REQUEUED", (JobState.REQUEUED, False)),
        (["PENDING", "REQUEUED"], (JobState.REQUEUED, False)),
        ("REQUEUE_HOLD", (JobState.PENDING, True)),
        (["PENDING", "REQUEUE_HOLD"], (JobState.PENDING, True)),
        ("COMPLETING", (JobState.COMPLETING, False)),
        (["CANCELLED", "COMPLETING"], (JobState.COMPLETING, False)),
        ("CONFIGURING", (JobState.RUNNING, False)),
        (["RUNNING", "CONFIGURING"], (JobState.RUNNING, False)),
        ("BOOT_FAIL", (JobState.OTHER, False)),
        (["OUT_OF_MEMORY"], (JobState.OUT_OF_MEMORY, False)),
    ],
)
def test_job_state(value, expected):
    assert job_state(value) == expected


# --------------------------------------------------------------------------
# Hostlists
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,names",
    [
        # What `scontrol show hostnames TEXT` printed (Slurm 22.05.8), but without its repeats (the last case).
        ("n1", ("n1",)),
        ("n[1-3,5]", ("n1", "n2", "n3", "n5")),
        ("gpu[01-02]", ("gpu01", "gpu02")),
        ("n[08-10]", ("n08", "n09", "n10")),
        ("n[8-10]", ("n8", "n9", "n10")),
        ("n[01-2]", ("n01", "n02")),
        ("a[1-2]b[3-4]", ("a1b3", "a1b4", "a2b3", "a2b4")),
        ("gpu[1-2]-ib[0-1]", ("gpu1-ib0", "gpu1-ib1", "gpu2-ib0", "gpu2-ib1")),
        ("a,b[1-2],c", ("a", "b1", "b2", "c")),
        ("n[1-2],n2", ("n1", "n2")),
        # Slurm's words for no nodes.
        ("", ()),
        ("None assigned", ()),
        ("(null)", ()),
    ],
)
def test_expand_hostlist(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[[1]]", "n[1-999999]"])
def test_expand_hostlist_rejects_bad_lists(bad):
    with pytest.raises(ParseError, match=r"hostlist .*; allowed: .*n\[1-3,5\]"):
        expand_hostlist(bad)


# --------------------------------------------------------------------------
# GRES and TRES strings
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("gres:mps:25", GresRequest("mps", 25)),
        ("gres/mps:10", GresRequest("mps", 10)),
        ("gres/gpu:2", GresRequest("gpu", 2)),
        ("gres:gpu:1", GresRequest("gpu", 1)),
        ("gres/gpu:tesla:1", GresRequest("gpu", 1, "tesla")),
        ("gres:gpu:a100:4", GresRequest("gpu", 4, "a100")),
        ("gres/gpu", GresRequest("gpu", 1)),
        ("gres/shard:2,gres/mps:30", GresRequest("mps", 30)),
        ("gres/shard:2", None),
        ("gres:", None),
        ("", None),
        (None, None),
    ],
)
def test_gres_request_forms(text, expected):
    assert parse_gres_request(text) == expected


@pytest.mark.parametrize(
    "text,holds",
    [
        ("mps:25(IDX:0)", (GpuHold(0, 25, False),)),
        ("gpu:2(IDX:0-1)", (GpuHold(0, 0, True), GpuHold(1, 0, True))),
        ("gpu:tesla:3(IDX:0,2-3)", (GpuHold(0, 0, True), GpuHold(2, 0, True), GpuHold(3, 0, True))),
        ("gpu:1(IDX:2)", (GpuHold(2, 0, True),)),
        ("mps:10(10/100,0/100,0/100,0/100)", (GpuHold(0, 10, False),)),
        ("mps:60(0/100,20/100,40/100,0/100)", (GpuHold(1, 20, False), GpuHold(2, 40, False))),
        ("mps:0(IDX:N/A)", ()),
        ("", ()),
    ],
)
def test_gres_detail_forms(text, holds):
    assert parse_gres_detail(text) == holds


def test_gres_detail_rejects_unknown_detail():
    with pytest.raises(ParseError, match="neither"):
        parse_gres_detail("mps:10(what)")


def test_node_gres_and_tres():
    assert gres_counts("gpu:4,mps:400") == (4, 400)
    assert gres_counts("gpu:a100:2(S:0-1),gpu:v100:2(S:1),mps:400") == (4, 400)
    assert gres_counts("") == (0, 0)
    assert parse_tres("cpu=2,mem=4000M,billing=4,gres/gpu=4,gres/mps=400") == {
        "cpu": 2, "mem": 4000, "billing": 4, "gres/gpu": 4, "gres/mps": 400}
    assert parse_tres("mem=16G") == {"mem": 16384}
    assert parse_tres(None) == {}
    with pytest.raises(ParseError, match="not name=value"):
        parse_tres("cpu")
