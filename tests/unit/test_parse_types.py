"""GPU types in Slurm's JSON (22.05 and 24.11): nodes' gres, jobs' requests, the memory per type, typed moves.

The documents are the recorded ones of tests/data/slurm/ with their gres strings changed to the typed forms
Slurm prints (`gpu:a100:4(S:0-1)`, several entries on one node; `gres:gpu:a100:2` from 22.05 and
`gres/gpu:a100:2` from 24.11 for a job).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_elastico.errors import ConfigError, InvalidActionError
from slurm_elastico.model import Action, ActionKind, GresRequest
from slurm_elastico.slurm import commands, gpu_count
from slurm_elastico.slurm.gres import gres_types, parse_gres_request
from slurm_elastico.slurm.jobs import parse_squeue
from slurm_elastico.slurm.nodes import parse_sinfo
from slurm_elastico.slurm.snapshot import build_nodes

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"
GRES = ["gpu:t4:4,mps:400", "gpu:t4:4(S:0),mps:400(S:0)", "gpu:a100:4(S:0-1),mps:400(S:0-1)",
        "gpu:a100:2(S:0),gpu:v100:2(S:1),mps:400"]


def doc(version: str, name: str) -> dict:
    return json.loads((DATA / version / name).read_text())


def typed_nodes(version: str, name: str) -> str:
    d = doc(version, name)
    for node, gres in zip(d["nodes"], GRES):
        node["gres"] = gres
    return json.dumps(d)


@pytest.mark.parametrize("text,expected", [
    ("gpu:a100:4", (("a100", 4),)),
    ("gpu:a100:4(S:0-1),mps:400(S:0-1)", (("a100", 4),)),
    ("gpu:a100:2(S:0),gpu:v100:2(S:1),mps:400", (("a100", 2), ("v100", 2))),
    ("gpu:4,mps:400", (("", 4),)),
    ("gpu:(null):4", (("", 4),)),
    ("gpu:rtx_2080ti:8,shard:16", (("rtx_2080ti", 8),)),
    ("", ()),
])
def test_node_gres_gives_gpus_per_type(text, expected):
    assert gres_types(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("gres:gpu:a100:2", GresRequest("gpu", 2, "a100")),     # 22.05 tres_per_node
    ("gres/gpu:a100:2", GresRequest("gpu", 2, "a100")),     # 24.11
    ("gpu:a100:2", GresRequest("gpu", 2, "a100")),          # Gres= as written
    ("gres:gpu:a100", GresRequest("gpu", 1, "a100")),       # no count: one
    ("gres/gpu:a100-80:1", GresRequest("gpu", 1, "a100-80")),
    ("gres/gpu:2", GresRequest("gpu", 2, "")),
    ("gres/mps:25", GresRequest("mps", 25, "")),
])
def test_job_requests_carry_their_type(text, expected):
    got = parse_gres_request(text)
    assert got == expected
    assert str(got) == (f"{got.kind}:{got.gpu_type}:{got.count}" if got.gpu_type else f"{got.kind}:{got.count}")


@pytest.mark.parametrize("version,name", [("22.05", "sinfo.json"), ("24.11", "scontrol_show_node_json.json")])
def test_nodes_of_both_versions_have_their_type_and_memory_per_type(version, name):
    records = parse_sinfo(typed_nodes(version, name))
    assert [(r.name, r.gpu_type, r.gpus, r.gpu_types) for r in records] == [
        ("n1", "t4", 4, (("t4", 4),)), ("n2", "t4", 4, (("t4", 4),)), ("n3", "a100", 4, (("a100", 4),)),
        ("n4", "a100", 4, (("a100", 2), ("v100", 2)))]
    nodes = build_nodes(records, (), gpu_memory_mib=16384, type_memory={"a100": 40960, "t4": 15360, "v100": 16384})
    assert [(n.gpu_type, n.gpu_memory_mib) for n in nodes] == [("t4", 15360), ("t4", 15360), ("a100", 40960),
                                                              ("a100", 40960)]
    # No gpu.types: every GPU has gpu.memory_mib, typed or not (a one-type cluster keeps its settings).
    assert {n.gpu_memory_mib for n in build_nodes(records, (), gpu_memory_mib=16384)} == {16384}


def test_a_24_11_sinfo_group_has_its_type():
    d = doc("24.11", "sinfo_json.json")
    d["sinfo"][0]["gres"]["total"] = "gpu:a100:4(S:0-1),mps:400(S:0-1)"
    records = parse_sinfo(json.dumps(d))
    assert records[0].gpu_type == "a100" and records[0].gpus == 4 and records[0].mps_total == 400


def test_an_untyped_node_has_gpu_memory_mib_beside_typed_ones():
    d = doc("22.05", "sinfo.json")
    d["nodes"][0]["gres"] = "gpu:a100:4,mps:400"
    nodes = build_nodes(parse_sinfo(json.dumps(d)), (), gpu_memory_mib=8192, type_memory={"a100": 40960})
    assert [(n.gpu_type, n.gpu_memory_mib) for n in nodes] == [("a100", 40960)] + [("", 8192)] * 3


def test_a_node_of_a_type_gpu_types_lacks_is_refused_naming_node_type_and_the_types_configured():
    records = parse_sinfo(typed_nodes("22.05", "sinfo.json"))
    with pytest.raises(ConfigError) as e:
        build_nodes(records, (), gpu_memory_mib=16384, type_memory={"a100": 40960, "v100": 16384})
    msg = str(e.value)
    assert "node n1 has GPUs of type 't4'" in msg and "configured: a100, v100" in msg
    assert "add gpu.types.t4.memory_mib" in msg


@pytest.mark.parametrize("version,name,form", [("22.05", "squeue.json", "gres:gpu:a100:2"),
                                               ("24.11", "squeue_json.json", "gres/gpu:a100:2")])
def test_typed_jobs_of_both_versions(version, name, form):
    d = doc(version, name)
    d["jobs"][0]["tres_per_node"] = form
    d["jobs"][0]["gres_detail"] = ["gpu:a100:2(IDX:0-1)"] if d["jobs"][0]["nodes"] else []
    job = parse_squeue(json.dumps(d))[0]
    assert job.gres == GresRequest("gpu", 2, "a100")


@pytest.mark.parametrize("version,name", [("22.05", "squeue_json_gpu_count_held_2x2.json"),
                                          ("24.11", "squeue_json_gpu_count_held_2x2.json")])
def test_a_typed_request_is_read_back_and_checked_with_its_type(version, name):
    d = doc(version, name)
    job_id = d["jobs"][0]["job_id"]
    plain = gpu_count.request_of(json.dumps(d), job_id)
    assert plain.gpu_type == "" and plain.excluded_nodes == ()
    prefix = "gres:" if version == "22.05" else "gres/"
    d["jobs"][0]["tres_per_node"] = f"{prefix}gpu:a100:{plain.count}"
    typed = json.dumps(d)
    got = gpu_count.request_of(typed, job_id)
    assert got.gpu_type == "a100" and f"gpu:a100:{plain.count}" in str(got)
    want = gpu_count.GpuRequest("gpu", plain.count, plain.node_count, got.required_nodes, "a100")
    assert gpu_count.verify(typed, job_id, gpu_count.GpuUpdate(["x"], want)) == got
    for other in ("t4", "A100", ""):  # Slurm's type names are case-sensitive
        with pytest.raises(gpu_count.GpuCountMismatch, match=f"asked Slurm for gpu:{other + ':' if other else ''}"):
            gpu_count.verify(typed, job_id, gpu_count.GpuUpdate(["x"], replace(want, gpu_type=other)))
    # The 22.05 way to a type: excluded nodes, read back from `excluded_nodes` and checked where the update set them.
    d["jobs"][0]["tres_per_node"] = f"{prefix}gpu:{plain.count}"
    d["jobs"][0]["excluded_nodes"] = "n[1-2]"
    kept = json.dumps(d)
    away = replace(want, gpu_type="", excluded_nodes=("n1", "n2"))
    assert gpu_count.verify(kept, job_id, gpu_count.GpuUpdate(["x"], away, check_excluded=True)).excluded_nodes == (
        "n1", "n2")
    swapped = replace(away, excluded_nodes=("n2", "n1"))  # given in another order than Slurm prints them
    assert gpu_count.verify(kept, job_id, gpu_count.GpuUpdate(["x"], swapped, check_excluded=True))
    with pytest.raises(gpu_count.GpuCountMismatch, match="not on n1,n2"):
        gpu_count.verify(kept, job_id, gpu_count.GpuUpdate(["x"], replace(away, excluded_nodes=("n1",)),
                                                           check_excluded=True))


def test_a_type_no_node_set_can_hold_is_refused_naming_it_and_what_the_cluster_has():
    records = parse_sinfo(typed_nodes("22.05", "sinfo.json"))
    assert gpu_count.cluster_types(records) == ("t4", "a100", "v100")
    gpu_count.check_type(records, 7, "t4", per_node=4, node_count=2)
    gpu_count.check_type(records, 7, "")
    with pytest.raises(InvalidActionError, match=r"job 7 cannot be moved to GPU type 'h100'.*are t4, a100, v100"):
        gpu_count.check_type(records, 7, "h100")
    with pytest.raises(InvalidActionError, match="type 'T4'"):  # Slurm refuses gpu:T4 on gpu:t4 nodes
        gpu_count.check_type(records, 7, "T4")
    with pytest.raises(InvalidActionError, match=r"8 GPU\(s\) of type a100 on each of 1 node\(s\): 0 node\(s\)"):
        gpu_count.check_type(records, 7, "a100", per_node=8)
    with pytest.raises(InvalidActionError, match=r"4 GPU\(s\) of type a100 on each of n3, n4: n4 \(2\)"):
        gpu_count.check_type(records, 7, "a100", per_node=4, node_count=2, nodes=("n3", "n4"))
    with pytest.raises(InvalidActionError, match=r"on each of 3 node\(s\): 2 node\(s\) have that many"):
        gpu_count.check_type(records, 7, "t4", per_node=1, node_count=3)
    untyped = parse_sinfo((DATA / "22.05" / "sinfo.json").read_text())
    with pytest.raises(InvalidActionError, match="gres name no GPU type"):
        gpu_count.check_type(untyped, 7, "a100")


@pytest.mark.parametrize("version,current,form", [
    ("24.11.5", "t4", ["Gres=gpu:a100:1"]),                      # the typed form replaces the request
    ("24.11.5", "", ["Gres=gpu:a100:1"]),
    ("22.05.8", "", ["Gres=gpu:1", "ExcNodeList=n1,n2"]),       # 22.05: untyped, every other node excluded
    ("22.05.8", "a100", ["Gres=gpu:a100:1"]),                   # 22.05: a count change within its type
])
def test_the_update_to_a_type_fits_the_version_and_the_jobs_request(version, current, form):
    records = parse_sinfo(typed_nodes("22.05", "sinfo.json"))  # n1, n2 t4; n3 a100; n4 a100 and v100
    now = gpu_count.GpuRequest("gpu", 1, 1, (), current)
    update = gpu_count.plan_update(version, now, records, 5, 1, (), "a100")
    assert update.argv[:3] == ["scontrol", "update", "JobId=5"] and all(f in update.argv for f in form)
    assert update.want.gpu_type == ("" if "ExcNodeList=n1,n2" in form else "a100")
    assert update.check_excluded == ("ExcNodeList=n1,n2" in form)


def test_a_move_to_a_type_or_node_outside_the_jobs_partition_is_refused_before_any_update():
    # One partition per GPU type is common: a job of partition t4p cannot run on an a100 node of a100p, and
    # Slurm would accept the update and strand the job.
    records = [replace(r, partitions=("t4p",) if r.name in ("n1", "n2") else ("a100p",))
               for r in parse_sinfo(typed_nodes("22.05", "sinfo.json"))]
    now = gpu_count.GpuRequest("gpu", 1, 1, ())
    with pytest.raises(InvalidActionError, match="no such type on its partition t4p; the types its nodes have are t4"):
        gpu_count.plan_update("24.11.5", now, records, 5, 1, (), "a100", partition="t4p")
    with pytest.raises(InvalidActionError, match=r"on each of n3: n3 \(not on its partition t4p\)"):
        gpu_count.plan_update("24.11.5", now, records, 5, 1, ("n3",), "t4", partition="t4p")
    assert "Gres=gpu:a100:1" in gpu_count.plan_update("24.11.5", now, records, 5, 1, (), "a100",
                                                      partition="t4p,a100p").argv
    assert "Gres=gpu:t4:1" in gpu_count.plan_update("24.11.5", now, records, 5, 1, (), "t4", partition="t4p").argv


def test_slurm_22_05_keeps_a_jobs_first_type_so_a_move_to_another_is_refused_before_any_update():
    records = parse_sinfo(typed_nodes("22.05", "sinfo.json"))
    with pytest.raises(InvalidActionError) as e:
        gpu_count.plan_update("22.05.8", gpu_count.GpuRequest("gpu", 1, 1, (), "t4"), records, 5, 1, (), "a100")
    assert "keeps the type a job was submitted with" in str(e.value) and "untyped --gres=gpu:N" in str(e.value)
    with pytest.raises(InvalidActionError, match="an update to an untyped gpu is refused"):
        gpu_count.plan_update("22.05.8", gpu_count.GpuRequest("gpu", 1, 1, (), "t4"), records, 5, 2, (), "")
    same = gpu_count.plan_update("22.05.8", gpu_count.GpuRequest("gpu", 1, 1, (), "t4"), records, 5, 2, (), "t4")
    assert "Gres=gpu:t4:2" in same.argv
    untyped = gpu_count.plan_update("22.05.8", gpu_count.GpuRequest("gpu", 1, 1, ()), records, 5, 2, (), "")
    assert "Gres=gpu:2" in untyped.argv and not any(a.startswith("ExcNodeList") for a in untyped.argv)
    # 24.11 replaces a typed request by an untyped one.
    assert "Gres=gpu:2" in gpu_count.plan_update("24.11.5", gpu_count.GpuRequest("gpu", 1, 1, (), "t4"), records, 5,
                                                 2, (), "").argv


# ----------------------------------------------------------------------------- recorded on typed clusters

RECORDED = Path(__file__).resolve().parent.parent / "data" / "slurm"


@pytest.mark.parametrize("name", ["22.05/sinfo_json_typed.json", "24.11/scontrol_show_node_json_typed.json"])
def test_recorded_typed_nodes(name):
    """Recorded from `elastico cluster up --gpu-types t4:1,a100:1`: each version types the MPS count too
    ("gpu:t4:4,mps:t4:400"), which counts as the node's shares all the same."""
    records = parse_sinfo((RECORDED / name).read_text())
    assert [(r.name, r.gres, r.gpu_type, r.gpus, r.mps_total) for r in records] == [
        ("n1", "gpu:t4:4,mps:t4:400", "t4", 4, 400), ("n2", "gpu:a100:4,mps:a100:400", "a100", 4, 400)]
    nodes = build_nodes(records, (), gpu_memory_mib=1, type_memory={"t4": 15360, "a100": 40960})
    assert [(n.gpu_type, n.gpu_memory_mib, n.gpus[0].shares_total) for n in nodes] == [("t4", 15360, 100),
                                                                                     ("a100", 40960, 100)]


