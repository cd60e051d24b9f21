"""The Slurm gateway: the only class that runs Slurm commands.

It reads the cluster (`snapshot()`: one `squeue` call and one node listing, whatever
the number of jobs) and acts on it (MPS share, node pin, requeue with a new
share, signals, admin comments). Argv comes from `commands`, parsing from
`jobs`, `nodes` and `accounting`, assembly from `snapshot`; this class only
sequences them through an injected runner, so a test or the simulator can
hand in another runner (or another gateway with the same methods).

Every failure is a typed error carrying the argv, exit code and stderr. A read
that gets no answer (a non-zero exit, a timeout, no JSON, or Slurm's own
`errors` list in the JSON) is `SlurmUnavailable`, never an empty cluster:
22.05's `squeue --json` exits 0 with `slurm_load_jobs` errors and no jobs while
slurmctld is down.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from slurm_elastico.errors import (
    InvalidActionError,
    JobNotPendingError,
    NotJsonError,
    SlurmError,
    SlurmUnavailable,
    UnknownJobError,
)
from slurm_elastico.model import Action, ActionKind, JobState, JobView, Snapshot
from slurm_elastico.slurm import commands, gpu_count
from slurm_elastico.slurm.accounting import SacctRecord, parse_sacct
from slurm_elastico.slurm.jobs import parse_squeue
from slurm_elastico.slurm.nodes import parse_sinfo
from slurm_elastico.slurm.runner import Completed, Runner
from slurm_elastico.slurm.schema import slurm_errors, slurm_version
from slurm_elastico.slurm.snapshot import build_nodes, partitions_from

REVOKE_GAP_S = 2.0
"""Least time between a requeue-hold and the release of the job (see `requeue_with_share`)."""
RESTART_TIMEOUT_S = 60.0
"""How long a requeued job, released, may take to run again on the place kept for it (`_place_kept`)."""
log = logging.getLogger(__name__)
_NOT_WAITING = tuple(s for s in JobState if s is not JobState.PENDING)
_NO_RESERVATION = re.compile(r"Requested reservation is invalid", re.IGNORECASE)
"""What `scontrol delete ReservationName=` says of a reservation that does not exist (ESLURM_RESERVATION_INVALID)."""
_RESERVATION_BUSY = re.compile(r"Requested reservation is in use", re.IGNORECASE)
"""What it says of one with a job in it (ESLURM_RESERVATION_BUSY)."""

_UNKNOWN_JOB = ("invalid job id", "unknown job", "does not exist")
_NOT_PENDING = ("no longer pending", "job is not pending", "already running")
# What Slurm's clients print when the controller cannot be reached (measured on 22.05 with slurmctld
# stopped: `scontrol show config` "Unable to contact slurm controller (connect failure)", `scontrol release`
# and `update` "Unexpected message received"); the rest are the other texts of Slurm's communication errors.
_UNREACHABLE = ("unable to contact slurm controller", "connect failure", "connection refused",
                "unexpected message received", "socket timed out", "zero bytes were transmitted",
                "communication connection failure", "connection timed out")


_NOTHING_FOUND = "slurmdb_jobs_get: nothing found"
"""22.05's `sacct --json` for a query no job matches: exit 0, no jobs, this one `errors` entry (error 9003)."""


def _nothing_found(result: Completed) -> bool:
    """Whether `result` is accounting's answer that no job matched: an empty answer, not an outage."""
    if result.returncode != 0:
        return False
    try:
        errors = slurm_errors(result.stdout)
    except NotJsonError:
        return False
    return bool(errors) and all(e.lower() == _NOTHING_FOUND for e in errors)


def _says(text: str, phrases: Sequence[str]) -> bool:
    low = text.lower()
    return any(s in low for s in phrases)


