"""Trace loaders on small slices, the trace CSV format, the synthetic mix's load, and the `elastico sim` CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slurm_elastico.cli import main
from slurm_elastico.errors import ConfigError
from slurm_elastico.sim import trace, trace_alibaba, trace_azure, trace_philly, trace_pollux, trace_synthetic
from slurm_elastico.sim.families import family_of
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth


@pytest.fixture(scope="module")
def truth() -> GroundTruth:
    return GroundTruth()


def test_csv_round_trip_and_bad_rows_named(truth, tmp_path):
    jobs = [TraceJob(1, 0.0, "train", "cifar10", 1, 400.0, 256), TraceJob(2, 5.0, "infer", "llm", 1, 900.0, 0, 50,
                                                                        800.0, 120.0)]
    trace.write_csv(jobs, tmp_path / "t.csv")
    assert trace.read_csv(tmp_path / "t.csv", truth) == jobs
    (tmp_path / "bad.csv").write_text("job_id,submit_s,kind,app,work,global_batch\n1,0,train,nosuch,10,32\n"
                                      "2,0,serve,llm,-1,0\n")
    with pytest.raises(ConfigError) as err:
        trace.read_csv(tmp_path / "bad.csv", truth)
    text = str(err.value)
    assert "job 1: app 'nosuch' has no measured profile" in text and "job 2: kind 'serve'" in text
    assert "job 2: work -1.0 must be > 0" in text


def test_pollux_workload_work_is_measured_iterations(truth):
    jobs = trace_pollux.pollux(1, truth)
    assert len(jobs) == 160 and jobs[0].submit_s <= jobs[-1].submit_s
    first = next(j for j in jobs if j.app == "cifar10" and j.global_batch == 2048)
    assert first.work == truth.iterations["cifar10"][2048]  # measured iterations at that batch
    assert max(j.gpus for j in jobs) > 1 and all(j.gpus == 1 for j in trace_pollux.pollux(1, truth, single_gpu=True))


def test_philly_slice_keeps_arrivals_and_durations(truth):
    jobs = trace_philly.philly(truth=truth, seed=1, start_s=40 * 86400, hours=2)
    assert jobs and all(0 <= j.submit_s < 2 * 3600 for j in jobs)
    again = trace_philly.philly(truth=truth, seed=1, start_s=40 * 86400, hours=2)
    assert again == jobs  # seeded model assignment
    one = next(j for j in jobs if j.gpus == 1)
    # work = duration × speed alone at the submitted shape, so alone on plain Slurm it takes its Philly duration
    speed = truth.train_speed(one.app, one.global_batch, trace.default_micro(truth, one.app, one.global_batch), 100)
    assert one.work / speed >= 1.0


def test_alibaba_pods_become_shared_inference_and_whole_gpu_training(truth, tmp_path):
    p = tmp_path / "pods.csv"
    p.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
                 "scheduled_time\n"
                 "a,1000,1024,1,500,,LS,Running,100,3700,100\n"
                 "b,1000,1024,2,1000,,LS,Running,50,7250,50\n"
                 "c,1000,1024,0,0,,LS,Running,0,10,0\n"  # CPU only: dropped
                 "d,1000,1024,1,1000,,BE,Running,10,1810,10\n")
    jobs = trace_alibaba.alibaba(p, truth, seed=0)
    assert [(j.kind, j.gpus, j.share) for j in jobs] == [("train", 1, 100), ("train", 2, 100), ("infer", 1, 50)]
    assert [j.submit_s for j in jobs] == [0.0, 40.0, 90.0]  # in creation order, from the first pod's creation


def test_azure_requests_size_inference_jobs(truth):
    req = trace_azure.azure_requests(service="code")
    assert req.shape[1] == 3 and (req[:, 1] > 0).all() and (req[:, 0][1:] >= req[:, 0][:-1]).all()
    with pytest.raises(ConfigError, match="allowed: conv, code"):
        trace_azure.azure_requests(service="chat")


def test_synthetic_mix_offers_the_load_asked_for(truth):
    spec = trace_synthetic.MixSpec(n_jobs=300, gpus=16, load=1.5, infer_fraction=0.4)
    jobs = trace_synthetic.synthetic(spec, seed=2, truth=truth)
    kinds = {j.kind for j in jobs}
    assert kinds == {"train", "infer"} and 0.25 < sum(j.kind == "infer" for j in jobs) / len(jobs) < 0.55
    gpu_s = 0.0
    for j in jobs:
        fam = family_of(j, truth, (100,), spec.gpu_memory_mib)
        gpu_s += j.work / fam.default_shape.throughput
    span = jobs[-1].submit_s - jobs[0].submit_s
    assert gpu_s / (spec.gpus * span) == pytest.approx(1.5, rel=0.02)
    assert trace.scale_load(jobs, 2.0)[-1].submit_s == pytest.approx(span / 2)


def test_families_keep_the_global_batch_unless_adaptive(truth):
    job = TraceJob(1, 0.0, "train", "cifar10", 1, 1000.0, 512)
    fam = family_of(job, truth, (25, 50, 100), 16384)
    assert {s.knob("global_batch") for s in fam.shapes} == {512}
    assert fam.default_shape.resources.mps == 100
    wide = family_of(job, truth, (25, 50, 100), 16384, adaptive=True)
    assert len({s.knob("global_batch") for s in wide.shapes}) > 1
    assert all(s.knob("lr_scaling") == "sqrt" for s in wide.shapes if s.knob("global_batch") != 512)
    assert family_of(TraceJob(2, 0.0, "train", "cifar10", 4, 10.0, 512), truth, (100,), 16384) is None


def test_cli_run_and_compare(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["sim", "run", "--jobs", "20", "--gpus", "4", "--policy", "static", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["policies"]["static"]["mean_jct_h"]["mean"] > 0 and out["complete"] is True
    res = runner.invoke(main, ["sim", "compare", "--jobs", "12", "--gpus", "2", "--seeds", "2",
                               "--policies", "static,elastico", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "elastico" in res.output and (tmp_path / "runs.csv").read_text().count("\n") == 5
    assert (tmp_path / "jct_cdf.png").stat().st_size > 0
    res = runner.invoke(main, ["sim", "run", "--policy", "fifo", "--jobs", "2"])
    assert res.exit_code == 2 and "'fifo' is not a policy" in res.output


def test_a_family_with_gpu_counts_offers_one_gpu_only_whole_when_gangs_start_whole():
    # elastico-submit starts a family with GPU counts on whole GPUs, and Slurm 22.05 cannot move a job from gpu to
    # mps: `whole_gpu_gangs` keeps the simulator's family to that; without gangs the shares stay.
    truth = GroundTruth()
    job = TraceJob(1, 0.0, "train", "bert", 1, 10.0, 24)
    shared = family_of(job, truth, (50, 100), 16384, max_gpus=4, gpus_per_node=4)
    whole = family_of(job, truth, (50, 100), 16384, max_gpus=4, gpus_per_node=4, whole_gpu_gangs=True)
    assert {s.resources.mps for s in shared.shapes if not s.resources.gpus} == {50, 100}
    assert {s.resources.mps for s in whole.shapes if not s.resources.gpus} == {100}
    assert {s.resources.gpus for s in whole.shapes} == {0, 2, 4} and whole.default == shared.default
    alone = family_of(job, truth, (50, 100), 16384, whole_gpu_gangs=True)  # no GPU counts: shares kept
    assert {s.resources.mps for s in alone.shapes} == {50, 100}


@pytest.mark.parametrize("policy, shares", [("elastico", {100}), ("no-allot", {100}), ("tiresias", {25, 50, 75, 100})])
def test_elastico_gets_the_families_elastico_submit_starts_and_a_baseline_the_settings(policy, shares):
    # The elastico policies' jobs come through elastico-submit, which starts a family with GPU counts on whole
    # GPUs (Policy.whole_gpu_gangs); a baseline's families follow SimSettings.whole_gpu_gangs (false here).
    from slurm_elastico.config import Settings
    from slurm_elastico.interference.base import ContentionModel
    from slurm_elastico.sim.engine import Engine
    from slurm_elastico.sim.settings import SimSettings

    truth = GroundTruth()
    jobs = [TraceJob(1, 0.0, "train", "bert", 1, 10.0, 24), TraceJob(2, 0.0, "train", "bert", 1, 10.0, 24)]
    run = Engine(jobs, policy, Settings(), SimSettings(gpus=4, gpus_per_node=4), ContentionModel(), truth)
    run._arrive(jobs[0])
    fam = run.families[1]
    assert any(s.resources.gpus for s in fam.shapes)
    assert {s.resources.mps for s in fam.shapes if not s.resources.gpus} == shares


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_family_on_a_count_that_does_not_divide_its_batch_has_only_shapes_the_runtime_runs(adaptive):
    # Sia's and Pollux's traces submit jobs on GPU counts that do not divide their batch (2,048 on 6 GPUs: half of
    # Sia's Philly jobs). The runtime splits it exactly (parts of 342 and 341 samples: `runtime.split.rank_part`),
    # so the simulator's shape at 6 GPUs is one the runtime accepts, knobs and all, at the job's own batch.
    from slurm_elastico.runtime.shape import runtime_shape

    truth = GroundTruth()
    job = TraceJob(1, 0.0, "train", "cifar10", 6, 10.0, 2048)
    fam = family_of(job, truth, (100,), 16384, adaptive=adaptive, max_gpus=16, gpus_per_node=4)
    assert fam.default_shape.resources.gpus == 6 and fam.default_shape.knob("global_batch") == 2048
    for s in fam.shapes:
        run = runtime_shape(fam, s)  # a ConfigError names a split the runtime refuses
        assert (run.micro_batch, run.accumulation) == (s.knob("micro_batch"), s.knob("accumulation")), s.name
    six = runtime_shape(fam, fam.default_shape)
    assert six.ranks == 6 and sum(six.rank_part(r)[1] for r in range(6)) == 2048
