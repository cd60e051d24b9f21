"""The simulator on clusters of several GPU types: the cluster spec, per-type ground truth read from profiles in
Sia's layout, families per type, the simulated Slurm and gateway with typed requests, and runs (issue 28, item 6).

Sia's measurements are the peers' (never copied into the repository), so every test here runs on made-up
profiles in Sia's layout (`tests.sia_layout`), everywhere; what Sia's own measurements give is the heterogeneous
table's to say (`benchmarks/sim.py`, `--sia DIR`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError, SlurmError
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import Action, ActionKind, GresRequest, JobState
from slurm_elastico.sim import engine, gpu_types, trace_pollux, trace_spec
from slurm_elastico.sim.cluster import SimCluster
from slurm_elastico.sim.families_typed import check_typed, typed_family_of
from slurm_elastico.sim.job import SimJob
from slurm_elastico.sim.profiles_sia import SIA_RESTART_S, SIA_SLOWDOWN, sia_truths
from slurm_elastico.sim.settings import SimSettings, from_mapping
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth
from slurm_elastico.sim.truth_types import TypedTruth
from tests.sia_layout import APPS, made_up_profiles

SMALL = "aws:1x4,dgx-ext:1x8"


# ---------------------------------------------------------------- the cluster spec


def test_sia_names_its_64_gpu_cluster_and_a_spec_keeps_its_order():
    groups = gpu_types.parse_cluster("sia")
    assert [(g.gpu_type, g.nodes, g.gpus_per_node) for g in groups] == [("aws", 6, 4), ("dgx-ext", 2, 8),
                                                                        ("rtx", 3, 8)]
    assert sum(g.gpus for g in groups) == 64
    assert [g.memory_mib for g in groups] == [15 * 1024, 40 * 1024, 11 * 1024]
    assert gpu_types.describe(gpu_types.parse_cluster(" rtx:2x8 , quad:1x4 ")) == "rtx:2x8,quad:1x4"


@pytest.mark.parametrize("spec,words", [
    ("aws:6", ["'aws:6' is not a node group", "TYPE:NODESxGPUS"]),
    ("p100:2x4", ["unknown GPU type 'p100'", "aws (NVIDIA T4, 15 GiB)", "dgx-ext", "quad"]),
    ("aws:2x4,aws:1x4", ["appears twice"]),
    ("aws:0x4", ["1..4096 nodes of 1..64 GPUs"]),
    ("", ["empty cluster spec"]),
])
def test_a_bad_spec_names_the_part_and_the_allowed_form(spec, words):
    with pytest.raises(ConfigError) as err:
        gpu_types.parse_cluster(spec)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_an_unknown_type_is_refused_with_the_known_ones():
    assert gpu_types.memory_of("rtx") == 11 * 1024
    with pytest.raises(ConfigError, match="known: aws"):
        gpu_types.memory_of("h100")


def test_sim_settings_want_profiles_with_a_cluster_and_a_valid_spec():
    with pytest.raises(ConfigError) as err:
        from_mapping({"cluster": "aws:1x4,bogus"})
    text = str(err.value)
    assert "sim.cluster: 'bogus' is not a node group" in text and "needs sim.profiles" in text
    with pytest.raises(ConfigError, match="need a cluster of GPU types"):
        from_mapping({"profiles": "somewhere"})
    assert from_mapping({"cluster": "sia", "profiles": "somewhere"}).cluster == "sia"


def test_the_simulated_cluster_builds_typed_nodes_and_the_snapshot_names_them():
    c = SimCluster(0, groups=gpu_types.parse_cluster(SMALL))
    assert c.n_gpus == 12 and [len(n.gpus) for n in c.nodes] == [4, 8]
    views = c.snapshot().nodes
    assert [(v.gpu_type, v.gpu_memory_mib, len(v.gpus)) for v in views] == [("aws", 15360, 4), ("dgx-ext", 40960, 8)]
    assert SimCluster(8, gpus_per_node=4).snapshot().nodes[0].gpu_type == ""  # one type: names none, as before


# ---------------------------------------------------------------- per-type ground truth


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> Path:
    """Made-up profiles of aws, dgx-ext and rtx in Sia's layout (`tests.sia_layout`): no peer's data."""
    return made_up_profiles(tmp_path_factory.mktemp("made-up") / "profiles")


@pytest.fixture(scope="module")
def types(profiles) -> TypedTruth:
    return TypedTruth.from_sia(str(profiles), ["aws", "dgx-ext", "rtx"])


def test_the_profiles_read_raw_are_the_step_times_written_and_each_type_has_its_own_batches_and_memory(profiles):
    raw = sia_truths(profiles, ["aws", "dgx-ext", "rtx"], sia_model=False)
    per_sample, local, local_rtx = APPS["cifar10"][:3]
    # one step of 4 x 64 on four aws GPUs: the step time written for placement "4" at local batch 64
    assert raw["aws"].gang_speed("cifar10", 256, (4,)) == pytest.approx(1 / (0.01 + per_sample * 64 + 0.008))
    assert raw["aws"].gang_speed("cifar10", 256, (1,)) == pytest.approx(1 / (0.01 + per_sample * 256))
    assert raw["dgx-ext"].gang_speed("cifar10", 256, (4,)) > 1.2 * raw["aws"].gang_speed("cifar10", 256, (4,))
    # the gradient statistics are the app's, whatever the type
    assert raw["dgx-ext"].iterations_to_end("cifar10", 2048) == raw["aws"].iterations_to_end("cifar10", 2048) > 0
    assert set(raw["aws"].apps) == set(raw["rtx"].apps) == set(APPS)
    assert raw["aws"].batch_range("yolov3") == (4, 16) and raw["rtx"].batch_range("yolov3") == (4, 8)
    # Each type's largest measured batch fills 90 % of its own memory.
    assert raw["dgx-ext"].train_mem_mib("cifar10", 256) == pytest.approx(0.9 * 40960)
    assert raw["aws"].train_mem_mib("cifar10", 256) == pytest.approx(0.9 * 15360)


def test_sia_s_calibration_slows_every_step_by_the_app_s_factor(profiles, types):
    raw = sia_truths(profiles, ["rtx"], sia_model=False)["rtx"]
    for app in ("cifar10", "bert", "yolov3"):
        assert types["rtx"].gang_speed(app, 64, (8,)) == pytest.approx(raw.gang_speed(app, 64, (8,)) /
                                                                       SIA_SLOWDOWN[app], rel=1e-9)
    assert SIA_SLOWDOWN["cifar10"] != SIA_SLOWDOWN["yolov3"]  # the factor is the app's, not one for all
    assert types.restart_s("imagenet") == SIA_RESTART_S["imagenet"] == 250.0


def test_a_gang_across_types_runs_at_its_slowest_rank(types):
    across = types.gang_speed("cifar10", 2048, (("aws", 4), ("dgx-ext", 4)), 256)
    on_aws = types["aws"].gang_speed("cifar10", 2048, (4, 4), 256)
    on_a100 = types["dgx-ext"].gang_speed("cifar10", 2048, (4, 4), 256)
    assert on_a100 > on_aws and across == pytest.approx(on_aws)
    assert types.slowest_type("cifar10", ["dgx-ext", "rtx", "aws"]) == "aws"
    # A micro-batch beyond a type's measurements runs as its largest, in more accumulation steps.
    assert types.gang_speed("yolov3", 64, (("rtx", 4),), 16) == pytest.approx(types["rtx"].gang_speed("yolov3", 64,
                                                                                                     (4,), 8))


def test_a_missing_type_or_column_is_named(profiles, tmp_path):
    with pytest.raises(ConfigError, match="no profiles .* for GPU type 'p100'; measured types: aws, dgx-ext, rtx"):
        sia_truths(profiles, ["p100"])
    bad = tmp_path / "workload.csv"
    bad.write_text("name,time,application,batch_size\ncifar10-0,0,cifar10,2048\n")  # no num_replicas
    with pytest.raises(ConfigError, match="missing column.s. num_replicas"):
        trace_spec.load(f"sia:{bad}", GroundTruth())
    with pytest.raises(ConfigError, match="sia needs a path"):
        trace_spec.load("sia", GroundTruth())
    with pytest.raises(ConfigError, match="not a directory"):
        sia_truths(tmp_path / "absent", ["aws"])


# ---------------------------------------------------------------- families per type


def test_families_per_type_carry_the_type_and_its_throughput(types):
    groups = gpu_types.parse_cluster(SMALL)
    job = TraceJob(1, 0.0, "train", "cifar10", 4, 3000.0, global_batch=2048)
    fam = typed_family_of(job, types, groups, (25, 50, 100), max_gpus=16)
    by_type = {t: {s.name.rsplit("@", 1)[0]: s for s in fam.shapes if s.gpu_type == t} for t in ("aws", "dgx-ext")}
    assert all(s.name.endswith("@" + s.gpu_type) for s in fam.shapes) and len({s.name for s in fam.shapes}) == len(
        fam.shapes)
    same = sorted(set(by_type["aws"]) & set(by_type["dgx-ext"]))
    assert same and all(by_type["dgx-ext"][n].throughput > by_type["aws"][n].throughput for n in same)
    assert max(s.resources.gpus for s in by_type["aws"].values()) == 4  # the aws node has 4: no 8-GPU shape there
    assert max(s.resources.gpus for s in by_type["dgx-ext"].values()) == 8
    assert fam.default_shape.gpu_type == "aws" and fam.default_shape.resources.gpus == 4  # submitted, slowest type
    blind = typed_family_of(job, types, groups, (25, 50, 100), max_gpus=16, type_blind=True)
    assert {s.gpu_type for s in blind.shapes} == {""}
    aws_only = typed_family_of(job, types, gpu_types.parse_cluster("aws:3x4"), (25, 50, 100), max_gpus=16)
    assert [(s.name, s.throughput) for s in blind.shapes] == [(s.name, s.throughput) for s in aws_only.shapes]
    a100_only = typed_family_of(job, types, gpu_types.parse_cluster("dgx-ext:1x8"), (25, 50, 100), max_gpus=16)
    assert {s.gpu_type for s in a100_only.shapes} == {""}  # one type: nothing changes


def test_a_typed_cluster_runs_training_on_profiled_apps_only(types):
    groups = gpu_types.parse_cluster(SMALL)
    with pytest.raises(ConfigError, match="inference job"):
        check_typed([TraceJob(1, 0.0, "infer", "llm", 1, 10.0, context_tokens=10, generated_tokens=10)], types,
                    groups, "t")


# ---------------------------------------------------------------- the simulated Slurm and gateway


def typed_settings(types: TypedTruth, **kw) -> SimSettings:
    base = dict(cluster=SMALL, profiles=types.source, epoch_s=60.0, placement_window_s=0.0,
                profile_noise=0.0, audit=True)
    return SimSettings(**{**base, **kw})


def test_a_typed_request_starts_only_on_its_type_and_an_untyped_one_anywhere():
    c = SimCluster(0, groups=gpu_types.parse_cluster(SMALL))
    c.now = 0.0
    typed = SimJob(TraceJob(1, 0.0, "train", "cifar10", 4, 10.0, 2048), None, GresRequest("gpus", 4, "dgx-ext"), 4, 64)
    share = SimJob(TraceJob(2, 1.0, "train", "cifar10", 1, 10.0, 256), None, GresRequest("mps", 50, "dgx-ext"), 4, 64)
    plain = SimJob(TraceJob(3, 2.0, "train", "cifar10", 4, 10.0, 2048), None, GresRequest("gpus", 4), 4, 64)
    for j in (typed, share, plain):
        c.submit(j)
    c.schedule()
    c.check()
    assert {c.nodes[ni].gpu_type for ni in typed.node_indices} == {"dgx-ext"}  # best fit would be the aws node
    assert {c.nodes[ni].gpu_type for ni in share.node_indices} == {"dgx-ext"}
    assert {c.nodes[ni].gpu_type for ni in plain.node_indices} == {"aws"}


def test_a_move_to_another_type_is_a_requeue_that_pays_the_restart(types):
    tj = TraceJob(1, 0.0, "train", "cifar10", 4, 5000.0, global_batch=2048)
    e = engine.Engine([tj], "static", Settings(), typed_settings(types), ContentionModel(), types)
    e.cluster.now = 0.0
    e._arrive(tj)
    e._settle()
    job = e.cluster.jobs[1]
    assert e.cluster.typed_placement(job) == (("aws", 4),) and job.ready_at == SIA_RESTART_S["cifar10"]
    slow = job.rate
    assert slow == pytest.approx(types.gang_speed("cifar10", 2048, (("aws", 4),), 512))
    with pytest.raises(SlurmError, match="no node has GPU type rtx"):
        e.cluster.apply(Action(ActionKind.RESHAPE_RUNNING, 1, "t", gpus=4, gpu_type="rtx"))
    with pytest.raises(SlurmError, match="n0000 have no GPU of type dgx-ext"):
        e.cluster.apply(Action(ActionKind.RESHAPE_RUNNING, 1, "t", gpus=4, nodes=("n0000",), gpu_type="dgx-ext"))
    e.cluster.now = 200.0
    e.cluster.apply(Action(ActionKind.RESHAPE_RUNNING, 1, "t", gpus=4, nodes=("n0001",), gpu_type="dgx-ext"))
    assert job.state is JobState.PENDING and job.gres == GresRequest("gpus", 4, "dgx-ext")
    e._settle()
    assert e.cluster.typed_placement(job) == (("dgx-ext", 4),) and job.restarts == 1
    assert job.ready_at == 200.0 + SIA_RESTART_S["cifar10"] and job.rate > 2 * slow
    assert job.done == pytest.approx(150.0 * slow)  # the work done is kept


def test_the_same_job_runs_faster_on_the_a100_than_on_the_t4(types):
    twins = [TraceJob(i, 0.0, "train", "cifar10", 4, 3000.0, global_batch=2048) for i in (1, 2)]
    r = engine.run(twins, "static", Settings(), typed_settings(types), ContentionModel(), types)
    assert r.unfinished == 0
    jct = sorted(j.jct for j in r.jobs)
    fast = types.gang_speed("cifar10", 2048, (("dgx-ext", 4),), 512)
    slow = types.gang_speed("cifar10", 2048, (("aws", 4),), 512)
    assert jct == pytest.approx([50.0 + 3000.0 / fast, 50.0 + 3000.0 / slow], rel=1e-6) and fast > 2 * slow


def small_workload(tmp_path: Path) -> Path:
    """Ten jobs in Sia's workload format (made up here, 4 to 8 GPUs each, so they fit the small cluster's types)."""
    rows = [("cifar10", 4, 2048), ("deepspeech2", 8, 320), ("cifar10", 8, 4096), ("yolov3", 4, 64),
            ("bert", 6, 384), ("cifar10", 6, 2048), ("deepspeech2", 4, 320), ("cifar10", 8, 2048),
            ("yolov3", 4, 64), ("bert", 8, 384)]
    path = tmp_path / "workload-small.csv"
    path.write_text("name,time,application,num_replicas,batch_size\n" + "".join(
        f"{app}-{i},{300 * i},{app},{n},{b}\n" for i, (app, n, b) in enumerate(rows)))
    return path


@pytest.mark.parametrize("policy", ["static", "elastico"])
def test_a_small_typed_run_finishes_every_job(types, tmp_path, policy):
    jobs = trace_pollux.pollux(small_workload(tmp_path), types.reference)
    assert len(jobs) == 10 and jobs[0].work == types.reference.iterations_to_end("cifar10", 2048)
    r = engine.run(jobs, policy, Settings(), typed_settings(types, placement_window_s=60.0), ContentionModel(), types)
    assert r.unfinished == 0 and len(r.jobs) == 10  # the audit held after every event (typed jobs on their type)
    assert all(j.end > j.submit for j in r.jobs)


def test_the_cli_runs_a_sia_workload_on_a_typed_cluster_and_reports_jct_and_unfinished(types, tmp_path):
    from click.testing import CliRunner

    from slurm_elastico.cli import main

    runner = CliRunner()
    args = ["sim", "run", "--trace", f"sia:{small_workload(tmp_path)}", "--profiles", types.source,
            "--policy", "static", "--json", "--no-progress"]
    got = runner.invoke(main, args + ["--cluster", SMALL])
    assert got.exit_code == 0, got.output
    out = json.loads(got.stdout)
    assert out["mean_jct_h"] > 0 and out["unfinished"] == [] and out["unfinished_jobs"] == 0
    bad = runner.invoke(main, args + ["--cluster", "aws:1x4,h100:1x8"])
    assert bad.exit_code == 2 and "unknown GPU type 'h100'" in bad.output


def test_a_one_type_run_is_what_it_was_before_types():
    """Pollux's workload 1 under static, seed 0, the default settings: the figure main gave before clusters of
    types existed (commit ac8a4aa: 1.4958 h), as plain Slurm runs it since static has no placement window."""
    from slurm_elastico.sim import experiment

    s = experiment.setup(Settings(), "pollux:1", 400, 2.0, 0.3, 24.0, None, None, None, None, None)
    from slurm_elastico.sim import compare

    res = compare.compare(s.make, ["static"], [0], s.cfg, s.sim, s.model, s.truth)
    assert res.to_json()["mean_jct_h"] == pytest.approx(1.3240273394140263, rel=1e-9)
