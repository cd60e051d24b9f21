"""elastico-run for shapes on several whole GPUs: the srun step, each rank's env:// variables, which shape a job
holding n GPUs runs, and the relaunch rule across GPU counts and share units (real processes and signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from slurm_elastico.errors import ConfigError
from slurm_elastico.jobwrap.payload import Payload
from slurm_elastico.jobwrap.ranks import ENTRY, rank_env, rendezvous, srun_argv
from slurm_elastico.jobwrap.shape import Found, family_from_spec
from slurm_elastico.jobwrap.supervisor import Supervisor

from test_run import PROGRAM, Script, launches, signal_when_ready

FAMILY = """kind: train
global_batch: 16
micro_batches: [2, 4]
precisions: [fp32]
checkpointing: [false]
steps: 20
mps_shares: [50, 100]
gpus: [1, 2, 4]
gpus_per_node: 4
default: mb4-fp32-mps100
"""


@pytest.fixture
def family():
    return family_from_spec(FAMILY, "test family", 81920)


def named(family, name):
    return next(s for s in family[1] if s.name == name)


def test_srun_step_spreads_ranks_evenly_and_refuses_an_uneven_spread():
    argv = srun_argv(["/bin/prog", "--x"], 4, 2, python="/py")
    assert argv[:4] == ["srun", "--ntasks=4", "--ntasks-per-node=2", "--nodes=2"]
    assert "--kill-on-bad-exit=0" in argv and argv[-5:] == ["/py", "-m", ENTRY, "/bin/prog", "--x"]
    with pytest.raises(ConfigError, match="3 rank\\(s\\) cannot be spread evenly over 2 node\\(s\\)"):
        srun_argv(["/bin/prog"], 3, 2)


def test_each_task_becomes_the_program_with_its_rank_variables(tmp_path):
    env = {**os.environ, "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", **rendezvous("127.0.0.1")}
    code = "import json, os; print(json.dumps({k: os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR')}))"
    done = subprocess.run([sys.executable, "-m", ENTRY, sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=30, check=True)
    assert json.loads(done.stdout) == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1"}
    assert 0 < int(env["MASTER_PORT"]) < 65536
    with pytest.raises(ConfigError, match="SLURM_PROCID, MASTER_PORT not set"):
        rank_env({"SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "MASTER_ADDR": "h"})
    bare = subprocess.run([sys.executable, "-m", ENTRY, "true"], env={"PATH": os.environ["PATH"]},
                          capture_output=True, text=True, timeout=30)
    assert bare.returncode == 2 and "not set" in bare.stderr


def test_a_job_holding_n_gpus_runs_a_shape_of_n_ranks(family):
    from slurm_elastico.jobwrap.shape import choose_shape

    fam, candidates = family
    assert choose_shape(fam, candidates, "elastico:shape=mb4-fp32-gpus2", held_gpus=2)[0].name == "mb4-fp32-gpus2"
    s, origin = choose_shape(fam, candidates, "elastico:shape=mb4-fp32-gpus2", held_gpus=4)
    assert s.resources.gpus == 4 and "runs on 2 GPU(s), not the 4 the job holds" in origin
    # one whole GPU runs the 1-GPU shapes (today's MPS-share shapes) whatever their share
    assert choose_shape(fam, candidates, "elastico:shape=mb2-fp32-mps50", held_gpus=1)[0].name == "mb2-fp32-mps50"


def make(tmp_path, family, source, shares_per_gpu=100):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    log = tmp_path / "launches.jsonl"
    messages: list[str] = []
    sup = Supervisor([sys.executable, str(prog), str(log), "done-second"], family[0], source, dict(os.environ),
                     grace_s=5, lead_s=60, requeue=lambda: None, log=messages.append, shares_per_gpu=shares_per_gpu)
    return sup, log, messages


def test_a_shape_on_another_gpu_count_waits_for_the_requeue(tmp_path, family):
    one, two = named(family, "mb4-fp32-mps100"), named(family, "mb4-fp32-gpus2")
    sup, log, messages = make(tmp_path, family, Script(Found(one, "default", allocated_gpus=1, nodes=1),
                                                       Found(two, "AdminComment", allocated_gpus=1, nodes=1)))
    signal_when_ready(log, signal.SIGUSR1)
    assert sup.run() == 0
    assert launches(log) == ["mb4-fp32-mps100", "mb4-fp32-mps100"]  # not run on 1 GPU: the helper requeues it
    assert any("needs 2 whole GPUs but the job holds 1 whole GPU(s)" in m for m in messages)
    # a job on a share (no whole GPUs read back) cannot run it either
    (tmp_path / "share").mkdir()
    sup, log, messages = make(tmp_path / "share", family, Script(Found(one, "default", 100), Found(two, "AdminComment", 100)))
    signal_when_ready(log, signal.SIGUSR1)
    assert sup.run() == 0 and launches(log) == ["mb4-fp32-mps100"] * 2
    assert any("needs 2 whole GPUs but the job holds one GPU" in m for m in messages)


def test_held_share_is_read_in_slurms_counts(tmp_path, family):
    """At 50 shares a GPU, a job holding 25 shares holds 50 %: a 50 % shape is relaunched in place there."""
    half, other = named(family, "mb4-fp32-mps50"), named(family, "mb2-fp32-mps50")
    for per_gpu, in_place in ((50, True), (100, False)):
        (tmp_path / str(per_gpu)).mkdir()
        sup, log, messages = make(tmp_path / str(per_gpu), family,
                                  Script(Found(half, "default", 25), Found(other, "AdminComment", 25)), per_gpu)
        signal_when_ready(log, signal.SIGUSR1)
        assert sup.run() == 0
        assert launches(log)[1] == ("mb2-fp32-mps50" if in_place else "mb4-fp32-mps50"), per_gpu
        assert any(("reshape in place" if in_place else "holds share 25 %") in m for m in messages), messages


def test_payload_carries_the_sites_shares_per_gpu():
    p = Payload(script=b"#!/bin/sh\n", script_name="s", args=(), family_spec=FAMILY, family_source="f",
                gpu_memory_mib=1, grace_s=1, signal_lead_s=1, shares_per_gpu=48)
    assert Payload.decode(p.encode()).shares_per_gpu == 48
    assert Payload.decode(Payload(**{**p.__dict__, "shares_per_gpu": 100}).encode()).shares_per_gpu == 100


def test_a_family_with_gpu_counts_starts_on_whole_gpus_unless_the_user_chose():
    from slurm_elastico.jobwrap.additions import added_options
    from slurm_elastico.slurm.sbatch_options import Option
    from slurm_elastico.shapes import build_family, parse_spec
    from slurm_elastico.shapes.nodes import start_request

    import yaml

    spec = parse_spec(yaml.safe_load(FAMILY), "f.yaml")
    fam = build_family(spec, 81920)
    assert start_request(spec, fam.default_shape) == (1, 1)  # the 1-GPU default, on one whole GPU
    assert start_request(spec, next(s for s in fam.shapes if s.resources.gpus == 4)) == (1, 4)
    wide = parse_spec({**yaml.safe_load(FAMILY), "gpus_per_node": 2, "default": "mb2-fp32-gpus4"}, "f.yaml")
    assert start_request(wide, build_family(wide, 81920).default_shape) == (2, 2)
    plain = parse_spec({**yaml.safe_load(FAMILY), "gpus": [1], "default": "mb4-fp32-mps50"}, "f.yaml")
    assert start_request(plain, build_family(plain, 81920).default_shape) is None
    common = dict(share=50, window_s=0, lead_s=0, job_name="")
    assert added_options([], {}, whole_gpus=(2, 2), **common).argv[-2:] == ("--gres=gpu:2", "--nodes=2")
    assert added_options([], {}, **common).argv[-1] == "--gres=mps:50"
    mine = added_options([Option("nodes", "1")], {}, whole_gpus=(2, 2), **common).argv
    assert "--gres=gpu:2" in mine and not any(a.startswith("--nodes") for a in mine)
    assert not any(a.startswith("--gres") for a in added_options([], {"SBATCH_GRES": "gpu:1"}, whole_gpus=(1, 1), **common).argv)


def test_processes_are_training_ranks_or_engine_replicas():
    from slurm_elastico.jobwrap.ranks import processes
    from slurm_elastico.runtime.shape import runtime_shape
    from slurm_elastico.shapes import parse_family

    fam, _ = family_from_spec(FAMILY, "f", 81920)
    counts = {s.name: processes(runtime_shape(fam, s)) for s in fam.shapes}
    assert counts["mb2-fp32-gpus4"] == 4 and counts["mb4-fp32-mps100"] == 1
    infer = {"kind": "infer", "requests": 10, "gpu_memory_utilization": [0.9], "max_num_seqs": [8],
             "kv_cache_dtype": ["auto"], "mps_shares": [100], "gpus": [1, 2]}
    for rule, expected in (("replicas", 2), ("tensor", 1)):  # a tensor-parallel engine is one process on 2 GPUs
        ifam = parse_family({**infer, "parallel": rule}, "i.yaml", 81920)
        two = next(s for s in ifam.shapes if s.resources.gpus == 2)
        assert processes(runtime_shape(ifam, two)) == expected, rule
