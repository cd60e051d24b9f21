"""The local cluster's fake GPU types: parsing `--gpu-types`, the typed slurm.conf and gres.conf, pacing per type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_elastico.cluster import LocalCluster, config, gpu_types, pacing
from slurm_elastico.cluster.config import ClusterSpec, Layout
from slurm_elastico.errors import ClusterError
from slurm_elastico.sim.truth import GroundTruth

ROOT = Path("/srv/lab/cluster")
LAYOUT = Layout(ROOT)


def typed_spec(text: str = "t4:2,a100:1", **kw) -> ClusterSpec:
    types = gpu_types.parse_gpu_types(text)
    return ClusterSpec(hostname="vm", nodes=sum(t.nodes for t in types), gpu_types=types, **kw)


def test_known_names_need_only_a_node_count_and_others_give_memory_and_speed():
    types = gpu_types.parse_gpu_types("t4:2, a100:1,x1:1:8192:2.5")
    assert [(t.name, t.nodes, t.memory_mib, t.speed) for t in types] == [
        ("t4", 2, 15360, 1.0), ("a100", 1, 40960, 4.8), ("x1", 1, 8192, 2.5)]
    assert gpu_types.parse_gpu_types(gpu_types.types_text(types)) == types  # what the state directory keeps
    assert gpu_types.node_types(types)["n3"].name == "a100" and set(gpu_types.node_types(types)) == {"n1", "n2", "n3", "n4"}
    assert gpu_types.yaml_types(types) == {"t4": {"memory_mib": 15360}, "a100": {"memory_mib": 40960},
                                           "x1": {"memory_mib": 8192, "like": "v100"}}  # speed 2.5: nearest 1.9
    assert gpu_types.parse_gpu_types("") == ()


@pytest.mark.parametrize("text,named", [
    ("foo:1", "'foo:1' (nodes 1..64"),          # an unknown name without memory and speed
    ("3090:2", "'3090:2' (a name of letters"),  # digits alone read as a count in Slurm's gres
    ("T4:1", "'T4:1' (a name of letters"),      # upper case: Slurm's names compare ignoring case
    ("t4:x", "'t4:x' (a count, memory or speed that is not a number"),
    ("t4:0", "'t4:0' (nodes 1..64"),
    ("t4:1,t4:2", "type t4 given twice"),
    ("x1:1:8192:0", "'x1:1:8192:0' (nodes 1..64"),
])
def test_a_bad_entry_is_named_with_what_is_allowed(text, named):
    with pytest.raises(ClusterError) as e:
        gpu_types.parse_gpu_types(text)
    assert named in str(e.value) and "allowed: NAME:NODES[:MEMORY_MIB[:SPEED]]" in str(e.value)


def test_typed_nodes_get_one_node_line_per_type_with_their_ports_and_a_typed_gres():
    conf = config.slurm_conf(typed_spec(), LAYOUT).splitlines()
    assert [line for line in conf if line.startswith("NodeName=")] == [
        "NodeName=n[1-2] NodeHostname=vm NodeAddr=127.0.0.1 Port=[17001-17002] CPUs=8 RealMemory=8000 "
        "Gres=gpu:t4:4,mps:400 State=UNKNOWN",
        "NodeName=n3 NodeHostname=vm NodeAddr=127.0.0.1 Port=17003 CPUs=8 RealMemory=8000 "
        "Gres=gpu:a100:4,mps:400 State=UNKNOWN"]
    assert "PartitionName=debug Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP" in conf
    assert "GresTypes=gpu,mps" in conf
    gres = config.gres_conf(typed_spec(), LAYOUT).splitlines()
    assert f"NodeName=n2 Name=gpu Type=t4 File={ROOT}/dev/n2/nvidia[0-3]" in gres
    assert f"NodeName=n3 Name=gpu Type=a100 File={ROOT}/dev/n3/nvidia[0-3]" in gres
    # MPS keeps working: untyped shares over every GPU of each node.
    assert f"NodeName=n3 Name=mps Count=400 File={ROOT}/dev/n3/nvidia[0-3] Flags=all_sharing" in gres


def test_the_default_stays_one_untyped_type():
    conf = config.slurm_conf(ClusterSpec(hostname="vm"), LAYOUT)
    assert "Gres=gpu:4,mps:400" in conf and "Type=" not in config.gres_conf(ClusterSpec(hostname="vm"), LAYOUT)


def test_the_node_count_must_be_that_of_the_types():
    with pytest.raises(ClusterError, match=r"nodes=4 \(allowed: the nodes of the GPU types, 3\)"):
        ClusterSpec(hostname="vm", nodes=4, gpu_types=gpu_types.parse_gpu_types("t4:2,a100:1"))


def test_local_cluster_keeps_its_types_and_a_node_count_alone_makes_it_untyped(tmp_path):
    cluster = LocalCluster(tmp_path, gpu_types="t4:1,a100:2")
    assert cluster.nodes == ("n1", "n2", "n3") and [t.name for t in cluster.gpu_types] == ["t4", "a100"]
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "cluster.json").write_text(json.dumps(cluster._params))
    again = LocalCluster.from_state_dir(tmp_path)
    assert again.gpu_types == cluster.gpu_types and again.nodes == cluster.nodes
    assert LocalCluster.from_state_dir(tmp_path, nodes=2).gpu_types == ()
    with pytest.raises(ClusterError, match="not both"):
        LocalCluster.from_state_dir(tmp_path, nodes=2, gpu_types="t4:2")


def test_a_paced_job_steps_at_its_node_types_speed(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "cluster.json").write_text(json.dumps({"gpu_types": "t4:1,a100:1"}))
    speeds = pacing.type_speeds(str(etc / "slurm.conf"))
    assert speeds == {"n1": 1.0, "n2": 4.8}
    assert pacing.type_speeds(str(tmp_path / "elsewhere" / "slurm.conf")) == {} == pacing.type_speeds("")
    truth = GroundTruth()
    job, knobs = pacing.Emulated("train", "bert", 12), pacing.Knobs(micro_batch=12)
    where = {"node": "n1"}

    def paced(node: str) -> float:
        where["node"] = node
        p = pacing.Pacer(truth, job, knobs, lambda: pacing.Placement(100, (), node=where["node"]), lambda o: pacing.UNKNOWN,
                         refresh_s=0.0, speed_of=lambda n: speeds.get(n, 1.0))
        return p.refresh()

    slow, fast = paced("n1"), paced("n2")
    assert slow == pytest.approx(pacing.rate(truth, job, knobs, 100)) and fast == pytest.approx(4.8 * slow)
