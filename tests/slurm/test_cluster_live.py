"""The local cluster against real Slurm daemons: up, an MPS job, idempotent up, down, sacct.

Each test brings up its own cluster in a tmp dir on ports away from the
session cluster (tests/conftest.py), so both can run at once. Timings of a
clean `up` and of a first `sleep 1` job are printed, not asserted.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time

import pytest

from slurm_elastico.cluster import LocalCluster, config, daemons, host
from slurm_elastico.cluster.config import Ports
from slurm_elastico.errors import ClusterError

pytestmark = pytest.mark.live

PORT_BASE_PLAIN = 26817
PORT_BASE_ACCOUNTING = 26917
PORT_BASE_BROKEN = 27017
PORT_BASE_TAKEN = 27317
"""Each test's clusters have ports of their own (slurmd at base + 184): under pytest-xdist they may run at once."""


def slurm(env: dict[str, str], *argv: str, timeout: float = 30) -> str:
    out = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=timeout, check=False)
    assert out.returncode == 0, f"{argv} failed: {out.stderr}"
    return out.stdout


def wait_for_state(env: dict[str, str], job: str, timeout: float = 30) -> str:
    """Poll until the job ends; return its final state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = slurm(env, "scontrol", "-o", "show", "job", job)
        state = re.search(r"JobState=(\S+)", line).group(1)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state
        time.sleep(0.1)
    raise AssertionError(f"job {job} did not finish within {timeout} s: {line}")


def show(capsys, text: str) -> None:
    with capsys.disabled():
        print(f"\n[cluster timing] {text}")


@pytest.fixture
def make_cluster(tmp_path):
    """Build LocalClusters under tmp_path and always stop them, even when a test fails."""
    made: list[LocalCluster] = []

    def make(**kw) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"c{len(made)}", **kw)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.down()


def test_up_runs_an_mps_job_is_idempotent_and_down_leaves_nothing(make_cluster, tmp_path, capsys):
    cluster = make_cluster(port_base=PORT_BASE_PLAIN)
    result = cluster.up()
    show(capsys, f"clean up without accounting: {result.seconds:.2f} s ({result.version})")
    assert set(result.started) == {"munged", "slurmctld", "slurmd-n1", "slurmd-n2", "slurmd-n3", "slurmd-n4"}
    env = cluster.env()

    nodes = [line.split() for line in slurm(env, "sinfo", "-h", "-N", "-o", "%N %t %G").splitlines()]
    assert sorted(n[0] for n in nodes) == ["n1", "n2", "n3", "n4"]
    for name, state, gres in nodes:
        assert state == "idle", nodes
        assert re.search(r"gpu:4\b", gres) and re.search(r"mps:400\b", gres), gres

    out = tmp_path / "job-%j.out"
    start = time.monotonic()
    job = slurm(env, "sbatch", "--parsable", "--gres=mps:25", f"--output={out}",
                "--wrap", "echo $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; sleep 1").strip()
    assert wait_for_state(env, job) == "COMPLETED"
    show(capsys, f"first sleep-1 job submit-to-COMPLETED: {time.monotonic() - start:.2f} s")
    assert (tmp_path / f"job-{job}.out").read_text().split() == ["25"]

    again = cluster.up()
    assert again.already_running and again.started == ()

    # A half-started cluster is repaired: only the missing slurmd is started.
    daemons.stop(cluster.state_dir / "run" / "slurmd-n3.pid", "slurmd")
    assert cluster.up().started == ("slurmd-n3",)

    running = slurm(env, "sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 300").strip()
    pids = [d.pid for d in cluster.status().daemons]
    assert all(pids) and len(pids) == 6
    stopped = cluster.down()
    assert stopped.cancelled_jobs == 1, running
    assert set(stopped.stopped) == set(result.started)
    # kill -0 succeeds on zombies: read the state from /proc instead.
    assert [daemons.proc_state(pid) for pid in pids if daemons.proc_state(pid) not in (None, "Z", "X")] == []
    assert cluster.status().stopped
    assert cluster.down().stopped == ()


def test_accounting_lists_the_job_in_sacct_json(make_cluster, tmp_path, capsys):
    cluster = make_cluster(port_base=PORT_BASE_ACCOUNTING, accounting=True, nodes=2)
    result = cluster.up()
    show(capsys, f"clean up with accounting (MariaDB + slurmdbd): {result.seconds:.2f} s")
    assert {"mariadbd", "slurmdbd"} <= set(result.started)
    env = cluster.env()
    job = slurm(env, "sbatch", "--parsable", "--gres=mps:25", "--comment=elastico-live",
                f"--output={tmp_path / 'acct.out'}", "--wrap", "true").strip()
    assert wait_for_state(env, job) == "COMPLETED"

    deadline = time.monotonic() + 15
    while True:  # the controller hands finished jobs to slurmdbd asynchronously
        jobs = {str(j["job_id"]): j for j in json.loads(slurm(env, "sacct", "--json", "-X"))["jobs"]}
        if job in jobs or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert job in jobs, f"sacct does not list job {job}: {sorted(jobs)}"
    record = jobs[job]
    assert record["comment"]["job"] == "elastico-live"
    gres = [t for t in record["tres"]["allocated"] if t["type"] == "gres"]
    assert {"type": "gres", "name": "mps", "count": 25} in [{k: t[k] for k in ("type", "name", "count")} for t in gres]

    pids = [d.pid for d in cluster.status().daemons]
    cluster.down()
    assert [pid for pid in pids if daemons.is_alive(pid)] == []


def test_a_daemon_that_cannot_start_is_named_with_its_log(make_cluster):
    cluster = make_cluster(port_base=PORT_BASE_BROKEN, nodes=1, timeout=20)
    key = cluster.state_dir / "etc" / "munge.key"
    key.parent.mkdir(parents=True)
    key.write_bytes(b"too short")  # munged wants at least 32 bytes
    key.chmod(0o400)
    with pytest.raises(ClusterError) as err:
        cluster.up()
    text = str(err.value)
    assert text.startswith("munged ")
    assert str(cluster.state_dir / "logs" / "munged.log") in text
    assert "at least 32 bytes" in text  # the log's last lines are in the message


def test_a_taken_port_is_refused_before_anything_starts(make_cluster):
    cluster = make_cluster(port_base=PORT_BASE_TAKEN, nodes=1)
    with socket.socket() as blocker:  # someone else holds the controller's port
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", PORT_BASE_TAKEN))
        blocker.listen()
        with pytest.raises(ClusterError, match=f"slurmctld cannot start: TCP port {PORT_BASE_TAKEN} is already in use"):
            cluster.up()
    assert cluster.status().stopped


KERNEL_PORTS = host.kernel_port_ranges()
"""The kernel's range for outgoing connections (None: unreadable), a setting of the host."""


