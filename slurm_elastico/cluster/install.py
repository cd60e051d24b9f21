"""Install the Debian packages the local cluster needs, only when a binary is missing.

Runs `apt-get update` once, then `apt-get install -y --no-install-recommends`
non-interactively. Without systemd, package scripts would try to start the
system's own munge/slurm/mariadb services; a temporary /usr/sbin/policy-rc.d
that exits 101 ("action forbidden") stops that.

One process installs at a time (`INSTALL_LOCK`, `file_lock.held` waiting its turn): the test
command starts six local clusters at once on a clean machine, and six
`apt-get update`s at once fail on apt's own lock ("Could not get lock
/var/lib/apt/lists/lock"), as one process's policy-rc.d would be removed under
another's install. The ones that waited look again and find the packages
there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from slurm_elastico.errors import ClusterError
from slurm_elastico.file_lock import held

# binary -> Debian package providing it (same names on Debian 12 and 13).
CORE_BINARIES = {
    "munged": "munge",
    "munge": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "sbatch": "slurm-client",
    "scancel": "slurm-client",
    "scontrol": "slurm-client",
    "sacct": "slurm-client",
}
ACCOUNTING_BINARIES = {
    "slurmdbd": "slurmdbd",
    "sacctmgr": "slurm-client",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
    "mariadb": "mariadb-client",
}
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
INSTALL_LOCK = Path("/var/lib/dpkg/slurm-elastico-install.lock")
"""Held while one process installs (dpkg's own directory: it exists wherever apt-get does, and only root writes
there, as only root installs)."""
# Daemons live in sbin, which a non-login root shell may lack on PATH.
SEARCH_PATH = os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
)
UPDATE_TIMEOUT_S = 300
INSTALL_TIMEOUT_S = 900


def which(binary: str) -> str | None:
    """Full path of `binary`, looking in the sbin directories too."""
    return shutil.which(binary, path=SEARCH_PATH)


def needed_binaries(accounting: bool) -> dict[str, str]:
    return {**CORE_BINARIES, **(ACCOUNTING_BINARIES if accounting else {})}


def missing_packages(accounting: bool, find: Callable[[str], str | None] | None = None) -> list[str]:
    """Packages to install so that every needed binary exists, sorted and without repeats."""
    find = find or which
    return sorted({pkg for binary, pkg in needed_binaries(accounting).items() if find(binary) is None})


def install_argv(packages: Iterable[str]) -> list[str]:
    return ["apt-get", "install", "-y", "--no-install-recommends", *packages]


def ensure_installed(accounting: bool) -> list[str]:
    """Install what is missing; return the packages installed (empty when nothing was needed)."""
    packages = missing_packages(accounting)
    if not packages:
        return []
    if os.geteuid() != 0:
        raise ClusterError(f"packages {', '.join(packages)} are missing and installing them needs root; "
                           f"run as root or install them with: apt-get install {' '.join(packages)}")
    if which("apt-get") is None:
        raise ClusterError(f"packages {', '.join(packages)} are missing and apt-get is not available "
                           "(the local cluster needs a Debian-based system)")
    with held(INSTALL_LOCK, {"pid": os.getpid(), "installing": packages}, wait=True):
        packages = missing_packages(accounting)  # another process may have installed them while this one waited
        if not packages:
            return []
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        made_policy = not POLICY_RC_D.exists()
        if made_policy:
            POLICY_RC_D.write_text("#!/bin/sh\n# slurm-elastico: no service starts during package installation\n"
                                   "exit 101\n")
            POLICY_RC_D.chmod(0o755)
        try:
            _apt(["apt-get", "update"], env, UPDATE_TIMEOUT_S)
            _apt(install_argv(packages), env, INSTALL_TIMEOUT_S)
        finally:
            if made_policy:
                POLICY_RC_D.unlink(missing_ok=True)
    still = missing_packages(accounting)
    if still:
        raise ClusterError(f"apt-get installed {', '.join(packages)} but binaries of {', '.join(still)} are still missing")
    return packages


def _apt(argv: list[str], env: dict[str, str], timeout: int) -> None:
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(argv)}` did not finish within {timeout} s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise ClusterError(f"`{' '.join(argv)}` failed with exit code {proc.returncode}:\n{tail}")
