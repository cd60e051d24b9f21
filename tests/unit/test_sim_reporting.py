"""What `elastico sim` reports: unfinished jobs beside every mean, a comparison with any failing, seeded arrival
jitter for fixed traces, and clear errors for traces a cluster cannot run."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from slurm_elastico.cli import main
from slurm_elastico.errors import ConfigError
from slurm_elastico.sim import compare, metrics, trace, trace_pollux
from slurm_elastico.sim.experiment import seed_varies, setup
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.results import JobResult, RunResult
from slurm_elastico.sim.trace import TraceJob

TRACE = ("job_id,submit_s,kind,app,gpus,work,global_batch,share,context_tokens,generated_tokens\n"
         "1,0,train,cifar10,1,400,256,100,,\n"
         "2,30,infer,llm,1,2000,,100,1024,250\n"
         "3,40,train,cifar10,1,300,256,100,,\n")
# Nodes of one GPU and 2 CPUs: a training job asks 4 CPUs (sim.families.TRAIN_CPUS), so Slurm never starts jobs 1
# and 3 on such a cluster; the inference job asks 2 and finishes. The run gives up on the two and reports them.
CPU_STARVED = "sim:\n  gpus_per_node: 1\n  cpus_per_gpu: 2\n"


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "t.csv").write_text(TRACE)
    (tmp_path / "starved.yaml").write_text(CPU_STARVED)
    return tmp_path


def sim(*args: str):
    return CliRunner().invoke(main, ["sim", *args, "--no-progress"])


def test_run_table_and_json_show_unfinished_jobs(files):
    base = ["run", "--trace", str(files / "t.csv"), "--gpus", "2", "--policy", "static"]
    res = sim(*base, "--sim-config", str(files / "starved.yaml"))
    assert res.exit_code == 0, res.output
    head, row = res.stdout.splitlines()[:2]
    assert head.split()[:3] == ["policy", "unfinished", "mean_jct_h"]
    assert row.split()[:4] == ["static", "2", "of", "3"] and row.split()[4].endswith("*")
    assert "* over finished jobs only: static left jobs unfinished" in res.stdout
    assert "warning: policy static seed 0 left 2 of 3 jobs unfinished" in res.stderr
    res = sim(*base, "--sim-config", str(files / "starved.yaml"), "--json")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["complete"] is False
    assert out["unfinished"] == [{"policy": "static", "seed": 0, "unfinished": 2, "jobs": 3, "job_ids": [1, 3]}]
    static = out["policies"]["static"]
    assert static["mean_jct_h"]["unfinished"] == 2 and static["unfinished_by_seed"] == {"0": 2}
    assert static["jobs"]["mean"] == 3 and static["mean_jct_h"]["mean"] > 0  # the inference job's JCT only
    # The same trace on an ordinary cluster: nothing unfinished, nothing marked.
    res = sim(*base)
    assert res.exit_code == 0 and res.stderr == "", res.output
    row = res.stdout.splitlines()[1].split()
    assert row[:2] == ["static", "0"] and "*" not in res.stdout


def test_compare_with_unfinished_jobs_prints_the_table_and_fails(files):
    res = sim("compare", "--trace", str(files / "t.csv"), "--gpus", "2", "--policies", "static,elastico",
              "--seeds", "2", "--sim-config", str(files / "starved.yaml"), "--out", str(files / "out"))
    assert res.exit_code == compare.Incomplete.exit_code == 5, res.output
    lines = res.stdout.splitlines()
    assert lines[1].startswith("static") and "4 (seed 0: 2/3, seed 1: 2/3)" in lines[1]
    assert lines[2].startswith("elastico") and "4 (seed 0: 2/3, seed 1: 2/3)" in lines[2]
    for p in ("static", "elastico"):
        for s in (0, 1):
            assert f"policy {p} seed {s}: 2 of 3 jobs unfinished" in res.stderr
    assert "not a result" in res.stderr
    jobs = (files / "out" / "jobs.csv").read_text().splitlines()
    assert jobs[0].endswith(",jct,finished")
    assert sum(r.endswith(",0") for r in jobs[1:]) == 8 and sum(r.endswith(",1") for r in jobs[1:]) == 4


def test_table_marks_means_of_runs_with_unfinished_jobs():
    job = JobResult(1, "train", "cifar10", 1, 0.0, 0.0, 3600.0, 0, 10.0, 10.0, 1800.0, 10.0, 0.0)
    full = RunResult("a", 0, 1, [job], [], 1.0, 1.0, 1, 1, 1, 0.1, 0.0, unfinished=0)
    part = RunResult("b", 0, 1, [job], [], 1.0, 1.0, 1, 1, 1, 0.1, 0.0, unfinished=3)
    assert metrics.summarize(part)["jobs"] == 4 and metrics.summarize(part)["mean_jct_h"] == 1.0
    c = compare.Comparison({"a": [full], "b": [part]}, {"a": [metrics.summarize(full)],
                                                        "b": [metrics.summarize(part)]}, seed_varies="x")
    rows = c.table(("mean_jct_h", "wall_s")).splitlines()
    assert rows[1].split() == ["a", "0", "1", "0.1"]
    assert rows[2].split() == ["b", "3", "of", "4", "1*", "0.1"]  # wall time is not over jobs: unmarked
    assert c.incomplete() == [("b", 0, 3, 4)]
    with pytest.raises(compare.Incomplete, match="policy b seed 0: 3 of 4 jobs unfinished"):
        c.check_complete()
    compare.Comparison({"a": [full]}, {"a": [metrics.summarize(full)]}).check_complete()


def test_jitter_varies_arrivals_by_seed_within_the_bound_and_is_order_independent():
    jobs = trace_pollux.pollux(1)
    a, b = trace.jitter_arrivals(jobs, 0, 60.0), trace.jitter_arrivals(jobs, 1, 60.0)
    base = {j.job_id: j.submit_s for j in jobs}
    for got in (a, b):
        assert sorted(j.job_id for j in got) == sorted(base)
        assert all(abs(j.submit_s - base[j.job_id]) <= 60.0 and j.submit_s >= 0 for j in got)
        assert [(j.submit_s, j.job_id) for j in got] == sorted((j.submit_s, j.job_id) for j in got)
        assert {j.job_id: (j.app, j.gpus, j.work) for j in got} == {j.job_id: (j.app, j.gpus, j.work) for j in jobs}
    moved = [abs(j.submit_s - base[j.job_id]) for j in a]
    assert sum(m > 1.0 for m in moved) > 0.9 * len(jobs) and max(moved) > 40.0  # really spread over the bound
    assert {j.job_id: j.submit_s for j in a} != {j.job_id: j.submit_s for j in b}
    assert trace.jitter_arrivals(jobs, 0, 60.0) == a  # same seed, same trace
    shuffled = list(jobs)
    random.Random(7).shuffle(shuffled)
    assert trace.jitter_arrivals(shuffled, 0, 60.0) == a  # a job's offset depends on (seed, job) only
    assert trace.jitter_arrivals(jobs, 3, 0.0) == jobs
    with pytest.raises(ConfigError, match="jitter_s"):
        trace.jitter_arrivals(jobs, 0, -1.0)


def _setup(trace_name: str, jitter_s: float | None = None, **kw):
    from slurm_elastico.config import Settings

    args = dict(jobs=10, load=1.0, infer_fraction=0.3, hours=1.0, gpus=64, epoch_s=None, window_s=None,
                colocation=None, sim_config=None) | kw
    return setup(Settings(), trace_name, **args, jitter_s=jitter_s)


def test_setup_jitters_fixed_traces_per_seed_and_says_what_a_seed_varies():
    s = _setup("pollux:1")
    assert [j.submit_s for j in s.make(0)] != [j.submit_s for j in s.make(1)]
    assert s.make(2) == s.make(2)
    assert "arrival jitter" in s.seed_varies and "±60 s" in s.seed_varies and "estimates" in s.seed_varies
    exact = _setup("pollux:1", jitter_s=0.0)
    assert exact.make(0) == exact.make(1) == trace_pollux.pollux(1)
    assert "jitter" not in exact.seed_varies and "app 0.3" in exact.seed_varies
    assert "synthetic trace itself" in _setup("synthetic").seed_varies
    quiet = SimSettings(profile_noise=0.0, estimate_app_sigma=0.0, estimate_job_sigma=0.0, estimate_share_sigma=0.0,
                        estimate_scaling_sigma=0.0, efficiency_noise=0.0)
    assert seed_varies("pollux:1", 0.0, quiet).startswith("nothing")


def test_compare_output_says_what_the_seed_varies(files):
    res = sim("compare", "--trace", str(files / "t.csv"), "--gpus", "2", "--policies", "static", "--seeds", "2")
    assert res.exit_code == 0, res.output
    assert "2 seeds (0..1); a seed varies the arrival jitter" in res.stdout
    row = res.stdout.splitlines()[1].split()
    assert row[:2] == ["static", "0"] and row[3] == "±" and float(row[4]) > 0  # jittered replicas differ in JCT


@pytest.mark.parametrize("content", ["", TRACE.splitlines()[0] + "\n"])
def test_empty_or_header_only_trace_is_a_clear_error(files, content):
    (files / "empty.csv").write_text(content)
    res = sim("run", "--trace", str(files / "empty.csv"), "--policy", "static")
    assert res.exit_code == 2, res.output
    assert "the trace has no jobs" in res.stderr and "nan" not in res.output.lower()


def test_a_job_larger_than_the_cluster_is_a_clear_error(files):
    (files / "big.csv").write_text(TRACE + "4,50,train,cifar10,8,400,256,100,,\n")
    res = sim("run", "--trace", str(files / "big.csv"), "--gpus", "4", "--policy", "static")
    assert res.exit_code == 2, res.output
    assert "job 4 asks for 8 GPUs; the cluster has 4" in res.stderr
    res = sim("compare", "--trace", "pollux:1", "--gpus", "16", "--policies", "static", "--seeds", "1")
    assert res.exit_code == 2 and "asks for 24 GPUs; the cluster has 16" in res.stderr, res.output
    with pytest.raises(ConfigError, match="no jobs"):
        trace.check_cluster([], 4)
    trace.check_cluster([TraceJob(1, 0.0, "train", "cifar10", 4, 1.0, 256)], 4)


def test_a_job_needing_more_gpu_memory_than_a_gpu_has_is_a_clear_error(files):
    (files / "small.yaml").write_text("sim:\n  gpu_memory_mib: 1024\n")
    res = sim("run", "--trace", str(files / "t.csv"), "--policy", "static", "--sim-config", str(files / "small.yaml"))
    assert res.exit_code == 2, res.output
    assert "job 1 (cifar10, global batch 256) needs" in res.stderr and "a GPU has 1024 MiB" in res.stderr
    assert "job 2 (inference) fits no vLLM shape" in res.stderr


@pytest.mark.parametrize("args", [["run", "--policy", "nosuch"], ["compare", "--policies", "static,nosuch"]])
def test_an_unknown_policy_lists_the_allowed_ones(args):
    res = sim(*args, "--jobs", "2")
    assert res.exit_code == 2, res.output
    assert "'nosuch' is not a policy; allowed: elastico, elastico-goodput, static" in res.stderr
