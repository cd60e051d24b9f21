"""What the jobs' progress reports tell the helper: work done, solo speeds, and observed co-location slowdowns.

Pure logic; `helper.observer.ProgressObserver` does the I/O (report files, the store).
Each epoch the helper reads every running family job's report
(`runtime.progress`) and compares it with the previous epoch's reading:

* the work done feeds the planner (remaining work, instead of a guess from
  the start time);
* a job's progress over the interval, Δdone in Δt of the reports' own times,
  counts only if nothing changed in between: the same restart, the same shape
  and the same partners on its GPU (its *context*), and the earlier report was
  written at least `WARMUP_S` after everyone in that context had started;
* with no partner it adds to the job's solo speed at that shape (total work /
  total seconds), and a GPU counters report (`runtime.counters`) taken wholly
  in that time becomes the shape's measured counters (`Shape.measured`, which
  the planner's and the observations' solo profiles then use); with exactly
  one partner on its one GPU, it adds to the job's co-located speed next to
  that partner at their two shapes. At a shape of another global batch (goodput
  mode) the progress is counted in that shape's figure units
  (`shapes.goodput.to_figure`), so the planner prices it at the job's noise
  scale once, as it does the figure.

A pair becomes a co-location observation once both directions have run
`MIN_PAIR_S` together and both jobs' solo speeds at those shapes are known,
in whichever order that happens (a job that starts beside a partner gets its
solo speed when the partner leaves): each job's normalized throughput is its
co-located speed ÷ its solo speed. That is the measurement format the
predictor learns from (`interference.measurements`), with the solo profiles
the planner itself asks the model about (`shapes.solo_profile`). The pair's
accumulated time is then spent, so a long co-location gives one observation
per `MIN_PAIR_S` or more.

A job that joined its partner straight from the queue has no solo speed at
that shape yet. Its pair is still judged (`interference.probe`), against the
family's figure for the shape (`estimated_solo`), on the time since an earlier
judgement of that kind (`unjudged`); it becomes an observation only once the
solo speed is measured, over its whole accumulated time (see
`helper.observer`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.model import Counters, Family, JobState, JobView, Shape, Snapshot
from slurm_elastico.runtime.progress import Progress
from slurm_elastico.shapes.current import running_shape
from slurm_elastico.shapes.goodput import to_figure
from slurm_elastico.shapes.solo import solo_profile

SOURCE = "observed"
MIN_INTERVAL_S = 5.0
"""A rate needs reports at least this far apart: shorter intervals are mostly noise of step boundaries."""
WARMUP_S = 5.0
"""A rate counts from a report at least this long after everyone in the context (re)started and after the job's
own run began reporting: start-up (imports, compilation, first steps) is not speed."""
MAX_INTERVAL_S = 1800.0
"""Longer gaps between readings (a helper that was down) give no sample: jobs may have come and gone unseen."""
MIN_PAIR_S = 10.0
"""Seconds each job of a pair must have run beside the other before the pair is an observation."""
MAX_NORM = 1.25
"""Co-located ÷ solo above this is not a speed-up but a wrong solo rate (taken while the machine was busier): dropped."""


@dataclass(frozen=True)
class Reading:
    """A job's last report as the helper saw it, with the context it ran in."""

    done: float
    updated: float
    restarts: int
    context: str  # json of [self, run start, [partners]], each job as [id, shape, start, restarts]; equal = unchanged
    since: float  # when the context began: everyone in it had started (Unix seconds)


PairKey = tuple[int, str, int, str]
"""(job, its shape, partner, partner's shape): one direction of a co-located pair."""
CounterReport = tuple[Counters, float, float]
"""(counters, since, updated): what `runtime.counters.read_counters` returns."""


@dataclass
class Observation:
    """The result of one epoch's look at the reports."""

    progress: dict[int, float] = field(default_factory=dict)  # job id -> work done (for the planner)
    readings: dict[int, Reading] = field(default_factory=dict)  # to keep for the next epoch
    solo: list[tuple[int, str, float, float]] = field(default_factory=list)  # (job, shape, work, seconds)
    beside: list[tuple[PairKey, float, float]] = field(default_factory=list)  # (key, work, seconds), one partner
    solo_counters: list[tuple[int, str, Counters]] = field(default_factory=list)  # (job, shape, counters) alone


