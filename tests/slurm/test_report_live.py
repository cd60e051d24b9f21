"""`elastico report` on the real local cluster: a running job and a finished one are not runaway.

A runaway job (accounting shows it active, slurmctld no longer knows it: `report.metrics`) cannot be made
here without destroying the shared cluster's state, so the rule's positive case is a unit test
(tests/unit/test_report.py). This test checks the boundary it rests on: the job ids and states slurmctld's
answer and accounting's give for the same jobs agree on both Slurm versions, so the check marks none of
them, even as if asked two minutes later (jobs this fresh are otherwise inside its margin); the command
prints the jobs, and over a window with no job an empty report.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from slurm_elastico.model import JobState
from slurm_elastico.report import job_rows
from slurm_elastico.slurm.accounting import runs_by_job

from live_helpers import BIN, Cluster, wait_for

pytestmark = pytest.mark.live


def sbatch(c: Cluster, script: str) -> int:
    path = c.root / f"job{len(c.ids)}.sh"
    path.write_text(script)
    done = subprocess.run(["sbatch", "--parsable", "--gres=gpu:1", f"--output={c.root}/%j.out", str(path)],
                          env=c.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    c.ids.append(int(done.stdout.strip().split(";")[0]))
    return c.ids[-1]


def test_report_marks_no_job_slurmctld_knows_as_runaway(slurm_cluster, tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {})
    try:
        short = sbatch(c, "#!/bin/bash\nsleep 1\n")
        long = sbatch(c, "#!/bin/bash\nsleep 60\n")
        g = c.gateway

        def both_recorded():
            runs = runs_by_job(g.sacct(start="now-1hours", job_ids=(short, long)))
            done = runs.get(short) and runs[short][-1].state is JobState.COMPLETED
            running = runs.get(long) and runs[long][-1].state is JobState.RUNNING
            return done and running

        wait_for(both_recorded, "accounting to show the short job completed and the long one running", 60)
        asked_at = time.time()
        active = {j.job_id for j in g.jobs()}
        records = g.sacct(start="now-1hours", job_ids=(short, long))
        assert long in active and short not in active
        rows = {r.job_id: r for r in job_rows(records, {}, {}, controller_jobs=active,
                                              controller_at=asked_at + 120)}
        assert set(rows) == {short, long}
        assert not rows[short].runaway and not rows[long].runaway
        assert rows[long].state == "RUNNING" and rows[short].jct_s is not None

        out = subprocess.run([str(BIN / "elastico"), "--config", str(c.root / "elastico.yaml"), "report",
                              "--start", "now-1hours", "--format", "json"],
                             env=c.env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        listed = {j["job_id"]: j for j in json.loads(out.stdout)["jobs"]}
        assert {short, long} <= set(listed)
        assert not listed[short]["runaway"] and not listed[long]["runaway"]

        # a window no job falls in is an empty report (22.05's sacct says "Nothing found" in its errors), not an outage
        out = subprocess.run([str(BIN / "elastico"), "--config", str(c.root / "elastico.yaml"), "report",
                              "--start", "2020-01-01", "--end", "2020-01-02", "--format", "json"],
                             env=c.env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["jobs"] == []
    finally:
        c.cancel_all()
