"""How each daemon of the local cluster starts: its command line, and what "started" and "ready" mean.

munged, slurmctld, slurmd and slurmdbd daemonize themselves: each is started,
then waited for until its pid file names a live process (and, for munged and
slurmdbd, until it answers). mariadbd runs in the foreground as our child, which
`start` hands back so the cluster can reap it. A daemon that exits at start or logs
"fatal:" fails at once with the end of its log, instead of after the timeout.
Every daemon reads this cluster's configuration (`slurm_env`: `SLURM_CONF`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slurm_elastico.cluster import config, daemons, install
from slurm_elastico.cluster.config import ClusterSpec, Layout
from slurm_elastico.cluster.programs import typed
from slurm_elastico.errors import ClusterError

COMMAND_TIMEOUT_S = 15.0
MARIADB_START_S = 60.0
SLURMDBD_START_S = 60.0
DAEMON_START_S = 15.0


@dataclass(frozen=True)
class Daemon:
    name: str        # as reported: "slurmd-n1"
    program: str     # the process's command name
    pid_file: Path
    log: Path

    def pid(self) -> int | None:
        """The pid of the running daemon, or None (no pid file, a dead or another process: `daemons.running_pid`)."""
        return daemons.running_pid(self.pid_file, self.program)


def slurm_env(layout: Layout) -> dict[str, str]:
    """Environment for Slurm commands and daemons aimed at this cluster."""
    return {"SLURM_CONF": str(layout.slurm_conf)}


def binary(name: str) -> str:
    """The installed program `name`; `ClusterError` saying how to install it where it is missing."""
    path = install.which(name)
    if path is None:
        raise ClusterError(f"`{name}` is not installed; `{typed('elastico')} cluster up` installs it as root")
    return path


def start(daemon: Daemon, spec: ClusterSpec, layout: Layout, children: list[subprocess.Popen]) -> None:
    """Start `daemon` and wait until it runs (and answers, where it can say so); a foreground child (mariadbd)
    joins `children` as soon as it is spawned, so the caller reaps it even when its start fails."""
    daemon.pid_file.unlink(missing_ok=True)  # stale: its process is gone
    if daemon.name == "munged":
        _start_munged(daemon, layout)
    elif daemon.name == "mariadbd":
        _start_mariadb(daemon, spec, layout, children)
    elif daemon.name == "slurmdbd":
        _start_slurmdbd(daemon, spec, layout)
    elif daemon.name == "slurmctld":
        launch(daemon, [binary("slurmctld"), "-f", layout.slurm_conf], layout)
    else:
        launch(daemon, [binary("slurmd"), "-f", layout.slurm_conf, "-N", daemon.name.split("-", 1)[1]], layout)


def launch(daemon: Daemon, argv: list, layout: Layout, ready: Callable[[], bool] | None = None,
           timeout: float = DAEMON_START_S) -> None:
    """Run a self-daemonizing program and wait for its pid file (and `ready`, if given)."""
    out = layout.logs / f"{daemon.name}.out"
    log_start = daemon.log.stat().st_size if daemon.log.exists() else 0
    rc = daemons.launch(argv, out, env=slurm_env(layout))
    if rc != 0:
        raise daemons.failure(daemon.name, f"exited with code {rc} at start (its output is in {out})", daemon.log)

    def started() -> bool:
        if daemon.pid() is not None:
            return True
        # Fail fast instead of waiting out the timeout: Slurm logs "fatal:" before it exits.
        pid = daemons.read_pid(daemon.pid_file)
        if (pid is not None and not daemons.is_alive(pid)) or daemons.logged_fatal(daemon.log, log_start):
            raise daemons.failure(daemon.name, "exited at start", daemon.log)
        return False

    if not daemons.wait_for(started, timeout):
        raise daemons.failure(daemon.name, f"wrote no live pid to {daemon.pid_file} within {timeout:g} s",
                              daemon.log)
    if ready is not None and not daemons.wait_for(lambda: daemon.pid() is None or ready(), timeout):
        raise daemons.failure(daemon.name, f"was not ready within {timeout:g} s", daemon.log)
    if daemon.pid() is None:
        raise daemons.failure(daemon.name, "exited right after starting", daemon.log)


def _start_munged(daemon: Daemon, layout: Layout) -> None:
    layout.munge_socket.unlink(missing_ok=True)
    argv = [binary("munged"), f"--socket={layout.munge_socket}", f"--key-file={layout.munge_key}",
            f"--pid-file={daemon.pid_file}", f"--log-file={daemon.log}", f"--seed-file={layout.run / 'munged.seed'}",
            "--force"]
    launch(daemon, argv, layout, ready=layout.munge_socket.exists)


def _start_mariadb(daemon: Daemon, spec: ClusterSpec, layout: Layout, children: list[subprocess.Popen]) -> None:
    layout.db_tmp.mkdir(parents=True, exist_ok=True)
    if not (layout.db / "mysql").is_dir():
        layout.db.mkdir(parents=True, exist_ok=True)
        argv = [binary("mariadb-install-db"), "--no-defaults", "--user=root", f"--datadir={layout.db}",
                f"--tmpdir={layout.db_tmp}", "--auth-root-authentication-method=socket", "--skip-test-db"]
        out = daemons.run(argv, 180)
        if out.returncode != 0:
            raise ClusterError(f"mariadb-install-db failed (exit {out.returncode}):\n"
                               + "\n".join((out.stderr + out.stdout).strip().splitlines()[-15:]))
    layout.mariadb_socket.unlink(missing_ok=True)
    # --user=root: the state dir may be private to root (pytest's tmp dirs are 0700).
    argv = [binary("mariadbd"), "--no-defaults", "--user=root", f"--datadir={layout.db}", f"--tmpdir={layout.db_tmp}",
            f"--socket={layout.mariadb_socket}", f"--port={spec.ports.mariadb}", "--bind-address=127.0.0.1",
            f"--pid-file={daemon.pid_file}", f"--log-error={daemon.log}", "--skip-name-resolve",
            # slurmdbd warns below these; 900 s is its recommended lock wait.
            "--innodb-lock-wait-timeout=900", "--skip-log-bin"]
    child = daemons.spawn(argv, layout.logs / "mariadbd.out")
    children.append(child)

    def accepting() -> bool:
        if child.poll() is not None:
            raise daemons.failure("mariadbd", f"exited with code {child.returncode} at start", daemon.log)
        return daemon.pid() is not None and _sql(layout, "SELECT 1;") == 0

    if not daemons.wait_for(accepting, MARIADB_START_S, interval=0.2):
        raise daemons.failure("mariadbd", f"did not accept connections on {layout.mariadb_socket} "
                              f"within {MARIADB_START_S:g} s", daemon.log)
    if _sql(layout, config.db_setup_sql(layout.db_password.read_text().strip())) != 0:
        raise daemons.failure("mariadbd", "refused to create the accounting database and user", daemon.log)


def _sql(layout: Layout, sql: str) -> int:
    argv = [binary("mariadb"), "--no-defaults", f"--socket={layout.mariadb_socket}", "-u", "root", "--batch"]
    return daemons.run(argv, COMMAND_TIMEOUT_S, input=sql).returncode


def _start_slurmdbd(daemon: Daemon, spec: ClusterSpec, layout: Layout) -> None:
    # slurmdbd reads slurmdbd.conf from the directory of $SLURM_CONF (set by launch).
    launch(daemon, [binary("slurmdbd")], layout, ready=lambda: _clusters(layout) is not None,
           timeout=SLURMDBD_START_S)
    if spec.name not in (_clusters(layout) or ()):
        out = daemons.run([binary("sacctmgr"), "-i", "add", "cluster", spec.name], COMMAND_TIMEOUT_S,
                          env=slurm_env(layout))
        if out.returncode != 0 or spec.name not in (_clusters(layout) or ()):
            raise daemons.failure("slurmdbd", f"did not register cluster {spec.name!r} "
                                  f"(sacctmgr: {(out.stderr or out.stdout).strip()})", daemon.log)


def _clusters(layout: Layout) -> list[str] | None:
    """Cluster names slurmdbd knows, or None while it does not answer."""
    out = daemons.run([binary("sacctmgr"), "-n", "-P", "list", "cluster", "format=cluster"], COMMAND_TIMEOUT_S,
                      env=slurm_env(layout))
    return out.stdout.split() if out.returncode == 0 else None
