"""Pure writers of the local cluster's slurm.conf, gres.conf, slurmdbd.conf and cgroup.conf.

Nothing here touches the disk or runs a command: a `ClusterSpec` (what to
build) and a `Layout` (where its files live) go in, text comes out, so every
line can be checked in unit tests. The facts behind each setting (multiple
slurmd on one host, MPS `Flags=all_sharing`, accounting needing slurmdbd) were
measured on Slurm 22.05 and 24.11; see the comments at each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from slurm_elastico.cluster.gpu_types import FakeType, node_groups, node_types
from slurm_elastico.errors import ClusterError

CLUSTER_NAME = "elastico"
DEFAULT_PORT_BASE = 16817
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
# GPU character devices: NVIDIA's major number; slurmd only stats the files.
NVIDIA_MAJOR = 195
# AF_UNIX socket paths (munge, MariaDB) longer than this fail to bind.
MAX_SOCKET_PATH = 107
_UNSAFE_PATH = re.compile(r"[\s\[\],=#\"']")


def cluster_name(port_base: int) -> str:
    """The local cluster's ClusterName: `elastico` on the default ports, `elastico<port base>` elsewhere.

    Letters and digits only: slurmdbd names its MariaDB tables after the cluster. The helper locks one
    ClusterName per host (`helper.lock`), so two local clusters on one host (the demo's and the test
    suite's, say) must not share a name, or their helpers would refuse each other.
    """
    return CLUSTER_NAME if port_base == DEFAULT_PORT_BASE else f"{CLUSTER_NAME}{port_base}"


@dataclass(frozen=True)
class Ports:
    """TCP ports of the cluster's daemons, all above a system Slurm's 6817-6819 and MariaDB's 3306."""

    slurmctld: int
    slurmdbd: int
    mariadb: int
    slurmd_first: int

    @classmethod
    def from_base(cls, base: int = DEFAULT_PORT_BASE) -> "Ports":
        """slurmctld=base, slurmdbd=base+2, MariaDB=base+3, slurmd n1=base+184 (16817 → 17001)."""
        if not 1024 <= base <= 60000:
            raise ClusterError(f"port base {base} is outside the allowed 1024..60000")
        return cls(slurmctld=base, slurmdbd=base + 2, mariadb=base + 3, slurmd_first=base + 184)

    def slurmd(self, index: int) -> int:
        """Port of node number `index` (1-based)."""
        return self.slurmd_first + index - 1


def parse_port_ranges(text: str) -> list[tuple[int, int]]:
    """The kernel's port lists as (first, last) pairs: `32768\t60999` (ip_local_port_range) or
    `8080,9000-9010` (ip_local_reserved_ports, empty when none is reserved)."""
    if "\t" in text.strip() or " " in text.strip():
        first, last = text.split()
        return [(int(first), int(last))]
    pairs = []
    for item in filter(None, text.strip().split(",")):
        first, _, last = item.partition("-")
        pairs.append((int(first), int(last or first)))
    return pairs


def ephemeral(ports: list[int], local_range: tuple[int, int], reserved: list[tuple[int, int]]) -> list[int]:
    """The ports the kernel may hand to outgoing connections: inside `local_range`, not reserved.

    Such a port is free now and then taken by any program's outgoing connection for as long as it
    lasts, so a daemon that listens on it fails to start at random.
    """
    first, last = local_range
    return [p for p in ports if first <= p <= last and not any(lo <= p <= hi for lo, hi in reserved)]


@dataclass(frozen=True)
class ClusterSpec:
    """What to build: node count, fake GPUs, MPS shares, accounting, ports, Slurm version."""

    hostname: str
    nodes: int = 4
    gpus_per_node: int = 4
    shares_per_gpu: int = 100
    cpus_per_node: int = 8
    memory_mb: int = 8000
    accounting: bool = False
    kill_wait: int = 30
    ports: Ports = field(default_factory=Ports.from_base)
    version: tuple[int, int] = (22, 5)
    name: str = CLUSTER_NAME
    gpu_types: tuple[FakeType, ...] = ()
    """Fake GPU types (`cluster.gpu_types`), their nodes in order from n1; empty: one untyped type on every node."""

    def __post_init__(self) -> None:
        problems = []
        for attr, lo, hi in (
            ("nodes", 1, 64),
            ("gpus_per_node", 1, 16),
            ("shares_per_gpu", 1, 100),
            ("cpus_per_node", 1, 1024),
            ("memory_mb", 100, 10**7),
            ("kill_wait", 0, 3600),
        ):
            value = getattr(self, attr)
            if not isinstance(value, int) or not lo <= value <= hi:
                problems.append(f"{attr}={value!r} (allowed: integer {lo}..{hi})")
        if self.gpu_types and sum(t.nodes for t in self.gpu_types) != self.nodes:
            problems.append(f"nodes={self.nodes!r} (allowed: the nodes of the GPU types, "
                            f"{sum(t.nodes for t in self.gpu_types)})")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*", self.hostname or ""):
            problems.append(f"hostname={self.hostname!r} (allowed: a short host name, as `hostname -s` prints)")
        if problems:
            raise ClusterError("invalid cluster settings: " + "; ".join(problems))

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"n{i}" for i in range(1, self.nodes + 1))

    @property
    def node_range(self) -> str:
        """Slurm hostlist of all nodes, e.g. `n[1-4]` (or `n1` alone)."""
        return "n1" if self.nodes == 1 else f"n[1-{self.nodes}]"

    def gpu_type_of(self, node: str) -> str:
        """The fake GPU type of `node` ("" on an untyped cluster)."""
        found = node_types(self.gpu_types).get(node)
        return found.name if found else ""

    @property
    def mps_per_node(self) -> int:
        return self.gpus_per_node * self.shares_per_gpu


