"""The Slurm gateway: the only class that runs Slurm commands.

It reads the cluster (`snapshot()`: one `squeue` call and one node listing, whatever
the number of jobs) and acts on it (MPS share, node pin, GPU count, requeue with a
new shape, signals, admin comments). Argv comes from `commands`, parsing from
`jobs`, `nodes` and `accounting`, assembly from `snapshot`, the meaning of an
answer from `answers`, the place kept for a requeued job from `places`; this class
only sequences them through an injected runner, so a test or the simulator can
hand in another runner (or another gateway with the same methods).

Every failure is a typed error carrying the argv, exit code and stderr; a read
that gets no answer is `SlurmUnavailable`, never an empty cluster (`answers`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext

from slurm_elastico.errors import ElasticoError, InvalidActionError, SlurmError, UnknownJobError
from slurm_elastico.model import Action, ActionKind, JobState, JobView, Snapshot
from slurm_elastico.slurm import commands, gpu_count
from slurm_elastico.slurm.accounting import SacctRecord, parse_sacct, parse_sacct_each
from slurm_elastico.slurm.answers import check_answer, classify, nothing_found
from slurm_elastico.slurm.jobs import parse_squeue
from slurm_elastico.slurm.nodes import parse_sinfo
from slurm_elastico.slurm.places import RESTART_TIMEOUT_S, Places
from slurm_elastico.slurm.runner import Completed, Runner
from slurm_elastico.slurm.schema import slurm_version
from slurm_elastico.slurm.snapshot import build_nodes, partitions_from

log = logging.getLogger(__name__)

REVOKE_GAP_S = 2.0
"""Least time between a requeue-hold and the release of the job (see `requeue_with_share`)."""


def _source(argv: Sequence[str]) -> str:
    """How a parser's errors name the command whose output it read ("scontrol show node --json")."""
    return " ".join(argv)


