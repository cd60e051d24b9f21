"""`elastico-run`: runs the user's program inside the job at the job's current shape and turns signals into checkpoints.

On every (re)start of the job it reads the shape the scheduler chose (the
job's AdminComment `elastico:shape=<name>`, else the family default), exports
it as ELASTICO_* variables (`slurm_elastico.runtime.shape`) plus
ELASTICO_CKPT_DIR and ELASTICO_PROGRESS_FILE (`slurm_elastico.runtime.progress`),
and starts the program; on a job with a GPU it samples the GPU's NVML
counters while the program runs (`slurm_elastico.runtime.counters`). Then:

* SIGUSR1 (an in-place reshape, or Slurm's warning before the time limit) is
  forwarded; the program checkpoints and exits 75. The shape is read again:
  a new shape at the share the job already holds is relaunched in place; a
  shape that needs another share is not (the helper moves the job with a
  requeue, which sends SIGTERM), so the same shape is relaunched; no change
  and the time limit near: the job requeues itself (`scontrol requeue`) and
  continues with a fresh time limit after Slurm's ~120 s BeginTime (the helper's
  StartTime=now shortens it; from inside the job it cannot: the update lands
  before the requeue completes and is overwritten), unless it started under
  30 s ago (Slurm may warn up to a minute early: it is relaunched and
  checkpoints at the limit's SIGTERM, ending as TIMEOUT); otherwise the same
  shape is relaunched.
* SIGTERM (requeuehold, preemption, scancel, time limit) is forwarded; the
  program has `grace_s` (below Slurm's KillWait) to checkpoint and exit, then
  its process group is killed. Either way elastico-run exits and the next
  start resumes from the last good checkpoint. SIGINT acts like SIGTERM.
* Exit 0 from the program ends the job (0); any other code is passed on
  (a signal death as 128+N).

The program runs in its own process group so a kill after the grace takes its
children too; Slurm's own signals reach every process of the job anyway.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from slurm_elastico import config
from slurm_elastico.errors import ConfigError, ElasticoError
from slurm_elastico.model import Family
from slurm_elastico.model import Shape as PlannedShape
from slurm_elastico.runtime.counters import CounterRecorder, counters_path, gpu_of
from slurm_elastico.runtime.progress import ENV as PROGRESS_ENV
from slurm_elastico.runtime.progress import progress_path
from slurm_elastico.runtime.shape import EXIT_CHECKPOINTED, runtime_shape, shape_env
from slurm_elastico.shapes import build_family, enumerate_shapes, parse_spec
from slurm_elastico.wrap import Payload, choose_shape, shebang_argv

QUICK_RUN_S = 2.0
MAX_QUICK_RELAUNCHES = 5
"""A program that asks to be relaunched this many times in a row, each run shorter than QUICK_RUN_S, is failing, not checkpointing."""

MIN_RUN_BEFORE_REQUEUE_S = 30.0
"""A time-limit warning this soon after the job started does not requeue it (no progress would be made)."""

Log = Callable[[str], None]


@dataclass(frozen=True)
class Found:
    """The shape to run now and what Slurm says about the job: its MPS share, seconds to its time limit and since this run began (None = unknown)."""

    shape: PlannedShape
    origin: str
    allocated_share: int | None = None
    remaining_s: float | None = None
    elapsed_s: float | None = None


class JobShapes:
    """Reads the job's shape from Slurm on each call; falls back to the family default when Slurm cannot be read."""

    def __init__(self, family: Family, candidates: Sequence[PlannedShape], job_id: int | None, gateway, log: Log,
                 retries: int = 3, sleep: Callable[[float], None] = time.sleep):
        self.family, self.candidates, self.job_id, self.gateway = family, tuple(candidates), job_id, gateway
        self.log, self.retries, self.sleep = log, retries, sleep

    def __call__(self) -> Found:
        if self.job_id is None or self.gateway is None:
            return Found(self.family.default_shape, "default (not in a Slurm job)")
        problem = ""
        for attempt in range(self.retries):
            try:
                view = self.gateway.job(self.job_id)
            except ElasticoError as exc:  # Slurm down, or squeue printed something unparsable
                problem = str(exc)
                if attempt + 1 < self.retries:
                    self.sleep(1.0)
                continue
            shape, origin = choose_shape(self.family, self.candidates, view.admin_comment, view.mps_share or None)
            now = time.time()
            remaining = view.end_time - now if view.end_time is not None and view.time_limit_s is not None else None
            elapsed = now - view.start_time if view.start_time is not None else None
            return Found(shape, origin, view.mps_share or None, remaining, elapsed)
        self.log(f"warning: cannot read job {self.job_id} from Slurm ({problem}); running the family default")
        return Found(self.family.default_shape, "default (Slurm unreadable)")


