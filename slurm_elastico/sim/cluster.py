"""The simulated Slurm cluster: job and GPU state, the gateway the planner acts through, Slurm's own scheduler.

The gateway methods (`snapshot`, `apply`, `argv_for`, `release`) behave like
`slurm.gateway.SlurmGateway` where it matters to a policy:

- `SET_SHARE` / `SET_NODES` change a pending job; on a running job they are
  refused with `JobNotPendingError`, as Slurm refuses a running job's GRES.
- `RESHAPE_RUNNING` is requeue-hold → new share (and node pin) → StartTime=now
  → release: the job goes back to pending with its new request, and pays its
  checkpoint-and-restart time when it starts again.
- `START_NOW` lifts the job's BeginTime (the submit's placement window).
- `SET_ADMIN_COMMENT` names the shape the job runs as at its next start.
- `SIGNAL` USR1 to a running job: elastico-run checkpoints and relaunches in
  place (same resources) as its AdminComment now says, paying the restart time.

Slurm's scheduler (`schedule`): pending jobs in priority order (then submit
time, then id), each at its requested GRES — `mps:N` on one GPU with N free
shares (best fit within the first node that has one, or within its pinned
node), `gpu:N` on N idle GPUs of one node. Backfill without time limits: the
first job that cannot start reserves the GPU (mps) or node (gpu) it is
closest to fitting on, and later jobs may start anywhere else. Slurm knows no
GPU memory, so jobs it starts may overcommit it; those are counted.

Time is the engine's clock (`now`), in simulated seconds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from slurm_elastico.errors import InvalidActionError, JobNotPendingError, SlurmError, UnknownJobError
from slurm_elastico.model import (MPS_SHARES_PER_GPU, Action, ActionKind, Family, GpuUse, GpuView, GresRequest,
                                  JobState, JobView, NodeView, PartitionView, Snapshot)
from slurm_elastico.shapes.current import running_shape
from slurm_elastico.slurm import commands
from slurm_elastico.sim.trace import TraceJob

PARTITION = "gpu"
SLURM_VERSION = "24.11.5"


@dataclass
class SimJob:
    """One job's whole life in the simulation (mutable; only this module and the engine change it)."""

    trace: TraceJob
    family: Family | None
    gres: GresRequest
    cpus: int
    mem_mib: int
    state: JobState = JobState.PENDING
    held: bool = False
    begin: float = 0.0
    pin: str | None = None
    comment: str = ""
    # while running
    node: int = -1
    gpus: tuple[int, ...] = ()
    share: int = 0
    shape: str = ""
    start: float = -1.0
    # progress accounting (the engine's)
    done: float = 0.0
    rate: float = 0.0
    mark: float = 0.0
    ready_at: float = 0.0
    version: int = 0
    # outcomes
    first_start: float = -1.0
    end: float = -1.0
    restarts: int = 0  # requeues, as Slurm counts them
    relaunches: int = 0  # in-place relaunches at a new shape (USR1)
    starts: int = 0

    @property
    def job_id(self) -> int:
        return self.trace.job_id

    def shape_name(self) -> str:
        """The shape the job runs as when it starts: the rule elastico-run follows (`shapes.current.running_shape`)."""
        if self.family is None:
            return ""
        held = self.gres.count if self.gres.kind == "mps" else None  # the share it starts with
        return running_shape(self.family.shapes, self.family.default_shape, self.comment, held)[0].name


@dataclass
class SimNode:
    name: str
    cpus: int
    mem_mib: int
    gpu_mem_mib: int
    gpus: list[dict[int, GpuUse]]
    cpus_alloc: int = 0
    mem_alloc: int = 0


@dataclass
class Counters:
    starts: int = 0
    requeues: int = 0
    relaunches: int = 0
    memory_overcommits: int = 0
    actions: dict[str, int] = field(default_factory=dict)