def classify(result: Completed) -> Completed:
    """Raise the typed error a failed Slurm command deserves; return the result when it succeeded."""
    if result.returncode == 0:
        return result
    text = (result.stderr or result.stdout).strip()
    if _says(text, _UNKNOWN_JOB):
        raise UnknownJobError(result.argv, result.returncode, text)
    if _says(text, _NOT_PENDING):
        raise JobNotPendingError(result.argv, result.returncode, text)
    if _says(text, _UNREACHABLE):
        raise SlurmUnavailable(result.argv, result.returncode, text,
                               f"`{' '.join(result.argv)}` could not reach Slurm's controller (exit {result.returncode})")
    raise SlurmError(result.argv, result.returncode, text)


def check_answer(result: Completed) -> Completed:
    """A read's result when Slurm answered; otherwise the typed error (see the module's docstring).

    `UnknownJobError` when Slurm answered that the job does not exist (by exit code or in its `errors`);
    `SlurmUnavailable` for any other non-zero exit, output that is no JSON object, or a non-empty `errors`
    list; `ParseError` (from the parsers, later) for JSON of an unknown schema.
    """
    command = " ".join(result.argv)
    if result.returncode != 0:
        text = (result.stderr or result.stdout).strip()
        if _says(text, _UNKNOWN_JOB):
            raise UnknownJobError(result.argv, result.returncode, text)
        raise SlurmUnavailable(result.argv, result.returncode, text,
                               f"`{command}` did not answer (exit {result.returncode})")
    try:
        errors = slurm_errors(result.stdout)
    except NotJsonError as exc:
        raise SlurmUnavailable(result.argv, 0, result.stderr, f"`{command}` did not answer: {exc}") from None
    if errors:
        text = "; ".join(errors)
        if _says(text, _UNKNOWN_JOB):
            raise UnknownJobError(result.argv, 0, text)
        raise SlurmUnavailable(result.argv, 0, text,
                               f"`{command}` answered with Slurm errors and no trustworthy data (is slurmctld down?)")
    return result


