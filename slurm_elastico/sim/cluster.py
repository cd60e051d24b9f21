"""The simulated Slurm cluster: its nodes and GPUs, the jobs on them, and the bookkeeping of both.

`SimCluster` is Slurm as the planner and the engine meet it: the gateway the
planner acts through (`sim.gateway.SimGateway`: `snapshot`, `apply`,
`argv_for`, `release`) and Slurm's own scheduler
(`sim.scheduler.SlurmScheduler`: what starts where, with backfill), both over
the state kept here — nodes of GPUs with their free MPS shares, the queue,
each job's `SimJob` (`sim.job`) — and the job life they share (`submit`,
`start`, `stop`, `finish`, `requeue`). `check` audits all of it.

Time is the engine's clock (`now`), in simulated seconds.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from slurm_elastico.model import MPS_SHARES_PER_GPU, GpuUse, GresRequest, JobState, partition_names
from slurm_elastico.planner.partitions import node_sets
from slurm_elastico.planner.gpu_choice import lowest_unused
from slurm_elastico.sim.gateway import PARTITION, SimGateway
from slurm_elastico.sim.gpu_types import NodeGroup
from slurm_elastico.sim.job import SimJob
from slurm_elastico.sim.scheduler import SlurmScheduler

SLURM_VERSION = "24.11.5"
"""The version simulated unless told another (`SimSettings.slurm_version`)."""


@dataclass
class SimNode:
    name: str
    cpus: int
    mem_mib: int
    gpu_mem_mib: int
    gpus: list[dict[int, GpuUse]]
    cpus_alloc: int = 0
    mem_alloc: int = 0
    gpu_type: str = ""
    """The type of its GPUs ("" on a one-type cluster: the snapshot then names none, as a gres without a type)."""
    partitions: tuple[str, ...] = (PARTITION,)


@dataclass
class Counters:
    starts: int = 0
    requeues: int = 0
    relaunches: int = 0
    switches: int = 0  # goodput jobs' new batches taken in process (`runtime.rebatch`): no relaunch
    memory_overcommits: int = 0
    actions: dict[str, int] = field(default_factory=dict)


class SimCluster(SlurmScheduler, SimGateway):
    """Nodes of `gpus_per_node` GPUs; jobs submitted by the engine; the gateway and Slurm's scheduler."""

    def __init__(self, n_gpus: int, gpus_per_node: int = 8, gpu_mem_mib: int = 16384, cpus_per_gpu: int = 16,
                 mem_per_gpu_mib: int = 65536, shares_per_gpu: int = MPS_SHARES_PER_GPU, even_gangs: bool = True,
                 slurm_version: str = SLURM_VERSION, groups: Sequence[NodeGroup] = ()):
        """`n_gpus` on nodes of `gpus_per_node` with `gpu_mem_mib` each, or, with `groups` (`sim.gpu_types`), each
        group's nodes of its type, GPUs, memory and partitions, in the order given (then `n_gpus`, `gpus_per_node`
        and `gpu_mem_mib` are not used)."""
        self.shares_per_gpu = shares_per_gpu
        self.slurm_version = slurm_version  # what the snapshot says, and which GPUs `gpus:N` takes (`_idle`)
        self.lowest_unused = lowest_unused(slurm_version)
        self.even_gangs = even_gangs
        """False (`SimSettings.even_gangs`, calibration only): a GPU-count action asks for N GPUs over its nodes,
        at least one on each and any count per node (the Pollux peer's rule), not P on each of K. The snapshot
        says so to the planner (`Snapshot.even_gangs`)."""
        self.nodes: list[SimNode] = []
        left = n_gpus
        while left > 0 and not groups:
            g = min(gpus_per_node, left)
            self.nodes.append(SimNode(f"n{len(self.nodes):04d}", g * cpus_per_gpu, g * mem_per_gpu_mib, gpu_mem_mib,
                                      [dict() for _ in range(g)]))
            left -= g
        for group in groups:
            g = group.gpus_per_node
            for _ in range(group.nodes):
                self.nodes.append(SimNode(f"n{len(self.nodes):04d}", g * cpus_per_gpu, g * mem_per_gpu_mib,
                                          group.memory_mib, [dict() for _ in range(g)], gpu_type=group.gpu_type,
                                          partitions=group.partitions or (PARTITION,)))
        n_gpus = sum(len(n.gpus) for n in self.nodes)
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
        self.busy_gpus = 0  # GPUs holding at least one job (the denominator of useful work per GPU-second)
        self.changed: set[tuple[int, int]] = set()  # GPUs whose occupants changed; the engine recomputes their rates
        self.before_stop = lambda job: None  # the engine accrues a job's progress before it leaves its GPUs
        self.relaunched: list[SimJob] = []  # relaunched in place since the engine last looked: they pay a restart

    # ------------------------------------------------------------- job life

    def submit(self, job: SimJob) -> None:
        if job.gres.kind not in ("mps", "gpus"):
            raise ValueError(f"the simulated cluster runs mps:N and gpus:N jobs, not {job.gres}")
        job.reach, job.within = self.reach(job.trace.partition)
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
            self.busy_gpus += not self.nodes[ni].gpus[gi]
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
        job.start = job.shape_since = self.now
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
            self.busy_gpus -= not self.nodes[ni].gpus[gi]
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

    def typed_placement(self, job: SimJob) -> tuple[tuple[str, int], ...]:
        """(GPU type, GPUs held there) on each node of a running job, most GPUs first, then by type."""
        per = Counter(ni for ni, _ in job.alloc)
        return tuple(sorted(((self.nodes[ni].gpu_type, k) for ni, k in per.items()), key=lambda x: (-x[1], x[0])))

    def on_type(self, ni: int, job: SimJob) -> bool:
        """Whether node ni may run `job`: its request names no type or the node's (Slurm's gres matching)."""
        return not job.gres.gpu_type or self.nodes[ni].gpu_type == job.gres.gpu_type

    def may_run(self, ni: int, job: SimJob) -> bool:
        """Whether node ni may run `job`, or its part of it: of its type and in one of its partitions."""
        return self.on_type(ni, job) and (job.within is None or ni in job.within)

    def reach(self, partition: str) -> tuple[tuple[frozenset[int], ...] | None, frozenset[int] | None]:
        """The node indices of each partition a job of partition field `partition` may start in (name order), and
        all of them together; (None, None) when that is every node. ValueError when no node is in any of them
        (Slurm refuses such a job at submission: "invalid partition name specified")."""
        if not partition_names(partition):
            return None, None
        sets = node_sets(partition, [n.partitions for n in self.nodes])
        if not sets:
            raise ValueError(f"no node of the simulated cluster is in partition {partition!r}; partitions: "
                             f"{', '.join(self.partitions)}")
        if any(len(s) == len(self.nodes) for s in sets):
            return None, None
        return tuple(sets), frozenset().union(*sets)

    @property
    def partitions(self) -> tuple[str, ...]:
        """Every partition some node is in, sorted."""
        return tuple(sorted({p for n in self.nodes for p in n.partitions}))

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
            assert all(self.on_type(ni, j) for ni in j.node_indices), f"job {j.job_id} asks {j.gres}, runs on {names}"
            assert j.reach is None or any(set(j.node_indices) <= s for s in j.reach), \
                f"job {j.job_id} of partition {j.trace.partition} runs on {sorted(names)}, in none of them whole"
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
        assert self.busy_gpus == sum(bool(u) for n in self.nodes for u in n.gpus), "busy GPU count drifted"
        pending = sorted((j.trace.submit_s, j.job_id) for j in self.jobs.values() if j.state is JobState.PENDING)
        assert pending == self.queue, "queue drifted"