def test_recorded_typed_jobs_of_22_05():
    """22.05: job 1 `--gres=gpu:t4:1`, job 2 `--gres=gpu:1` (on a t4 node), job 3 updated to `Gres=gpu:A100:1`
    (another case than the nodes' a100: never runnable)."""
    jobs = {j.job_id: j for j in parse_squeue((RECORDED / "22.05/squeue_json_typed.json").read_text())}
    assert jobs[1].gres == GresRequest("gpu", 1, "t4") and jobs[1].gpu_alloc == (("n1", 0, 0),)
    assert jobs[2].gres == GresRequest("gpu", 1) and jobs[2].gpu_alloc == (("n1", 1, 0),)
    assert jobs[3].gres == GresRequest("gpu", 1, "A100") and jobs[3].reason == "BadConstraints"


def test_recorded_typed_jobs_of_24_11():
    """24.11: held jobs updated to a100, untyped, h100 (unknown), a100:8 (more than a node has), ExcNodeList=n1
    and A100; then a running t4 job moved to a100 by requeuehold, `Gres=gpu:a100:1` and release."""
    held = parse_squeue((RECORDED / "24.11/squeue_json_typed_held.json").read_text())
    assert [(j.job_id, str(j.gres)) for j in held] == [(1, "gpu:a100:1"), (2, "gpu:1"), (3, "gpu:a100:1"),
                                                        (4, "gpu:h100:1"), (5, "gpu:a100:8"), (6, "gpu:1"),
                                                        (7, "gpu:A100:1")]
    assert gpu_count.request_of((RECORDED / "24.11/squeue_json_typed_held.json").read_text(), 6).excluded_nodes == (
        "n1",)
    moved = parse_squeue((RECORDED / "24.11/squeue_json_typed_moved.json").read_text())[0]
    assert moved.gres == GresRequest("gpu", 1, "a100") and moved.gpu_alloc == (("n2", 0, 0),)


def test_typed_actions_become_typed_gres_updates():
    assert commands.set_gpu_count(5, 4, ("n3", "n4"), "a100") == [
        "scontrol", "update", "JobId=5", "Gres=gpu:a100:2", "NumNodes=2-2", "NodeList=n3,n4"]
    assert commands.set_gpu_count(5, 1, ()) == ["scontrol", "update", "JobId=5", "Gres=gpu:1", "NumNodes=1-1",
                                                "NodeList="]
    move = Action(ActionKind.RESHAPE_RUNNING, 5, "to a100", gpus=2, nodes=("n3",), gpu_type="a100")
    argv = commands.gpu_count_argv(move)
    assert [a[1] for a in argv] == ["requeuehold", "update", "update", "release"]
    assert "Gres=gpu:a100:2" in argv[1]
    pending = Action(ActionKind.SET_GPUS, 5, "on t4", gpus=1, gpu_type="t4")
    assert commands.gpu_count_argv(pending)[0][3] == "Gres=gpu:t4:1"
    for bad in ("a100:2", "a 100", "-x", "gpu,mps"):
        with pytest.raises(InvalidActionError, match="is not a Slurm GPU type name"):
            commands.set_gpu_count(5, 1, (), bad)
