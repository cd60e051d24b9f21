"""The discrete-event loop: arrivals, Slurm starts, completions, reshapes, and a planner epoch every `epoch_s`.

Each epoch is `elastico sched`'s own epoch (`helper.epoch.run_once`: recover,
plan, act through the one action executor) with the simulated cluster as the
gateway, an in-memory journal, and the exact progress of every running job.
So a refused action has the live consequences — the job's later actions are
skipped, its AdminComment put back, a failed reshape recovered next epoch —
and is counted (`refused_actions`, `skipped_actions`). The policy is chosen by name from the planner's registry (the
loop never branches on it). Between epochs Slurm starts what fits
(`SimCluster.schedule`).

A job's rate is piecewise constant: its speed alone (`sim.speeds`) under the
ground truth's co-location rule. It changes only when its GPU's occupants
change (a job holding whole GPUs runs alone on them, at the speed of its
placement: the GPUs it holds on each node), or, for a job running at another
global batch than its own (goodput shapes), when an epoch of its statistical
efficiency ends. So progress is accrued exactly at those instants, and the
next one is an event at `max(now, ready_at) + work_left / rate` (`ready_at`
ends a restart's checkpoint-and-restart time, during which a job makes no
progress; work left is to the epoch's end when that comes first, and the job
is re-rated there). A stale event (the rate changed since) is ignored by its
version number.

Useful work per GPU-second (`RunResult.useful_per_gpu_s`): each running job's speed as a fraction of its
speed alone on a whole GPU at the same shape (a gang's: its GPUs, each 1), integrated while it makes progress (not
during a restart), over the GPU-seconds some job held (`SimCluster.busy_gpus`). A GPU running one job at a share
its work cannot fill counts below 1, two jobs that together beat one alone above 1: beside the allocated share
(`util_*`), the figure that says whether sharing paid.

An epoch is skipped when nothing happened since the last one and that one
acted on nothing: the planner is pure, so the same cluster gets the same
plan except through time-dependent weights; this is what makes day-long
replays affordable.

Deterministic: events are ordered by (time, kind, sequence number), and
nothing depends on dict order of anything but insertion.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence

from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError
from slurm_elastico.helper.epoch import run_once
from slurm_elastico.helper.journal import MemoryJournal
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Family, GresRequest, JobState
from slurm_elastico.planner import policies
from slurm_elastico.shapes.units import shares_of
from slurm_elastico.sim import belief, gpu_types
from slurm_elastico.sim.cluster import SimCluster
from slurm_elastico.sim.families import (INFER_CPUS, INFER_HOST_MIB, TRAIN_CPUS, TRAIN_HOST_MIB, efficiency_segment,
                                         fastest_speed, family_of)
from slurm_elastico.sim.families_typed import typed_family_of, typed_fastest_speed
from slurm_elastico.sim.job import SimJob
from slurm_elastico.sim.results import JobResult, RunResult
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.speeds import JobSpeeds, shape_of
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth
from slurm_elastico.sim.truth_types import TypedTruth

COMPLETE, ARRIVAL, BEGIN, EPOCH = 0, 1, 2, 3
FIRST, REQUEUE, RELAUNCH = "first", "requeue", "relaunch"
"""The kinds of start, each with its true cost (`Engine._restart_s`)."""
STALL_EPOCHS = 20
"""Epochs in a row with nothing running, nothing arriving and nothing done before a run gives up (jobs left
unfinished), whatever the planner asked meanwhile: actions that start nothing (a pin re-issued every epoch to a
job Slurm will not start) must not keep a run going for ever."""



HOST_UNLIMITED = (1 << 12, 1 << 30)
"""CPUs and host MiB per GPU of a node that never limits a job (Sia's calibration: GPUs only)."""

class Engine(JobSpeeds):
    """One simulation run of one policy on one trace."""

    def __init__(self, trace: Sequence[TraceJob], policy: str, settings: Settings, sim: SimSettings,
                 model: SlowdownModel | None, truth: GroundTruth | TypedTruth | None = None, seed: int = 0,
                 on_progress: Callable[[float], None] | None = None, rigid: frozenset[int] = frozenset(),
                 nodes: Sequence[gpu_types.NodeGroup] = ()):
        """`rigid`: ids of jobs Slurm runs as submitted whatever family their trace row would offer (a plain job
        of a cluster's history, `history.whatif`): no family, so no policy reshapes them. `nodes`: the cluster's
        node groups in place of `sim.gpus` over nodes of `sim.gpus_per_node` (a history's own nodes and
        partitions, `history.whatif`), of no GPU type; a typed cluster is `sim.cluster`'s."""
        chosen = policies.get(policy)  # an unknown name fails before anything runs
        self.trace = sorted(trace, key=lambda j: (j.submit_s, j.job_id))
        self.policy = policy
        self.settings = dataclasses.replace(settings, planner=dataclasses.replace(settings.planner, policy=policy))
        self.sim = sim
        # Goodput shapes (other global batches) for every training family when the settings ask for them or the
        # policy adapts batch sizes (a policy attribute, as the epoch reads `narrow` or `reshape`).
        self.adaptive = (sim.adaptive_batch or bool(getattr(chosen, "adapts_batch", False))) and not sim.fixed_batch
        # A family with GPU counts on whole GPUs only where the settings or the policy (elastico-submit's start) say so.
        self.whole_gpu_gangs = sim.whole_gpu_gangs or bool(getattr(chosen, "whole_gpu_gangs", False))
        # Its jobs come through elastico-submit's wrapper (`Policy.whole_gpu_gangs`): their first start pays its start-up.
        self.wrapped = bool(getattr(chosen, "whole_gpu_gangs", False))
        # A policy that acts in rounds of time (`round_s`, Gavel) is planned at every epoch: with nothing changed and
        # nothing asked, its next round would otherwise never come.
        self.timed = bool(getattr(chosen, "round_s", 0))
        # Slurm as it is (`Policy.plain`, static): each job submitted at its narrowed default shape, started by
        # Slurm the moment it fits; the planner sees no family.
        self.plain = chosen.narrow if getattr(chosen, "plain", False) else None
        self.model = model
        self.rigid = rigid
        # A cluster of GPU types (`sim.cluster`) runs on a truth per type (`types`); `truth` is then the reference
        # type's, for what every type shares (statistical efficiency, co-location).
        # A history's nodes (`nodes`, the what-if's) stand for the whole cluster; typed, they are one group per type
        # for the families (`gpu_types.by_type`).
        if nodes and sim.cluster:
            raise ConfigError("sim.cluster", ["the nodes of a history's cluster stand for the whole cluster; "
                                              "allowed: them or sim.cluster, not both"])
        self.groups = (gpu_types.parse_cluster(sim.cluster, "sim.cluster") if sim.cluster else
                       gpu_types.by_type(nodes) if any(g.gpu_type for g in nodes) else ())
        self.types = truth if isinstance(truth, TypedTruth) else None
        if bool(self.groups) != (self.types is not None):
            raise ConfigError("sim.cluster", ["a cluster of GPU types runs on a ground truth per type and a one-type "
                                              "cluster on one; allowed: sim.cluster with a TypedTruth, or neither"])
        self.truth = self.types.reference if self.types is not None else truth or GroundTruth()
        self.seed = seed
        self.on_progress = on_progress
        self.observe = self._observe
        """Each epoch's observer (`helper.epoch.run_once`'s); a subclass may put another in its place."""
        # Sia's simulator counts GPUs only: under its calibration (`sia_model`) no node runs out of CPUs or memory.
        gpus_only = self.types is not None and self.types.sia_model
        self.cluster = SimCluster(sim.gpus, sim.gpus_per_node, sim.gpu_memory_mib,
                                  HOST_UNLIMITED[0] if gpus_only else sim.cpus_per_gpu,
                                  **({"mem_per_gpu_mib": HOST_UNLIMITED[1]} if gpus_only else {}),
                                  shares_per_gpu=settings.gpu.shares_per_gpu, even_gangs=sim.even_gangs,
                                  slurm_version=sim.slurm_version, groups=tuple(nodes) or self.groups)
        self.cluster.before_stop = self._accrue
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.families: dict[int, Family] = {}
        self.family_source = _Families(self.families)
        self.journal = MemoryJournal()
        self.outcomes: Counter[str] = Counter()
        self.results: list[JobResult] = []
        self.solo: dict[int, tuple[float, float, tuple[str, int]]] = {}
        self.until: dict[int, float] = {}
        """Work done at which a running job's rate next changes without a change of its GPUs (an epoch of
        statistical efficiency ends), when that comes before its end."""
        self.belief = belief.Belief(self.truth, sim, seed)
        """The planner's view of the families: estimates, refined only by what each job measured (`sim.belief`)."""
        self.useful: dict[int, float] = {}
        """Each running job's GPUs' worth of solo speed at its current rate (`useful_per_gpu_s`)."""
        self.useful_area = 0.0  # ∫ Σ useful dt, accrued per job with its progress (`_accrue`)
        self.events = 0
        self.dirty = True
        self.acted = True

    # -------------------------------------------------------------- events

    def _push(self, t: float, kind: int, job_id: int = 0, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, job_id, version))

    def run(self) -> RunResult:
        started, cpu = time.perf_counter(), time.thread_time()
        plan_s = 0.0
        if not self.trace:
            return RunResult(self.policy, self.seed, self.sim.gpus, [], [], 0.0, 0.0, 0, 0, 0, 0.0, 0.0)
        for j in self.trace:
            self._push(j.submit_s, ARRIVAL, j.job_id)
        by_id = {j.job_id: j for j in self.trace}
        t0, t_last_arrival = self.trace[0].submit_s, self.trace[-1].submit_s
        self._push(t0, EPOCH)
        now = self.cluster.now = t0  # the clock starts at the first arrival, for the cluster too
        area = area_arr = busy_area = 0.0
        timeline: list[tuple[float, float]] = []
        epochs = planned = 0
        total = len(self.trace)
        shares_total = self.cluster.n_gpus * self.cluster.shares_per_gpu
        next_report = 0
        stalled = arrived = 0
        while self.heap:
            t, kind, _, jid, version = heapq.heappop(self.heap)
            if t > now:
                frac = self.cluster.alloc_shares / shares_total
                area += frac * (t - now)
                busy_area += self.cluster.busy_gpus * (t - now)
                lo, hi = max(now, t0), min(t, t_last_arrival)
                if hi > lo:
                    area_arr += frac * (hi - lo)
                now = t
                self.cluster.now = t
            if kind == COMPLETE:
                job = self.cluster.jobs.get(jid)
                if job is None or job.version != version or job.state is not JobState.RUNNING:
                    continue
                self._reached(job)
            elif kind == ARRIVAL:
                self._arrive(by_id[jid])
                arrived += 1
            elif kind == BEGIN:
                self.dirty = True
            else:
                epochs += 1
                timeline.append((now, self.cluster.alloc_shares / shares_total))
                if len(self.results) < total and stalled < STALL_EPOCHS:
                    self._push(now + self.sim.epoch_s, EPOCH)
                running = any(j.rate > 0 or j.ready_at > now for j in self.cluster.jobs.values()
                              if j.state is JobState.RUNNING)
                stalled = 0 if (running or self.dirty or arrived < total) else stalled + 1
                if self.plain is not None:  # Slurm alone: nothing to plan (it starts jobs as they fit)
                    self.dirty = self.acted = False
                elif self.cluster.jobs and (self.dirty or self.acted or self.timed):
                    self._settle()
                    tp = time.perf_counter()
                    self._epoch(now)
                    plan_s += time.perf_counter() - tp
                    planned += 1
                    self.dirty = False
            self.events += 1
            if not self.heap or self.heap[0][0] > now:
                self._settle()
                if self.sim.audit:
                    self.cluster.check()
            if self.on_progress is not None and len(self.results) >= next_report:
                self.on_progress(len(self.results) / total)
                next_report = len(self.results) + max(1, total // 200)
            if len(self.results) == total:
                break
        end = max((r.end for r in self.results), default=t0)
        span = max(end - t0, 1e-9)
        unfinished = total - len(self.results)
        return RunResult(
            policy=self.policy, seed=self.seed, gpus=self.cluster.n_gpus,
            jobs=sorted(self.results, key=lambda r: r.job_id), timeline=timeline,
            util_makespan=area / span, util_arrivals=area_arr / max(t_last_arrival - t0, 1e-9) if t_last_arrival > t0
            else area / span, events=self.events, epochs=epochs, epochs_planned=planned,
            wall_s=time.perf_counter() - started, plan_s=plan_s,
            counters={"starts": self.cluster.counters.starts, "requeues": self.cluster.counters.requeues,
                      "relaunches": self.cluster.counters.relaunches,
                      "switches": self.cluster.counters.switches,
                      "refused_actions": self.outcomes["failed"],
                      "skipped_actions": self.outcomes["skipped"],
                      "recovered_actions": self.journal.settled["recovered"],
                      "memory_overcommits": self.cluster.counters.memory_overcommits,
                      "actions": dict(sorted(self.cluster.counters.actions.items()))},
            unfinished=unfinished, cpu_s=time.thread_time() - cpu,
            useful_per_gpu_s=self.useful_area / busy_area if busy_area > 0 else math.nan)

    # -------------------------------------------------------------- handlers

    def _arrive(self, tj: TraceJob) -> None:
        if tj.job_id in self.rigid:
            fam = None
        elif self.types is not None:
            fam = typed_family_of(tj, self.types, self.groups, self.sim.share_levels(), self.sim.profile_noise,
                                  self.seed, self.adaptive, self.sim.max_gpus_per_job, self.whole_gpu_gangs,
                                  self.sim.type_blind)
        else:
            fam = family_of(tj, self.truth, self.sim.share_levels(), self.sim.gpu_memory_mib, self.sim.profile_noise,
                            self.seed, self.adaptive, self.sim.max_gpus_per_job, self.sim.gpus_per_node,
                            self.whole_gpu_gangs, belief.errors(self.sim))
        if fam is None:  # rigid: `--gpus=N`, on as many nodes as it takes, or a history's MPS job on its share
            if tj.gpus <= 1 and tj.share < 100:
                gres = GresRequest("mps", shares_of(tj.share, self.cluster.shares_per_gpu), tj.gpu_type)
            else:
                gres = GresRequest("gpus", tj.gpus, tj.gpu_type)
            cpus, mem = TRAIN_CPUS * max(1, tj.gpus), TRAIN_HOST_MIB * max(1, tj.gpus)
            begin = tj.submit_s
        else:
            if self.plain is not None:
                fam = self.plain(fam)
            d = fam.default_shape.resources
            gres = GresRequest("gpus", d.gpus, tj.gpu_type) if d.gpus else GresRequest(
                "mps", shares_of(d.mps, self.cluster.shares_per_gpu), tj.gpu_type)
            cpus, mem = d.cpus, d.host_mem_mib
            window = 0.0 if self.plain is not None else self.sim.placement_window_s
            begin = math.inf if window < 0 else tj.submit_s + window
            if self.plain is None:
                self.families[tj.job_id] = fam
            if math.isfinite(begin) and begin > tj.submit_s:
                self._push(begin, BEGIN)
        if tj.kind == "infer" and fam is None:
            cpus, mem = INFER_CPUS, INFER_HOST_MIB
        job = SimJob(trace=tj, family=fam, gres=gres, cpus=cpus, mem_mib=mem, begin=begin)
        job.mark = tj.submit_s
        self.cluster.submit(job)
        self.dirty = True

    def _reached(self, job: SimJob) -> None:
        """A running job's rate ran out: an epoch of statistical efficiency ended (same GPUs, a new rate from
        here), or its work is done."""
        if job.job_id in self.until:
            self._accrue(job)
            job.done = max(job.done, self.until.pop(job.job_id))
            self._rerate(job)
        else:
            self._complete(job)

    def _complete(self, job: SimJob) -> None:
        self._accrue(job)
        job.done = job.trace.work  # the float residue of accrual is rounding, not work
        self.cluster.finish(job)
        self.useful.pop(job.job_id, None)
        self.families.pop(job.job_id, None)
        self.solo.pop(job.job_id, None)
        self.belief.forget(job.job_id)
        tj = job.trace
        # The lower bound is the trace's under the settings, the same whatever the policy: with goodput shapes
        # only when the settings offer them to every policy (a policy that adapts batches may beat it).
        if self.types is not None:
            best = tj.work / typed_fastest_speed(tj, self.types, self.groups, self.sim.adaptive_batch,
                                                 self.sim.max_gpus_per_job)
        else:
            best = tj.work / fastest_speed(tj, self.truth, self.sim.gpu_memory_mib, self.sim.adaptive_batch,
                                           min(self.sim.max_gpus_per_job, self.sim.gpus), self.sim.gpus_per_node)
        self.results.append(JobResult(
            tj.job_id, tj.kind, tj.app, tj.gpus, tj.submit_s, job.first_start, job.end, job.restarts + job.relaunches,
            tj.work,
            job.done, best, tj.work * tj.global_batch if tj.kind == "train" else 0.0,
            tj.work if tj.kind == "infer" else 0.0))
        self.dirty = True

    def _epoch(self, now: float) -> None:
        result = run_once(self.cluster, self.settings, self.family_source, self.model, self.journal, now,
                          observer=self.observe)
        self.outcomes.update(o.status for o in result.outcomes)
        self.acted = bool(result.plan.actions)
        self._settle()

    def _observe(self, snap, families: dict[int, Family], dry_run: bool, source) -> tuple[dict[int, float], dict, list]:
        """The epoch's observer: the exact work done of every family job that has run (a requeued one's is what
        its last checkpoint holds, as the live observer reads it from the job's progress file), and the families
        as the planner may know them (`sim.belief`): what each running job measured alone is noted first."""
        now = self.cluster.now
        progress = {j.job_id: self._done_at(j, now) if j.state is JobState.RUNNING else j.done
                    for j in self.cluster.jobs.values()
                    if j.family is not None and (j.state is JobState.RUNNING or j.done > 0)}
        for jid in families if self.types is None else ():  # typed families: as profiled per type (`sim.belief`)
            job = self.cluster.jobs[jid]
            if job.state is JobState.RUNNING and job.alloc:
                ni, gi = job.alloc[0]
                self.belief.record(job, shape_of(job).name, job.whole or len(self.cluster.nodes[ni].gpus[gi]) == 1,
                                   now)
        families = {jid: self.belief.view(self.cluster.jobs[jid], fam, progress.get(jid), self.adaptive)
                    for jid, fam in families.items()}
        return progress, families, []

    def _settle(self) -> None:
        """Let Slurm start what fits, then re-rate every job whose GPU changed."""
        now = self.cluster.now
        for job in self.cluster.relaunched:
            job.ready_at = now + self._restart_s(job, RELAUNCH)
        self.cluster.relaunched = []
        for job in self.cluster.schedule():
            job.ready_at = now + self._restart_s(job, FIRST if job.starts <= 1 else REQUEUE)
            job.mark = now
            job.rate = 0.0
            self._solo(job)
            self.dirty = True
        changed, self.cluster.changed = self.cluster.changed, set()
        if not changed:
            return
        self.dirty = True
        touched: dict[int, SimJob] = {}
        for ni, gi in sorted(changed):
            for jid in self.cluster.nodes[ni].gpus[gi]:
                touched[jid] = self.cluster.jobs[jid]
        for jid in sorted(touched):
            touched[jid].context_since = now
            self._rerate(touched[jid])

    def _restart_s(self, job: SimJob, kind: str) -> float:
        """Seconds a start of `kind` (FIRST, REQUEUE, RELAUNCH) makes no progress: the app's under Sia's model (every
        start), else the settings' true costs (`SimSettings`): the first start's, with the wrapper's start-up for a
        job that comes through elastico-submit; a later one's checkpoint-and-restore plus its kind's overhead."""
        per_app = self.types.restart_s(job.trace.app) if self.types is not None else None
        if per_app is not None:
            return per_app
        s = self.sim
        if kind == FIRST:
            return s.start_cost_s + (s.wrapper_start_s if self.wrapped and job.family is not None else 0.0)
        return s.restart_cost_s + (s.requeue_overhead_s if kind == REQUEUE else s.relaunch_overhead_s)

    # -------------------------------------------------------------- progress

    def _done_at(self, job: SimJob, t: float) -> float:
        return min(job.trace.work, job.done + job.rate * max(0.0, t - max(job.mark, job.ready_at)))

    def _accrue(self, job: SimJob) -> None:
        now = self.cluster.now
        self.useful_area += self.useful.get(job.job_id, 0.0) * max(0.0, now - max(job.mark, job.ready_at))
        job.done = self._done_at(job, now)
        job.mark = now
        job.version += 1

    def _rerate(self, job: SimJob) -> None:
        self._accrue(job)
        share_speed, whole_speed, me = self._solo(job)
        if job.whole or job.family is None:  # alone on its GPUs: Slurm gives a gang only idle ones, and nobody joins
            # a whole GPU; a rigid job on a share is a history's, whose run time has its neighbours in it already
            others = []
        else:
            ni, gi = job.alloc[0]
            others = [self._solo(self.cluster.jobs[o])[2] for o in self.cluster.nodes[ni].gpus[gi] if o != job.job_id]
        rate = self.truth.colocated(share_speed, whole_speed, me, others, self.sim.colocation)
        job.rate = rate
        self.useful[job.job_id] = (0.0 if rate <= 0 or whole_speed <= 0 else
                                   len(job.alloc) if job.whole else rate / whole_speed)
        end = job.trace.work
        self.until.pop(job.job_id, None)
        if self._stat_epoch(job) >= 0:
            _, until = efficiency_segment(self.truth, job.trace, int(shape_of(job).knob("global_batch")), job.done)
            if until < end:
                self.until[job.job_id] = end = until
        if rate <= 0:
            return  # stalled (a shape that cannot run here); it completes only if its neighbours change
        left = max(0.0, end - job.done)
        self._push(max(self.cluster.now, job.ready_at) + left / rate, COMPLETE, job.job_id, job.version)


class _Families:
    """The epoch's family source: the families of the queue's jobs, in arrival order."""

    def __init__(self, families: dict[int, Family]):
        self.known = families

    def families(self, job_ids: set[int]) -> tuple[dict[int, Family], list[str]]:
        return {j: f for j, f in self.known.items() if j in job_ids}, []


def run(trace: Sequence[TraceJob], policy: str, settings: Settings, sim: SimSettings, model: SlowdownModel | None,
        truth: GroundTruth | TypedTruth | None = None, seed: int = 0,
        on_progress: Callable[[float], None] | None = None, rigid: frozenset[int] = frozenset(),
        nodes: Sequence[gpu_types.NodeGroup] = ()) -> RunResult:
    """Simulate `trace` under `policy`; see `Engine`."""
    return Engine(trace, policy, settings, sim, model, truth, seed, on_progress, rigid, nodes).run()
