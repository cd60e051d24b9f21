"""Replay the cluster's past on the simulator's Slurm (pure): do its starts match the ones Slurm really made?

The `static` policy is Slurm alone: each job at its request, started by
Slurm's own scheduler. So the replay is the simulator's scheduler
(`sim.scheduler.SlurmScheduler`, through `sim.cluster.SimCluster`) on the
cluster's own nodes (`history.shape`), fed the past jobs (`history.past`):

- each job arrives at its real submission time and asks what it asked then
  (`gpu:N` whole GPUs of its type, or `mps:N` shares; its CPUs and memory),
  in the partitions it was submitted to (their nodes now);
- pending jobs are taken in submission order (FIFO: Slurm's order at equal
  priority, which `priority/basic` and an idle cluster's multifactor give),
  with backfill: the first job that cannot start keeps the GPUs or nodes it
  is closest to, later ones start anywhere else;
- a job holds its GPUs for its real time on them (first start to last end,
  restarts included): the replay asks where and when it would have started,
  not how fast it ran;
- a job still running at the end of the window holds its GPUs to the end; a
  job still pending then has no real start to compare with.

Slurm starts a job a moment after it could: its scheduling pass, the
allocation, the accounting's whole seconds (about 1 s on the local cluster).
The replay takes that lag from the same history (`start_lag`): the mean real
wait of the jobs it starts the moment they arrive, where no queue explains
the wait. The mean, because sacct records whole seconds: a lag of half a
second shows as waits of 0 or 1 s, whose median is one or the other (every
simulated wait half a second off) and whose mean is the lag. Each job the
replay's scheduler places then starts that long later, holding its GPUs from
the moment it was placed; 0 (no job found room at once, or they all started
within the second) is the replay without lag.

Each job's start-time error is |simulated wait - actual wait|; the result
gives their median and p90 and the ratio of the mean waits (simulated over
actual). What the replay cannot follow is counted, by reason, never dropped:
a job that asks more than any set of its partitions' nodes offers now (the
cluster changed since, or the partition is gone), a job that never started
in reality, one that the replay could not start.

What it does not model, so a cluster using it will show larger errors:
multifactor priority beyond submission order (fair share, QOS, age),
reservations, backfill's use of time limits (a later job here may start when
it fits elsewhere, whatever its limit), `bf_interval` (starts here come one
lag after they could), jobs without GPUs competing for the nodes' CPUs.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from slurm_elastico.history.past import PastJob
from slurm_elastico.history.shape import ClusterShape
from slurm_elastico.model import GresRequest
from slurm_elastico.sim.cluster import SimCluster
from slurm_elastico.sim.gpu_types import NodeGroup
from slurm_elastico.sim.job import SimJob
from slurm_elastico.sim.trace import TraceJob

NOT_STARTED = "never started in reality (pending at the end of the window)"
TOO_BIG = "asks more than its partitions' nodes offer now"
NOT_REPLAYED = "the replay could not start it"
REASONS = (NOT_STARTED, TOO_BIG, NOT_REPLAYED)


@dataclass(frozen=True)
class JobReplay:
    job_id: str
    submit: int
    actual_wait_s: float | None
    simulated_wait_s: float | None

    @property
    def error_s(self) -> float | None:
        if self.actual_wait_s is None or self.simulated_wait_s is None:
            return None
        return abs(self.simulated_wait_s - self.actual_wait_s)


@dataclass
class ReplayResult:
    jobs: list[JobReplay]
    not_compared: Counter = field(default_factory=Counter)  # reason -> jobs
    start_lag_s: float = 0.0  # Slurm's start lag the replay took from the history (`start_lag`)

    @property
    def compared(self) -> list[JobReplay]:
        return [j for j in self.jobs if j.error_s is not None]

    def stats(self) -> dict:
        """median and p90 start error (s), both mean waits and their ratio (simulated / actual; None when the
        actual mean wait is 0), over the jobs compared."""
        c = self.compared
        errors = np.array([j.error_s for j in c], dtype=float)
        actual = float(np.mean([j.actual_wait_s for j in c])) if c else math.nan
        simulated = float(np.mean([j.simulated_wait_s for j in c])) if c else math.nan
        return {
            "jobs": len(self.jobs), "compared": len(c),
            "median_start_error_s": float(np.median(errors)) if c else None,
            "p90_start_error_s": float(np.percentile(errors, 90)) if c else None,
            "max_start_error_s": float(errors.max()) if c else None,
            "mean_wait_actual_s": actual if c else None, "mean_wait_simulated_s": simulated if c else None,
            "mean_wait_ratio": simulated / actual if c and actual > 0 else None,
            "mean_wait_error_s": simulated - actual if c else None,  # what the ratio hides when nothing waited long
            "not_compared": {r: self.not_compared.get(r, 0) for r in REASONS},
            "start_lag_s": self.start_lag_s,
        }


def cluster_of(shape: ClusterShape) -> SimCluster:
    """The simulated cluster of the shape's nodes: their names, GPUs and type, CPUs, memory and partitions."""
    groups = [NodeGroup(n.gpu_type, 1, n.gpus, 1 << 20, n.partitions) for n in shape.nodes]
    cluster = SimCluster(0, shares_per_gpu=shape.shares_per_gpu, groups=groups,
                         **({"slurm_version": shape.slurm_version} if shape.slurm_version else {}))
    for sim_node, node in zip(cluster.nodes, shape.nodes):
        sim_node.name, sim_node.cpus, sim_node.mem_mib = node.name, node.cpus, node.mem_mib
    cluster.node_index = {n.name: i for i, n in enumerate(cluster.nodes)}
    return cluster


