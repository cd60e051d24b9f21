"""`elastico trace from-sacct` on the real local cluster's accounting (slurmdbd and MariaDB).

GPU jobs that completed, an array of two GPU tasks, a GPU job still running, one cancelled while it waited (a job
held and cancelled before it was ever eligible is not in sacct's window at all) and one that asked for no GPU: the trace file holds the GPU jobs that ran or run, each array task a row of its own,
not the other two, which the summary counts with their reasons; a window with no job writes nothing and exits 1.
"""

from __future__ import annotations

import csv
import json
import subprocess
import time

import pytest

from slurm_elastico.model import JobState
from slurm_elastico.slurm.accounting import runs_by_job

from live_helpers import BIN, Cluster, wait_for

pytestmark = pytest.mark.live


def sbatch(c: Cluster, *options: str, seconds: int = 1) -> int:
    path = c.root / "job.sh"
    path.write_text(f"#!/bin/bash\nsleep {seconds}\n")
    done = subprocess.run(["sbatch", "--parsable", f"--output={c.root}/%j.out", *options, str(path)],
                          env=c.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    c.ids.append(int(done.stdout.strip().split(";")[0]))
    return c.ids[-1]


def trace(c: Cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "elastico"), "--config", str(c.root / "elastico.yaml"), "trace", "from-sacct",
                           *args], env=c.env, capture_output=True, text=True, timeout=120)


def test_the_trace_holds_the_gpu_jobs_and_counts_the_skipped_ones(slurm_cluster, tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {})
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    try:
        done = sbatch(c, "--gres=gpu:1")
        array = sbatch(c, "--gres=gpu:1", "--array=0-1")
        plain = sbatch(c)  # no GPU
        running = sbatch(c, "--gres=gpu:1", seconds=120)
        node = wait_for(lambda: c.gateway.job(running).nodes, "the long job to start", 60)[0]
        # pending (eligible: sacct lists it; a held job, never eligible, it would not), then cancelled
        never = sbatch(c, "--gres=gpu:1", "--exclusive", f"--nodelist={node}")
        wait_for(lambda: c.gateway.job(never).state is JobState.PENDING, "the exclusive job to wait", 30)
        time.sleep(2)
        subprocess.run(["scancel", str(never)], env=c.env, capture_output=True, timeout=30, check=True)
        waiting = sbatch(c, "--gres=gpu:1", "--exclusive", f"--nodelist={node}", "--array=0-2")  # none can start

        seen: dict = {}

        def recorded():
            runs = runs_by_job(c.gateway.sacct(start=since))
            last = {j: r[-1] for j, r in runs.items()}
            seen.clear()
            seen.update({j: (r.state.value, r.array_job_id, r.array_task_id) for j, r in last.items()})
            tasks = [r for r in last.values() if r.array_job_id == array]
            return (last.get(done) and last[done].state is JobState.COMPLETED
                    and last.get(plain) and last[plain].state is JobState.COMPLETED
                    and last.get(never) and last[never].state is JobState.CANCELLED
                    and last.get(running) and last[running].state is JobState.RUNNING
                    and len(tasks) == 2 and all(r.state is JobState.COMPLETED for r in tasks)
                    and last.get(waiting) and last[waiting].state is JobState.PENDING)

        try:
            wait_for(recorded, "accounting to show every job as it ended (or runs)", 90)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; sacct shows {seen} for done {done}, array {array}, plain {plain}, never "
                                 f"{never}, running {running}") from None
        out = tmp_path / "trace.csv"
        got = trace(c, "--since", since, "--out", str(out), "--json")
        assert got.returncode == 0, got.stderr
        summary = json.loads(got.stdout.strip().splitlines()[-1])
        rows = {r["job_id"]: r for r in csv.DictReader(out.open())}
        # the window may also hold the end of an earlier test's jobs: ours are checked by id
        assert {str(done), f"{array}_0", f"{array}_1", str(running)} <= set(rows)
        assert not {str(plain), str(never), str(array)} & set(rows)
        assert summary["kept"] == len(rows) >= 4 and summary["array_tasks"] >= 2 and summary["running"] >= 1
        assert summary["skipped"]["no GPU"] >= 1 and summary["skipped"]["cancelled before it started"] >= 1
        assert summary["jobs_seen"] == summary["kept"] + sum(summary["skipped"].values())
        assert summary["bad_records"] == []
        d = rows[str(done)]
        assert (d["state"], d["gpus"], d["user"]) == ("COMPLETED", "1", "root")
        assert int(d["run_s"]) >= 1 and int(d["wait_s"]) >= 0 and int(d["end"]) >= int(d["start"])
        assert rows[str(running)]["end"] == "" and rows[str(running)]["state"] == "RUNNING"
        # sacct prints an array none of whose tasks started as one record: a pending row per task
        assert {f"{waiting}_{t}" for t in range(3)} <= set(rows) and str(waiting) not in rows
        assert {rows[f"{waiting}_{t}"]["state"] for t in range(3)} == {"PENDING"}

        empty = tmp_path / "empty.csv"
        got = trace(c, "--since", "2020-01-01", "--until", "2020-01-02", "--out", str(empty))
        assert got.returncode == 1 and "no GPU job in accounting" in got.stderr and not empty.exists()
        nowhere = tmp_path / "no such directory" / "trace.csv"
        got = trace(c, "--since", since, "--out", str(nowhere))
        assert got.returncode == 2 and f"--out {nowhere}" in got.stderr and "existing directory" in got.stderr, got
        assert "Traceback" not in got.stderr
    finally:
        c.cancel_all()
