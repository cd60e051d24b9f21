"""The simulated Slurm cluster: job and GPU state, the gateway the planner acts through, Slurm's own scheduler.

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
- `START_NOW` lifts the job's BeginTime (the submit's placement window).
- `PREEMPT` is requeue-hold with the request unchanged: the job goes back to
  pending HELD with the work it has done (the scheduler never starts a held
  job) and pays its restart time when it runs again.
- `RESUME` pins a held job to the action's nodes (when given), lifts its
  BeginTime and releases it.
- `SET_ADMIN_COMMENT` names the shape the job runs as at its next start.
- `SIGNAL` USR1 to a running job: elastico-run checkpoints and relaunches in
  place (same resources) as its AdminComment now says, paying the restart time.

Slurm's scheduler (`schedule`): pending jobs in priority order (then submit
time, then id), each at its requested GRES — `mps:N` on one GPU with N free
shares (the lowest-index one of the first node that has one, or of the
first node of its pin: first fit, as measured on Slurm,
`planner.gpu_choice`), `gpus:N` on N idle whole GPUs (no MPS user; on a
Slurm other than 24.11, `slurm_version`, only the lowest of a node not held
whole) of as few
nodes as it takes: the one node with the fewest idle GPUs that still has N
(best fit), else nodes by most idle GPUs first; pinned, only on its nodes
and at least one GPU on each (Slurm's NodeList= is required nodes); a
request set per node (`Gres=gpu:P NumNodes=K-K`) takes P on each of its K
nodes (one node when unpinned). A gang's
CPUs and host memory are for the whole job, split over its nodes in
proportion to its GPUs there (rounded up per node) and checked per node.
Backfill without time limits: the first job that cannot start reserves the
GPU (mps) or whole nodes (gpus) it is closest to fitting on, and later jobs
may start anywhere else. Slurm knows no GPU memory, so jobs it starts may
overcommit it; those are counted. (A job submitted with `--gres=gpu:N` is
not simulated: nothing submits it here; the GPU-count actions set it.)

Time is the engine's clock (`now`), in simulated seconds.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from slurm_elastico.errors import InvalidActionError, JobNotPendingError, SlurmError, UnknownJobError
from slurm_elastico.model import (MPS_SHARES_PER_GPU, Action, ActionKind, Family, GpuUse, GpuView, GresRequest,
                                  JobState, JobView, NodeView, PartitionView, Snapshot)
from slurm_elastico.planner.gpu_choice import lowest_unused
from slurm_elastico.shapes.current import running_shape
from slurm_elastico.slurm import commands
from slurm_elastico.sim.trace import TraceJob

PARTITION = "gpu"
SLURM_VERSION = "24.11.5"
"""The version simulated unless told another (`SimSettings.slurm_version`)."""


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
    pin: tuple[str, ...] = ()
    """Node names the job must run on (NodeList=); an `mps` job uses only the first."""
    per_node: bool = False
    """A gang asked as `Gres=gpu:P NumNodes=K-K` (`commands.set_gpu_count`): P = N / K GPUs on each of its K
    pinned nodes (one node when unpinned). False: `gpus:N` for the job as submitted (`--gpus=N`), which Slurm
    may spread unevenly."""
    comment: str = ""
    # while running
    alloc: tuple[tuple[int, int], ...] = ()
    """(node index, GPU index) of every GPU the job holds, in node then GPU order."""
    share: int = 0
    """MPS shares it holds on each of its GPUs (all of them when it holds them whole)."""
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

    @property
    def whole(self) -> bool:
        """Whether the job asks for whole GPUs (a `gpus:N` gang) rather than an MPS share."""
        return self.gres.kind == "gpus"

    @property
    def placement(self) -> tuple[int, ...]:
        """GPUs it holds on each of its nodes, most first (e.g. (4, 2)); () when not running."""
        return tuple(sorted(Counter(ni for ni, _ in self.alloc).values(), reverse=True))

    @property
    def node_indices(self) -> tuple[int, ...]:
        """Its nodes, in index order."""
        return tuple(sorted({ni for ni, _ in self.alloc}))

    def shape_name(self, shares_per_gpu: int) -> str:
        """The shape the job runs as when it starts: the rule elastico-run follows (`shapes.current.running_shape`)."""
        if self.family is None:
            return ""
        held = self.gres.count if self.gres.kind == "mps" else None  # the share it starts with, in Slurm's counts
        return running_shape(self.family.shapes, self.family.default_shape, self.comment, held, shares_per_gpu)[0].name


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
                 mem_per_gpu_mib: int = 65536, shares_per_gpu: int = MPS_SHARES_PER_GPU, even_gangs: bool = True,
                 slurm_version: str = SLURM_VERSION):
        self.shares_per_gpu = shares_per_gpu
        self.slurm_version = slurm_version  # what the snapshot says, and which GPUs `gpus:N` takes (`_idle`)
        self.lowest_unused = lowest_unused(slurm_version)
        self.even_gangs = even_gangs
        """False (`SimSettings.even_gangs`, calibration only): a GPU-count action asks for N GPUs over its nodes,
        at least one on each and any count per node (the Pollux peer's rule), not P on each of K. The snapshot
        says so to the planner (`Snapshot.even_gangs`)."""
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
        if job.gres.kind not in ("mps", "gpus"):
            raise ValueError(f"the simulated cluster runs mps:N and gpus:N jobs, not {job.gres}")
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

    @staticmethod
    def host_share(job: SimJob, k: int, total: int) -> tuple[int, int]:
        """(CPUs, host MiB) of `job` on a node where it holds k of its `total` GPUs: its share, rounded up."""
        return -(-job.cpus * k // total), -(-job.mem_mib * k // total)

    def host_split(self, job: SimJob, alloc: tuple[tuple[int, int], ...]) -> list[tuple[int, int, int]]:
        """(node, CPUs, host MiB) of `job` on each node of `alloc`; one node gets all of it."""
        counts = Counter(ni for ni, _ in alloc)
        return [(ni, *self.host_share(job, k, len(alloc))) for ni, k in sorted(counts.items())]

    def start(self, job: SimJob, alloc: tuple[tuple[int, int], ...]) -> None:
        whole = job.whole
        share = self.shares_per_gpu if whole else job.gres.count
        alloc = tuple(sorted(alloc))
        for ni, gi in alloc:
            self.nodes[ni].gpus[gi][job.job_id] = GpuUse(job.job_id, 0 if whole else share, whole)
            self._set_free(ni, gi, -share, whole)
            self.changed.add((ni, gi))
        for ni, cpus, mem in self.host_split(job, alloc):
            self.nodes[ni].cpus_alloc += cpus
            self.nodes[ni].mem_alloc += mem
        self.alloc_shares += share * len(alloc)
        self.queue.remove((job.trace.submit_s, job.job_id))
        job.state, job.alloc, job.share = JobState.RUNNING, alloc, share
        job.shape = job.shape_name(self.shares_per_gpu)
        job.start = self.now
        job.starts += 1
        if job.first_start < 0:
            job.first_start = self.now
        self.counters.starts += 1

    def stop(self, job: SimJob) -> None:
        """Take a running job off its GPUs (completion or requeue)."""
        self.before_stop(job)
        whole = job.whole
        for ni, gi in job.alloc:
            del self.nodes[ni].gpus[gi][job.job_id]
            self._set_free(ni, gi, job.share, whole)
            self.changed.add((ni, gi))
        for ni, cpus, mem in self.host_split(job, job.alloc):
            self.nodes[ni].cpus_alloc -= cpus
            self.nodes[ni].mem_alloc -= mem
        self.alloc_shares -= job.share * len(job.alloc)
        job.alloc, job.share = (), 0

    def finish(self, job: SimJob) -> None:
        self.stop(job)
        job.state = JobState.COMPLETED
        job.end = self.now
        del self.jobs[job.job_id]

    def requeue(self, job: SimJob, gres: GresRequest, pin: tuple[str, ...]) -> None:
        self.stop(job)
        job.state, job.held, job.begin = JobState.PENDING, False, self.now
        job.gres = gres
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
            too_big = not job.whole and job.gres.count > top
            if too_big and not blocked:
                continue  # cannot fit anywhere: skip the search
            where = None if too_big else self._fit(job, open_gpus, reserved, reserved_nodes)
            if where is not None:
                self.start(job, where)
                started.append(job)
                if not self.open:
                    break
                open_gpus = [self.gpu_key[g] for g in sorted(self.open)]
                top = max(self.free[g] for g in self.open)
            elif blocked:
                self._reserve(job, open_gpus, reserved, reserved_nodes)
        return started

    def _fit(self, job: SimJob, open_gpus, reserved, reserved_nodes) -> tuple[tuple[int, int], ...] | None:
        if job.whole:
            return self._fit_gang(job, open_gpus, reserved, reserved_nodes)
        pin = self.node_index.get(job.pin[0]) if job.pin else None
        need = job.gres.count
        best: tuple[int, int] | None = None
        for ni, gi in open_gpus:  # first fit in node and GPU order, as Slurm picks (`planner.gpu_choice.mps_gpu`)
            if (pin is not None and ni != pin) or (ni, gi) in reserved or ni in reserved_nodes:
                continue
            if self.gpu_free(ni, gi) >= need and self._host_fits(ni, job):
                best = (ni, gi)
                break
        if best is None:
            return None
        if self._gpu_mem_used(*best) + self._gpu_mem_of(job) > self.nodes[best[0]].gpu_mem_mib:
            self.counters.memory_overcommits += 1
        return (best,)

    def _idle(self, open_gpus, reserved, reserved_nodes) -> dict[int, list[int]]:
        """The idle GPUs (no user at all) per node that `gpus:N` may take, outside the reservation, in node and GPU
        order: on 24.11 (`lowest_unused`) every one; otherwise only those below the node's lowest GPU that is
        neither held whole nor idle (`planner.gpu_choice.whole_gpus`: Slurm takes the lowest GPUs not held whole,
        MPS users or not). 22.05 would then start the job beside those MPS users; that is not modelled: here it
        waits for them to leave."""
        idle: dict[int, list[int]] = {}
        if self.lowest_unused:
            for ni, gi in open_gpus:
                if ni not in reserved_nodes and (ni, gi) not in reserved and not self.nodes[ni].gpus[gi]:
                    idle.setdefault(ni, []).append(gi)
            return idle
        for ni in sorted({ni for ni, _ in open_gpus} - set(reserved_nodes)):
            for gi, uses in enumerate(self.nodes[ni].gpus):
                if any(u.whole for u in uses.values()):
                    continue
                if uses or (ni, gi) in reserved:
                    break
                idle.setdefault(ni, []).append(gi)
        return idle

    def _fit_gang(self, job: SimJob, open_gpus, reserved, reserved_nodes) -> tuple[tuple[int, int], ...] | None:
        """`gpus:N` on idle GPUs: one node (best fit), else most idle nodes first; pinned: on each of its nodes."""
        n = job.gres.count
        idle = self._idle(open_gpus, reserved, reserved_nodes)

        def room(ni: int, k: int) -> int:
            """How many of k GPUs node ni can take: idle ones whose share of the host still fits."""
            k = min(k, len(idle.get(ni, ())))
            while k > 0 and not self._host_fits(ni, job, k, n):
                k -= 1
            return k

        most_idle = lambda ni: (-len(idle.get(ni, ())), ni)  # noqa: E731
        take: dict[int, int] = {}
        if job.per_node:  # P on each of its K nodes, exactly
            pins = sorted({self.node_index.get(name, -1) for name in job.pin})
            if job.pin:
                p = n // len(pins)
                if pins[0] < 0 or n % len(pins) or any(room(ni, p) < p for ni in pins):
                    return None
                take = dict.fromkeys(pins, p)
            else:
                whole_node = [ni for ni in idle if room(ni, n) == n]
                if not whole_node:
                    return None
                take = {min(whole_node, key=lambda ni: (len(idle[ni]), ni)): n}
            left = 0
        elif job.pin:
            pins = sorted({self.node_index.get(name, -1) for name in job.pin})
            if pins[0] < 0 or n < len(pins) or any(room(ni, 1) < 1 for ni in pins):
                return None
            take = dict.fromkeys(pins, 1)
            left = n - len(pins)
            for ni in sorted(pins, key=most_idle):
                extra = room(ni, take[ni] + left) - take[ni]
                take[ni] += extra
                left -= extra
        else:
            whole_node = [ni for ni in idle if room(ni, n) == n]
            if whole_node:
                take = {min(whole_node, key=lambda ni: (len(idle[ni]), ni)): n}
                left = 0
            else:
                left = n
                for ni in sorted(idle, key=most_idle):
                    k = room(ni, left)
                    if k:
                        take[ni] = k
                        left -= k
                    if not left:
                        break
        if left:
            return None
        alloc = tuple((ni, gi) for ni, k in sorted(take.items()) for gi in idle[ni][:k])
        if self._gpu_mem_of(job) > min(self.nodes[ni].gpu_mem_mib for ni in take):
            self.counters.memory_overcommits += 1
        return alloc

    def _fits_empty(self, job: SimJob, nodes: list[int]) -> bool:
        """Whether gang `job` would fit on `nodes` (pinned: on each of them) if they were empty."""
        if not nodes or nodes[0] < 0:
            return False
        n = job.gres.count

        def room(ni: int, k: int) -> int:
            node = self.nodes[ni]
            k = min(k, len(node.gpus))
            while k > 0 and not all(a <= b for a, b in zip(self.host_share(job, k, n), (node.cpus, node.mem_mib))):
                k -= 1
            return k

        if job.per_node:
            k = max(1, len(job.pin))
            return n % k == 0 and (all(room(ni, n // k) >= n // k for ni in nodes) if job.pin
                                   else any(room(ni, n) >= n for ni in nodes))
        if job.pin and (n < len(nodes) or any(room(ni, 1) < 1 for ni in nodes)):
            return False
        return sum(room(ni, n) for ni in nodes) >= n

    def _host_fits(self, ni: int, job: SimJob, k: int = 1, total: int = 1) -> bool:
        """Whether node ni has the CPUs and memory for `job` holding k of its `total` GPUs there."""
        n = self.nodes[ni]
        cpus, mem = self.host_share(job, k, total)
        return n.cpus - n.cpus_alloc >= cpus and n.mem_mib - n.mem_alloc >= mem

    def _gpu_mem_of(self, job: SimJob) -> int:
        if job.family is None:
            return 0
        try:
            return job.family.shape(job.shape_name(self.shares_per_gpu)).resources.gpu_mem_mib
        except KeyError:
            return job.family.default_shape.resources.gpu_mem_mib

    def _gpu_mem_used(self, ni: int, gi: int) -> int:
        return sum(self._gpu_mem_of(self.jobs[j]) for j in self.nodes[ni].gpus[gi])

    def _reserve(self, job: SimJob, open_gpus, reserved, reserved_nodes) -> None:
        """The blocked head keeps what it is closest to fitting on, so backfill cannot starve it.

        A gang keeps whole nodes: its pinned nodes, else the nodes with the most idle GPUs until they hold
        its N GPUs. A request its nodes could not hold even empty keeps nothing (a share: no node with its
        CPUs and memory): Slurm's backfill finds no start time for it, and holding nodes for it would starve
        the rest for ever.
        """
        if job.whole:
            n = job.gres.count
            pins = sorted({self.node_index.get(name, -1) for name in job.pin}) if job.pin else \
                list(range(len(self.nodes)))
            if not self._fits_empty(job, pins):
                return
            if job.pin:
                reserved_nodes.update(pins)
                return
            idle = self._idle(open_gpus, (), ())
            held = 0
            for ni in sorted(pins, key=lambda ni: (-len(idle.get(ni, ())), ni)):
                if held >= n:
                    break
                reserved_nodes.add(ni)
                held += len(self.nodes[ni].gpus)
            return
        pin = self.node_index.get(job.pin[0]) if job.pin else None
        cpus, mem = self.host_share(job, 1, 1)
        cands = [(ni, gi) for ni, gi in open_gpus if (pin is None or ni == pin)
                 and cpus <= self.nodes[ni].cpus and mem <= self.nodes[ni].mem_mib]
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
        return Snapshot(taken_at=self.now, slurm_version=self.slurm_version, nodes=tuple(nodes), jobs=tuple(jobs),
                        partitions=(PartitionView(PARTITION, tuple(n.name for n in self.nodes)),),
                        even_gangs=self.even_gangs)

    def _view(self, j: SimJob) -> JobView:
        running = j.state is JobState.RUNNING
        nodes = tuple(self.nodes[ni].name for ni in j.node_indices) if running else ()
        first = j.alloc[0][0] if running else -1
        reason = "" if running else ("BeginTime" if j.begin > self.now else "Priority")
        return JobView(
            job_id=j.job_id, name=f"j{j.job_id}", user="sim", partition=PARTITION, state=j.state, reason=reason,
            held=j.held, gres=j.gres, nodes=nodes, gpu_indices=tuple(gi for ni, gi in j.alloc if ni == first),
            cpus=j.cpus, memory_mib=j.mem_mib, submit_time=int(j.trace.submit_s),
            start_time=int(j.start) if running else None, restarts=j.restarts, requeue=True, admin_comment=j.comment,
            gpu_alloc=tuple((self.nodes[ni].name, gi, 0 if j.whole else j.share) for ni, gi in j.alloc))

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
        elif kind in (ActionKind.SET_SHARE, ActionKind.SET_GPUS, ActionKind.SET_NODES, ActionKind.START_NOW):
            if job.state is not JobState.PENDING:
                raise JobNotPendingError(argv, 1, "Job is no longer pending execution")
            if kind is ActionKind.SET_SHARE:
                job.gres = self._share_request(action)
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
                self.requeue(job, self._share_request(action), tuple(action.nodes[:1]))
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
                job.shape = job.shape_name(self.shares_per_gpu)
                job.relaunches += 1
                self.counters.relaunches += 1
                self.relaunched.append(job)
                self.changed.update(job.alloc)
        else:  # pragma: no cover - the enum is closed
            raise InvalidActionError(f"unknown action kind {kind!r}")

    def _share_request(self, action: Action) -> GresRequest:
        share = commands.need(action.share, action)
        if not 1 <= share <= self.shares_per_gpu:
            raise InvalidActionError(f"share {share} of job {action.job_id} is outside 1..{self.shares_per_gpu}")
        return GresRequest("mps", share)

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
        return GresRequest("gpus", n), pin

    def argv_for(self, action: Action) -> list[list[str]]:
        """The Slurm commands the real gateway runs for `action` (`slurm.gateway.SlurmGateway.argv_for`): a GPU
        count as `Gres=gpu:P NumNodes=K-K NodeList=` (`commands.gpu_count_argv`), which refuses a count that
        does not split evenly over the nodes, as the live gateway does before touching Slurm."""
        if action.kind is ActionKind.SET_GPUS or (action.kind is ActionKind.RESHAPE_RUNNING and action.gpus is not None):
            if not self.even_gangs:  # the peer's rule: N GPUs on these nodes in any split (calibration only)
                update = ["scontrol", "update", f"JobId={action.job_id}",
                          f"TresPerJob=gres/gpu:{commands.need(action.gpus, action)}", f"NodeList={','.join(action.nodes)}"]
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

    # ------------------------------------------------------------- audit

    def check(self) -> None:
        """Raise AssertionError if any GPU, node or job breaks capacity or bookkeeping (tests, audits)."""
        total = 0
        host: dict[int, list[int]] = {ni: [0, 0] for ni in range(len(self.nodes))}
        for j in self.jobs.values():
            if j.state is not JobState.RUNNING:
                assert not j.alloc and j.share == 0, f"job {j.job_id} is {j.state.value} but holds {j.alloc}"
                continue
            assert j.alloc and len(set(j.alloc)) == len(j.alloc), f"job {j.job_id} runs on {j.alloc}"
            if j.whole:
                assert len(j.alloc) == j.gres.count and j.share == self.shares_per_gpu, \
                    f"gang {j.job_id} holds {j.alloc} for {j.gres}"
            else:
                assert len(j.alloc) == 1 and j.share == j.gres.count, f"job {j.job_id} holds {j.alloc} for {j.gres}"
            names = {self.nodes[ni].name for ni in j.node_indices}
            if j.pin:
                want = set(j.pin) if j.whole else {j.pin[0]}
                assert names == want, f"job {j.job_id} pinned to {j.pin} runs on {sorted(names)}"
            for ni, gi in j.alloc:
                use = self.nodes[ni].gpus[gi].get(j.job_id)
                assert use is not None and use.whole == j.whole, f"job {j.job_id} missing from GPU {ni}:{gi}"
            for ni, cpus, mem in self.host_split(j, j.alloc):
                host[ni][0] += cpus
                host[ni][1] += mem
        for ni, n in enumerate(self.nodes):
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
                    assert j.state is JobState.RUNNING and (ni, gi) in j.alloc, f"job {jid} misplaced"
            cpus, mem = host[ni]
            assert cpus == n.cpus_alloc <= n.cpus and mem == n.mem_alloc <= n.mem_mib, f"node {n.name} host overcommit"
        assert total == self.alloc_shares, "share count drifted"
        pending = sorted((j.trace.submit_s, j.job_id) for j in self.jobs.values() if j.state is JobState.PENDING)
        assert pending == self.queue, "queue drifted"
