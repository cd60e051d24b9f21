"""Alibaba's GPU-sharing trace: which pods become which jobs, slicing a window, sizing a cluster to its demand,
clear errors, and the benchmark's Alibaba section, on small CSVs in the trace's own format (the trace itself
states no license and is not bundled)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks import sim as bench
from slurm_elastico.cli import main
from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError
from slurm_elastico.sim import experiment, pool, trace, trace_alibaba
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.truth import GPU_MEM_MIB, GroundTruth

HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
          "scheduled_time\n")
H = 3600


@pytest.fixture(scope="module")
def truth() -> GroundTruth:
    return GroundTruth()


def pods(path: Path, rows: list[tuple]) -> Path:
    """A pod list: rows of (num_gpu, gpu_milli, phase, creation, deletion, scheduled); '' for a missing time."""
    lines = [f"openb-pod-{i:04d},4000,8192,{n},{m},,LS,{ph},{c},{d},{s}" for i, (n, m, ph, c, d, s) in enumerate(rows)]
    path.write_text(HEADER + "\n".join(lines) + "\n")
    return path


def test_pods_become_jobs_by_share_and_pods_that_never_ran_are_left_out(truth, tmp_path):
    p = pods(tmp_path / "pods.csv", [
        (1, 460, "Running", 1000, 1000 + 2 * H, 1000),       # row 1: a GPU share -> inference at share 46
        (0, 0, "Running", 1100, 9000, 1100),                  # row 2: CPU only
        (2, 1000, "Succeeded", 1200, 1260 + H, 1260),         # row 3: two whole GPUs, scheduled 60 s late
        (1, 1000, "Pending", 1300, 1900, ""),                 # row 4: never scheduled: it never ran
        (1, 1000, "Failed", 1400, 1400 + 600, 1400),          # row 5: ran 10 min until it failed
        (1, 1000, "Running", 1500, 1500, 1500),               # row 6: no run time
    ])
    s = trace_alibaba.alibaba_slice(p, truth, seed=3)
    assert [(j.job_id, j.kind, j.gpus, j.share) for j in s.jobs] == [
        (1, "infer", 1, 46), (3, "train", 2, 100), (5, "train", 1, 100)]
    assert [j.submit_s for j in s.jobs] == [0.0, 200.0, 400.0]  # creation, from the slice's first pod
    assert s.skipped == {"no GPU request": 1, "never scheduled": 1, "no run time": 1}
    assert (s.start_s, s.span_s) == (1000.0, 400.0)
    # Work is the pod's run time at its requested shape alone, so plain Slurm reproduces the trace's durations.
    inf, multi, single = s.jobs
    assert inf.work / truth.infer_speed(inf.context_tokens, inf.generated_tokens, 0.9, 256, "auto", 46,
                                        GPU_MEM_MIB) == pytest.approx(2 * H)
    assert multi.work / truth.rigid_speed(multi.app, multi.global_batch, 2) == pytest.approx(H)
    micro = trace.default_micro(truth, single.app, single.global_batch)
    assert single.work / truth.train_speed(single.app, single.global_batch, micro, 100) == pytest.approx(600)
    # Held GPUs while the pods arrived (t 1000..1400): 0.46 × 400 s + 2 GPUs × 140 s (from 1260) + 0 (at 1400).
    assert s.gpu_seconds == pytest.approx(0.46 * 400 + 2 * 140)
    assert trace_alibaba.alibaba(p, truth, seed=3) == s.jobs
    other = trace_alibaba.alibaba(p, truth, seed=4)
    assert [j.submit_s for j in other] == [j.submit_s for j in s.jobs]  # a seed draws models, not arrivals


def test_a_window_takes_the_pods_created_in_it_and_caps_durations(truth, tmp_path):
    day = 86400
    p = pods(tmp_path / "pods.csv", [(1, 1000, "Running", k * 6 * H, k * 6 * H + 30 * day, k * 6 * H)
                                     for k in range(8)])  # one pod every 6 h, each running 30 days
    s = trace_alibaba.alibaba_slice(p, truth, start_h=12, hours=12, max_duration_s=2 * day)
    assert [j.job_id for j in s.jobs] == [3, 4]  # created at 12 h and 18 h; the one at 24 h is outside
    assert s.start_s == 12 * H and [j.submit_s for j in s.jobs] == [0.0, 6 * H]
    speed = truth.train_speed(s.jobs[0].app, s.jobs[0].global_batch,
                              trace.default_micro(truth, s.jobs[0].app, s.jobs[0].global_batch), 100)
    assert s.jobs[0].work / speed == pytest.approx(2 * day)
    assert len(trace_alibaba.alibaba(p, truth, start_h=12)) == 6  # no `hours`: to the trace's end
    with pytest.raises(ConfigError) as err:
        trace_alibaba.alibaba_slice(p, truth, start_h=100, hours=5)
    assert "no pod created in [100 h, 105 h)" in str(err.value) and "the file has 8 pod(s)" in str(err.value)


def test_a_cluster_sized_to_the_slice_demand(truth, tmp_path):
    # 10 one-GPU pods, one every hour, each running 5 h: while they arrive (9 h) they hold 9 + 8 + ... GPU-hours.
    p = pods(tmp_path / "pods.csv", [(1, 1000, "Running", k * H, k * H + 5 * H, k * H) for k in range(10)]
             + [(8, 1000, "Running", 9 * H, 10 * H, 9 * H)])
    s = trace_alibaba.alibaba_slice(p, truth)
    held = sum(min(5, 9 - k) for k in range(10))  # GPU-hours within 0..9 h; the 8-GPU pod starts at 9 h
    assert s.gpu_seconds == pytest.approx(held * H)
    assert s.load_on(4) == pytest.approx(held / (4 * 9))
    assert s.gpus_for(1.0, 4) == 8  # 3.9 GPUs of demand -> 4, but the 8-GPU pod needs 8
    assert s.gpus_for(0.25, 4) == 16  # 15.6 GPUs -> four nodes of 4
    assert s.gpus_for(0.25, 8) == 16
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ConfigError, match="load"):
            s.gpus_for(bad, 8)


def test_bad_files_and_arguments_are_named(truth, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "a,1,1,one,1000,,LS,Running,0,10,0\nb,1,1,1,1000,,LS,Running,5,x,5\n")
    with pytest.raises(ConfigError) as err:
        trace_alibaba.alibaba(bad, truth)
    text = str(err.value)
    assert "pod row 1 (a): num_gpu 'one'" in text and "pod row 2 (b): deletion_time 'x'" in text
    short = tmp_path / "short.csv"
    short.write_text("name,num_gpu,creation_time\na,1,0\n")
    with pytest.raises(ConfigError, match="missing column.*gpu_milli, deletion_time, scheduled_time"):
        trace_alibaba.alibaba(short, truth)
    with pytest.raises(ConfigError) as err:
        trace_alibaba.alibaba(bad, truth, start_h=-1, hours=0)
    assert "start_h -1" in str(err.value) and "hours 0" in str(err.value)
    with pytest.raises(ConfigError, match="cannot read"):
        trace_alibaba.alibaba(tmp_path / "nosuch.csv", truth)


def test_a_job_larger_than_the_cluster_is_a_clear_error_not_a_nan_table(tmp_path):
    p = pods(tmp_path / "pods.csv", [(1, 500, "Running", 0, 600, 0), (8, 1000, "Running", 60, 1800, 60)])
    with pytest.raises(ConfigError) as err:
        experiment.setup(Settings(), f"alibaba:{p}", 10, 1.0, 0.3, 24.0, 4, None, None, None, None).make(0)
    assert "job 2 asks for 8 GPUs; the cluster has 4" in str(err.value)
    res = CliRunner().invoke(main, ["sim", "run", "--trace", f"alibaba:{p}", "--gpus", "4", "--policy", "static"])
    assert res.exit_code == 2 and "job 2 asks for 8 GPUs" in res.output and "nan" not in res.output.lower()
    res = CliRunner().invoke(main, ["sim", "run", "--trace", f"alibaba:{p}", "--gpus", "8", "--policy", "static",
                                    "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["complete"] is True and out["policies"]["static"]["jobs"]["mean"] == 2


def test_the_benchmark_section_compares_policies_over_seeds(truth, tmp_path):
    rows = [(1, 250 + 250 * (k % 3), "Running", k * 600, k * 600 + 1800, k * 600) for k in range(12)]
    rows += [(1, 1000, "Running", k * 900 + 30, k * 900 + 2400, k * 900 + 30) for k in range(8)]
    p = pods(tmp_path / "pods.csv", rows)
    out = bench.alibaba(pool.Runs(truth), str(p), 4.0, 3, ["static", "elastico"])()  # submitted, then finished
    assert out["gpus"] == 8 and out["jobs"] == len(out_jobs := trace_alibaba.alibaba(p, truth, 0, out["start_h"], 4.0))
    assert out["shared_gpu_jobs"] == sum(j.kind == "infer" for j in out_jobs) > 0
    static = out["policies"]["static"]
    assert static["unfinished_by_seed"] == {"0": 0, "1": 0, "2": 0} and out["unfinished_jobs"] == 0
    assert static["mean_jct_h"] >= static["lower_bound_h"] > 0
    assert static["paired_ratio"] > 0 and not math.isnan(static["paired_ci95"])  # three seeds: a real interval


def test_the_benchmark_says_when_the_trace_is_not_given(truth, tmp_path, capsys):
    figures, why = bench.alibaba_or_why_not(pool.Runs(truth), None, quick=True)()
    assert figures is None and capsys.readouterr().out == f"\nalibaba: not run ({why})\n"
    assert "give --alibaba PATH to openb_pod_list_default.csv" in why
    assert "not bundled: it states no license" in why and bench.ALIBABA_ENV in why
    script = Path(bench.__file__)
    env = {k: v for k, v in os.environ.items() if k != bench.ALIBABA_ENV} | {"PYTHONPATH": str(script.parent.parent)}
    res = subprocess.run([sys.executable, str(script), "--alibaba", str(tmp_path / "nosuch.csv")],
                         capture_output=True, text=True, env=env, cwd=script.parent.parent, timeout=120)
    assert res.returncode == 2 and "is not a file; give the path to openb_pod_list_default.csv" in res.stderr
    res = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, env=env,
                         cwd=script.parent.parent, timeout=120)
    assert res.returncode == 0 and bench.ALIBABA_ENV in res.stdout
