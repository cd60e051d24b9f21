"""elastico-run inside a Slurm job: wires the supervisor (`slurm_elastico.jobwrap.supervisor`) to the job.

Where checkpoints and the progress report go, the GPU counter recorder, the
Slurm gateway that reads the job's shape and requeues it (every Slurm command
goes through `slurm_elastico.slurm`), and the embedded payload of a generated
batch script written to a private file and run. The entry points are
`slurm_elastico.cli.run` (`elastico-run` and `run_embedded`).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from slurm_elastico.errors import ConfigError
from slurm_elastico.file_lock import Busy, held
from slurm_elastico.jobwrap.payload import Payload
from slurm_elastico.jobwrap.script import shebang_argv
from slurm_elastico.jobwrap.shape import JobShapes, Log, family_from_spec
from slurm_elastico.jobwrap.supervisor import Supervisor
from slurm_elastico.model import MPS_SHARES_PER_GPU, Family
from slurm_elastico.model import Shape as PlannedShape
from slurm_elastico.runtime.counters import CounterRecorder, counters_path, gpu_of
from slurm_elastico.runtime.progress import ENV as PROGRESS_ENV
from slurm_elastico.runtime.progress import progress_path


def ckpt_dir(env: Mapping[str, str]) -> str:
    """ELASTICO_CKPT_DIR if the user set it, else <submit dir>/.elastico/<job id> (per job, kept across requeues)."""
    if env.get("ELASTICO_CKPT_DIR"):
        return env["ELASTICO_CKPT_DIR"]
    job = env.get("SLURM_JOB_ID")
    if job:
        return str(Path(env.get("SLURM_SUBMIT_DIR") or os.getcwd()) / ".elastico" / job)
    return str(Path(os.getcwd()) / "elastico-ckpt")


def fresh_ckpt_dir(env: Mapping[str, str], log: Log, now: float | None = None) -> str:
    """`ckpt_dir`, made, for this start of the job. On the job's first start (SLURM_RESTART_COUNT 0 or unset), a
    per-job default directory that already holds anything is another job's of the same id (Slurm gives an id again
    once its state is reset, or when ids wrap): it is moved aside to `<id>.stale-<unix time>`, so that this job
    neither resumes that job's checkpoints (it would end at once, having trained nothing) nor prunes them. A
    directory the user names (ELASTICO_CKPT_DIR) is resumed as it is: continuing a former job there is what it
    is for."""
    path = Path(ckpt_dir(env))
    first = env.get("SLURM_RESTART_COUNT", "0") in ("", "0")
    if first and env.get("SLURM_JOB_ID") and not env.get("ELASTICO_CKPT_DIR") and path.is_dir() \
            and any(path.iterdir()):
        aside = path.with_name(f"{path.name}.stale-{int(time.time() if now is None else now)}")
        path.rename(aside)
        log(f"{path} held another job's files (the same job id, given again by Slurm): moved to {aside}")
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


LOCK_NAME = ".elastico-run.lock"
"""The file in a checkpoint directory whose flock the running job's elastico-run holds (`ckpt_lock`)."""
OWN_LINGER_S = 120.0
"""How long a start waits for its own job's earlier run to let go of the directory (a step still being killed
after a requeue, or an NFS lock the server has not yet dropped after a node died) before it gives up."""


class CkptDirBusy(ConfigError):
    """Another running job holds the checkpoint directory."""