def request_of(job: PastJob) -> GresRequest:
    """What the job asked of Slurm: whole GPUs (of its type) or MPS shares."""
    if job.gpus > 0:
        return GresRequest("gpus", job.gpus, job.gpu_type)
    return GresRequest("mps", job.mps, job.gpu_type)


def fits(job: PastJob, shape: ClusterShape) -> bool:
    """Whether the nodes of one of its partitions could hold the job empty (its GPUs of its type; a share on one
    GPU)."""
    groups = shape.nodes_for(shape.partition_of(job.partition), job.gpu_type)
    if job.gpus > 0:
        return any(sum(n.gpus for n in nodes) >= job.gpus for nodes in groups)
    return job.mps <= shape.shares_per_gpu and bool(groups)


def start_lag(result: ReplayResult) -> float:
    """Slurm's start lag as `result` (a replay without lag) shows it: the mean real wait of the jobs it started
    the moment they arrived (0 when there are none; the mean, as the module's docstring says)."""
    at_once = [j.actual_wait_s for j in result.compared if j.simulated_wait_s == 0]
    return float(np.mean(at_once)) if at_once else 0.0


def replay(jobs: Sequence[PastJob], shape: ClusterShape, until: int | None = None,
           lag_s: float | None = None) -> ReplayResult:
    """Each job's simulated wait beside its real one (see the module docstring). `until`: the end of the window,
    to which a job still running holds its GPUs (default: for ever); `lag_s`: Slurm's start lag (None: taken from
    the history, `start_lag`)."""
    if lag_s is None:
        first = _replay(jobs, shape, until, 0.0)
        lag_s = start_lag(first)
        if lag_s <= 0:
            return first
    return _replay(jobs, shape, until, lag_s)


def _replay(jobs: Sequence[PastJob], shape: ClusterShape, until: int | None, lag_s: float) -> ReplayResult:
    cluster = cluster_of(shape)
    result = ReplayResult([], start_lag_s=lag_s)
    order = sorted(jobs, key=lambda j: (j.submit, _id_key(j.job_id)))
    hold: dict[int, float] = {}
    sim_jobs: dict[int, SimJob] = {}
    arrivals: list[tuple[float, int]] = []
    for i, job in enumerate(order):
        if not fits(job, shape):
            result.not_compared[TOO_BIG] += 1
            continue
        if job.run_s is not None:
            hold[i] = float(job.run_s)
        elif job.start is not None:  # running at the end of the window
            hold[i] = float(until - job.start) if until is not None else math.inf
        else:
            hold[i] = math.inf  # pending at the end: it has no real start nor time to replay
        tj = TraceJob(i, float(job.submit), "train", "", max(job.gpus, 1), 1.0,
                      partition=shape.partition_of(job.partition))
        sj = SimJob(trace=tj, family=None, gres=request_of(job), cpus=max(job.cpus, 1), mem_mib=max(job.mem_mib, 0),
                    begin=float(job.submit))
        sim_jobs[i] = sj
        arrivals.append((float(job.submit), i))
    ends: list[tuple[float, int]] = []
    started: dict[int, float] = {}
    a = 0
    while a < len(arrivals) or ends:
        now = min(arrivals[a][0] if a < len(arrivals) else math.inf, ends[0][0] if ends else math.inf)
        cluster.now = now
        while ends and ends[0][0] <= now:
            _, i = heapq.heappop(ends)
            cluster.finish(sim_jobs[i])
        while a < len(arrivals) and arrivals[a][0] <= now:
            cluster.submit(sim_jobs[arrivals[a][1]])
            a += 1
        for sj in cluster.schedule():  # it holds its GPUs from this pass; it starts, and its time runs, a lag later
            started[sj.job_id] = now + lag_s
            if math.isfinite(hold[sj.job_id]):
                heapq.heappush(ends, (now + lag_s + hold[sj.job_id], sj.job_id))
    for i, sj in sim_jobs.items():
        job = order[i]
        sim_wait = started[i] - job.submit if i in started else None
        result.jobs.append(JobReplay(job.job_id, job.submit, job.wait_s, sim_wait))
        if job.wait_s is None:
            result.not_compared[NOT_STARTED] += 1
        elif sim_wait is None:
            result.not_compared[NOT_REPLAYED] += 1
    return result


def _id_key(job_id: str) -> tuple[int, int]:
    """Slurm's order of ids at equal submission: the job (or array) id, then the task."""
    head, _, task = job_id.partition("_")
    return (int(head) if head.isdigit() else 0, int(task) if task.isdigit() else -1)