class Supervisor:
    """Runs the program at a shape, relaunching on request; owns the signal handling. One per process."""

    def __init__(self, program: Sequence[str], family: Family, shapes: Callable[[], Found], env: Mapping[str, str], *,
                 grace_s: float, lead_s: int, requeue: Callable[[], None], log: Log,
                 clock: Callable[[], float] = time.monotonic, counters: Callable[[int], object] | None = None):
        self.program, self.family, self.shapes = list(program), family, shapes
        self.counters = counters  # pid -> a started recorder with stop(), for each launch (see runtime.counters)
        self.env, self.grace_s, self.lead_s = dict(env), grace_s, lead_s
        self.requeue, self.log, self.clock = requeue, log, clock
        self.child: subprocess.Popen | None = None
        self.pending: list[int] = []
        self.usr1 = False
        self.stopping = False
        self.kill_at: float | None = None

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGUSR1:
            self.usr1 = True
            forward = signal.SIGUSR1
        else:  # SIGTERM, SIGINT: stop for good
            if self.stopping:
                return
            self.stopping = True
            self.kill_at = self.clock() + self.grace_s
            forward = signal.SIGTERM
        self._forward(forward)

    def _forward(self, sig: int) -> None:
        child = self.child
        if child is None or child.returncode is not None:
            self.pending.append(sig)  # delivered to the next program started (if any)
            return
        try:
            os.kill(child.pid, sig)
        except ProcessLookupError:
            pass

    # ------------------------------------------------------------------ running

    def run(self) -> int:
        """Run until the program finishes, fails, or the job is stopped; returns the exit code for the job."""
        handled = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
        previous = {s: signal.signal(s, self._on_signal) for s in handled}
        try:
            return self._loop()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _loop(self) -> int:
        found = self.shapes()
        quick = 0
        while True:
            if self.stopping:
                self.log("stopping before the program started again; its last checkpoint is on disk")
                return EXIT_CHECKPOINTED
            self.log(f"starting the program as shape {found.shape.name} ({found.origin})")
            self.usr1 = False
            started = self.clock()
            rc = self._launch(found.shape)
            ran = self.clock() - started
            if self.stopping:
                self.log(f"program exited {_describe(rc)} after the stop signal")
                return _exit_code(rc)
            if rc == 0:
                self.log("program finished (exit 0)")
                return 0
            if not (rc == EXIT_CHECKPOINTED or (self.usr1 and rc == -signal.SIGUSR1)):
                self.log(f"program failed: {_describe(rc)}")
                return _exit_code(rc)
            quick = quick + 1 if ran < QUICK_RUN_S else 0
            if quick > MAX_QUICK_RELAUNCHES:
                self.log(f"program asked to be relaunched {quick} times in a row within {QUICK_RUN_S:g} s each; giving up")
                return _exit_code(rc)
            new = self.shapes()
            if self.stopping:
                continue
            if new.shape.name != found.shape.name:
                held = new.allocated_share or found.shape.resources.mps
                if new.shape.resources.mps == held:
                    self.log(f"reshape in place: {found.shape.name} -> {new.shape.name} (same share {held})")
                    found = new
                else:
                    self.log(f"shape {new.shape.name} needs share {new.shape.resources.mps} but the job holds {held}: "
                             f"relaunching {found.shape.name}; a requeue moves it")
                continue
            if _time_limit_near(new, self.lead_s):
                if new.elapsed_s is not None and new.elapsed_s < MIN_RUN_BEFORE_REQUEUE_S:
                    # Slurm may send the warning up to a minute early; a job whose limit is barely above the
                    # lead would be requeued before doing any work, again and again.
                    self.log(f"time-limit warning after only {new.elapsed_s:.0f} s with {new.remaining_s:.0f} s left: "
                             f"relaunching {found.shape.name}; it checkpoints again at the limit's SIGTERM")
                    continue
                self.log(f"time limit in {new.remaining_s:.0f} s: checkpointed; requeueing the job to continue later")
                try:
                    self.requeue()
                except ElasticoError as exc:
                    self.log(f"requeue refused ({exc}); the job ends here and can be resubmitted to resume")
                return EXIT_CHECKPOINTED
            self.log(f"checkpointed without a new shape: relaunching {found.shape.name}")

    def _launch(self, shape: PlannedShape) -> int:
        env = {**self.env, **shape_env(runtime_shape(self.family, shape))}
        self.child = subprocess.Popen(self.program, env=env, start_new_session=True)
        pending, self.pending = self.pending, []
        for sig in pending:  # a USR1 that came between two runs: this run checkpoints at once and the shape is re-read
            self.usr1 = self.usr1 or sig == signal.SIGUSR1
            self._forward(sig)
        recorder = self.counters(self.child.pid) if self.counters is not None else None
        try:
            return self._wait()
        finally:
            if recorder is not None:
                recorder.stop()

    def _wait(self) -> int:
        killed = False
        while True:
            try:
                return self.child.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                if not killed and self.kill_at is not None and self.clock() >= self.kill_at:
                    self.log(f"program did not exit within the {self.grace_s:g} s grace: killing it; "
                             "the job resumes from its last good checkpoint")
                    try:
                        os.killpg(self.child.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    killed = True


def _time_limit_near(found: Found, lead_s: int) -> bool:
    """The USR1 was Slurm's time-limit warning (`--signal=B:USR1@lead`): the limit is about `lead_s` away."""
    return found.remaining_s is not None and found.remaining_s <= lead_s * 1.5 + 30


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


# ---------------------------------------------------------------------- entry points


def family_from_spec(text: str, source: str, gpu_memory_mib: int) -> tuple[Family, list[PlannedShape]]:
    """The job's family and every shape of its spec that fits the GPU (names the planner may write)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"not valid YAML: {exc}"]) from None
    spec = parse_spec(data, source)
    return build_family(spec, gpu_memory_mib), enumerate_shapes(spec, gpu_memory_mib)


def ckpt_dir(env: Mapping[str, str]) -> str:
    """ELASTICO_CKPT_DIR if the user set it, else <submit dir>/.elastico/<job id> (per job, kept across requeues)."""
    if env.get("ELASTICO_CKPT_DIR"):
        return env["ELASTICO_CKPT_DIR"]
    job = env.get("SLURM_JOB_ID")
    if job:
        return str(Path(env.get("SLURM_SUBMIT_DIR") or os.getcwd()) / ".elastico" / job)
    return str(Path(os.getcwd()) / "elastico-ckpt")


def _counter_recorder(env: Mapping[str, str], job: str | None) -> Callable[[int], CounterRecorder] | None:
    """For a job with a GPU: start a recorder of its counters for a launched program's pid (runtime.counters)."""
    gpu = gpu_of(env)
    if not job or gpu is None:
        return None
    path = counters_path(os.getcwd(), job)
    return lambda pid: CounterRecorder(path, gpu).start(pid)


def _log_to_stderr(job: str | None) -> Log:
    tag = f"elastico-run[{job}]" if job else "elastico-run"

    def log(msg: str) -> None:
        print(f"{tag}: {msg}", file=sys.stderr, flush=True)

    return log


def supervise(program: Sequence[str], family: Family, candidates: Sequence[PlannedShape], *, grace_s: float,
              lead_s: int, slurm_conf: str = "", env: Mapping[str, str] | None = None) -> int:
    """Wire the Slurm-facing parts (gateway, requeue) to a Supervisor and run it."""
    from slurm_elastico.slurm.gateway import SlurmGateway
    from slurm_elastico.slurm.runner import SubprocessRunner

    env = dict(os.environ if env is None else env)
    job = env.get("SLURM_JOB_ID")
    log = _log_to_stderr(job)
    runner = SubprocessRunner(env={"SLURM_CONF": slurm_conf} if slurm_conf else None)
    gateway = SlurmGateway(runner) if job else None
    job_id = int(job) if job else None
    env["ELASTICO_CKPT_DIR"] = ckpt_dir(env)
    Path(env["ELASTICO_CKPT_DIR"]).mkdir(parents=True, exist_ok=True)
    if job:  # where the helper looks for it (see runtime.progress): the job's working directory and id
        env[PROGRESS_ENV] = str(progress_path(os.getcwd(), job))
    log(f"restart {env.get('SLURM_RESTART_COUNT', '0')}, checkpoints in {env['ELASTICO_CKPT_DIR']}")

    def requeue() -> None:
        if gateway is not None and job_id is not None:
            gateway.requeue(job_id)

    shapes = JobShapes(family, candidates, job_id, gateway, log)
    sup = Supervisor(program, family, shapes, env, grace_s=grace_s, lead_s=lead_s, requeue=requeue, log=log,
                     counters=_counter_recorder(env, job))
    return sup.run()


def run_embedded(blob: str) -> int:
    """Entry of the batch script elastico-submit generates: decode the payload, write the script privately, supervise it."""
    log = _log_to_stderr(os.environ.get("SLURM_JOB_ID"))
    try:
        payload = Payload.decode(blob)
        family, candidates = family_from_spec(payload.family_spec, payload.family_source, payload.gpu_memory_mib)
        workdir = tempfile.mkdtemp(prefix="elastico-run-")
    except ElasticoError as exc:
        log(f"error: {exc}")
        return exc.exit_code
    try:
        path = os.path.join(workdir, payload.script_name or "job-script")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
        with os.fdopen(fd, "wb") as f:
            f.write(payload.script)
        program = shebang_argv(payload.script, path) + list(payload.args)
        return supervise(program, family, candidates, grace_s=payload.grace_s, lead_s=payload.signal_lead_s,
                         slurm_conf=payload.slurm_conf)
    except ElasticoError as exc:
        log(f"error: {exc}")
        return exc.exit_code
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    """`elastico-run --family FILE [--grace S] [--] PROGRAM [ARGS]`: the same supervision for a hand-written batch script."""
    p = argparse.ArgumentParser(prog="elastico-run", description=main.__doc__)
    p.add_argument("--family", required=True, help="shape family YAML")
    p.add_argument("--grace", type=float, default=None, help="seconds the program has after SIGTERM (default: submit.grace_s)")
    p.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    log = _log_to_stderr(os.environ.get("SLURM_JOB_ID"))
    if not program:
        p.error("no program given")
    try:
        settings = config.load()
        family, candidates = family_from_spec(Path(args.family).read_text(), args.family, settings.gpu.memory_mib)
    except OSError as exc:
        log(f"error: family {args.family}: cannot read it: {exc.strerror}")
        sys.exit(2)
    except ElasticoError as exc:
        log(f"error: {exc}")
        sys.exit(exc.exit_code)
    sys.exit(supervise(program, family, candidates, grace_s=args.grace or settings.submit.grace_s,
                       lead_s=settings.submit.signal_lead_s, slurm_conf=settings.slurm.conf))
