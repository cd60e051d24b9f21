"""A job's whole-GPU count changed through the live gateway on the real local cluster (22.05 here, 24.11 in CI).

The verified form (`gpu_count`): `Gres=gpu:P NumNodes=K-K NodeList=` on a pending or held job; a running job
goes through requeuehold first. Each test checks where the job then runs: every srun task prints its node and
`SLURM_JOB_GPUS`, which must agree with squeue's `gpu_alloc`.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from slurm_elastico.errors import InvalidActionError
from slurm_elastico.model import Action, ActionKind, GresRequest, JobState
from slurm_elastico.slurm.gateway import SlurmGateway

from live_helpers import wait_for

pytestmark = pytest.mark.live

TASKS = """#!/bin/sh
echo "start restarts=${SLURM_RESTART_COUNT:-0}"
srun /bin/sh -c 'echo "task node=$SLURMD_NODENAME gpus=$SLURM_JOB_GPUS"'
sleep 60
"""


class GpuJobs:
    """sbatch (argv, no shell) into `root`; reads each job's task lines; cancels every job afterwards."""

    def __init__(self, env: dict[str, str], root: Path):
        self.env, self.root, self.ids = {**os.environ, **env}, root, []
        self.script = root / "tasks.sh"
        self.script.write_text(TASKS)

    def submit(self, *options: str) -> int:
        done = subprocess.run(["sbatch", "--parsable", "--open-mode=append", f"--output={self.root}/%j.out",
                               *options, str(self.script)], env=self.env, capture_output=True, text=True,
                              timeout=30, check=True)
        self.ids.append(int(done.stdout.strip().split(";")[0]))
        return self.ids[-1]

    def runs(self, job_id: int) -> list[list[tuple[str, tuple[int, ...]]]]:
        """Per run of the job, its tasks' (node, GPU indices), in output order."""
        path = self.root / f"{job_id}.out"
        runs: list[list[tuple[str, tuple[int, ...]]]] = []
        for line in path.read_text().splitlines() if path.exists() else []:
            if line.startswith("start "):
                runs.append([])
            elif line.startswith("task ") and runs:
                fields = dict(kv.split("=", 1) for kv in line.split()[1:])
                runs[-1].append((fields["node"], tuple(int(i) for i in fields["gpus"].split(",") if i)))
        return runs


@pytest.fixture
def jobs(slurm_env, tmp_path):
    j = GpuJobs(slurm_env, tmp_path)
    yield j
    subprocess.run(["scancel", *map(str, j.ids)], env=j.env, capture_output=True, timeout=30)


def run_tasks(gateway: SlurmGateway, jobs: GpuJobs, job_id: int, runs: int, tasks: int):
    """Wait for run number `runs` of the job to print all `tasks` task lines; return them and squeue's view."""
    wait_for(lambda: len(jobs.runs(job_id)) >= runs and len(jobs.runs(job_id)[runs - 1]) >= tasks,
             f"run {runs} of job {job_id} with {tasks} task(s)")
    view = wait_for(lambda: (v := gateway.job(job_id)).state is JobState.RUNNING and v.gpu_alloc and v,
                    f"job {job_id} running with its GPUs")
    return sorted(jobs.runs(job_id)[runs - 1]), view


def alloc_by_node(view) -> list[tuple[str, tuple[int, ...]]]:
    by: dict[str, list[int]] = {}
    for node, index, shares in view.gpu_alloc:
        assert shares == 0, f"job {view.job_id} holds a share, not a whole GPU: {view.gpu_alloc}"
        by.setdefault(node, []).append(index)
    return sorted((n, tuple(sorted(i))) for n, i in by.items())


def test_gpu_count_of_a_pending_job_1_2_4_and_back_to_1(gateway, jobs):
    job = jobs.submit("--hold", "--gres=gpu:1", "--nodes=1")
    for gpus, nodes, per_node, count in ((2, (), 2, 1), (4, ("n2", "n3"), 2, 2), (4, ("n1",), 4, 1),
                                         (2, (), 2, 1), (1, ("n4",), 1, 1)):
        gateway.apply(Action(ActionKind.SET_GPUS, job, "test", gpus=gpus, nodes=nodes))  # reads back itself
        view = gateway.job(job)
        assert view.held and view.gres == GresRequest("gpu", per_node), (gpus, nodes, view.gres)
    gateway.release(job)
    tasks, view = run_tasks(gateway, jobs, job, runs=1, tasks=1)
    assert view.nodes == ("n4",) and len(view.gpu_alloc) == 1
    assert tasks == alloc_by_node(view)  # the task sees exactly the GPU squeue says it holds


