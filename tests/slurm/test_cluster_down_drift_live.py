"""`LocalCluster.down` stops its daemons when it cannot read the job list, on a real cluster.

A Slurm newer than the parsers (a JSON schema they refuse) must not leave a user unable to stop the local
cluster: `down` then cancels the jobs by squeue's plain job ids, and when even those cannot be read it still
stops every daemon and says why no job was cancelled. The drift is made by a runner around the real one that
renames the schema in every JSON answer, as an unknown Slurm release would print it; the daemons, the jobs
and the commands are real.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from slurm_elastico.cluster import LocalCluster, daemons
from slurm_elastico.cluster.config import Layout
from slurm_elastico.cluster.startup import COMMAND_TIMEOUT_S, slurm_env
from slurm_elastico.errors import ClusterError
from slurm_elastico.slurm.runner import Completed, SubprocessRunner

pytestmark = pytest.mark.live

PORT_BASE_DRIFT = 27417
"""Ports of their own (slurmd at base + 184), away from test_cluster_live's and the session cluster's."""


class Drift:
    """The real runner, with the schema of each JSON answer renamed once `on`; `junk` breaks the plain text too."""

    def __init__(self, state_dir):
        self.real = SubprocessRunner(slurm_env(Layout(state_dir)), COMMAND_TIMEOUT_S)
        self.on = self.junk = False

    def __call__(self, argv, *, timeout=None) -> Completed:
        out = self.real(argv, timeout=timeout)
        if self.on and "--json" in argv:
            return Completed(out.argv, out.returncode, re.sub(r"v0\.0\.\d+", "v0.0.99", out.stdout), out.stderr)
        if self.junk and "--json" not in argv and os.path.basename(argv[0]) == "squeue":
            return Completed(out.argv, out.returncode, "JOBID\n" + out.stdout, out.stderr)
        return out


def _submit(cluster: LocalCluster) -> str:
    out = subprocess.run(["sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 300"],
                         env={**os.environ, **cluster.env()}, capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.strip()


def _alive(pids) -> list[int]:
    # kill -0 succeeds on zombies: read the state from /proc instead.
    return [pid for pid in pids if daemons.proc_state(pid) not in (None, "Z", "X")]


def test_down_cancels_by_plain_job_ids_and_stops_every_daemon_when_the_json_is_unknown(tmp_path):
    drift = Drift(tmp_path / "c")
    cluster = LocalCluster(tmp_path / "c", port_base=PORT_BASE_DRIFT, runner=drift)
    try:
        started = cluster.up().started
        job = _submit(cluster)
        pids = [d.pid for d in cluster.status().daemons]
        drift.on = True
        with pytest.raises(ClusterError, match=r"(scontrol show node|sinfo) --json: .*v0\.0\.99.*does not read"):
            cluster.status()  # what made `down` fail before: the job list is read the same way
        result = cluster.down()
        assert result.cancelled_jobs == 1 and result.jobs_problem == "", (job, result)
        assert set(result.stopped) == set(started) and _alive(pids) == []
    finally:
        drift.on = drift.junk = False
        cluster.down()


def test_down_stops_every_daemon_even_when_no_job_list_can_be_read(tmp_path):
    drift = Drift(tmp_path / "c")
    cluster = LocalCluster(tmp_path / "c", port_base=PORT_BASE_DRIFT + 10, nodes=1, runner=drift)
    try:
        started = cluster.up().started  # no job: one left uncancelled would outlive the test
        pids = [d.pid for d in cluster.status().daemons]
        drift.on = drift.junk = True
        result = cluster.down()
        assert result.cancelled_jobs == 0 and "'JOBID' where a job id was expected" in result.jobs_problem
        assert set(result.stopped) == set(started) and _alive(pids) == []
    finally:
        drift.on = drift.junk = False
        cluster.down()
