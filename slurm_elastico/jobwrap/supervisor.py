"""elastico-run's in-job supervisor: runs the user's program at the job's current shape, turns signals into checkpoints.

On every (re)start of the job `slurm_elastico.jobwrap.job` exports the shape
the scheduler chose (the job's AdminComment `elastico:shape=<name>`, else the
family default; `slurm_elastico.jobwrap.shape`) as ELASTICO_* variables
(`slurm_elastico.runtime.shape`) plus ELASTICO_CKPT_DIR and
ELASTICO_PROGRESS_FILE (`slurm_elastico.runtime.progress`), and starts the
program under the Supervisor below; on a job with a GPU it samples the GPU's
NVML counters while the program runs (`slurm_elastico.runtime.counters`).
The relaunch and requeue rules:

* SIGUSR1 to a goodput-mode program (`batch: {adaptive: true}`): the shape is
  read at once, and a new batch on the GPUs the job holds is handed to the
  running program (`runtime.rebatch`), which takes it at its next step
  without a relaunch; any other USR1 is handled as below.
* SIGUSR1 (an in-place reshape, or Slurm's warning before the time limit) is
  forwarded; the program checkpoints and exits 75. The shape is read again:
  a new shape at the share (or whole-GPU count) the job already holds is
  relaunched in place; a shape that needs another share or another GPU count
  is not (the helper moves the job with a requeue, which sends SIGTERM, and the
  next start runs it), so the same shape is relaunched; no change
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

A shape on n > 1 whole GPUs runs n ranks, one process per GPU, as one srun
step (`slurm_elastico.jobwrap.ranks`: RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT); the signals above go to srun, which passes them to
every rank, and the step's end is the program's end (srun's exit status is the
highest of its ranks'). Every rank gets the same ELASTICO_* variables and
checkpoint directory. A 1-GPU shape runs the program directly, as always.
"""

from __future__ import annotations

import contextlib

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from slurm_elastico.errors import ElasticoError
from slurm_elastico.jobwrap.ranks import processes, rendezvous, srun_argv
from slurm_elastico.jobwrap.shape import Found, Log
from slurm_elastico.model import MPS_SHARES_PER_GPU, Family
from slurm_elastico.model import Shape as PlannedShape
from slurm_elastico.runtime import rebatch
from slurm_elastico.runtime.shape import DEFAULT_CKPT_DIR, EXIT_CHECKPOINTED, runtime_shape, shape_env
from slurm_elastico.shapes.current import ranks_of
from slurm_elastico.shapes.units import percent_of

QUICK_RUN_S = 2.0
MAX_QUICK_RELAUNCHES = 5
"""A program that asks to be relaunched this many times in a row, each run shorter than QUICK_RUN_S, is failing, not checkpointing."""

UNREAD = "default ("
"""How `JobShapes` names a shape it could not read from Slurm (the family default): never a reason to switch."""

MIN_RUN_BEFORE_REQUEUE_S = 30.0
"""A time-limit warning this soon after the job started does not requeue it (no progress would be made)."""


