"""The gateway against the real local Slurm cluster: snapshots, share updates, requeue, signals, errors.

Each job prints what it sees (node, GPU, MPS percentage, restart count), so the
tests compare the gateway's view with the job's own.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from slurm_elastico.errors import InvalidActionError, JobNotPendingError, UnknownJobError
from slurm_elastico.model import JobState
from slurm_elastico.slurm.gateway import SlurmGateway

from live_helpers import wait_for

pytestmark = pytest.mark.live

JOB = """#!/bin/bash
echo "start node=$SLURMD_NODENAME gpus=$SLURM_JOB_GPUS cvd=$CUDA_VISIBLE_DEVICES mps=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE restarts=${SLURM_RESTART_COUNT:-0}"
trap 'echo "signal USR1"' USR1
for i in $(seq 1 600); do sleep 0.1; done
"""

HOSTILE = "it's \"q\"; $(touch /nonexistent/x) `id` | ünï ✓\nsecond line"


class Jobs:
    """Submits test jobs with sbatch (argv, no shell) and cancels every one of them afterwards."""

    def __init__(self, env: dict[str, str], tmp_path: Path):
        self.env, self.dir, self.ids = env, tmp_path, []
        self.script = tmp_path / "job.sh"
        self.script.write_text(JOB)

    def submit(self, *options: str) -> int:
        out = subprocess.run(
            ["sbatch", "--parsable", "--open-mode=append", f"--output={self.dir}/%j.out", *options, str(self.script)],
            env={**_os_env(), **self.env}, capture_output=True, text=True, timeout=30, check=True,
        )
        job_id = int(out.stdout.strip().split(";")[0])
        self.ids.append(job_id)
        return job_id

    def lines(self, job_id: int) -> list[str]:
        p = self.dir / f"{job_id}.out"
        return p.read_text().splitlines() if p.exists() else []

    def starts(self, job_id: int) -> list[dict[str, str]]:
        return [dict(kv.split("=", 1) for kv in line.split()[1:]) for line in self.lines(job_id) if line.startswith("start ")]

    def cancel_all(self) -> None:
        if self.ids:
            subprocess.run(["scancel", *map(str, self.ids)], env={**_os_env(), **self.env}, capture_output=True, timeout=30)


def _os_env() -> dict[str, str]:
    import os

    return dict(os.environ)


@pytest.fixture
def jobs(slurm_env, tmp_path):
    j = Jobs(slurm_env, tmp_path)
    yield j
    j.cancel_all()


def wait_running(gateway: SlurmGateway, jobs: Jobs, job_id: int, count: int = 1) -> dict[str, str]:
    """Wait until the job runs and has printed its `count`-th start line; return that line's fields."""
    wait_for(lambda: gateway.job(job_id).state is JobState.RUNNING, what=f"job {job_id} running")
    return wait_for(lambda: len(jobs.starts(job_id)) >= count and jobs.starts(job_id)[count - 1],
                    what=f"start line {count} of job {job_id}")


def test_idle_cluster_snapshot(gateway, slurm_cluster):
    snap = gateway.snapshot()
    assert snap.slurm_version[:5] in ("22.05", "24.11", "26.05")
    assert [n.name for n in snap.nodes] == ["n1", "n2", "n3", "n4"]
    assert all(len(n.gpus) == 4 and n.usable for n in snap.nodes)
    assert all(g.shares_total == 100 for g in snap.gpus) and len(snap.gpus) == 16
    busy = {j.job_id for j in snap.jobs}
    assert sum(g.shares_used for g in snap.gpus if not set(g.job_ids) & busy) == 0
    assert "debug" in {p.name for p in snap.partitions}


def test_mps_jobs_land_where_the_snapshot_says(gateway, jobs):
    shares = [60, 50, 40, 30, 70]
    ids = [jobs.submit(f"--gres=mps:{s}", "--job-name=land") for s in shares]
    seen = {i: wait_running(gateway, jobs, i) for i in ids}
    snap = gateway.snapshot()
    for job_id, share in zip(ids, shares):
        view = snap.job(job_id)
        assert view.mps_share == share
        ((node, index, held),) = view.gpu_alloc
        assert held == share
        assert seen[job_id]["node"] == node
        assert int(seen[job_id]["gpus"]) == index
        assert int(seen[job_id]["mps"]) == share
        gpu = snap.node(node).gpus[index]
        assert job_id in gpu.job_ids
    for gpu in snap.gpus:
        assert gpu.shares_used <= gpu.shares_total