@contextmanager
def ckpt_lock(path: str, env: Mapping[str, str], log: Log, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> Iterator[None]:
    """Hold the checkpoint directory for this job while the block runs: two jobs running at once in one directory
    (a shared ELASTICO_CKPT_DIR) would resume and prune each other's checkpoints. Another job holding it:
    `CkptDirBusy`, naming it, before this job reads or writes anything there. This job's own earlier run holding it
    is waited for, up to `OWN_LINGER_S`. A file system without locks is logged and used unlocked."""
    job = env.get("SLURM_JOB_ID", "")
    holder = {"pid": os.getpid(), "job": job, "host": socket.gethostname()}
    lock = Path(path) / LOCK_NAME
    deadline = clock() + OWN_LINGER_S
    while True:
        try:
            with held(lock, holder, lambda exc: log(f"cannot lock {lock} ({exc.strerror or exc}): two jobs sharing "
                                                     "this directory would not be stopped"), shared=True):
                yield
            return
        except Busy as busy:
            other = busy.holder
            own = bool(job) and str(other.get("job", "")) == job
            if own and clock() < deadline:
                sleep(1.0)
                continue
            who = f"job {other.get('job') or 'unknown'} (pid {other.get('pid', 'unknown')} on " \
                  f"{other.get('host', 'an unknown host')})"
            raise CkptDirBusy("ELASTICO_CKPT_DIR", [
                f"{path} is in use by {who}" + (f" for over {OWN_LINGER_S:.0f} s" if own else "")
                + "; two jobs running at once in one checkpoint directory would resume and prune each other's "
                "checkpoints; allowed: one running job per directory (unset ELASTICO_CKPT_DIR for the job's own, "
                "<submit dir>/.elastico/<job id>)"]) from None


def counter_recorder(env: Mapping[str, str], job: str | None) -> Callable[[int], CounterRecorder] | None:
    """For a job with a GPU: start a recorder of its counters for a launched program's pid (runtime.counters)."""
    gpu = gpu_of(env)
    if not job or gpu is None:
        return None
    path = counters_path(os.getcwd(), job)
    return lambda pid: CounterRecorder(path, gpu).start(pid)


def stderr_log(job: str | None) -> Log:
    """Log lines as `elastico-run[<job id>]: ...` on stderr."""
    tag = f"elastico-run[{job}]" if job else "elastico-run"

    def log(msg: str) -> None:
        print(f"{tag}: {msg}", file=sys.stderr, flush=True)

    return log


def supervise(program: Sequence[str], family: Family, candidates: Sequence[PlannedShape], *, grace_s: float,
              lead_s: int, slurm_conf: str = "", env: Mapping[str, str] | None = None,
              shares_per_gpu: int = MPS_SHARES_PER_GPU) -> int:
    """Wire the Slurm-facing parts (gateway, requeue) to a Supervisor and run it."""
    from slurm_elastico.slurm.gateway import SlurmGateway
    from slurm_elastico.slurm.runner import SubprocessRunner

    env = dict(os.environ if env is None else env)
    job = env.get("SLURM_JOB_ID")
    log = stderr_log(job)
    runner = SubprocessRunner(env={"SLURM_CONF": slurm_conf} if slurm_conf else None)
    gateway = SlurmGateway(runner) if job else None
    job_id = int(job) if job else None
    env["ELASTICO_CKPT_DIR"] = fresh_ckpt_dir(env, log)
    if job:  # where the helper looks for it (see runtime.progress): the job's working directory and id
        env[PROGRESS_ENV] = str(progress_path(os.getcwd(), job))
    log(f"restart {env.get('SLURM_RESTART_COUNT', '0')}, checkpoints in {env['ELASTICO_CKPT_DIR']}")

    def requeue() -> None:
        if gateway is not None and job_id is not None:
            gateway.requeue(job_id)

    if slurm_conf:  # srun, for a shape of several ranks, reads the same cluster
        env["SLURM_CONF"] = slurm_conf
    shapes = JobShapes(family, candidates, job_id, gateway, log, shares_per_gpu=shares_per_gpu)
    sup = Supervisor(program, family, shapes, env, grace_s=grace_s, lead_s=lead_s, requeue=requeue, log=log,
                     counters=counter_recorder(env, job), shares_per_gpu=shares_per_gpu)
    with ckpt_lock(env["ELASTICO_CKPT_DIR"], env, log):
        return sup.run()


def run_payload(payload: Payload) -> int:
    """Run the job a generated batch script carries: write its script privately, supervise it, remove the copy."""
    family, candidates = family_from_spec(payload.family_spec, payload.family_source, payload.gpu_memory_mib,
                                          payload.gpu_types, payload.type_limit,
                                          {t: {"like": like} for t, like in payload.type_like})
    workdir = tempfile.mkdtemp(prefix="elastico-run-")
    try:
        path = os.path.join(workdir, payload.script_name or "job-script")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
        with os.fdopen(fd, "wb") as f:
            f.write(payload.script)
        program = shebang_argv(payload.script, path) + list(payload.args)
        return supervise(program, family, candidates, grace_s=payload.grace_s, lead_s=payload.signal_lead_s,
                         slurm_conf=payload.slurm_conf, shares_per_gpu=payload.shares_per_gpu)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
