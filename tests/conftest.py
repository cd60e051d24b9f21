"""Shared fixtures: one live local Slurm cluster for the whole test run.

`slurm_cluster` starts it on first use (root needed; missing Debian packages
are installed) with accounting on, so `sacct` works for every live test, and
stops it at the end of the session. Without root or apt it FAILS with the
reason instead of skipping: CI runs as root and must run the live tests.
Set ELASTICO_TEST_CLUSTER_DIR to reuse a state directory between runs (a
cluster that was already running there is left running), and
ELASTICO_TEST_CLUSTER_PORT_BASE to choose its ports. By default they are not
the default ports of `elastico cluster up`, so `make test` runs beside the
cluster `make demo` leaves running.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_elastico.cluster import DEFAULT_PORT_BASE, LocalCluster
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


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> LocalCluster:
    """The session's running LocalCluster: 4 nodes × 4 fake GPUs, 100 MPS shares each, accounting on."""
    if os.geteuid() != 0:
        pytest.fail("the live tests need root: the local Slurm cluster runs its daemons as root and makes fake "
                    "GPU device nodes; run pytest as root (CI does)", pytrace=False)
    state_dir = Path(os.environ.get(TEST_CLUSTER_ENV) or tmp_path_factory.mktemp("cluster"))
    port_base = int(os.environ.get(TEST_PORT_BASE_ENV) or TEST_PORT_BASE)
    cluster = LocalCluster(state_dir, accounting=True, port_base=port_base)
    problem = None
    try:
        result = cluster.up()
    except ClusterError as exc:
        problem = str(exc)
    if problem is not None:
        cluster.down()  # leave no half-started daemons behind a failed run
        hint = f" (set {TEST_PORT_BASE_ENV} to test beside it)" if "already in use" in problem or "ip_local_port_range" in problem else ""
        pytest.fail(f"the local Slurm cluster in {state_dir} did not come up: {problem}{hint}", pytrace=False)
    yield cluster
    if not result.already_running:
        cluster.down()


@pytest.fixture
def slurm_env(slurm_cluster: LocalCluster) -> dict[str, str]:
    """Environment variables (SLURM_CONF) that aim Slurm commands at the session's cluster; a fresh copy per test."""
    return dict(slurm_cluster.env())


@pytest.fixture
def gateway(slurm_env: dict[str, str]) -> SlurmGateway:
    """A SlurmGateway on the session's cluster (30 s per Slurm command)."""
    return SlurmGateway(SubprocessRunner(env=slurm_env, timeout=30))