def test_pending_share_update_changes_what_the_job_sees(gateway, jobs):
    job_id = jobs.submit("--gres=mps:20", "--hold")
    assert gateway.job(job_id).held
    gateway.set_share(job_id, 35)
    assert gateway.job(job_id).mps_share == 35
    jobs_release = ["scontrol", "release", str(job_id)]
    subprocess.run(jobs_release, env={**_os_env(), **jobs.env}, check=True, capture_output=True, timeout=30)
    seen = wait_running(gateway, jobs, job_id)
    assert seen["mps"] == "35"


def test_requeue_with_new_share_runs_again_within_seconds(gateway, jobs):
    job_id = jobs.submit("--gres=mps:20", "--requeue")
    first = wait_running(gateway, jobs, job_id)
    assert first["mps"] == "20" and first["restarts"] == "0"
    t0 = time.monotonic()
    gateway.requeue_with_share(job_id, 60)
    second = wait_running(gateway, jobs, job_id, count=2)
    elapsed = time.monotonic() - t0
    print(f"\nrequeue-hold -> running with the new share: {elapsed:.1f} s")
    assert second["mps"] == "60" and second["restarts"] == "1"
    view = gateway.job(job_id)
    assert view.restarts == 1 and view.mps_share == 60 and not view.held
    assert elapsed < 60, "StartTime=now should bring the job back long before Slurm's 120 s BeginTime"


def test_preempt_holds_the_job_with_its_request_and_resume_restarts_it_on_the_given_node(gateway, jobs):
    # What elastico's allotment and Tiresias do to a longer job: requeue-held, later released on chosen nodes.
    job_id = jobs.submit("--gres=mps:30", "--requeue")
    first = wait_running(gateway, jobs, job_id)
    gateway.preempt(job_id)
    held = gateway.job(job_id)
    assert held.state is JobState.PENDING and held.held and held.mps_share == 30
    time.sleep(3)
    assert gateway.job(job_id).state is JobState.PENDING, "a held job must not start again by itself"
    node = "n2" if first["node"] != "n2" else "n3"
    gateway.resume(job_id, (node,))
    second = wait_running(gateway, jobs, job_id, count=2)
    assert (second["node"], second["mps"], second["restarts"]) == (node, "30", "1")
    assert not gateway.job(job_id).held


def test_signal_reaches_the_batch_script(gateway, jobs):
    job_id = jobs.submit("--gres=mps:10")
    wait_running(gateway, jobs, job_id)
    gateway.signal(job_id, "USR1")
    wait_for(lambda: "signal USR1" in jobs.lines(job_id), what="the batch script's USR1 trap")
    assert gateway.job(job_id).state is JobState.RUNNING


@pytest.mark.parametrize("share", [0, 500])
def test_bad_share_refused_and_nothing_changes(gateway, jobs, share):
    job_id = jobs.submit("--gres=mps:15", "--hold")
    with pytest.raises(InvalidActionError, match="1 to 100"):
        gateway.set_share(job_id, share)
    assert gateway.job(job_id).mps_share == 15


def test_unknown_job_raises_typed_error(gateway):
    with pytest.raises(UnknownJobError) as e:
        gateway.set_share(987654, 20)
    assert e.value.argv[:2] == ("scontrol", "update") and e.value.returncode != 0
    assert "invalid job id" in e.value.stderr.lower()


def test_running_job_gres_change_refused_and_unchanged(gateway, jobs):
    job_id = jobs.submit("--gres=mps:25")
    wait_running(gateway, jobs, job_id)
    with pytest.raises(JobNotPendingError) as e:
        gateway.set_share(job_id, 50)
    assert "pending" in e.value.stderr.lower()
    view = gateway.job(job_id)
    assert view.state is JobState.RUNNING and view.mps_share == 25 and view.restarts == 0


def test_hostile_names_and_comments_pass_unharmed(gateway, jobs):
    job_id = jobs.submit("--gres=mps:5", "--hold", f"--job-name={HOSTILE}", f"--comment={HOSTILE}")
    gateway.set_admin_comment(job_id, HOSTILE)
    view = gateway.snapshot().job(job_id)
    assert view.name == HOSTILE and view.comment == HOSTILE and view.admin_comment == HOSTILE
    assert not Path("/nonexistent/x").exists()
    gateway.set_share(job_id, 6)  # an update of a job with such a name still works
    assert gateway.job(job_id).mps_share == 6