class Supervisor:
    """Runs the program at a shape, relaunching on request; owns the signal handling. One per process."""

    def __init__(self, program: Sequence[str], family: Family, shapes: Callable[[], Found], env: Mapping[str, str], *,
                 grace_s: float, lead_s: int, requeue: Callable[[], None], log: Log,
                 clock: Callable[[], float] = time.monotonic, counters: Callable[[int], object] | None = None,
                 shares_per_gpu: int = MPS_SHARES_PER_GPU):
        self.program, self.family, self.shapes = list(program), family, shapes
        self.shares_per_gpu = shares_per_gpu
        self.counters = counters  # pid -> a started recorder with stop(), for each launch (see runtime.counters)
        self.env, self.grace_s, self.lead_s = dict(env), grace_s, lead_s
        self.requeue, self.log, self.clock = requeue, log, clock
        self.child: subprocess.Popen | None = None
        self.pending: list[int] = []
        self.usr1 = False
        # Goodput mode: a USR1 is first read as a possible new batch in process (`runtime.rebatch`), by `_wait`.
        self.adaptive = rebatch.adaptive(family)
        self.usr1_unread = False
        self.running: Found | None = None  # what the program runs now (its launch, or a new batch taken since)
        self.stopping = False
        self.kill_at: float | None = None

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGUSR1:
            if self.adaptive and self.child is not None and self.child.returncode is None and not self.stopping:
                self.usr1_unread = True  # `_wait` reads the new shape (no Slurm call inside a handler)
                return
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
        with contextlib.suppress(ProcessLookupError):  # it just ended: `_wait` reads its exit status
            os.kill(child.pid, sig)

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
            rc = self._launch(found)
            found = self.running or found  # (a new batch it took in process since its launch)
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
                same, held = self._holds(new, found)
                if same:
                    self.log(f"reshape in place: {found.shape.name} -> {new.shape.name} (same {held})")
                    found = new
                else:
                    self.log(f"shape {new.shape.name} needs {_needs(new.shape)} but the job holds {held}: "
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

    def _holds(self, new: Found, current: Found) -> tuple[bool, str]:
        """Does the job hold what `new.shape` needs (its GPU count, and for a share that share)? And what it holds."""
        gpus = new.allocated_gpus or ranks_of(current.shape)
        if ranks_of(new.shape) != gpus:
            return False, f"{gpus} whole GPU(s)" if new.allocated_gpus or gpus > 1 else "one GPU"
        if new.allocated_gpus or gpus > 1:  # whole GPUs: a 1-GPU shape runs at any share on a whole one
            return True, f"{gpus} whole GPU(s)"
        # Slurm's MPS counts, converted (shapes.units) rather than assuming 100 a GPU
        held = (percent_of(new.allocated_share, self.shares_per_gpu) if new.allocated_share
                else float(current.shape.resources.mps))
        return new.shape.resources.mps == held, f"share {held:g} %"

    def _launch(self, found: Found) -> int:
        shape = found.shape
        planned = runtime_shape(self.family, shape)
        env = {**self.env, **shape_env(planned)}
        if self.adaptive:
            rebatch.discard(self._ckpt_dir())  # an offer the last run did not take: this launch's shape is newer
        self.running = found
        argv = self.program
        ranks = processes(planned)
        if ranks > 1:  # one process per rank (or engine replica): an srun step of `ranks` tasks (jobwrap.ranks)
            nodes = found.nodes or int(env.get("SLURM_JOB_NUM_NODES") or 1)
            argv = srun_argv(self.program, ranks, nodes)
            env.update(rendezvous())
            self.log(f"{ranks} ranks on {nodes} node(s), rendezvous {env['MASTER_ADDR']}:{env['MASTER_PORT']}")
        self.child = subprocess.Popen(argv, env=env, start_new_session=True)
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
                if self.usr1_unread:
                    self.usr1_unread = False
                    self._read_usr1()
                if not killed and self.kill_at is not None and self.clock() >= self.kill_at:
                    self.log(f"program did not exit within the {self.grace_s:g} s grace: killing it; "
                             "the job resumes from its last good checkpoint")
                    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile: wait() returns its status
                        os.killpg(self.child.pid, signal.SIGKILL)
                    killed = True

    def _ckpt_dir(self) -> str:
        return self.env.get("ELASTICO_CKPT_DIR") or DEFAULT_CKPT_DIR

    def _read_usr1(self) -> None:
        """A USR1 to a goodput-mode program: a new batch on the GPUs it holds is offered to it in process
        (`runtime.rebatch`); anything else (another shape, the time-limit warning) is forwarded, as always."""
        new = self.shapes()
        now = self.running
        if (not self.stopping and now is not None and not new.origin.startswith(UNREAD)
                and rebatch.in_process(self.family, now.shape, new.shape)):
            rebatch.offer(self._ckpt_dir(), runtime_shape(self.family, new.shape))
            self.log(f"new batch in process: {now.shape.name} -> {new.shape.name} (the program takes it at its "
                     "next step)")
            self.running = new
            return
        self.usr1 = True
        self._forward(signal.SIGUSR1)


def _needs(shape: PlannedShape) -> str:
    return f"{shape.resources.gpus} whole GPUs" if shape.resources.gpus > 1 else f"share {shape.resources.mps} %"


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
