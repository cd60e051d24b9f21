"""One process per GPU for a data-parallel shape: `srun` tasks, each given torch's env:// variables.

A shape on n whole GPUs (`Resources.gpus` n) runs n ranks (training; an
inference shape runs one process per engine replica, `processes`). elastico-run starts
them as one job step, `srun --ntasks=n --ntasks-per-node=n/K` over the job's K
nodes, each task through this module (`python -m slurm_elastico.jobwrap.ranks
PROGRAM ...`), which sets RANK (SLURM_PROCID), LOCAL_RANK (SLURM_LOCALID) and
WORLD_SIZE (SLURM_NTASKS) and then becomes the program. MASTER_ADDR (the batch
host, where rank 0 runs: srun's block distribution puts the first ranks on the
first node) and MASTER_PORT (a port free there) come from elastico-run through
srun's `--export=ALL`. Why srun and not a launcher of our own (torchrun, or
forking n children): a job on K > 1 nodes can only start processes on the other
nodes through srun, and one way serves both cases. Verified on Slurm 22.05 and
24.11 with the local cluster's fake GPUs, several nodes on one host
(`tests/slurm/test_ranks_live.py`): every task of the step sees the job's GPUs
of its node (a step gets the job's GRES by default), `--overcommit` lets n
tasks run where the job holds fewer CPUs than GPUs, and srun passes the
signals elastico-run forwards (SIGUSR1, SIGTERM) to every task.

`--kill-on-bad-exit=0`: a rank that exits 75 (checkpointed) before rank 0 has
finished writing the checkpoint must not get rank 0 killed.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence

from slurm_elastico.errors import ConfigError
from slurm_elastico.runtime.shape import Shape as RuntimeShape
from slurm_elastico.runtime.shape import TrainShape
from slurm_elastico.slurm import commands

ENTRY = "slurm_elastico.jobwrap.ranks"


def processes(shape: RuntimeShape) -> int:
    """Processes a shape runs as: a training shape's ranks, an inference shape's engine replicas (each engine
    spans `tensor_parallel_size` GPUs itself, so tensor parallelism alone is one process)."""
    return shape.ranks if isinstance(shape, TrainShape) else shape.replicas


def srun_argv(program: Sequence[str], ranks: int, nodes: int, python: str = sys.executable) -> list[str]:
    """The srun command line that runs `program` as `ranks` tasks spread evenly over the job's `nodes` nodes."""
    if ranks < 1 or nodes < 1 or ranks % nodes:
        raise ConfigError("elastico-run", [f"{ranks} rank(s) cannot be spread evenly over {nodes} node(s); "
                                           "allowed: a rank count that is a multiple of the job's node count"])
    return commands.srun_tasks([python, "-m", ENTRY, *program], ranks, nodes)


def rendezvous(host: str | None = None) -> dict[str, str]:
    """MASTER_ADDR and MASTER_PORT for this launch: this host (rank 0's) and a TCP port free on it now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return {"MASTER_ADDR": host or socket.gethostname(), "MASTER_PORT": str(port)}


def rank_env(env: Mapping[str, str]) -> dict[str, str]:
    """RANK, LOCAL_RANK, WORLD_SIZE of this srun task, from Slurm's SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS."""
    missing = [v for v in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT")
               if not env.get(v)]
    if missing:
        raise ConfigError("elastico-run rank", [f"{', '.join(missing)} not set: this runs as an srun task "
                                                "started by elastico-run, not by hand"])
    return {"RANK": env["SLURM_PROCID"], "LOCAL_RANK": env["SLURM_LOCALID"], "WORLD_SIZE": env["SLURM_NTASKS"]}


def main(argv: Sequence[str]) -> int:
    """Become `argv` with this task's rank variables set; 2 with a message when they cannot be."""
    if not argv:
        print(f"usage: python -m {ENTRY} PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    try:
        env = {**os.environ, **rank_env(os.environ)}
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    os.execvpe(argv[0], list(argv), env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