class SimCluster:
    """Nodes of `gpus_per_node` GPUs; jobs submitted by the engine; the gateway and Slurm's scheduler."""

    def __init__(self, n_gpus: int, gpus_per_node: int = 8, gpu_mem_mib: int = 16384, cpus_per_gpu: int = 16,
                 mem_per_gpu_mib: int = 65536, shares_per_gpu: int = MPS_SHARES_PER_GPU):
        self.shares_per_gpu = shares_per_gpu
        self.nodes: list[SimNode] = []
        left = n_gpus
        while left > 0:
            g = min(gpus_per_node, left)
            self.nodes.append(SimNode(f"n{len(self.nodes):04d}", g * cpus_per_gpu, g * mem_per_gpu_mib, gpu_mem_mib,
                                      [dict() for _ in range(g)]))
            left -= g
        self.node_index = {n.name: i for i, n in enumerate(self.nodes)}
        self.n_gpus = n_gpus
        self.gpu_key = [(ni, gi) for ni, n in enumerate(self.nodes) for gi in range(len(n.gpus))]
        self.offset = [0]
        for n in self.nodes:
            self.offset.append(self.offset[-1] + len(n.gpus))
        self.free = [shares_per_gpu] * n_gpus  # free MPS shares per GPU (0 when held whole)
        self.open: set[int] = set(range(n_gpus))  # GPUs with free shares
        self.jobs: dict[int, SimJob] = {}
        self.queue: list[tuple[float, int]] = []  # (submit, id) of pending jobs: Slurm's order at equal priority
        self.now = 0.0
        self.counters = Counters()
        self.alloc_shares = 0
        self.changed: set[tuple[int, int]] = set()  # GPUs whose occupants changed; the engine recomputes their rates
        self.before_stop = lambda job: None  # the engine accrues a job's progress before it leaves its GPUs
        self.relaunched: list[SimJob] = []  # relaunched in place since the engine last looked: they pay a restart

    # ------------------------------------------------------------- job life

    def submit(self, job: SimJob) -> None:
        self.jobs[job.job_id] = job
        bisect.insort(self.queue, (job.trace.submit_s, job.job_id))

    def gpu_free(self, ni: int, gi: int) -> int:
        return self.free[self.offset[ni] + gi]

    def _set_free(self, ni: int, gi: int, delta: int, whole: bool) -> None:
        g = self.offset[ni] + gi
        if whole:
            self.free[g] = 0 if delta < 0 else self.shares_per_gpu
        else:
            self.free[g] += delta
        if self.free[g] > 0:
            self.open.add(g)
        else:
            self.open.discard(g)

    def start(self, job: SimJob, ni: int, gpus: tuple[int, ...]) -> None:
        node = self.nodes[ni]
        whole = job.gres.kind == "gpu"
        share = self.shares_per_gpu if whole else job.gres.count
        for gi in gpus:
            node.gpus[gi][job.job_id] = GpuUse(job.job_id, 0 if whole else share, whole)
            self._set_free(ni, gi, -share, whole)
            self.changed.add((ni, gi))
        node.cpus_alloc += job.cpus
        node.mem_alloc += job.mem_mib
        self.alloc_shares += share * len(gpus)
        self.queue.remove((job.trace.submit_s, job.job_id))
        job.state, job.node, job.gpus, job.share = JobState.RUNNING, ni, gpus, share
        job.shape = job.shape_name()
        job.start = self.now
        job.starts += 1
        if job.first_start < 0:
            job.first_start = self.now
        self.counters.starts += 1

    def stop(self, job: SimJob) -> None:
        """Take a running job off its GPUs (completion or requeue)."""
        self.before_stop(job)
        node = self.nodes[job.node]
        whole = job.gres.kind == "gpu"
        for gi in job.gpus:
            del node.gpus[gi][job.job_id]
            self._set_free(job.node, gi, job.share, whole)
            self.changed.add((job.node, gi))
        node.cpus_alloc -= job.cpus
        node.mem_alloc -= job.mem_mib
        self.alloc_shares -= job.share * len(job.gpus)
        job.node, job.gpus, job.share = -1, (), 0

    def finish(self, job: SimJob) -> None:
        self.stop(job)
        job.state = JobState.COMPLETED
        job.end = self.now
        del self.jobs[job.job_id]

    def requeue(self, job: SimJob, share: int, pin: str | None) -> None:
        self.stop(job)
        job.state, job.held, job.begin = JobState.PENDING, False, self.now
        job.gres = GresRequest("mps", share)
        job.pin = pin
        job.restarts += 1
        self.counters.requeues += 1
        bisect.insort(self.queue, (job.trace.submit_s, job.job_id))

    # ------------------------------------------------------------- Slurm's scheduler

    def schedule(self) -> list[SimJob]:
        """Start what Slurm would start now; returns the jobs it started."""
        if not self.open:
            return []
        open_gpus = [self.gpu_key[g] for g in sorted(self.open)]
        top = max(self.free[g] for g in self.open)
        started: list[SimJob] = []
        reserved: set[tuple[int, int]] = set()
        reserved_nodes: set[int] = set()
        for _, jid in list(self.queue):
            job = self.jobs[jid]
            if job.held or job.begin > self.now:
                continue
            blocked = not reserved and not reserved_nodes
            if job.gres.kind == "mps" and job.gres.count > top and not blocked:
                continue  # cannot fit anywhere: skip the search
            where = None if job.gres.kind == "mps" and job.gres.count > top else \
                self._fit(job, open_gpus, reserved, reserved_nodes)
            if where is not None:
                ni, gpus = where
                self.start(job, ni, gpus)
                started.append(job)
                if not self.open:
                    break
                open_gpus = [self.gpu_key[g] for g in sorted(self.open)]
                top = max(self.free[g] for g in self.open)
            elif blocked:
                self._reserve(job, open_gpus, reserved, reserved_nodes)
        return started

    def _fit(self, job: SimJob, open_gpus, reserved, reserved_nodes) -> tuple[int, tuple[int, ...]] | None:
        pin = self.node_index.get(job.pin) if job.pin else None
        if job.gres.kind == "gpu":
            by_node: dict[int, list[int]] = {}
            for ni, gi in open_gpus:
                if ni not in reserved_nodes and (pin is None or ni == pin) and not self.nodes[ni].gpus[gi]:
                    by_node.setdefault(ni, []).append(gi)
            for ni, idle in by_node.items():
                if len(idle) >= job.gres.count and self._host_fits(ni, job):
                    return ni, tuple(idle[: job.gres.count])
            return None
        need = job.gres.count
        best: tuple[int, int] | None = None
        for ni, gi in open_gpus:
            if best is not None and ni != best[0]:
                break  # first node with a fit; best fit within it
            if (pin is not None and ni != pin) or (ni, gi) in reserved or ni in reserved_nodes:
                continue
            free = self.gpu_free(ni, gi)
            if free >= need and self._host_fits(ni, job) and (best is None or free < self.gpu_free(*best)):
                best = (ni, gi)
        if best is None:
            return None
        if self._gpu_mem_used(*best) + self._gpu_mem_of(job) > self.nodes[best[0]].gpu_mem_mib:
            self.counters.memory_overcommits += 1
        return best[0], (best[1],)

    def _host_fits(self, ni: int, job: SimJob) -> bool:
        n = self.nodes[ni]
        return n.cpus - n.cpus_alloc >= job.cpus and n.mem_mib - n.mem_alloc >= job.mem_mib

    def _gpu_mem_of(self, job: SimJob) -> int:
        if job.family is None:
            return 0
        try:
            return job.family.shape(job.shape_name()).resources.gpu_mem_mib
        except KeyError:
            return job.family.default_shape.resources.gpu_mem_mib

    def _gpu_mem_used(self, ni: int, gi: int) -> int:
        return sum(self._gpu_mem_of(self.jobs[j]) for j in self.nodes[ni].gpus[gi])

    def _reserve(self, job: SimJob, open_gpus, reserved, reserved_nodes) -> None:
        """The blocked head keeps what it is closest to fitting on, so backfill cannot starve it."""
        if job.gres.kind == "gpu":
            counts: dict[int, int] = {}
            for ni, gi in open_gpus:
                if not self.nodes[ni].gpus[gi]:
                    counts[ni] = counts.get(ni, 0) + 1
            if counts:
                reserved_nodes.add(max(counts, key=lambda n: (counts[n], -n)))
            return
        pin = self.node_index.get(job.pin) if job.pin else None
        cands = [(ni, gi) for ni, gi in open_gpus if pin is None or ni == pin]
        if cands:
            reserved.add(max(cands, key=lambda k: (self.gpu_free(*k), -k[0], -k[1])))

    # ------------------------------------------------------------- the gateway

    def snapshot(self) -> Snapshot:
        """The cluster as squeue and sinfo would show it now."""
        nodes = []
        for n in self.nodes:
            gpus = tuple(GpuView(n.name, gi, self.shares_per_gpu, tuple(uses.values())) for gi, uses in enumerate(n.gpus))
            busy = n.cpus_alloc > 0 or any(gpus[i].users for i in range(len(gpus)))
            nodes.append(NodeView(n.name, "mixed" if busy else "idle", (PARTITION,), n.cpus, n.cpus_alloc, n.mem_mib,
                                  n.mem_alloc, gpus, n.gpu_mem_mib))
        jobs = [self._view(j) for j in self.jobs.values()]
        return Snapshot(taken_at=self.now, slurm_version=SLURM_VERSION, nodes=tuple(nodes), jobs=tuple(jobs),
                        partitions=(PartitionView(PARTITION, tuple(n.name for n in self.nodes)),))

    def _view(self, j: SimJob) -> JobView:
        running = j.state is JobState.RUNNING
        node = self.nodes[j.node].name if running else None
        reason = "" if running else ("BeginTime" if j.begin > self.now else "Priority")
        return JobView(
            job_id=j.job_id, name=f"j{j.job_id}", user="sim", partition=PARTITION, state=j.state, reason=reason,
            held=j.held, gres=j.gres, nodes=(node,) if node else (), gpu_indices=j.gpus if running else (),
            cpus=j.cpus, memory_mib=j.mem_mib, submit_time=int(j.trace.submit_s),
            start_time=int(j.start) if running else None, restarts=j.restarts, requeue=True, admin_comment=j.comment,
            gpu_alloc=tuple((node, g, 0 if j.gres.kind == "gpu" else j.share) for g in j.gpus) if running else ())

    def _job(self, action: Action) -> SimJob:
        job = self.jobs.get(action.job_id)
        if job is None:
            raise UnknownJobError(["scontrol", "update", f"JobId={action.job_id}"], 1,
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
        elif kind in (ActionKind.SET_SHARE, ActionKind.SET_NODES, ActionKind.START_NOW):
            if job.state is not JobState.PENDING:
                raise JobNotPendingError(argv, 1, "Job is no longer pending execution")
            if kind is ActionKind.SET_SHARE:
                share = commands.need(action.share, action)
                if not 1 <= share <= self.shares_per_gpu:
                    raise InvalidActionError(f"share {share} of job {job.job_id} is outside 1..{self.shares_per_gpu}")
                job.gres = GresRequest("mps", share)
            elif kind is ActionKind.SET_NODES:
                job.pin = action.nodes[0] if action.nodes else None
                if job.pin is not None and job.pin not in self.node_index:
                    raise SlurmError(argv, 1, f"Invalid node name specified: {job.pin}")
            else:
                job.begin = min(job.begin, self.now)
        elif kind is ActionKind.RESHAPE_RUNNING:
            if job.state is not JobState.RUNNING:
                raise SlurmError(argv, 1, "Job is not running: requeue refused")
            share = commands.need(action.share, action)
            if not 1 <= share <= self.shares_per_gpu:
                raise InvalidActionError(f"share {share} of job {job.job_id} is outside 1..{self.shares_per_gpu}")
            self.requeue(job, share, action.nodes[0] if action.nodes else None)
        elif kind is ActionKind.SIGNAL:
            if job.state is not JobState.RUNNING:
                raise SlurmError(argv, 1, "Job is not running: nothing to signal")
            if action.signal == "USR1":  # elastico-run checkpoints and relaunches in place as the AdminComment says
                self.before_stop(job)
                job.shape = job.shape_name()
                job.relaunches += 1
                self.counters.relaunches += 1
                self.relaunched.append(job)
                self.changed.update((job.node, g) for g in job.gpus)
        else:  # pragma: no cover - the enum is closed
            raise InvalidActionError(f"unknown action kind {kind!r}")

    def argv_for(self, action: Action) -> list[list[str]]:
        """The Slurm commands the real gateway would run for `action` (for logs and dry runs)."""
        return commands.argv_for(action, self.shares_per_gpu)

    def release(self, job_id: int) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            raise UnknownJobError(commands.release(job_id), 1, f"Invalid job id specified: {job_id}")
        job.held = False

    # ------------------------------------------------------------- audit

    def check(self) -> None:
        """Raise AssertionError if any GPU, node or job breaks capacity or bookkeeping (tests, audits)."""
        total = 0
        for ni, n in enumerate(self.nodes):
            cpus = mem = 0
            seen: set[int] = set()
            for gi, uses in enumerate(n.gpus):
                whole = [u for u in uses.values() if u.whole]
                assert not whole or len(uses) == 1, f"GPU {n.name}:{gi} held whole and shared: {uses}"
                used = self.shares_per_gpu if whole else sum(u.shares for u in uses.values())
                assert used <= self.shares_per_gpu, f"GPU {n.name}:{gi} has {used} shares in use"
                g = self.offset[ni] + gi
                assert self.free[g] == self.shares_per_gpu - used and (g in self.open) == (used < self.shares_per_gpu), \
                    f"free shares of GPU {n.name}:{gi} drifted"
                total += used
                for jid in uses:
                    j = self.jobs[jid]
                    assert j.state is JobState.RUNNING and j.node == ni and gi in j.gpus, f"job {jid} misplaced"
                    if jid not in seen:
                        seen.add(jid)
                        cpus += j.cpus
                        mem += j.mem_mib
            assert cpus == n.cpus_alloc <= n.cpus and mem == n.mem_alloc <= n.mem_mib, f"node {n.name} host overcommit"
        assert total == self.alloc_shares, "share count drifted"
        pending = sorted((j.trace.submit_s, j.job_id) for j in self.jobs.values() if j.state is JobState.PENDING)
        assert pending == self.queue, "queue drifted"