def _shape_of(job: JobView, family: Family, report: Progress) -> Shape:
    """The shape the job says it ran (its report), else the one elastico-run's rule gives."""
    named = next((s for s in family.shapes if report.shape and s.name == report.shape), None)
    if named is not None:
        return named
    held = max((s for _, _, s in job.gpu_alloc), default=0)
    return running_shape(family.shapes, family.default_shape, job.admin_comment, held)[0]


def _who(job: JobView, shapes: Mapping[int, Shape]) -> list:
    """A job as part of a context: a restart or another shape makes it another context."""
    return [job.job_id, shapes[job.job_id].name if job.job_id in shapes else "?", job.start_time or 0, job.restarts]


def observe(snapshot: Snapshot, families: Mapping[int, Family], reports: Mapping[int, Progress],
            previous: Mapping[int, Reading], counters: Mapping[int, CounterReport] | None = None) -> Observation:
    """One epoch's work done, readings, and solo and co-located progress samples (see the module text).

    `counters` are the jobs' GPU counter reports (`runtime.counters`): one taken wholly while a job ran
    alone, after its warm-up, and newer than the previous reading, is that job's solo counters at its shape.
    Jobs on a node where a GPU job's GPUs are unknown give no samples (who shares with whom is unknown).
    """
    counters = counters or {}
    out = Observation()
    views = {j.job_id: j for j in snapshot.jobs}
    running = {j.job_id: j for j in snapshot.jobs
               if j.state is JobState.RUNNING and j.job_id in families and j.job_id in reports}
    shapes = {jid: _shape_of(j, families[jid], reports[jid]) for jid, j in running.items()}
    on_gpu: dict[tuple[str, int], list[int]] = {}
    blind: set[str] = set()  # nodes with a GPU job whose GPUs squeue did not say
    for j in snapshot.jobs:
        if j.state is JobState.RUNNING:
            for node, index, _ in j.gpu_alloc:
                on_gpu.setdefault((node, index), []).append(j.job_id)
            if j.gres is not None and not j.gpu_alloc:
                blind.update(j.nodes)
    for jid, reading in previous.items():  # a job requeued for a reshape keeps its work done while it waits
        if jid in views and jid not in running:
            out.progress[jid] = reading.done
    for jid, job in running.items():
        report = reports[jid]
        out.progress[jid] = report.done
        gpus = {(n, i) for n, i, _ in job.gpu_alloc}
        partners = sorted({p for g in gpus for p in on_gpu.get(g, []) if p != jid})
        # An in-place relaunch (a new `started`) is a new context too: the interval would span the restart.
        context = json.dumps([_who(job, shapes), report.started, [_who(views[p], shapes) for p in partners]])
        before = previous.get(jid)
        same = before is not None and (before.restarts, before.context) == (report.restarts, context)
        if same and MIN_INTERVAL_S > report.updated - before.updated >= 0:
            out.readings[jid] = before  # too soon to tell: measure from the earlier reading next epoch
            continue
        # When the context began: a start is known exactly; a departure only as "since the last epoch".
        since = before.since if same else max(
            [float(views[p].start_time or 0) for p in [jid, *partners]] + ([snapshot.taken_at] if before else []))
        reading = Reading(report.done, report.updated, report.restarts, context, since)
        out.readings[jid] = reading
        if not same or not gpus or blind.intersection(job.nodes):
            continue
        dt = reading.updated - before.updated
        warm_from = max(since, report.started) + WARMUP_S
        if not MIN_INTERVAL_S <= dt <= MAX_INTERVAL_S or before.updated < warm_from or reading.done <= before.done:
            continue
        work = (reading.done - before.done) * to_figure(shapes[jid], report.grad_noise_scale)  # goodput mode
        if not partners:
            out.solo.append((jid, shapes[jid].name, work, dt))
            measured = counters.get(jid)
            if measured is not None and measured[1] >= warm_from and measured[2] > before.updated:
                out.solo_counters.append((jid, shapes[jid].name, measured[0]))
        elif len(gpus) == 1 and len(partners) == 1 and partners[0] in shapes:
            out.beside.append(((jid, shapes[jid].name, partners[0], shapes[partners[0]].name), work, dt))
    return out