@dataclass(frozen=True)
class Layout:
    """Where every file of a cluster lives under its state directory."""

    root: Path

    def __post_init__(self) -> None:
        text = str(self.root)
        if not self.root.is_absolute():
            raise ClusterError(f"state dir {text!r} must be an absolute path")
        if _UNSAFE_PATH.search(text):
            # slurm.conf has no quoting and gres.conf File= is a hostlist: spaces,
            # brackets, commas or '=' would be misread.
            raise ClusterError(f"state dir {text!r} contains a space or one of []=,#'\" that Slurm config files cannot hold")
        longest = max(len(str(self.munge_socket)), len(str(self.mariadb_socket)))
        if longest > MAX_SOCKET_PATH:
            raise ClusterError(
                f"state dir {text!r} is too deep: its socket paths would be {longest} characters "
                f"(Unix sockets allow {MAX_SOCKET_PATH}); choose a shorter --state-dir"
            )

    etc = property(lambda self: self.root / "etc")
    logs = property(lambda self: self.root / "logs")
    run = property(lambda self: self.root / "run")
    dev = property(lambda self: self.root / "dev")
    spool = property(lambda self: self.root / "spool")
    db = property(lambda self: self.root / "db")
    db_tmp = property(lambda self: self.root / "db-tmp")
    """MariaDB's own temporary directory: two servers bootstrapping at once in a shared /tmp clash on their
    temporary tables' names ("Unknown table 'mysql.tmp_user_sys'", mariadb-install-db exit 1)."""
    slurm_conf = property(lambda self: self.etc / "slurm.conf")
    gres_conf = property(lambda self: self.etc / "gres.conf")
    cgroup_conf = property(lambda self: self.etc / "cgroup.conf")
    slurmdbd_conf = property(lambda self: self.etc / "slurmdbd.conf")
    spec_file = property(lambda self: self.etc / "cluster.json")
    munge_key = property(lambda self: self.etc / "munge.key")
    db_password = property(lambda self: self.etc / "db.password")
    munge_socket = property(lambda self: self.run / "munge.sock")
    mariadb_socket = property(lambda self: self.run / "mariadb.sock")
    state_save = property(lambda self: self.spool / "ctld")
    jobcomp = property(lambda self: self.logs / "jobcomp.txt")

    def pid_file(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        return self.logs / f"{daemon}.log"

    def gpu_dir(self, node: str) -> Path:
        return self.dev / node


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) from `slurmd -V` output such as `slurm-wlm 22.05.8` or `slurm 24.11.5`."""
    match = re.search(r"(\d+)\.(\d+)(?:\.\d+)?", text)
    if not match:
        raise ClusterError(f"cannot read a Slurm version from {text.strip()!r} (expected e.g. 'slurm 24.11.5')")
    return int(match.group(1)), int(match.group(2))


def slurm_conf(spec: ClusterSpec, layout: Layout) -> str:
    """slurm.conf: one controller and `spec.nodes` slurmd on this host, partition `debug`."""
    p = spec.ports
    lines = [
        "# Written by slurm-elastico for a local test cluster; rewritten by `elastico cluster up`.",
        f"ClusterName={spec.name}",
        # Must be the short host name, or slurmctld exits "not a valid controller".
        f"SlurmctldHost={spec.hostname}(127.0.0.1)",
        f"SlurmctldPort={p.slurmctld}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # Our own munged, so a system munge (other key) is never involved.
        f"AuthInfo=socket={layout.munge_socket}",
        f"StateSaveLocation={layout.state_save}",
        # %n: one spool, pid and log per slurmd when several run on one host.
        f"SlurmdSpoolDir={layout.spool}/%n",
        f"SlurmctldPidFile={layout.pid_file('slurmctld')}",
        f"SlurmdPidFile={layout.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={layout.log_file('slurmctld')}",
        f"SlurmdLogFile={layout.logs}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "JobRequeue=1",
        "ReturnToService=2",
        f"KillWait={spec.kill_wait}",
        "SchedulerType=sched/backfill",
        # Backfill every second (default 30): tests wait on the scheduler.
        "SchedulerParameters=bf_interval=1",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # Lets the node lines claim more CPUs and memory than this machine has.
        "SlurmdParameters=config_overrides",
        "MessageTimeout=10",
        "InactiveLimit=0",
        "MinJobAge=300",
        "GresTypes=gpu,mps",
    ]
    if spec.accounting:
        lines += [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={p.slurmdbd}",
            # For the slurmdbd connection the munge socket comes from here, not AuthInfo.
            f"AccountingStoragePass={layout.munge_socket}",
            # GRES appear in TRES strings only when listed (a typed one, gres/gpu:t4, for the type a job asked:
            # what `elastico whatif` keeps it on); fatal without slurmdbd.
            "AccountingStorageTRES=" + ",".join(["gres/gpu", "gres/mps",
                                                 *(f"gres/gpu:{t.name}" for t in spec.gpu_types)]),
            "AccountingStoreFlags=job_comment",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=30",
        ]
    else:
        # Without slurmdbd, `sacct -c` still reads finished jobs from this file.
        lines += ["JobCompType=jobcomp/filetxt", f"JobCompLoc={layout.jobcomp}"]
    # One line per group of alike nodes; a typed group's gres names its type (gpu:t4:4), so Slurm places a
    # typed request (--gres=gpu:t4:1) on it alone and an untyped one anywhere.
    for first, last, kind in node_groups(spec.gpu_types, spec.nodes):
        names = f"n{first}" if first == last else f"n[{first}-{last}]"
        ports = str(p.slurmd(first)) if first == last else f"[{p.slurmd(first)}-{p.slurmd(last)}]"
        gpu = f"gpu:{kind}:{spec.gpus_per_node}" if kind else f"gpu:{spec.gpus_per_node}"
        lines.append(f"NodeName={names} NodeHostname={spec.hostname} NodeAddr=127.0.0.1 Port={ports} "
                     f"CPUs={spec.cpus_per_node} RealMemory={spec.memory_mb} Gres={gpu},mps:{spec.mps_per_node} "
                     "State=UNKNOWN")
    lines.append(f"PartitionName=debug Nodes={spec.node_range} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _device_range(layout: Layout, node: str, gpus: int) -> str:
    base = layout.gpu_dir(node) / "nvidia"
    return f"{base}0" if gpus == 1 else f"{base}[0-{gpus - 1}]"


def gres_conf(spec: ClusterSpec, layout: Layout) -> str:
    """gres.conf: fake GPUs per node (of its type, `Type=`, on a typed cluster) and their MPS shares, shared across
    all GPUs (MPS stays untyped: a share's type is that of the node it is pinned to)."""
    lines = ["# Written by slurm-elastico: fake GPU device files, no NVML autodetection.", "AutoDetect=off"]
    for node in spec.node_names:
        devices = _device_range(layout, node, spec.gpus_per_node)
        kind = spec.gpu_type_of(node)
        lines.append(f"NodeName={node} Name=gpu Type={kind} File={devices}" if kind else
                     f"NodeName={node} Name=gpu File={devices}")
        # all_sharing is essential: without it every MPS job lands on GPU 0
        # (one_sharing) and waits while the other GPUs are idle. Count is
        # split evenly over the File= devices.
        lines.append(f"NodeName={node} Name=mps Count={spec.mps_per_node} File={devices} Flags=all_sharing")
    return "\n".join(lines) + "\n"


def cgroup_conf(spec: ClusterSpec) -> str | None:
    """cgroup.conf, or None where the version has no way to switch cgroups off.

    Slurm >= 23.02 accepts `CgroupPlugin=disabled`, which keeps slurmd away from
    systemd/dbus and delegated controllers: 24.11's slurmd in a chroot without
    /sys/fs/cgroup exits "Unable to initialize cgroup plugin" without it.
    22.05 has no such value (it rejects it); it runs with proctrack/linuxproc
    and no cgroup.conf where the cgroup filesystem is mounted.
    """
    if spec.version < (23, 2):
        return None
    return "# Written by slurm-elastico: no cgroup enforcement on the local cluster.\nCgroupPlugin=disabled\n"


def slurmdbd_conf(spec: ClusterSpec, layout: Layout, db_password: str) -> str:
    """slurmdbd.conf (must be mode 600): MariaDB on 127.0.0.1 at `ports.mariadb`."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{8,}", db_password):
        raise ClusterError("database password must be 8 or more characters of [A-Za-z0-9_-]")
    lines = [
        "# Written by slurm-elastico for a local test cluster.",
        "AuthType=auth/munge",
        f"AuthInfo=socket={layout.munge_socket}",
        f"DbdHost={spec.hostname}",
        "DbdAddr=127.0.0.1",
        f"DbdPort={spec.ports.slurmdbd}",
        "SlurmUser=root",
        "DebugLevel=info",
        f"LogFile={layout.log_file('slurmdbd')}",
        f"PidFile={layout.pid_file('slurmdbd')}",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={spec.ports.mariadb}",
        f"StorageUser={DB_USER}",
        f"StoragePass={db_password}",
        f"StorageLoc={DB_NAME}",
    ]
    return "\n".join(lines) + "\n"


def db_setup_sql(db_password: str) -> str:
    """SQL that creates the accounting database and its user; safe to run again."""
    return (
        f"CREATE DATABASE IF NOT EXISTS {DB_NAME};\n"
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{db_password}';\n"
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{db_password}';\n"
        f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';\n"
        f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'localhost';\n"
        "FLUSH PRIVILEGES;\n"
    )