class SlurmGateway:
    """Snapshot and actions against a real Slurm cluster through `runner`.

    `shares_per_gpu` must match gres.conf (MPS Count ÷ GPUs); `gpu_memory_mib`
    is each GPU's memory, which Slurm does not know, and `type_memory` each GPU
    type's (`gpu.types`; empty: every GPU has `gpu_memory_mib`). `sleep` is injectable so
    tests of the polling logic need not wait.
    """

    def __init__(
        self,
        runner: Runner,
        *,
        shares_per_gpu: int = 100,
        gpu_memory_mib: int = 0,
        type_memory: Mapping[str, int] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ):
        self.runner = runner
        self.shares_per_gpu = shares_per_gpu
        self.gpu_memory_mib = gpu_memory_mib
        self.type_memory = dict(type_memory or {})
        self._sleep = sleep
        self._clock = clock
        self._held_at: dict[int, float] = {}  # when `preempt` held each job (the release waits REVOKE_GAP_S)
        # Late-bound: a gateway whose wait_state is replaced (a test's) waits for its places the same way.
        self._places = Places(lambda argv: self._run(argv), lambda *wait: self.wait_state(*wait))

    # ----------------------------------------------------------------- reading

    def _run(self, argv: Sequence[str]) -> Completed:
        """An action: typed errors by exit code and message (`classify`)."""
        return classify(self.runner(argv))

    def _read(self, argv: Sequence[str]) -> str:
        """A read's JSON text; `SlurmUnavailable` when Slurm did not answer (`check_answer`)."""
        return check_answer(self.runner(argv)).stdout

    def jobs(self) -> tuple[JobView, ...]:
        """Active jobs (pending, running, suspended, completing), from one squeue call."""
        argv = commands.squeue_json()
        jobs = parse_squeue(self._read(argv), _source(argv))
        return tuple(j for j in jobs if j.state.active)

    def snapshot(self) -> Snapshot:
        """The cluster now: one squeue call and one node listing, whatever the number of jobs.

        `SlurmUnavailable` when either did not answer: an outage is never an empty cluster.
        """
        squeue_argv = commands.squeue_json()
        squeue_text = self._read(squeue_argv)
        version = slurm_version(squeue_text, _source(squeue_argv))
        nodes_argv = commands.nodes_json(version)
        nodes_text = self._read(nodes_argv)
        taken_at = self._clock()
        jobs = tuple(j for j in parse_squeue(squeue_text, _source(squeue_argv)) if j.state.active)
        records = parse_sinfo(nodes_text, _source(nodes_argv))
        nodes = build_nodes(records, jobs, shares_per_gpu=self.shares_per_gpu, gpu_memory_mib=self.gpu_memory_mib,
                            type_memory=self.type_memory)
        return Snapshot(
            taken_at=taken_at,
            slurm_version=version,
            nodes=nodes,
            jobs=jobs,
            partitions=partitions_from(records),
        )

    def job(self, job_id: int) -> JobView:
        """One job's current view (from squeue); `UnknownJobError` when Slurm no longer lists it."""
        return self._job(job_id)[0]

    def _job(self, job_id: int) -> tuple[JobView, str]:
        """(the job's view, squeue's text)."""
        argv = commands.squeue_job_json(job_id)
        text = self._read(argv)
        for j in parse_squeue(text, _source(argv)):
            if j.job_id == job_id:
                return j, text
        raise UnknownJobError(argv, 0, f"job {job_id} is not in squeue")

    def job_on_type(self, job_id: int) -> tuple[JobView, str]:
        """The job's view and the GPU type of the node it runs on (its first): what a job whose request names no
        type learns its type from. "" when it is not running, or the node's gres names no single type."""
        job, text = self._job(job_id)
        if not job.nodes:
            return job, ""
        nodes_argv = commands.nodes_json(slurm_version(text, "squeue --json"))
        record = next((r for r in parse_sinfo(self._read(nodes_argv), _source(nodes_argv)) if r.name == job.nodes[0]),
                      None)
        types = {t for t, count in (record.gpu_types if record else ()) if count}
        return job, next(iter(types)) if len(types) == 1 else ""

    def batch_script(self, job_id: int) -> str:
        """The job's batch script as Slurm keeps it; `UnknownJobError` when the job is gone.

        Not JSON, so not `_read`: a refusal is classified like an action's (`classify`)."""
        return self._run(commands.batch_script(job_id)).stdout

    def sacct(self, **kwargs) -> tuple[SacctRecord, ...]:
        """Accounting records (needs slurmdbd or a jobcomp file); see `commands.sacct_json`. None matched is an
        empty answer on both versions (22.05 says so in `errors`: `answers.nothing_found`)."""
        return parse_sacct(*self._sacct_text(**kwargs))

    def sacct_each(self, **kwargs) -> tuple[tuple[SacctRecord, ...], tuple[str, ...]]:
        """As `sacct`, a record that cannot be read set aside: (the records, a line per bad record naming its job
        and field); `accounting.parse_sacct_each`."""
        return parse_sacct_each(*self._sacct_text(**kwargs))

    def _sacct_text(self, **kwargs) -> tuple[str, str]:
        argv = commands.sacct_json(**kwargs)
        result = self.runner(argv)
        return result.stdout if nothing_found(result) else check_answer(result).stdout, _source(argv)

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
        """Delete the place a helper that died kept for the job, taking the job out of it first (`Places.forget`).

        Recovery calls it for every interrupted reshape: Slurm kills a job still inside a reservation when it ends.
        """
        self._places.forget(job_id)

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
        Its place is kept for it throughout (`Places.kept`); returns once it runs again (when its place was
        kept: at most `RESTART_TIMEOUT_S` after the release).
        """
        share_argv = commands.set_share(job_id, share, self.shares_per_gpu)  # validate before touching the job
        nodes_argv = commands.set_nodes(job_id, tuple(nodes)) if nodes else None

        def update() -> None:
            self._run(share_argv)
            if nodes_argv:
                self._run(nodes_argv)
        self._requeue(job_id, nodes, stop_timeout_s, update)

    def _requeue(self, job_id: int, nodes: Sequence[str], stop_timeout_s: float, update: Callable[[], None],
                 keep_place: bool = True) -> None:
        """The requeue both reshapes share: its place kept (`Places.kept`; not for a job that leaves its nodes for
        others not named, `keep_place` False), requeuehold, wait until it is pending, `update()` its request, into
        its place, StartTime=now, release; released whatever fails."""
        kept = self._places.kept(job_id, self._place_argv(job_id, nodes, stop_timeout_s)) if keep_place else nullcontext()
        with kept as place:
            self._run(commands.requeue_hold(job_id))
            held_at = self._clock()
            restarted = False
            try:
                self.wait_state(job_id, (JobState.PENDING,), stop_timeout_s)
                update()
                if place is not None:
                    self._run(commands.set_reservation(job_id, place))
                self._run(commands.start_now(job_id))
                restarted = True
            finally:
                if not restarted:  # on its old request, where it ran (its place when that is where it ran)
                    self._restart_anyway(job_id, None if nodes else place)
                # slurmd refuses a credential issued in the same second as the revocation of the
                # job's previous one ("Job credential revoked": the job FAILS instead of running);
                # Slurm's default ~120 s BeginTime exists for this. Two seconds are enough.
                wait = held_at + REVOKE_GAP_S - self._clock()
                if wait > 0:
                    self._sleep(wait)
                self._run(commands.release(job_id))

    def _restart_anyway(self, job_id: int, place: str | None) -> None:
        """After a failed update: into its place (if given) and StartTime=now, so the job, released on its old
        request, runs again at once; without them it waited out Slurm's ~120 s BeginTime (measured on 22.05), or
        its own place until `RESTART_TIMEOUT_S`. Best effort: a refusal is logged, the release follows anyway."""
        for argv in ([commands.set_reservation(job_id, place)] if place else []) + [commands.start_now(job_id)]:
            try:
                self._run(argv)
            except ElasticoError as exc:
                log.warning("job %d, released after a failed update: %s refused: %s", job_id, " ".join(argv), exc)

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
        if action.gpu_type and (action.kind is ActionKind.SET_GPUS or action.kind is ActionKind.RESHAPE_RUNNING
                                and action.gpus is not None):
            # The form depends on the version and the job's request (`gpu_count.plan_update`): read them.
            plan = self._gpu_update(action.job_id, commands.need(action.gpus, action), action.nodes, action.gpu_type)
            jid = action.job_id
            if action.kind is ActionKind.SET_GPUS:
                return [plan.argv]
            cmds = [commands.requeue_hold(jid), plan.argv, commands.start_now(jid), commands.release(jid)]
            if not plan.keep_place:
                return cmds
        elif action.kind is ActionKind.SET_GPUS or (action.kind is ActionKind.RESHAPE_RUNNING and action.gpus is not None):
            cmds = commands.gpu_count_argv(action)
        else:
            cmds = commands.argv_for(action, self.shares_per_gpu)
        if action.kind is ActionKind.RESHAPE_RUNNING:
            cmds = commands.with_place(cmds, action.job_id, self._place_argv(action.job_id, action.nodes))
        return cmds

    # ----------------------------------------------------------------- GPU count

    def _gpu_update(self, job_id: int, gpus: int, nodes: Sequence[str], gpu_type: str) -> gpu_count.GpuUpdate:
        """The update for this Slurm version and the job's request now (`gpu_count.plan_update`), from one squeue
        call (and one node listing for a typed change); refused before any update where Slurm would refuse,
        ignore or strand the change."""
        commands.set_gpu_count(job_id, gpus, tuple(nodes), gpu_type)  # validate before reading Slurm
        argv = commands.squeue_job_json(job_id)
        text = self._read(argv)
        version = slurm_version(text, _source(argv))
        nodes_argv = commands.nodes_json(version)
        records = parse_sinfo(self._read(nodes_argv), _source(nodes_argv)) if gpu_type else ()
        job = next((j for j in parse_squeue(text, _source(argv)) if j.job_id == job_id), None)
        return gpu_count.plan_update(version, gpu_count.request_of(text, job_id), records, job_id, gpus,
                                     tuple(nodes), gpu_type, job.nodes if job else (), job.partition if job else "")

    def _apply_gpu_update(self, job_id: int, update: gpu_count.GpuUpdate) -> None:
        self._run(update.argv)
        gpu_count.verify(self._read(commands.squeue_job_json(job_id)), job_id, update)

    def set_gpus(self, job_id: int, gpus: int, nodes: Sequence[str] = (), gpu_type: str = "") -> None:
        """Give a pending or held job `gpus` whole GPUs spread evenly over `nodes` (one node when empty), of
        `gpu_type` when one is given ("" asks for any type).

        `InvalidActionError` before any update where this Slurm version refuses or ignores the change (22.05: a
        job on an MPS share, one that asked `--gpus`, or one submitted with another GPU type) or no node set
        can hold it (an unknown type, more GPUs than its nodes have); `GpuCountMismatch` when the request read
        back afterwards is not the one asked for; `JobNotPendingError` for a running job.
        """
        self._apply_gpu_update(job_id, self._gpu_update(job_id, gpus, nodes, gpu_type))

    def requeue_with_gpus(self, job_id: int, gpus: int, nodes: Sequence[str] = (), *, gpu_type: str = "",
                          stop_timeout_s: float = 120.0) -> None:
        """Move a running job to `gpus` whole GPUs on `nodes`, of `gpu_type` when given (a move between types):
        requeuehold → update → check → StartTime=now → release.

        Checked against the Slurm version, the job's request and the cluster's GPU types before the hold, so a
        change Slurm would refuse or strand leaves the job running; whatever fails after the hold (a refused
        update, a mismatch), the job is released, on its old request.
        """
        update = self._gpu_update(job_id, gpus, nodes, gpu_type)
        self._requeue(job_id, nodes, stop_timeout_s, lambda: self._apply_gpu_update(job_id, update), update.keep_place)

    def apply(self, action: Action) -> None:
        """Carry out one planner action.

        A change of a job's GPU count or type (`SET_GPUS`, or a `RESHAPE_RUNNING` with `gpus`, each with its
        `gpu_type`) goes through `set_gpus` / `requeue_with_gpus`: the verified `Gres=gpu[:TYPE]:P NumNodes=K-K
        NodeList=` form, refused up front where the Slurm version would refuse or ignore it or no node has the
        type, and read back afterwards (`gpu_count`). An MPS share (`SET_SHARE`, a `RESHAPE_RUNNING` with a
        share) names no type: MPS is untyped in gres.conf, so its type is that of the nodes it is pinned to.
        """
        if action.kind is ActionKind.SET_GPUS:
            self.set_gpus(action.job_id, commands.need(action.gpus, action), action.nodes, action.gpu_type)
        elif action.kind is ActionKind.RESHAPE_RUNNING and action.gpus is not None:
            self.requeue_with_gpus(action.job_id, action.gpus, action.nodes, gpu_type=action.gpu_type)
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


def gateway_from(cfg, wrap=None):
    """The live gateway for these settings (SLURM_CONF and timeouts from `slurm:`); `wrap(runner)`, when given,
    returns the runner the gateway uses instead (the helper's `slurm.readonly.GuardedRunner`)."""
    from slurm_elastico.slurm.runner import SubprocessRunner

    env = {"SLURM_CONF": cfg.slurm.conf} if cfg.slurm.conf else {}
    runner = SubprocessRunner(env=env, timeout=cfg.slurm.timeout_s)
    return SlurmGateway(
        wrap(runner) if wrap is not None else runner,
        shares_per_gpu=cfg.gpu.shares_per_gpu,
        gpu_memory_mib=cfg.gpu.memory_mib,
        type_memory=cfg.gpu.type_memory(),
    )