def test_gpu_count_of_a_pending_job_across_two_nodes_runs_on_those_gpus(gateway, jobs):
    job = jobs.submit("--hold", "--gres=gpu:1", "--nodes=1")
    gateway.apply(Action(ActionKind.SET_GPUS, job, "test", gpus=4, nodes=("n2", "n3")))
    gateway.release(job)
    tasks, view = run_tasks(gateway, jobs, job, runs=1, tasks=2)
    assert view.nodes == ("n2", "n3") and len(view.gpu_alloc) == 4
    assert tasks == alloc_by_node(view) and all(len(gpus) == 2 for _, gpus in tasks)


def test_running_job_requeued_from_2_to_1_gpu_and_started_again(gateway, jobs):
    job = jobs.submit("--requeue", "--gres=gpu:2", "--nodes=1")
    first, view = run_tasks(gateway, jobs, job, runs=1, tasks=1)
    assert len(first) == 1 and len(first[0][1]) == 2 and first == alloc_by_node(view)
    began = time.monotonic()
    gateway.apply(Action(ActionKind.RESHAPE_RUNNING, job, "test", gpus=1))
    second, view = run_tasks(gateway, jobs, job, runs=2, tasks=1)
    print(f"GPU-count reshape 2 -> 1: running again {time.monotonic() - began:.1f} s after the action")
    assert view.restarts == 1 and view.gres == GresRequest("gpu", 1)
    assert len(second) == 1 and len(second[0][1]) == 1 and second == alloc_by_node(view)


def test_running_job_requeued_from_one_node_to_two_and_back_starts_at_once_each_time(gateway, jobs):
    """The node count of a job that already ran: 22.05 keeps the old one in squeue's `node_count` until the job
    starts, so the read-back must use what it does update (`tres_req_str`); else the gateway refuses the change
    and skips `StartTime=now`, and Slurm waits ~120 s before starting the job again."""
    job = jobs.submit("--requeue", "--gres=gpu:1", "--nodes=1")
    run_tasks(gateway, jobs, job, runs=1, tasks=1)
    for run, gpus, nodes, tasks in ((2, 4, ("n2", "n3"), 2), (3, 1, (), 1)):
        began = time.monotonic()
        gateway.apply(Action(ActionKind.RESHAPE_RUNNING, job, "test", gpus=gpus, nodes=nodes))
        got, view = run_tasks(gateway, jobs, job, runs=run, tasks=tasks)
        waited = time.monotonic() - began
        print(f"GPU-count reshape to {gpus} GPU(s) on {tasks} node(s): running again {waited:.1f} s after the action")
        assert waited < 60, "Slurm's ~120 s requeue delay: the gateway did not set StartTime=now"
        assert view.restarts == run - 1 and len(view.nodes) == tasks and len(view.gpu_alloc) == gpus
        assert got == alloc_by_node(view) and all(len(g) == gpus // tasks for _, g in got)
        if nodes:
            assert view.nodes == nodes


def test_mps_job_to_whole_gpus_by_version(gateway, jobs):
    """22.05 refuses mps → gpu on a pending job, so the gateway refuses first; 24.11 carries it out."""
    job = jobs.submit("--hold", "--gres=mps:50", "--nodes=1")
    version = gateway.snapshot().slurm_version
    action = Action(ActionKind.SET_GPUS, job, "test", gpus=2)
    if version.startswith("22."):
        with pytest.raises(InvalidActionError, match=r"Slurm 22\.05\.\d+ refuses to switch a pending job from mps"):
            gateway.apply(action)
        assert gateway.job(job).gres == GresRequest("mps", 50)  # unchanged
        return
    gateway.apply(action)
    gateway.release(job)
    tasks, view = run_tasks(gateway, jobs, job, runs=1, tasks=1)
    assert view.gres == GresRequest("gpu", 2) and len(tasks[0][1]) == 2 and tasks == alloc_by_node(view)