def pair_observations(beside: Mapping[PairKey, tuple[float, float]], solo_rates: Mapping[tuple[int, str], float],
                      families: Mapping[int, Family], gpu_type: str,
                      since: Mapping[PairKey, tuple[float, float]] | None = None
                      ) -> tuple[list[Colocation], list[PairKey], list[str], list[float]]:
    """(observations, keys spent, notes, the seconds each observation's pair shared a GPU since it was last
    judged) from accumulated co-located (work, seconds) per direction (see the module).

    `since`: each direction's (work, seconds) since an earlier epoch judged it against a family's figure
    (`unjudged`; None: never judged so); the observation is of the whole accumulation, its seconds are those."""
    found: list[Colocation] = []
    seconds: list[float] = []
    spent: list[PairKey] = []
    notes: list[str] = []
    for key in sorted(beside):
        a, sa, b, sb = key
        back = (b, sb, a, sa)
        if a > b or back not in beside or a not in families or b not in families:
            continue
        (wa, ta), (wb, tb) = beside[key], beside[back]
        if min(ta, tb) < MIN_PAIR_S or (a, sa) not in solo_rates or (b, sb) not in solo_rates:
            continue
        if not gpu_type:
            notes.append(f"jobs {a} and {b} ran side by side, but gpu.type is not set: observations need the GPU "
                         "type, none is recorded")
            continue
        spent += [key, back]
        fa, fb = families[a], families[b]
        if sa not in {x.name for x in fa.shapes} or sb not in {x.name for x in fb.shapes}:
            continue  # the family changed since: the samples describe shapes it no longer has
        norm_a, norm_b = wa / ta / solo_rates[(a, sa)], wb / tb / solo_rates[(b, sb)]
        if not (0 < norm_a <= MAX_NORM and 0 < norm_b <= MAX_NORM):
            notes.append(f"jobs {a} and {b}: co-located / solo = {norm_a:.2f} / {norm_b:.2f} is outside "
                         f"(0, {MAX_NORM:g}]: a solo speed is off, not recorded")
            continue
        found.append(Colocation(gpu_type, solo_profile(fa.shape(sa), fa.kind, fa.name),
                                solo_profile(fb.shape(sb), fb.kind, fb.name), norm_a, norm_b, True, SOURCE))
        fresh = since or beside
        seconds.append(min(fresh[key][1], fresh[back][1]))
        notes.append(f"observed: jobs {a} and {b} on one GPU run at {norm_a:.2f} and {norm_b:.2f} of solo speed")
    return found, spent, notes, seconds


def with_measured(families: Mapping[int, Family], measured: Mapping[tuple[int, str], Counters]) -> dict[int, Family]:
    """The families with each shape a job was measured alone at carrying its counters (`Shape.measured`)."""
    out = dict(families)
    for job_id, fam in families.items():
        mine = {shape: c for (j, shape), c in measured.items() if j == job_id}
        if mine:
            out[job_id] = replace(fam, shapes=tuple(replace(s, measured=mine[s.name]) if s.name in mine else s
                                                    for s in fam.shapes))
    return out


def merge_solo(work_s: Mapping[tuple[int, str], tuple[float, float]]) -> dict[tuple[int, str], float]:
    """Solo rates from accumulated (work, seconds) per (job, shape)."""
    return {k: w / s for k, (w, s) in work_s.items() if s > 0 and w > 0 and math.isfinite(w / s)}


def estimated_solo(beside: Iterable[PairKey], solo_rates: Mapping[tuple[int, str], float],
                   families: Mapping[int, Family]) -> dict[tuple[int, str], float]:
    """The solo speed to judge a co-located (job, shape) of `beside` against where `solo_rates` has none: its family's
    figure for the shape (declared or estimated, rescaled to the GPU type of a typed shape, moved by what the job
    measured at its other shapes: what the planner believed when it paired it), where positive and finite."""
    out: dict[tuple[int, str], float] = {}
    for job, name, _, _ in beside:
        fam = families.get(job)
        shape = next((s for s in fam.shapes if s.name == name), None) if fam is not None else None
        if (job, name) not in solo_rates and shape is not None and 0 < shape.throughput < math.inf:
            out[(job, name)] = shape.throughput
    return out


def unjudged(beside: Mapping[PairKey, tuple[float, float]], judged: Mapping[PairKey, tuple[float, float]]
             ) -> dict[PairKey, tuple[float, float]]:
    """Each direction's (work, seconds) since an earlier judgement against an estimate (`judged`: what it had then)."""
    out = {}
    for key, (work, seconds) in beside.items():
        w, t = judged.get(key, (0.0, 0.0))
        out[key] = (max(0.0, work - w), max(0.0, seconds - t))
    return out
