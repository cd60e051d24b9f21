"""`elastico sched --once` against the real local cluster: planned shares reach the jobs; crashes are repaired.

Jobs are submitted with a BeginTime in the future (as elastico-submit's
placement window does), so they are pending when the helper plans; the plan
sets their share, pins a node and starts them now.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_elastico.model import Action, ActionKind, JobState
from slurm_elastico.helper.journal import Journal
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.runner import SubprocessRunner
from slurm_elastico.store import Store

from live_helpers import PLANNED_FAMILY

pytestmark = pytest.mark.live

JOB = """#!/bin/bash
echo "start node=$SLURMD_NODENAME mps=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
sleep 30
"""


def env_with(slurm_env):
    return {**os.environ, **slurm_env}


@pytest.fixture
def setup(slurm_env, tmp_path):
    conf = tmp_path / "elastico.yaml"
    conf.write_text(json.dumps({"state_dir": str(tmp_path / "state"),
                                "slurm": {"conf": slurm_env["SLURM_CONF"]},
                                "gpu": {"memory_mib": 16000}}))
    fams = tmp_path / "families"
    fams.mkdir()
    script = tmp_path / "job.sh"
    script.write_text(JOB)
    ids: list[int] = []

    def submit(*opts: str) -> int:
        out = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/%j.out", *opts, str(script)],
                             env=env_with(slurm_env), capture_output=True, text=True, timeout=30, check=True)
        job_id = int(out.stdout.strip().split(";")[0])
        ids.append(job_id)
        (fams / f"{job_id}.yaml").write_text(PLANNED_FAMILY)
        return job_id

    yield conf, fams, submit, tmp_path
    if ids:
        subprocess.run(["scancel", *map(str, ids)], env=env_with(slurm_env), capture_output=True, timeout=30)


def elastico(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("elastico")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)


def test_sched_once_sets_shares_and_jobs_run_with_them(setup, slurm_env):
    conf, fams, submit, tmp = setup
    ids = [submit("--gres=mps:25", "--begin=now+600") for _ in range(3)]
    dry = elastico("--config", str(conf), "sched", "--once", "--dry-run", "--families", str(fams))
    assert dry.returncode == 0, dry.stderr
    assert "scontrol update JobId=" in dry.stdout and "Gres=mps:100" in dry.stdout
    gw = SlurmGateway(SubprocessRunner(env=slurm_env))
    assert all(gw.job(i).state is JobState.PENDING and gw.job(i).mps_share == 25 for i in ids), "dry run changed nothing"

    run = elastico("--config", str(conf), "sched", "--once", "--json", "--families", str(fams))
    assert run.returncode == 0, run.stderr
    epoch = json.loads(run.stdout.strip().splitlines()[-1])
    planned = {a["job_id"]: a["share"] for a in epoch["actions"] if a["kind"] == "set_share"}
    assert set(planned) == set(ids) and all(a["status"] == "done" for a in epoch["actions"])
    deadline = time.monotonic() + 30
    seen: dict[int, str] = {}
    while time.monotonic() < deadline and len(seen) < len(ids):
        for i in ids:
            out = tmp / f"{i}.out"
            if out.exists() and "mps=" in out.read_text():
                seen[i] = out.read_text().split("mps=")[1].split()[0]
        time.sleep(0.3)
    assert seen == {i: str(planned[i]) for i in ids}, "each job runs with the share the plan set"
    snap = gw.snapshot()
    for i in ids:
        view = snap.job(i)
        assert view.admin_comment.startswith("elastico:shape=") and view.node == next(
            a["nodes"][0] for a in epoch["actions"] if a["job_id"] == i and a["kind"] == "set_nodes")
    with Store(tmp / "state" / "elastico.sqlite") as store:
        statuses = {r["status"] for r in store.query("SELECT status FROM journal")}
    assert statuses == {"done"}


def test_interrupted_reshape_is_repaired_by_the_next_epoch(setup, slurm_env):
    conf, fams, submit, tmp = setup
    gw = SlurmGateway(SubprocessRunner(env=slurm_env))
    job_id = submit("--gres=mps:25", "--requeue")
    deadline = time.monotonic() + 30
    while gw.job(job_id).state is not JobState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.3)
    # An epoch that died after requeue-hold and before release: journaled 'planned', job held.
    with Store(tmp / "state" / "elastico.sqlite") as store:
        Journal(store).plan(time.time(), Action(ActionKind.RESHAPE_RUNNING, job_id, "test", share=100, nodes=("n1",)))
    subprocess.run(["scontrol", "requeuehold", str(job_id)], env=env_with(slurm_env), check=True, timeout=30)
    deadline = time.monotonic() + 30
    while not gw.job(job_id).held and time.monotonic() < deadline:
        time.sleep(0.3)
    assert gw.job(job_id).held
    time.sleep(2)  # see gateway.REVOKE_GAP_S: a release in the hold's second would fail the job
    run = elastico("--config", str(conf), "sched", "--once", "--families", str(fams))
    assert run.returncode == 0, run.stderr
    assert f"job {job_id}: released" in run.stdout
    deadline = time.monotonic() + 30
    while gw.job(job_id).held and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not gw.job(job_id).held
    with Store(tmp / "state" / "elastico.sqlite") as store:
        rows = store.query("SELECT status FROM journal WHERE job_id=? AND kind='reshape_running'", (job_id,))
    assert [r["status"] for r in rows] == ["recovered"]