class SlurmGateway:
    """Snapshot and actions against a real Slurm cluster through `runner`.

    `shares_per_gpu` must match gres.conf (MPS Count ÷ GPUs); `gpu_memory_mib`
    is each GPU's memory, which Slurm does not know. `sleep` is injectable so
    tests of the polling logic need not wait.
    """

    def __init__(
        self,
        runner: Runner,
        *,
        shares_per_gpu: int = 100,
        gpu_memory_mib: int = 0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ):
        self.runner = runner
        self.shares_per_gpu = shares_per_gpu
        self.gpu_memory_mib = gpu_memory_mib
        self._sleep = sleep
        self._clock = clock
        self._held_at: dict[int, float] = {}  # when `preempt` held each job (the release waits REVOKE_GAP_S)

    # ----------------------------------------------------------------- reading

    def _run(self, argv: Sequence[str]) -> Completed:
        """An action: typed errors by exit code and message (`classify`)."""
        return classify(self.runner(argv))

    def _read(self, argv: Sequence[str]) -> str:
        """A read's JSON text; `SlurmUnavailable` when Slurm did not answer (`check_answer`)."""
        return check_answer(self.runner(argv)).stdout

    def jobs(self) -> tuple[JobView, ...]:
        """Active jobs (pending, running, suspended, completing), from one squeue call."""
        jobs = parse_squeue(self._read(commands.squeue_json()))
        return tuple(j for j in jobs if j.state.active)

    def snapshot(self) -> Snapshot:
        """The cluster now: one squeue call and one node listing, whatever the number of jobs.

        `SlurmUnavailable` when either did not answer: an outage is never an empty cluster.
        """
        squeue_text = self._read(commands.squeue_json())
        version = slurm_version(squeue_text)
        nodes_text = self._read(commands.nodes_json(version))
        taken_at = self._clock()
        jobs = tuple(j for j in parse_squeue(squeue_text) if j.state.active)
        records = parse_sinfo(nodes_text)
        nodes = build_nodes(records, jobs, shares_per_gpu=self.shares_per_gpu, gpu_memory_mib=self.gpu_memory_mib)
        return Snapshot(
            taken_at=taken_at,
            slurm_version=version,
            nodes=nodes,
            jobs=jobs,
            partitions=partitions_from(records),
        )

    def job(self, job_id: int) -> JobView:
        """One job's current view (from squeue); `UnknownJobError` when Slurm no longer lists it."""
        argv = commands.squeue_job_json(job_id)
        for j in parse_squeue(self._read(argv)):
            if j.job_id == job_id:
                return j
        raise UnknownJobError(argv, 0, f"job {job_id} is not in squeue")

    def batch_script(self, job_id: int) -> str:
        """The job's batch script as Slurm keeps it; `UnknownJobError` when the job is gone.

        Not JSON, so not `_read`: a refusal is classified like an action's (`classify`)."""
        return self._run(commands.batch_script(job_id)).stdout

    def sacct(self, **kwargs) -> tuple[SacctRecord, ...]:
        """Accounting records (needs slurmdbd or a jobcomp file); see `commands.sacct_json`. None matched is an
        empty answer on both versions (22.05 says so in `errors`: `_nothing_found`)."""
        result = self.runner(commands.sacct_json(**kwargs))
        return parse_sacct(result.stdout if _nothing_found(result) else check_answer(result).stdout)

    # ----------------------------------------------------------------- acting

    def set_share(self, job_id: int, share: int) -> None:
        """Set a pending or held job's MPS share; a running job raises `JobNotPendingError`."""
        self._run(commands.set_share(job_id, share, self.shares_per_gpu))

    def set_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        self._run(commands.set_nodes(job_id, tuple(nodes)))

    def requeue(self, job_id: int) -> None:
        self._run(commands.requeue(job_id))

    def release(self, job_id: int) -> None:
        """Release a held job, at least `REVOKE_GAP_S` after its hold, outside any place kept for it (recovery's way).

        A job this gateway did not hold itself (recovery, after a helper that held it died) may have been
        held within the last second, and a release in the hold's second makes it fail: wait the whole gap.
        """
        held_at = self._held_at.pop(job_id, None)
        wait = REVOKE_GAP_S if held_at is None else held_at + REVOKE_GAP_S - self._clock()
        if wait > 0:
            self._sleep(wait)
        self.forget_place(job_id)
        self._run(commands.release(job_id))

    def forget_place(self, job_id: int) -> None:
        """Delete the place a helper that died kept for the job (`_place_kept`), first taking the job out of it if
        it is in there, so it neither waits for the reservation to end nor runs inside one that ends (Slurm kills
        a job still in a reservation when it ends: measured on 22.05). Recovery calls it for every interrupted
        reshape.

        Only that place is touched: the job is taken out of a reservation only when Slurm says the place is in
        use, so a job in any other one (a site's, its user's `--reservation`) stays there. No such place:
        nothing to do; still in use once the job is out (other jobs put into it): left to end by itself, logged.
        Any other refusal is raised, since a job left inside a place that ends is killed.
        """
        try:
            self._run(commands.delete_place(job_id))
            return
        except SlurmUnavailable:
            raise
        except SlurmError as exc:
            if _NO_RESERVATION.search(str(exc)):
                return
            if not _RESERVATION_BUSY.search(str(exc)):
                raise
        self._leave_place(job_id)  # the place has a job in it: this one, its only user

    def _leave_place(self, job_id: int) -> None:
        """Take the job out of its place and delete the place (the job gone: the place all the same). Still in use
        once the job is out (someone put other jobs into it): the job is out, which is what matters; the place
        ends by itself, logged. Any other refusal is raised."""
        try:
            self._run(commands.set_reservation(job_id, ""))
        except UnknownJobError as exc:
            log.info("job %d is gone, nothing of it to take out of its place: %s", job_id, exc)
        try:
            self._run(commands.delete_place(job_id))
        except SlurmUnavailable:
            raise
        except SlurmError as exc:
            if not _RESERVATION_BUSY.search(str(exc)):
                raise
            log.warning("job %d is out of its place, which still holds other jobs: %s", job_id, exc)

    def signal(self, job_id: int, sig: str, *, whole_job: bool = False) -> None:
        self._run(commands.signal(job_id, sig, whole_job=whole_job))

    def set_admin_comment(self, job_id: int, text: str) -> None:
        self._run(commands.set_admin_comment(job_id, text))

    def wait_state(self, job_id: int, states: Sequence[JobState], timeout_s: float, poll_s: float = 0.25) -> JobView:
        """Poll until the job is in one of `states`; `SlurmError` naming the last state on timeout."""
        deadline = self._clock() + timeout_s
        while True:
            view = self.job(job_id)
            if view.state in states:
                return view
            if self._clock() >= deadline:
                raise SlurmError(
                    commands.squeue_json(), 0, "",
                    f"job {job_id} did not reach {'/'.join(s.value for s in states)} within {timeout_s:g} s "
                    f"(it is {view.state.value}, reason {view.reason or 'none'})",
                )
            self._sleep(poll_s)

    def requeue_with_share(self, job_id: int, share: int, nodes: Sequence[str] = (), *, stop_timeout_s: float = 120.0) -> None:
        """Move a running job to a new MPS share: requeuehold → update → StartTime=now → release.

        `requeuehold` sends SIGTERM; elastico-run checkpoints within KillWait.
        Once the job is pending and held, its share (and node pin) is updated
        and it is released with StartTime=now (otherwise Slurm waits ~120 s).
        Whatever fails after the hold, the job is released: no job is left held.
        Its place is kept for it throughout (`_place_kept`); returns once it runs again (when its place was
        kept: at most `RESTART_TIMEOUT_S` after the release).
        """
        share_argv = commands.set_share(job_id, share, self.shares_per_gpu)  # validate before touching the job
        nodes_argv = commands.set_nodes(job_id, tuple(nodes)) if nodes else None

        def update() -> None:
            self._run(share_argv)
            if nodes_argv:
                self._run(nodes_argv)
        self._requeue(job_id, nodes, stop_timeout_s, update)

    def _requeue(self, job_id: int, nodes: Sequence[str], stop_timeout_s: float, update: Callable[[], None]) -> None:
        """The requeue both reshapes share: its place kept (`_place_kept`), requeuehold, wait until it is
        pending, `update()` its request, into its place, StartTime=now, release; released whatever fails."""
        with self._place_kept(job_id, nodes, stop_timeout_s) as place:
            self._run(commands.requeue_hold(job_id))
            held_at = self._clock()
            try:
                self.wait_state(job_id, (JobState.PENDING,), stop_timeout_s)
                update()
                if place is not None:
                    self._run(commands.set_reservation(job_id, place))
                self._run(commands.start_now(job_id))
            finally:
                # slurmd refuses a credential issued in the same second as the revocation of the
                # job's previous one ("Job credential revoked": the job FAILS instead of running);
                # Slurm's default ~120 s BeginTime exists for this. Two seconds are enough.
                wait = held_at + REVOKE_GAP_S - self._clock()
                if wait > 0:
                    self._sleep(wait)
                self._run(commands.release(job_id))

    @contextmanager
    def _place_kept(self, job_id: int, nodes: Sequence[str], stop_timeout_s: float) -> Iterator[str | None]:
        """Keep the nodes a requeued job restarts on for it alone, from before its requeue-hold until it runs again.

        Between the hold and the restart the job's GPUs are free for at least `REVOKE_GAP_S`, and Slurm starts
        any pending job that fits there the moment the job ends: measured on 22.05, a plain pending `mps:100`
        job took the GPU and the reshaped job stayed pending (Resources). So the nodes (`nodes`, else those the
        job runs on) are reserved for the job's owner first (`commands.reserve_place`: the running jobs go on,
        no other job starts there); the body puts the job into the reservation (the yielded name) before its
        release; once the job runs again (or after `RESTART_TIMEOUT_S`, an error) it is taken out of it and the
        reservation deleted, whatever happened. Where Slurm refuses the reservation (the nodes are already in
        another: a site's, or a place kept for another job at the same moment), it yields None and the job is
        requeued without one, as before. Measured with it: back on its GPU ~3 s after the hold, the
        competitor still pending. Other jobs wait for those nodes only these seconds. Should the helper die
        in between, the reservation ends by itself (the stop and restart timeouts, in whole minutes) and does
        not hold a job pending in it (`NO_HOLD_JOBS_AFTER_END`); but Slurm kills a job still running inside a
        reservation when it ends, so recovery takes the job out first (`forget_place`).
        """
        create = self._place_argv(job_id, nodes, stop_timeout_s)
        try:
            self._run(create)
        except SlurmUnavailable:
            raise
        except SlurmError:
            # One of this job's left by a helper that died: replace it. Any other refusal (the nodes are in
            # another reservation: a site's, or another job's place) leaves the job's place unkept, as before.
            self.forget_place(job_id)
            try:
                self._run(create)
            except SlurmUnavailable:
                raise
            except SlurmError:
                yield None
                return
        ok = False
        try:
            yield commands.place_name(job_id)
            ok = True  # carried out: held, updated, released; from here on nothing may report it failed
            try:
                self.wait_state(job_id, _NOT_WAITING, RESTART_TIMEOUT_S)
            except SlurmUnavailable:
                raise
            except SlurmError as exc:  # released with its new request: it starts when Slurm can, out of the place
                log.warning("job %d, reshaped and released, is not running again yet; its place is given up: %s",
                            job_id, exc)
        finally:
            try:
                self._leave_place(job_id)
            except SlurmError as exc:
                if ok:
                    raise
                # The body's own error is raised; the reshape's row stays open and recovery gives the place up.
                log.warning("job %d: its place was not given up (%s); the next epoch's recovery does it", job_id, exc)

    def _place_argv(self, job_id: int, nodes: Sequence[str], stop_timeout_s: float = 120.0) -> list[str]:
        """`commands.reserve_place` for this job: its owner, `nodes` or else those it runs on, long enough for a stop
        within `stop_timeout_s` and a restart within `RESTART_TIMEOUT_S` (one squeue call)."""
        view = self.job(job_id)
        # The stop, the revocation gap and the restart at their longest, plus a minute for the commands between.
        minutes = math.ceil((stop_timeout_s + REVOKE_GAP_S + RESTART_TIMEOUT_S) / 60) + 1
        return commands.reserve_place(job_id, tuple(nodes) or view.nodes, view.user, minutes)

    def preempt(self, job_id: int, *, stop_timeout_s: float = 120.0) -> None:
        """Stop a running job and keep it pending HELD, its request unchanged (a policy's preemption).

        `requeuehold` sends SIGTERM (elastico-run checkpoints within KillWait); this returns once the job is
        pending, so the GPUs it held are free for the epoch's next actions. It stays held until `resume`.
        """
        self._run(commands.requeue_hold(job_id))
        self._held_at[job_id] = self._clock()
        self.wait_state(job_id, (JobState.PENDING,), stop_timeout_s)

    def resume(self, job_id: int, nodes: Sequence[str] = ()) -> None:
        """Release a job a policy held, pinned to `nodes` when given, with StartTime=now (no ~120 s BeginTime).

        At least `REVOKE_GAP_S` after its hold, as `requeue_with_share` waits (a release in the same second as
        the revocation of the job's credential makes it fail).
        """
        nodes_argv = commands.set_nodes(job_id, tuple(nodes)) if nodes else None  # validate before touching it
        if nodes_argv:
            self._run(nodes_argv)
        self._run(commands.start_now(job_id))
        held_at = self._held_at.pop(job_id, None)
        if held_at is not None:
            wait = held_at + REVOKE_GAP_S - self._clock()
            if wait > 0:
                self._sleep(wait)
        self._run(commands.release(job_id))

    def argv_for(self, action: Action) -> list[list[str]]:
        """The exact commands `apply(action)` runs, for `--dry-run` (a reshape reads the job's owner and nodes)."""
        if action.kind is ActionKind.SET_GPUS or (action.kind is ActionKind.RESHAPE_RUNNING and action.gpus is not None):
            cmds = commands.gpu_count_argv(action)
        else:
            cmds = commands.argv_for(action, self.shares_per_gpu)
        if action.kind is ActionKind.RESHAPE_RUNNING:
            cmds = commands.with_place(cmds, action.job_id, self._place_argv(action.job_id, action.nodes))
        return cmds

    # ----------------------------------------------------------------- GPU count

    def _gpu_request(self, job_id: int) -> tuple[str, gpu_count.GpuRequest]:
        """The Slurm version and the job's GPU request now, from one squeue call."""
        text = self._read(commands.squeue_job_json(job_id))
        return slurm_version(text), gpu_count.request_of(text, job_id)

    def _verify_gpus(self, job_id: int, gpus: int, nodes: Sequence[str], argv: list[str]) -> None:
        gpu_count.verify(self._read(commands.squeue_job_json(job_id)), job_id, gpus, tuple(nodes), argv)

    def set_gpus(self, job_id: int, gpus: int, nodes: Sequence[str] = ()) -> None:
        """Give a pending or held job `gpus` whole GPUs spread evenly over `nodes` (one node when empty).

        `InvalidActionError` before any update where this Slurm version refuses or ignores the change
        (22.05: a job on an MPS share, or one that asked `--gpus`); `GpuCountMismatch` when the request read
        back afterwards is not the one asked for; `JobNotPendingError` for a running job.
        """
        argv = commands.set_gpu_count(job_id, gpus, tuple(nodes))  # validate before touching the job
        version, current = self._gpu_request(job_id)
        gpu_count.check_change(version, job_id, current)
        self._run(argv)
        self._verify_gpus(job_id, gpus, nodes, argv)

    def requeue_with_gpus(self, job_id: int, gpus: int, nodes: Sequence[str] = (), *, stop_timeout_s: float = 120.0) -> None:
        """Move a running job to `gpus` whole GPUs on `nodes`: requeuehold → update → check → StartTime=now → release.

        Checked against the Slurm version before the hold, so a change the version refuses leaves the job
        running; whatever fails after the hold (a mismatch included), the job is released.
        """
        argv = commands.set_gpu_count(job_id, gpus, tuple(nodes))
        version, current = self._gpu_request(job_id)
        gpu_count.check_change(version, job_id, current)

        def update() -> None:
            self._run(argv)
            self._verify_gpus(job_id, gpus, nodes, argv)
        self._requeue(job_id, nodes, stop_timeout_s, update)

    def apply(self, action: Action) -> None:
        """Carry out one planner action.

        A change of a job's GPU count (`SET_GPUS`, or a `RESHAPE_RUNNING` with `gpus`) goes through
        `set_gpus` / `requeue_with_gpus`: the verified `Gres=gpu:P NumNodes=K-K NodeList=` form, refused up
        front where the Slurm version would refuse or ignore it, and read back afterwards (`gpu_count`).
        """
        if action.kind is ActionKind.SET_GPUS:
            self.set_gpus(action.job_id, commands.need(action.gpus, action), action.nodes)
        elif action.kind is ActionKind.RESHAPE_RUNNING and action.gpus is not None:
            self.requeue_with_gpus(action.job_id, action.gpus, action.nodes)
        elif action.kind is ActionKind.SET_SHARE:
            self.set_share(action.job_id, commands.need(action.share, action))
        elif action.kind is ActionKind.SET_NODES:
            self.set_nodes(action.job_id, action.nodes)
        elif action.kind is ActionKind.RESHAPE_RUNNING:
            self.requeue_with_share(action.job_id, commands.need(action.share, action), action.nodes)
        elif action.kind is ActionKind.SIGNAL:
            self.signal(action.job_id, commands.need(action.signal, action))
        elif action.kind is ActionKind.SET_ADMIN_COMMENT:
            self.set_admin_comment(action.job_id, commands.need(action.text, action))
        elif action.kind is ActionKind.START_NOW:
            self._run(commands.start_now(action.job_id))
        elif action.kind is ActionKind.PREEMPT:
            self.preempt(action.job_id)
        elif action.kind is ActionKind.RESUME:
            self.resume(action.job_id, action.nodes)
        else:  # pragma: no cover - enum is closed
            raise InvalidActionError(f"unknown action kind {action.kind!r}")
