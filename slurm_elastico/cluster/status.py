"""What the local cluster reports: each daemon's pid, each node's state, what `up` and `down` did.

Node states are Slurm's JSON words joined by '+' ("idle", "mixed+completing",
"idle+not_responding"), as `slurm.nodes` writes them on 22.05 and 24.11 alike;
`usable` says which of them mean registered and usable.
"""

from __future__ import annotations

from dataclasses import dataclass

# The words of a node state ("mixed+completing") that mean "registered and usable"; a node with any other
# flag (not_responding, drain, planned, powered_down, ...) is not ready.
READY_STATES = frozenset({"idle", "mixed", "allocated", "completing"})


def usable(state: str) -> bool:
    """Whether a node state such as "mixed+completing" (as `slurm.nodes` writes it) means registered and usable."""
    return set(state.split("+")) <= READY_STATES


@dataclass(frozen=True)
class DaemonStatus:
    name: str
    pid: int | None
    log: str

    @property
    def running(self) -> bool:
        return self.pid is not None


@dataclass(frozen=True)
class ClusterStatus:
    """What runs now: each expected daemon with its pid (None = not running) and each node's state."""

    state_dir: str
    slurm_conf: str
    accounting: bool
    daemons: tuple[DaemonStatus, ...]
    nodes: dict[str, str]

    @property
    def running(self) -> bool:
        """Every daemon runs and every node is usable."""
        return (all(d.running for d in self.daemons) and bool(self.nodes)
                and all(usable(s) for s in self.nodes.values()))

    @property
    def stopped(self) -> bool:
        return not any(d.running for d in self.daemons)

    def to_dict(self) -> dict:
        return {
            "state_dir": self.state_dir,
            "slurm_conf": self.slurm_conf,
            "accounting": self.accounting,
            "running": self.running,
            "daemons": [{"name": d.name, "pid": d.pid, "running": d.running, "log": d.log} for d in self.daemons],
            "nodes": dict(self.nodes),
        }


@dataclass(frozen=True)
class UpResult:
    started: tuple[str, ...]
    installed: tuple[str, ...]
    seconds: float
    version: str

    @property
    def already_running(self) -> bool:
        return not self.started


@dataclass(frozen=True)
class DownResult:
    stopped: tuple[str, ...]
    cancelled_jobs: int
    seconds: float
    jobs_problem: str = ""
    """Why no job was cancelled though the daemons were stopped ("" when the jobs were listed)."""