@pytest.mark.skipif(KERNEL_PORTS is None or KERNEL_PORTS[0][0] > 60000,
                    reason=f"the kernel's range for outgoing connections is unreadable or above the highest port "
                           f"base (60000): {KERNEL_PORTS}")
def test_a_port_base_in_the_kernels_outgoing_range_is_refused_before_anything_starts(make_cluster):
    # Ports there are taken now and then by any program's outgoing connection: a daemon would fail at random.
    (first, last), reserved = KERNEL_PORTS
    base = first
    ports = Ports.from_base(base)
    clash = config.ephemeral([ports.slurmctld, ports.slurmd(1)], (first, last), reserved)
    assert clash, f"ports {ports} of base {base} are all reserved on this machine ({reserved}); pick another base"
    cluster = make_cluster(port_base=base, nodes=1)
    with pytest.raises(ClusterError) as err:
        cluster.up()
    text = str(err.value)
    assert f"port base {base} puts daemons on TCP ports {', '.join(map(str, clash))}, in the range" in text
    assert f"({first}-{last}, net.ipv4.ip_local_port_range)" in text
    assert f"at most {first - 185} (the default is 16817)" in text and "ip_local_reserved_ports" in text
    assert cluster.status().stopped
    assert not (cluster.state_dir / "etc" / "cluster.json").exists()  # the refused base is not saved


def test_session_cluster_fixture_serves_sinfo_and_sacct(slurm_cluster, slurm_env):
    assert slurm_env == {"SLURM_CONF": str(slurm_cluster.slurm_conf)}
    assert slurm_cluster.status().running
    nodes = slurm(slurm_env, "sinfo", "-h", "-N", "-o", "%N").split()
    assert sorted(set(nodes)) == ["n1", "n2", "n3", "n4"]
    assert "jobs" in json.loads(slurm(slurm_env, "sacct", "--json", "-X"))
