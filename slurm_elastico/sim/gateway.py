"""The simulated cluster's gateway: the planner's actions taken as Slurm takes them, and the cluster as Slurm shows it.

The gateway methods (`snapshot`, `apply`, `argv_for`, `release`) behave like
`slurm.gateway.SlurmGateway` where it matters to a policy:

- `SET_SHARE` / `SET_GPUS` / `SET_NODES` change a pending job; on a running
  job they are refused with `JobNotPendingError`, as Slurm refuses a running
  job's GRES. `SET_GPUS` asks for N GPUs as the live gateway does,
  `Gres=gpu:P NumNodes=K-K NodeList=<its K nodes>` (`commands.set_gpu_count`):
  P = N / K on each node, exactly; a count that does not split evenly is
  refused (`InvalidActionError`), and no node is filled beyond its P.
  With `even_gangs=False` (`SimSettings.even_gangs`, only to calibrate the
  peers' baselines against the Pollux peer's figures) it is N GPUs over the
  listed nodes in any split, at least one on each, as the peer places them.
- `RESHAPE_RUNNING` is requeue-hold → new share, or N whole GPUs (`gpus`),
  and node pin → StartTime=now → release: the job goes back to pending with
  its new request, and pays its checkpoint-and-restart time when it starts
  again.
- An action's `gpu_type` (SET_SHARE, SET_GPUS, RESHAPE_RUNNING) names the
  type in the new request (`gpu:TYPE:N`): Slurm then starts the job only on
  nodes of that type, so a RESHAPE_RUNNING to another type than the job's
  is a move, paid as any requeue. A type no node has, or pinned nodes of
  another type, are refused as Slurm refuses them; "" asks for any type.
- `START_NOW` lifts the job's BeginTime (the submit's placement window).
- `PREEMPT` is requeue-hold with the request unchanged: the job goes back to
  pending HELD with the work it has done (the scheduler never starts a held
  job) and pays its restart time when it runs again.
- `RESUME` pins a held job to the action's nodes (when given), lifts its
  BeginTime and releases it.
- `SET_ADMIN_COMMENT` names the shape the job runs as at its next start.
- `SIGNAL` USR1 to a running job: elastico-run checkpoints and relaunches in
  place (same resources) as its AdminComment now says, paying the restart time;
  a goodput job's new batch that `runtime.rebatch.in_process` allows is taken
  by the running program at its next step, with no restart.

The gateway is a mixin of `sim.cluster.SimCluster`: it reads and changes the
cluster's jobs and nodes, and requeues through the cluster's `requeue`.
"""

from __future__ import annotations

from slurm_elastico.errors import InvalidActionError, JobNotPendingError, SlurmError, UnknownJobError
from slurm_elastico.model import (Action, ActionKind, GpuView, GresRequest, JobState, JobView, NodeView, PartitionView,
                                  Snapshot)
from slurm_elastico.runtime import rebatch
from slurm_elastico.sim.job import SimJob
from slurm_elastico.slurm import commands

PARTITION = "gpu"


