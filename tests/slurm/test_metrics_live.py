"""The helper's Prometheus endpoint scraped while `elastico sched --interval` runs against the real local cluster.

A job submitted with elastico-submit is pending (BeginTime in the future); the
helper sets its share, and the scraped counters say so. Its output is one
JSON object per line (`--log-format json`).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import urllib.error
import urllib.request

import pytest

from live_helpers import BIN, PLANNED_FAMILY, Cluster, wait_for

pytestmark = pytest.mark.live

SAMPLE = re.compile(r'^([a-z_]+(?:\{[^}]*\})?) (\S+)$', re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            return {k: float(v) for k, v in SAMPLE.findall(r.read().decode())}
    except (urllib.error.URLError, ConnectionError):
        return {}  # not listening yet


def test_the_metrics_endpoint_is_scraped_while_the_helper_acts(slurm_cluster, tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {"fam.yaml": PLANNED_FAMILY},
                config=f"gpu: {{memory_mib: 16000}}\nslurm: {{conf: {slurm_cluster.env()['SLURM_CONF']}}}\n")
    (tmp_path / "job.sh").write_text("#!/bin/bash\nsleep 30\n")
    try:
        job_id = c.submit("fam.yaml", tmp_path / "job.sh", options=("--begin=now+600",))
        port = free_port()
        helper = subprocess.Popen([str(BIN / "elastico"), "--config", str(tmp_path / "elastico.yaml"), "sched",
                                   "--interval", "1", "--epochs", "8", "--metrics-port", str(port),
                                   "--log-format", "json"], env=c.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            done = 'elastico_actions_total{kind="set_share",outcome="done"}'
            seen = wait_for(lambda: (s := scrape(port)).get('elastico_epochs_total{result="ok"}', 0) >= 2
                            and s.get(done) and s, "two epochs and a share set, in the scraped metrics", 60)
            assert seen[done] == 1 and seen["elastico_managed_jobs"] >= 1
            assert seen["elastico_epoch_duration_seconds_count"] >= 2
            assert seen['elastico_epoch_duration_seconds_bucket{le="+Inf"}'] == seen["elastico_epoch_duration_seconds_count"]
            assert f'elastico_predicted_slowdown{{job_id="{job_id}"}}' in seen
            out, err = helper.communicate(timeout=60)
        finally:
            if helper.poll() is None:
                helper.kill()
                helper.communicate()
        assert helper.returncode == 0, err
        lines = [json.loads(line) for line in out.splitlines()]  # every line is one JSON object
        assert len(lines) == 8 and all(d["event"] == "epoch" and d["level"] in ("info", "warning") for d in lines)
        assert any(a["job_id"] == job_id and a["kind"] == "set_share" and a["status"] == "done"
                   for d in lines for a in d["actions"])
        assert all(json.loads(line)["event"] == "log" for line in err.splitlines())
        assert c.gateway.job(job_id).mps_share == 100
    finally:
        c.cancel_all()
