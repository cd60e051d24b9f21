"""Shared fixtures: one live local Slurm cluster per test process.

`slurm_cluster` starts it on first use (root needed; missing Debian packages
are installed) with accounting on, so `sacct` works for every live test, and
stops it at the end of the session. Without root or apt it FAILS with the
reason instead of skipping: CI runs as root and must run the live tests.

`make test` runs pytest-xdist workers (`-n 6 --dist loadgroup`). The live tests
mostly wait on Slurm, so they run side by side, but never on one cluster: each
worker starts its own (ports `TEST_PORT_BASE + 1000 × worker`), since the helper
acts on every elastico job of a cluster and some tests wait for an idle cluster.
The Debian packages are installed by one worker at a time (apt holds a lock).
Set ELASTICO_TEST_CLUSTER_DIR to reuse a state directory between runs (a
cluster that was already running there is left running; a worker adds its
name), and ELASTICO_TEST_CLUSTER_PORT_BASE to choose the first worker's ports.
By default they are not the default ports of `elastico cluster up`, so
`make test` runs beside the cluster `make demo` leaves running.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

import pytest

from slurm_elastico.cluster import DEFAULT_PORT_BASE, LocalCluster, install
from slurm_elastico.errors import ClusterError
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.runner import SubprocessRunner

TEST_CLUSTER_ENV = "ELASTICO_TEST_CLUSTER_DIR"
TEST_PORT_BASE_ENV = "ELASTICO_TEST_CLUSTER_PORT_BASE"
TEST_PORT_BASE = DEFAULT_PORT_BASE + 4000
"""The session cluster's ports: slurmctld 20817, slurmdbd 20819, MariaDB 20820, slurmd 21001-21004; apart from
`elastico cluster up`'s defaults (16817-16820, 17001-), the reshape benchmark's (18817-) and the clusters
`test_cluster_live` starts (26817-), and below the kernel's range for outgoing connections (from 32768), where
any connection may hold a port for a while."""
WORKER_PORT_STRIDE = 1000
"""Worker N's cluster takes TEST_PORT_BASE + N × 1000 (gw0 20817-21004, ..., gw3 23817-24004): up to 6 workers
stay below test_cluster_live's 26817."""
MAX_WORKERS = 6


def worker_index(worker_id: str) -> int:
    """0 for a run without xdist ("master") and for gw0, N for gwN; more workers than ports set aside is an error."""
    if worker_id == "master":
        return 0
    index = int(worker_id.removeprefix("gw"))
    if index >= MAX_WORKERS:
        pytest.fail(f"pytest-xdist worker {worker_id}: the live tests set ports aside for {MAX_WORKERS} workers "
                    f"(-n {MAX_WORKERS} at most)", pytrace=False)
    return index


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory, worker_id) -> LocalCluster:
    """This worker's running LocalCluster: 4 nodes × 4 fake GPUs, 100 MPS shares each, accounting on."""
    if os.geteuid() != 0:
        pytest.fail("the live tests need root: the local Slurm cluster runs its daemons as root and makes fake "
                    "GPU device nodes; run pytest as root (CI does)", pytrace=False)
    index = worker_index(worker_id)
    chosen = os.environ.get(TEST_CLUSTER_ENV)
    state_dir = Path(f"{chosen}-{worker_id}" if chosen and worker_id != "master" else chosen or tmp_path_factory.mktemp("cluster"))
    port_base = int(os.environ.get(TEST_PORT_BASE_ENV) or TEST_PORT_BASE) + WORKER_PORT_STRIDE * index
    cluster = LocalCluster(state_dir, accounting=True, port_base=port_base)
    problem = None
    try:
        install.ensure_installed(True)  # (one process at a time installs: `install.INSTALL_LOCK`)
        with cpu_share(tmp_path_factory, alone=False):  # a start is busy: never beside an `alone` test
            result = cluster.up()
    except ClusterError as exc:
        problem = str(exc)
    if problem is not None:
        cluster.down()  # leave no half-started daemons behind a failed run
        hint = f" (set {TEST_PORT_BASE_ENV} to test beside it)" if "already in use" in problem or "ip_local_port_range" in problem else ""
        pytest.fail(f"the local Slurm cluster in {state_dir} did not come up: {problem}{hint}", pytrace=False)
    yield cluster
    if not result.already_running:
        with cpu_share(tmp_path_factory, alone=False):
            cluster.down()


@pytest.fixture
def slurm_env(slurm_cluster: LocalCluster) -> dict[str, str]:
    """Environment variables (SLURM_CONF) that aim Slurm commands at the session's cluster; a fresh copy per test."""
    return dict(slurm_cluster.env())


@pytest.fixture
def gateway(slurm_env: dict[str, str]) -> SlurmGateway:
    """A SlurmGateway on the session's cluster (30 s per Slurm command)."""
    return SlurmGateway(SubprocessRunner(env=slurm_env, timeout=30))


@contextlib.contextmanager
def cpu_share(tmp_path_factory, alone: bool):
    """Hold this machine's CPUs shared with the other workers, or (`alone`) to this worker only.

    Under pytest-xdist the workers run tests side by side. A test that times jobs (probe and revert: two jobs
    taking turns on one fake GPU) needs nothing else running: it holds an exclusive lock that every other test,
    and every cluster start and stop, holds shared. The gate lock keeps new holders from starting while it waits, so it
    is not starved. The locks are in the base temporary directory, which all workers of one run share.
    """
    root = tmp_path_factory.getbasetemp().parent
    with open(root / "cpu-gate.lock", "w") as gate, open(root / "cpu.lock", "w") as cpu:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(cpu, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # the files' closing drops the locks


@pytest.fixture(autouse=True)
def cpu_turn(request, tmp_path_factory):
    """Each test holds the CPUs shared, or to itself when marked `alone` (see cpu_share)."""
    with cpu_share(tmp_path_factory, alone=request.node.get_closest_marker("alone") is not None):
        yield


PHASE_ENV = "ELASTICO_TEST_PHASE"
"""`shared`: every test but those marked `alone`; `alone`: only those; unset: all. `make test` runs the shared
phase on six workers, then the alone phase by itself: under the shared/exclusive locks alone, the tests that time
jobs (probe and revert; the four-rank stops inside the grace) still saw another process take a core now and then."""


def pytest_collection_modifyitems(config, items):
    """Select this phase's tests; tests marked `alone` first (they then wait for no long test on another worker)."""
    phase = os.environ.get(PHASE_ENV, "")
    if phase not in ("", "shared", "alone"):
        raise pytest.UsageError(f"{PHASE_ENV}={phase!r}: allowed are shared, alone, or unset (every test)")
    if phase:
        keep = [item for item in items if (item.get_closest_marker("alone") is not None) == (phase == "alone")]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
    items.sort(key=lambda item: item.get_closest_marker("alone") is None)