class SimGateway:
    """The gateway methods of a `SimCluster` (`slurm.gateway.SlurmGateway`'s, where they matter to a policy): a mixin
    of `SimCluster`, which holds the nodes, the jobs and their life."""

    def snapshot(self) -> Snapshot:
        """The cluster as squeue and sinfo would show it now."""
        nodes = []
        for n in self.nodes:
            gpus = tuple(GpuView(n.name, gi, self.shares_per_gpu, tuple(uses.values())) for gi, uses in enumerate(n.gpus))
            busy = n.cpus_alloc > 0 or any(gpus[i].users for i in range(len(gpus)))
            nodes.append(NodeView(n.name, "mixed" if busy else "idle", n.partitions, n.cpus, n.cpus_alloc, n.mem_mib,
                                  n.mem_alloc, gpus, n.gpu_mem_mib, n.gpu_type))
        every = ",".join(self.partitions)  # a job that names no partition may run in any
        jobs = [self._view(j, every) for j in self.jobs.values()]
        return Snapshot(taken_at=self.now, slurm_version=self.slurm_version, nodes=tuple(nodes), jobs=tuple(jobs),
                        partitions=tuple(PartitionView(p, tuple(n.name for n in self.nodes if p in n.partitions))
                                         for p in self.partitions),
                        even_gangs=self.even_gangs)

    def _view(self, j: SimJob, every: str) -> JobView:
        running = j.state is JobState.RUNNING
        nodes = tuple(self.nodes[ni].name for ni in j.node_indices) if running else ()
        first = j.alloc[0][0] if running else -1
        reason = "" if running else ("BeginTime" if j.begin > self.now else "Priority")
        return JobView(
            job_id=j.job_id, name=f"j{j.job_id}", user="sim", partition=j.trace.partition or every, state=j.state,
            reason=reason,
            held=j.held, gres=j.gres, nodes=nodes, gpu_indices=tuple(gi for ni, gi in j.alloc if ni == first),
            cpus=j.cpus, memory_mib=j.mem_mib, submit_time=int(j.trace.submit_s),
            start_time=int(j.start) if running else None, restarts=j.restarts, requeue=True, admin_comment=j.comment,
            gpu_alloc=tuple((self.nodes[ni].name, gi, 0 if j.whole else j.share) for ni, gi in j.alloc))

    def _job(self, action: Action) -> SimJob:
        job = self.jobs.get(action.job_id)
        if job is None:
            raise UnknownJobError(commands.update_job(action.job_id), 1,
                                  f"Invalid job id specified: {action.job_id}")
        return job

    def apply(self, action: Action) -> None:
        """Carry out one planner action as Slurm would take it."""
        kind = action.kind
        self.counters.actions[kind.value] = self.counters.actions.get(kind.value, 0) + 1
        job = self._job(action)
        argv = self.argv_for(action)[0]
        if kind is ActionKind.SET_ADMIN_COMMENT:
            job.comment = action.text or ""
        elif kind in (ActionKind.SET_SHARE, ActionKind.SET_GPUS, ActionKind.SET_NODES, ActionKind.START_NOW):
            if job.state is not JobState.PENDING:
                raise JobNotPendingError(argv, 1, "Job is no longer pending execution")
            if kind is ActionKind.SET_SHARE:
                job.gres = self._share_request(action, argv)
            elif kind is ActionKind.SET_GPUS:
                job.gres, job.pin = self._gang_request(action, argv)
                job.per_node = self.even_gangs
            elif kind is ActionKind.SET_NODES:
                job.pin = self._nodes(action, argv)
            else:
                job.begin = min(job.begin, self.now)
        elif kind is ActionKind.RESHAPE_RUNNING:
            if job.state is not JobState.RUNNING:
                raise SlurmError(argv, 1, "Job is not running: requeue refused")
            if action.gpus is not None:
                self.requeue(job, *self._gang_request(action, argv))
                job.per_node = self.even_gangs
            else:
                self.requeue(job, self._share_request(action, argv), tuple(action.nodes[:1]))
                job.per_node = False
        elif kind is ActionKind.PREEMPT:  # requeuehold: back to pending, held, its request and work done kept
            if job.state is not JobState.RUNNING:
                raise SlurmError(argv, 1, "Job is not running: requeue refused")
            self.requeue(job, job.gres, job.pin)
            job.held = True
        elif kind is ActionKind.RESUME:  # NodeList= when given, StartTime=now, release
            if job.state is not JobState.PENDING:
                raise JobNotPendingError(argv, 1, "Job is no longer pending execution")
            if action.nodes:
                job.pin = self._nodes(action, argv)
            job.begin = min(job.begin, self.now)
            job.held = False
        elif kind is ActionKind.SIGNAL:
            if job.state is not JobState.RUNNING:
                raise SlurmError(argv, 1, "Job is not running: nothing to signal")
            if action.signal == "USR1":  # elastico-run checkpoints and relaunches in place as the AdminComment says
                self.before_stop(job)
                was, job.shape = job.shape, job.shape_name(self.shares_per_gpu)
                job.shape_since = self.now
                if job.family is not None and rebatch.in_process(job.family, job.family_shape(was),
                                                                 job.family_shape(job.shape)):
                    self.counters.switches += 1  # a goodput job's new batch, taken in process: no restart
                else:
                    job.relaunches += 1
                    self.counters.relaunches += 1
                    self.relaunched.append(job)
                self.changed.update(job.alloc)
        else:  # pragma: no cover - the enum is closed
            raise InvalidActionError(f"unknown action kind {kind!r}")

    def _share_request(self, action: Action, argv: list[str]) -> GresRequest:
        share = commands.need(action.share, action)
        if not 1 <= share <= self.shares_per_gpu:
            raise InvalidActionError(f"share {share} of job {action.job_id} is outside 1..{self.shares_per_gpu}")
        return GresRequest("mps", share, self._gpu_type(action, argv, action.nodes[:1]))

    def _gpu_type(self, action: Action, argv: list[str], pin: tuple[str, ...] | list[str]) -> str:
        """The action's GPU type, which some node has and each of its nodes has (else Slurm's refusal); "" = any."""
        t = action.gpu_type
        if not t:
            return ""
        if not any(n.gpu_type == t for n in self.nodes):
            raise SlurmError(argv, 1, f"Invalid generic resource (gres) specification: no node has GPU type {t}")
        wrong = [name for name in pin if name in self.node_index and self.nodes[self.node_index[name]].gpu_type != t]
        if wrong:
            raise SlurmError(argv, 1, f"Requested node configuration is not available: {','.join(wrong)} have no "
                                      f"GPU of type {t}")
        return t

    def _nodes(self, action: Action, argv: list[str]) -> tuple[str, ...]:
        """The action's node names, each once, or SlurmError naming one Slurm does not know."""
        for name in action.nodes:
            if name not in self.node_index:
                raise SlurmError(argv, 1, f"Invalid node name specified: {name}")
        return tuple(dict.fromkeys(action.nodes))

    def _gang_request(self, action: Action, argv: list[str]) -> tuple[GresRequest, tuple[str, ...]]:
        """`gpus:N` pinned to the action's nodes: N at least one per listed node and at most the GPUs they have."""
        n = commands.need(action.gpus, action)
        pin = self._nodes(action, argv)
        room = sum(len(self.nodes[self.node_index[name]].gpus) for name in pin) if pin else self.n_gpus
        if not max(1, len(pin)) <= n <= room:
            where = f"nodes {','.join(pin)}" if pin else "the cluster"
            raise InvalidActionError(f"{n} GPUs for job {action.job_id}: {where} take {max(1, len(pin))}..{room}")
        return GresRequest("gpus", n, self._gpu_type(action, argv, pin)), pin

    def argv_for(self, action: Action) -> list[list[str]]:
        """The Slurm commands the real gateway runs for `action` (`slurm.gateway.SlurmGateway.argv_for`): a GPU
        count as `Gres=gpu:P NumNodes=K-K NodeList=` (`commands.gpu_count_argv`), which refuses a count that
        does not split evenly over the nodes, as the live gateway does before touching Slurm."""
        if action.kind is ActionKind.SET_GPUS or (action.kind is ActionKind.RESHAPE_RUNNING and action.gpus is not None):
            if not self.even_gangs:  # the peer's rule: N GPUs on these nodes in any split (calibration only)
                update = commands.set_gpus(action.job_id, commands.need(action.gpus, action), action.nodes)
                if action.kind is ActionKind.SET_GPUS:
                    return [update]
                return [commands.requeue_hold(action.job_id), update, commands.start_now(action.job_id),
                        commands.release(action.job_id)]
            return commands.gpu_count_argv(action)
        return commands.argv_for(action, self.shares_per_gpu)

    def release(self, job_id: int) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            raise UnknownJobError(commands.release(job_id), 1, f"Invalid job id specified: {job_id}")
        job.held = False

    def forget_place(self, job_id: int) -> None:
        """Recovery's clean-up of a place kept for a requeued job: the simulated requeue keeps none (no gap)."""
