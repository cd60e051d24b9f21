"""The replay of the real local cluster's own past (slurmctld, slurmd, slurmdbd and MariaDB): jobs that waited for
GPUs on the real Slurm, imported from sacct, replayed on the cluster's shape read from Slurm; the simulated starts
must be the real ones within seconds. Then `elastico whatif --json` on the same window ends with the JSON the
checks read."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from slurm_elastico.history.past import past_jobs
from slurm_elastico.history.replay import replay
from slurm_elastico.history.shape import from_snapshot
from slurm_elastico.model import JobState
from slurm_elastico.slurm.accounting import runs_by_job

from live_helpers import BIN, Cluster, wait_for

pytestmark = pytest.mark.live

RUNS_S = (16, 8, 20, 12, 10, 18, 8, 14)
"""Eight jobs of four GPUs each (a whole node) on 4 nodes: the last four wait for the first ones, each for a
different node's end; waits of several seconds, so that Slurm's whole-second accounting weighs little in their
mean."""


def quiet_window(c: Cluster, timeout: float = 120) -> str:
    """The start of a window that holds this test's jobs alone (sacct's --starttime, whole seconds): once no job of
    an earlier test on this worker's cluster is queued, the next whole second after the last one ended."""
    wait_for(lambda: not c.queue(), "the queue of earlier tests' jobs to empty", timeout)
    since = int(time.time()) + 1
    time.sleep(since + 0.2 - time.time())
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))


def listing(jobs) -> list[tuple]:
    """What an assertion shows of each job: id, submit, start, end, GPUs, shares, restarts, state."""
    return [(j.job_id, j.submit, j.start, j.end, j.gpus, j.mps, j.restarts, j.state) for j in jobs]


def sleepers(c: Cluster, runs_s, since: str, *options: str) -> list[int]:
    """Submit one whole-node sleep job per entry of `runs_s` (plain sbatch, half a second apart) and wait until
    accounting shows each completed; their ids."""
    ours = []
    for seconds in runs_s:
        path = c.root / f"job{len(ours)}.sh"
        path.write_text(f"#!/bin/bash\nsleep {seconds}\n")
        done = subprocess.run(["sbatch", "--parsable", f"--output={c.root}/%j.out", "--gres=gpu:4", *options,
                               "--job-name=whatif-live", str(path)], env=c.env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        ours.append(int(done.stdout.strip().split(";")[0]))
        c.ids.append(ours[-1])
        time.sleep(0.5)

    def ended():
        last = {j: r[-1] for j, r in runs_by_job(c.gateway.sacct(start=since)).items()}
        return all(j in last and last[j].state is JobState.COMPLETED and last[j].end_time for j in ours)

    wait_for(ended, "accounting to show every job completed", 120)
    return ours


def test_the_replay_starts_the_jobs_when_slurm_did(slurm_cluster, tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {})
    since = quiet_window(c)
    try:
        ours = sleepers(c, RUNS_S, since, "--nodes=1")
        records, bad = c.gateway.sacct_each(start=since)
        jobs, summary = past_jobs(records, bad=bad)
        shape = from_snapshot(c.gateway.snapshot())
        assert shape.gpus == 16 and len(shape.nodes) == 4
        mine = [j for j in jobs if int(j.job_id) in ours]
        assert len(mine) == len(ours) == len(jobs), listing(jobs)  # the window holds this test's jobs alone
        assert sum(j.wait_s >= 5 for j in mine) >= 3, listing(jobs)
        result = replay(jobs, shape)
        got = {j.job_id: j for j in result.jobs}
        errors = [got[str(j)].error_s for j in ours]
        assert all(e is not None for e in errors)
        assert max(errors) <= 3, ([(j, got[str(j)].actual_wait_s, got[str(j)].simulated_wait_s) for j in ours],
                                  listing(jobs))
        stats = result.stats()
        print(f"replay of the real cluster's starts: {[(j, got[str(j)].actual_wait_s, got[str(j)].simulated_wait_s) for j in ours]}; "
              f"{stats}")
        assert stats["median_start_error_s"] <= 2
        # the mean waits (issue target: within 15 %; with Slurm's start lag taken from the jobs that found room,
        # 0.98 and 0.86 in two runs of jobs half as long, 0.70 without it; the bound leaves room for a loaded
        # machine's lag)
        assert abs(stats["mean_wait_ratio"] - 1) <= 0.25, (stats, listing(jobs))

        cli = subprocess.run([str(BIN / "elastico"), "--config", str(tmp_path / "elastico.yaml"), "whatif",
                              "--since", since, "--epoch-s", "5", "--json"],
                             env=c.env, capture_output=True, text=True, timeout=300)
        assert cli.returncode == 0, cli.stderr
        out = json.loads(cli.stdout.strip().splitlines()[-1])
        assert out["replay"]["median_start_error_s"] <= 2 and out["replay"]["compared"] >= len(ours)
        assert out["replay"]["mean_wait_ratio"] == pytest.approx(stats["mean_wait_ratio"], rel=0.5)
        assert out["predicted_ratio"] > 0 and out["predicted_ratio_range"][0] <= out["predicted_ratio"]
        assert set(out["skipped"]) >= {"no GPU", "cancelled before it started", "not finished in the window"}
        assert "static (sim)" in cli.stdout and "GPU-hours idle" in cli.stdout
    finally:
        c.cancel_all()


PARTITION_RUNS_S = (8, 6, 9, 5)
"""Four jobs of a whole node each, all of one partition of one node: each waits for the one before, though the
cluster's other nodes are idle."""


def test_the_replay_keeps_each_job_in_its_own_partition(slurm_cluster, tmp_path):
    """Partition wa holds n1 alone, wb n2 alone (made at run time beside the default partition). Four jobs of wa
    ran one after another on n1; replayed on the cluster's shape read from Slurm, each waits as it did. A replay
    that knew no partitions started all four at once on the idle nodes (errors of 6 to 23 s)."""
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {})
    made = []
    since = quiet_window(c)
    try:
        for name, node in (("wa", "n1"), ("wb", "n2")):
            done = subprocess.run(["scontrol", "create", f"PartitionName={name}", f"Nodes={node}", "State=UP"],
                                  env=c.env, capture_output=True, text=True, timeout=30)
            assert done.returncode == 0, done.stderr
            made.append(name)
        ours = sleepers(c, PARTITION_RUNS_S, since, "--partition=wa")
        records, bad = c.gateway.sacct_each(start=since)
        jobs, _ = past_jobs(records, bad=bad)
        shape = from_snapshot(c.gateway.snapshot())
        parts = {n.name: set(n.partitions) for n in shape.nodes}
        assert "wa" in parts["n1"] and "wb" in parts["n2"] and "wa" not in parts["n2"], parts
        mine = [j for j in jobs if int(j.job_id) in ours]
        assert len(mine) == len(ours) and all(j.partition == "wa" for j in mine), listing(jobs)
        assert sum(j.wait_s >= 4 for j in mine) >= 3, listing(jobs)
        got = {j.job_id: j for j in replay(mine, shape).jobs}
        waits = [(j, got[str(j)].actual_wait_s, got[str(j)].simulated_wait_s) for j in ours]
        print(f"replay of one partition's queue: {waits}")
        assert all(got[str(j)].error_s is not None and got[str(j)].error_s <= 3 for j in ours), waits
    finally:
        c.cancel_all()
        for name in made:
            subprocess.run(["scontrol", "delete", f"PartitionName={name}"], env=c.env, capture_output=True,
                           text=True, timeout=30)
