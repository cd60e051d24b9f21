"""A real Slurm cluster on this one machine, for development and the live tests.

`LocalCluster(state_dir).up()` installs what is missing (Debian packages),
writes every config under the state directory and starts its own munged,
optionally MariaDB + slurmdbd, one slurmctld and N slurmd with fake GPUs, all
on ports away from a system Slurm. `down()` stops exactly those daemons, by
their pid files. Both are idempotent: `up` on a running cluster does nothing,
on a half-started one starts what is missing. Needs root (daemons run as
SlurmUser=root; fake GPUs are device nodes).

It reads its own Slurm as the gateway does: argv from `slurm.commands`, run
through `slurm.runner` with `SLURM_CONF` aimed at this cluster, and parsed by
the same JSON parsers (`slurm.nodes`, `slurm.jobs`), so node states are
Slurm's JSON words joined by '+' on 22.05 and 24.11 alike (`status`). Only the
daemons' own setup (`slurmd -V` here; munged, MariaDB and `sacctmgr` for
slurmdbd's cluster list in `startup`) runs through `daemons.run`: those print
no JSON the parsers read. What it needs of the machine (ports, private files,
fake GPUs) is in `host`.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from slurm_elastico.cluster import config, daemons, install, startup
from slurm_elastico.cluster.config import DEFAULT_PORT_BASE, ClusterSpec, Layout, Ports
from slurm_elastico.cluster.gpu_types import parse_gpu_types, types_text
from slurm_elastico.cluster.host import kernel_port_ranges, make_gpus, port_free, write_private
from slurm_elastico.cluster.programs import typed
from slurm_elastico.cluster.startup import COMMAND_TIMEOUT_S, Daemon, binary
from slurm_elastico.cluster.status import ClusterStatus, DaemonStatus, DownResult, UpResult, usable
from slurm_elastico.errors import ClusterError, ParseError, SlurmError
from slurm_elastico.slurm import commands
from slurm_elastico.slurm.jobs import parse_squeue
from slurm_elastico.slurm.nodes import NodeRecord, parse_sinfo
from slurm_elastico.slurm.runner import Completed, Runner, SubprocessRunner

STATE_DIR_ENV = "ELASTICO_CLUSTER_DIR"

_R = TypeVar("_R")


def default_state_dir() -> Path:
    """`$ELASTICO_CLUSTER_DIR`, else ~/.local/state/slurm-elastico/cluster."""
    env = os.environ.get(STATE_DIR_ENV)
    return Path(env) if env else Path.home() / ".local" / "state" / "slurm-elastico" / "cluster"


class LocalCluster:
    """One local Slurm cluster living in `state_dir`: configs, spool, logs, pids, sockets, fake GPUs."""

    def __init__(self, state_dir: str | os.PathLike | None = None, nodes: int = 4, gpus_per_node: int = 4,
                 shares_per_gpu: int = 100, accounting: bool = False, port_base: int = DEFAULT_PORT_BASE,
                 kill_wait: int = 30, cpus_per_node: int = 8, memory_mb: int = 8000, timeout: float = 60.0,
                 gpu_types: str = "", runner: Runner | None = None):
        self.layout = Layout(Path(state_dir or default_state_dir()).expanduser().absolute())
        self.accounting = accounting
        self.timeout = timeout
        # Several fake GPU types (`cluster.gpu_types`): the node count is theirs, n1.. in the order written.
        self.gpu_types = parse_gpu_types(gpu_types)
        if self.gpu_types:
            nodes = sum(t.nodes for t in self.gpu_types)
        self._params = dict(nodes=nodes, gpus_per_node=gpus_per_node, shares_per_gpu=shares_per_gpu,
                            accounting=accounting, port_base=port_base, kill_wait=kill_wait,
                            cpus_per_node=cpus_per_node, memory_mb=memory_mb, gpu_types=types_text(self.gpu_types))
        # Validate now, not at `up`: the version is a placeholder until slurmd is installed.
        self._spec_for((22, 5))
        self._spec: ClusterSpec | None = None
        self._version_text = ""
        self._children: list[subprocess.Popen] = []  # foreground daemons (mariadbd) to reap
        # Slurm's client commands; another runner (a test's) must aim them at this cluster, as `env()` does.
        self._runner = runner or SubprocessRunner(self.env(), COMMAND_TIMEOUT_S)

    @classmethod
    def from_state_dir(cls, state_dir: str | os.PathLike | None = None, **overrides) -> "LocalCluster":
        """The cluster as last brought up in `state_dir` (its saved settings), with non-None `overrides` applied.

        A node count alone makes the nodes untyped again; GPU types bring their own node count (both: refused)."""
        layout = Layout(Path(state_dir or default_state_dir()).expanduser().absolute())
        saved = {}
        if layout.spec_file.is_file():
            try:
                saved = json.loads(layout.spec_file.read_text())
            except (OSError, ValueError) as exc:
                raise ClusterError(f"cannot read the saved cluster settings {layout.spec_file}: {exc}") from None
        known = set(cls._param_names())
        params = {k: v for k, v in saved.items() if k in known}
        params.update({k: v for k, v in overrides.items() if v is not None})
        if overrides.get("nodes") is not None and overrides.get("gpu_types") is None:
            params["gpu_types"] = ""  # a node count alone asks for untyped nodes; typed ones come from gpu_types
        if overrides.get("gpu_types") and overrides.get("nodes") is not None:
            raise ClusterError("give either a node count (untyped nodes) or GPU types with their nodes "
                               f"(--gpu-types {overrides['gpu_types']}), not both")
        return cls(layout.root, **params)

    @staticmethod
    def _param_names() -> tuple[str, ...]:
        return ("nodes", "gpus_per_node", "shares_per_gpu", "accounting", "port_base", "kill_wait",
                "cpus_per_node", "memory_mb", "timeout", "gpu_types")

    # ----- public surface -------------------------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        return self.layout.root

    @property
    def slurm_conf(self) -> Path:
        return self.layout.slurm_conf

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(f"n{i}" for i in range(1, self._params["nodes"] + 1))

    def env(self) -> dict[str, str]:
        """Environment for Slurm commands aimed at this cluster."""
        return startup.slurm_env(self.layout)

    def up(self) -> UpResult:
        """Start what is not running (installing packages first if needed); wait until every node is usable."""
        start = time.monotonic()
        if os.geteuid() != 0:
            raise ClusterError("the local cluster must be started as root (its daemons run as SlurmUser=root "
                               f"and its fake GPUs are device nodes); run `{typed('elastico')} cluster up` as root")
        installed = install.ensure_installed(self.accounting)
        spec = self.spec
        running_before = [d.name for d in self._daemons() if d.pid() is not None]
        # Ports first: a refused --port-base must not be saved as the state directory's settings.
        self._check_ports(spec, [d for d in self._daemons() if d.name not in running_before])
        self._write_files(spec, config_locked=bool(running_before))
        started: list[str] = []
        launched: dict[str, float] = {}
        for daemon in self._daemons():
            if daemon.pid() is not None:
                continue
            if daemon.program == "slurmd":
                launched[daemon.name.removeprefix("slurmd-")] = time.time()
            startup.start(daemon, spec, self.layout, self._children)
            started.append(daemon.name)
        self._wait_for_nodes(spec, launched)
        return UpResult(tuple(started), tuple(installed), time.monotonic() - start, self._version_text)

    def down(self) -> DownResult:
        """Cancel every job, then stop this cluster's daemons by their pid files (nothing else).

        The daemons are stopped even when the jobs cannot be listed or cancelled (a Slurm whose JSON the parsers
        refuse, a controller that does not answer): the result then says why no job was cancelled
        (`DownResult.jobs_problem`), and the jobs' processes end with the daemons or are left to the caller.
        """
        start = time.monotonic()
        problem = ""
        try:
            cancelled = self._cancel_jobs()
        except ClusterError as exc:
            cancelled, problem = 0, str(exc)
        stopped = []
        for daemon in self._stop_order():
            if daemons.stop(daemon.pid_file, daemon.program) is not None:
                stopped.append(daemon.name)
        for child in self._children:
            child.poll()  # reap, so no zombie of ours is left behind
        self._children.clear()
        return DownResult(tuple(stopped), cancelled, time.monotonic() - start, problem)

    def status(self) -> ClusterStatus:
        """Each expected daemon's pid and, when the controller runs, each node's state."""
        listed = tuple(DaemonStatus(d.name, d.pid(), str(d.log)) for d in self._daemons())
        by_name = {d.name: d for d in listed}
        running = by_name["slurmctld"].running and by_name["munged"].running
        nodes = {r.name: r.state for r in self._node_records()} if running else {}
        return ClusterStatus(str(self.state_dir), str(self.slurm_conf), self.accounting, listed, nodes)

    @property
    def spec(self) -> ClusterSpec:
        """The full specification, with the installed Slurm's version (runs `slurmd -V` once)."""
        if self._spec is None:
            slurmd = install.which("slurmd")
            if slurmd is None:
                raise ClusterError("slurmd is not installed; `up` installs it (Debian package slurmd)")
            out = daemons.run([slurmd, "-V"], COMMAND_TIMEOUT_S)
            self._version_text = (out.stdout or out.stderr).strip()
            self._spec = self._spec_for(config.parse_version(self._version_text))
        return self._spec

    # ----- configuration on disk ------------------------------------------------------------------

    def _spec_for(self, version: tuple[int, int]) -> ClusterSpec:
        p = self._params
        return ClusterSpec(
            hostname=socket.gethostname().split(".")[0], nodes=p["nodes"], gpus_per_node=p["gpus_per_node"],
            shares_per_gpu=p["shares_per_gpu"], cpus_per_node=p["cpus_per_node"], memory_mb=p["memory_mb"],
            accounting=p["accounting"], kill_wait=p["kill_wait"], ports=Ports.from_base(p["port_base"]),
            version=version, name=config.cluster_name(p["port_base"]), gpu_types=self.gpu_types,
        )

    def _write_files(self, spec: ClusterSpec, config_locked: bool) -> None:
        """Create the directories, configs, munge key and fake GPUs; refuse to change a running cluster's config."""
        lay = self.layout
        for path in (lay.root, lay.etc, lay.logs, lay.run, lay.spool, lay.state_save, lay.dev):
            path.mkdir(parents=True, exist_ok=True)
        # munged refuses a key, socket or log directory others can write to.
        for path in (lay.root, lay.etc, lay.logs, lay.run):
            path.chmod(0o755)
        if not lay.db_password.exists():
            write_private(lay.db_password, secrets.token_urlsafe(18))
        password = lay.db_password.read_text().strip()
        files = {lay.slurm_conf: config.slurm_conf(spec, lay), lay.gres_conf: config.gres_conf(spec, lay)}
        cgroup = config.cgroup_conf(spec)
        if cgroup is not None:
            files[lay.cgroup_conf] = cgroup
        if spec.accounting:
            files[lay.slurmdbd_conf] = config.slurmdbd_conf(spec, lay, password)
        changed = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
        if changed and config_locked:
            raise ClusterError(
                f"the cluster in {lay.root} runs with other settings ({', '.join(p.name for p in changed)} would "
                f"change); run `{typed('elastico')} cluster down --state-dir {shlex.quote(str(lay.root))}` first, "
                "then `up` with the new settings")
        for path in changed:
            # slurmdbd refuses a slurmdbd.conf others can read (it holds the DB password).
            write_private(path, files[path]) if path == lay.slurmdbd_conf else path.write_text(files[path])
        if not config_locked and cgroup is None:
            lay.cgroup_conf.unlink(missing_ok=True)
        if not lay.munge_key.exists():
            write_private(lay.munge_key, os.urandom(1024), mode=0o400)
        for node in spec.node_names:
            (lay.spool / node).mkdir(exist_ok=True)
            make_gpus(lay.gpu_dir(node), spec.gpus_per_node)
        params = {**self._params, "timeout": self.timeout}
        lay.spec_file.write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")

    # ----- daemons --------------------------------------------------------------------------------

    def _daemons(self) -> list[Daemon]:
        """Every daemon of this cluster, in start order."""
        lay = self.layout

        def d(name: str, program: str) -> Daemon:
            return Daemon(name, program, lay.pid_file(name), lay.log_file(name))

        listed = [d("munged", "munged")]
        if self.accounting:
            listed += [d("mariadbd", "mariadbd"), d("slurmdbd", "slurmdbd")]
        listed.append(d("slurmctld", "slurmctld"))
        listed += [d(f"slurmd-{node}", "slurmd") for node in self.nodes]
        return listed

    def _stop_order(self) -> list[Daemon]:
        """Everything that may run, whatever the settings: slurmd (all pid files), controller, database, munge."""
        lay = self.layout
        slurmds = sorted({p.stem for p in lay.run.glob("slurmd-*.pid")} | {f"slurmd-{n}" for n in self.nodes})
        names = [*slurmds, "slurmctld", "slurmdbd", "mariadbd", "munged"]
        return [Daemon(n, n.split("-")[0], lay.pid_file(n), lay.log_file(n)) for n in names]

    def _check_ports(self, spec: ClusterSpec, to_start: list[Daemon]) -> None:
        """Refuse early, naming the port, when another program holds a port a daemon is about to bind, or
        when such a port lies where the kernel may hand it to any outgoing connection."""
        ports = {"mariadbd": spec.ports.mariadb, "slurmdbd": spec.ports.slurmdbd, "slurmctld": spec.ports.slurmctld}
        ports.update({f"slurmd-{n}": spec.ports.slurmd(i) for i, n in enumerate(spec.node_names, 1)})
        wanted = sorted(ports[d.name] for d in to_start if d.name in ports)
        kernel = kernel_port_ranges()
        clash = config.ephemeral(wanted, *kernel) if kernel else []
        if clash:
            (first, last), _ = kernel
            raise ClusterError(
                f"port base {self._params['port_base']} puts daemons on TCP ports {', '.join(map(str, clash))}, in the "
                f"range the kernel gives outgoing connections ({first}-{last}, net.ipv4.ip_local_port_range): "
                "any program's connection may hold such a port, and the daemon then fails to start; choose a "
                f"--port-base whose ports (base to base+3, base+184 to base+{183 + len(spec.node_names)}) lie "
                f"below it, at most {first - 184 - len(spec.node_names)} (the default is {DEFAULT_PORT_BASE}), or "
                "reserve them in net.ipv4.ip_local_reserved_ports")
        for daemon in to_start:
            port = ports.get(daemon.name)
            if port is not None and not port_free(port):
                raise ClusterError(
                    f"{daemon.name} cannot start: TCP port {port} is already in use by another program (another "
                    f"local cluster or a system service); stop it or choose another port base (now "
                    f"{self._params['port_base']}; --port-base)")

    def _slurm(self, argv: list[str]) -> Completed:
        """Run a Slurm client command built by `slurm.commands` against this cluster."""
        try:
            return self._runner([binary(argv[0]), *argv[1:]])
        except SlurmError as exc:  # not installed, or no answer in time
            raise ClusterError(str(exc)) from None

    def _node_records(self) -> tuple[NodeRecord, ...]:
        """Each node as the controller knows it (`commands.nodes_json` for this version); none while it does not answer."""
        major, minor = self.spec.version
        return _parsed(parse_sinfo, self._slurm(commands.nodes_json(f"{major}.{minor:02d}")))

    def _job_ids(self) -> list[int]:
        """The jobs still active (pending, running, suspended, completing); none while the controller does not answer."""
        return [j.job_id for j in _parsed(parse_squeue, self._slurm(commands.squeue_json())) if j.state.active]

    def _job_ids_text(self) -> list[int]:
        """The active jobs' ids from squeue's plain text (`commands.squeue_ids`): what `down` falls back on when
        the JSON parsers refuse this Slurm's output, so that it can still cancel them. `ClusterError` when
        squeue fails or prints something other than one job id a line."""
        out = self._slurm(commands.squeue_ids())
        if out.returncode != 0:
            raise ClusterError(f"`{' '.join(commands.squeue_ids())}` failed (exit {out.returncode}): "
                               f"{out.stderr.strip() or 'no message'}")
        lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        bad = [line for line in lines if not line.isdigit()]
        if bad:
            raise ClusterError(f"`{' '.join(commands.squeue_ids())}` printed {bad[0]!r} where a job id was expected")
        return [int(line) for line in lines]

    def _wait_for_nodes(self, spec: ClusterSpec, launched: dict[str, float]) -> None:
        """Wait until every node is usable and each slurmd started now has registered.

        A restarted slurmctld restores the old node states, so "idle" alone can
        be stale; a node whose slurmd was just launched counts only once the
        controller reports a SlurmdStartTime from this launch.
        """
        ctld = next(d for d in self._daemons() if d.name == "slurmctld")
        states: dict[str, str] = {}
        fresh = [n for n in spec.node_names if n in launched]

        def ready() -> bool:
            nonlocal states
            dead = [d for d in self._daemons() if d.pid() is None]
            if dead:
                raise daemons.failure(dead[0].name, "stopped while the cluster came up", dead[0].log)
            records = self._node_records()
            states = {r.name: r.state for r in records}
            if not (set(spec.node_names) <= states.keys() and all(usable(states[n]) for n in spec.node_names)):
                return False
            if not fresh:
                return True
            registered = {r.name: r.slurmd_start_time or 0 for r in records}
            # slurmd_start_time has whole seconds: compare with the launch second.
            late = [n for n in fresh if registered.get(n, 0) < int(launched[n])]
            for n in late:
                states[n] = f"{states[n]} (slurmd not registered yet)"
            return not late

        if daemons.wait_for(ready, self.timeout, interval=0.1):
            return
        late = [n for n in spec.node_names if not usable(states.get(n, "absent"))]
        shown = ", ".join(f"{n}={states.get(n, 'absent')}" for n in late)
        node_log = self.layout.log_file(f"slurmd-{late[0]}") if late else ctld.log
        raise ClusterError(
            f"nodes not usable after {self.timeout:g} s ({shown}); read {node_log} and {ctld.log}. "
            f"Last lines of {node_log}:\n{daemons.tail(node_log)}\nLast lines of {ctld.log}:\n{daemons.tail(ctld.log)}")

    def _cancel_jobs(self) -> int:
        """Cancel every job and wait (up to KillWait + 10 s) until they are gone; 0 when the controller is down."""
        daemon = next(d for d in self._stop_order() if d.name == "slurmctld")
        munge = next(d for d in self._stop_order() if d.name == "munged")
        if daemon.pid() is None or munge.pid() is None:
            return 0
        try:
            jobs, listed = self._job_ids(), self._job_ids
        except ClusterError:  # JSON this version does not read: the ids alone are enough to cancel the jobs
            jobs, listed = self._job_ids_text(), self._job_ids_text
        if jobs:
            self._slurm(commands.cancel(jobs))
            daemons.wait_for(lambda: not listed(), self._params["kill_wait"] + 10, interval=0.2)
        return len(jobs)


def _parsed(parse: Callable[[str, str], tuple[_R, ...]], out: Completed) -> tuple[_R, ...]:
    """`parse` of a command's JSON output; nothing when the command failed (the controller is not answering)."""
    if out.returncode != 0:
        return ()
    try:
        return parse(out.stdout, " ".join((Path(out.argv[0]).name, *out.argv[1:])))
    except ParseError as exc:
        raise ClusterError(f"the local cluster cannot read its Slurm's answer: {exc}") from None
