"""What-if on the cluster's own history (pure): the same past jobs under plain Slurm and under elastico.

The simulator needs to know what each past job is to run it under elastico;
accounting says only what it asked and how long it ran. So each job gets a
guess (`Guess`), by the assumption asked for (`ASSUMPTIONS`):

- `none`: every plain job is rigid, as Slurm runs it today (no family: no
  policy reshapes it); only jobs that came through `elastico-submit` are
  elastic;
- `gpu-count`: every plain job is a data-parallel training job that may run
  on fewer or more whole GPUs at its submitted global batch, its speed-up
  from the bundled measured profiles (`sim.truth.GroundTruth`);
- `families`: a file maps job names (or family names; shell patterns) to
  what the jobs are (`read_families`); a job no pattern matches is rigid.

A job that came through `elastico-submit` carries its family's kind in the
trace: a training family is taken as data-parallel (as `gpu-count`), an
inference one as the simulator's offline-inference job. Which measured app
a job is, nobody knows: each `gpu-count` guess is run once per bundled app
measured on several GPUs (`variants`), and every figure is given as the
median over those runs with their range: the interval over what had to be
assumed.

Each job's work is set so that, alone at its submitted shape, it takes the
time it really held its GPUs (`calibrate`); a job not finished in the window
has no such time and is left out, counted (`SKIP_UNFINISHED`). On a cluster
of several GPU types each type runs at its own speed and each job is
calibrated on the type it ran on (`Typed`, `history.whatif_types`). Both policies
run through the simulator's engine (`sim.engine`), `static` as plain Slurm
and `elastico` with the helper's settings; their ratio of mean JCT is the
predicted gain, applied to what was measured.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError
from slurm_elastico.history import whatif_types
from slurm_elastico.history.past import PastJob
from slurm_elastico.history.replay import fits
from slurm_elastico.history.shape import ClusterShape
from slurm_elastico.sim import settings as sim_settings
from slurm_elastico.sim.families import family_of
from slurm_elastico.sim.gpu_types import NodeGroup
from slurm_elastico.sim.results import RunResult
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth
from slurm_elastico.sim.truth_types import TypedTruth

ASSUMPTIONS = ("none", "gpu-count", "families")
DEFAULT_ASSUMPTION = "gpu-count"
SKIP_UNFINISHED = "not finished in the window"
SKIP_TOO_BIG = "asks more GPUs than its partitions have"
INFER_CONTEXT, INFER_GENERATED = 1024.0, 512.0
"""Mean tokens per request of an inference job the simulator stands in for one of the history's."""
H = 3600.0


@dataclass(frozen=True)
class Guess:
    """What one past job is taken to be: rigid (Slurm's, as submitted), a training job of a measured `app` at
    `global_batch` (0: the app's largest measured per-GPU batch times the GPUs asked), or inference."""

    kind: str  # rigid | train | infer
    app: str = ""
    global_batch: int = 0


RIGID = Guess("rigid")


def read_families(data: object, source: str = "families file") -> dict[str, Guess]:
    """{pattern: Guess} from the file's mapping `PATTERN: {kind: train, app: APP, global_batch: B}`, `{kind: infer}`
    or `{kind: rigid}`; one `ConfigError` naming every bad entry and what is allowed."""
    apps = GroundTruth().apps
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(source, ["must map job-name patterns to {kind: train|infer|rigid, app: APP, "
                                   "global_batch: N}"])
    out, problems = {}, []
    for pattern, spec in data.items():
        where = f"{pattern!r}"
        if not isinstance(spec, Mapping):
            problems.append(f"{where}: must be a mapping with kind (train, infer or rigid)")
            continue
        unknown = sorted(set(spec) - {"kind", "app", "global_batch"})
        if unknown:
            problems.append(f"{where}: unknown key(s) {', '.join(map(str, unknown))}; allowed: kind, app, "
                            "global_batch")
        kind = spec.get("kind")
        if kind not in ("train", "infer", "rigid"):
            problems.append(f"{where}: kind {kind!r}; allowed: train, infer, rigid")
            continue
        app, batch = spec.get("app", ""), spec.get("global_batch", 0)
        if kind == "train" and app not in apps:
            problems.append(f"{where}: app {app!r} has no measured profile; allowed: {', '.join(apps)}")
            continue
        if not isinstance(batch, int) or batch < 0:
            problems.append(f"{where}: global_batch {batch!r} must be an integer >= 0 (0: the app's largest "
                            "measured per-GPU batch times the GPUs asked)")
            continue
        out[str(pattern)] = Guess(kind, str(app) if kind == "train" else "", batch if kind == "train" else 0)
    if problems:
        raise ConfigError(source, problems)
    return out


def elastic_apps(truth: GroundTruth) -> tuple[str, ...]:
    """The bundled apps a data-parallel guess may be: those measured on several GPUs."""
    return tuple(a for a in truth.apps if truth.measured_on_several_gpus(a))


def variants(jobs: Sequence[PastJob], assume: str, truth: GroundTruth,
             families: Mapping[str, Guess] | None = None) -> list[tuple[str, list[Guess]]]:
    """(label, a guess per job) for each run the assumption needs: one per measured app when some job is guessed
    data-parallel without an app, else one."""
    if assume not in ASSUMPTIONS:
        raise ConfigError("--assume", [f"{assume!r}; allowed: {', '.join(ASSUMPTIONS)}"])
    if assume == "families" and not families:
        raise ConfigError("--assume", ["families needs the file that says what the jobs are"])

    def guess(job: PastJob, app: str) -> Guess:
        if assume == "families":
            for pattern, g in (families or {}).items():
                if fnmatch.fnmatchcase(job.name, pattern) or (job.family and fnmatch.fnmatchcase(job.family, pattern)):
                    return g
        if job.family:
            return Guess("infer") if job.kind == "infer" else Guess("train", app)
        return Guess("train", app) if assume == "gpu-count" else RIGID

    apps = elastic_apps(truth)
    open_app = [guess(j, "") for j in jobs]
    if not any(g.kind == "train" and not g.app for g in open_app):
        return [(assume, open_app)]
    return [(app, [g if not (g.kind == "train" and not g.app) else Guess("train", app) for g in open_app])
            for app in apps]


def sim_settings_for(shape: ClusterShape, settings: Settings, epoch_s: float, max_gpus: int,
                     placement_window_s: float) -> sim_settings.SimSettings:
    """The simulated cluster of the shape (as many GPUs, the most per node) and the helper's costs."""
    return sim_settings.from_mapping({
        "gpus": shape.gpus, "gpus_per_node": max(n.gpus for n in shape.nodes),
        "gpu_memory_mib": settings.gpu.memory_mib, "epoch_s": epoch_s, "placement_window_s": placement_window_s,
        "restart_cost_s": settings.planner.reshape_cost_s, "start_cost_s": 0.0, "profile_noise": 0.0,
        "max_gpus_per_job": max_gpus,
        **({"slurm_version": shape.slurm_version} if shape.slurm_version else {})}, "whatif")


def nodes_of(shape: ClusterShape, sim: sim_settings.SimSettings) -> list[NodeGroup]:
    """The simulated nodes of a cluster of one type: the shape's, each with its GPUs and partitions (of no GPU
    type: the what-if runs one truth), its GPUs of the helper's `gpu.memory_mib`."""
    return [NodeGroup("", 1, n.gpus, sim.gpu_memory_mib, n.partitions) for n in shape.nodes]


def calibrate(jobs: Sequence[PastJob], guesses: Sequence[Guess], shape: ClusterShape, sim: sim_settings.SimSettings,
              truth: GroundTruth, typed: Typed | None = None, notes: Counter | None = None,
              pin: bool = False) -> tuple[list[TraceJob], frozenset[int], Counter]:
    """The simulator's trace of the finished jobs (ids: position + 1, times from the first submission), the ids
    of the rigid ones, and the jobs left out by reason. Each job's work is its real time on its GPUs times its
    speed alone at its submitted shape, so plain Slurm in the simulator holds each GPU as long as it was held.
    On a cluster of several types (`typed`), that speed is the one of the type it ran on (`whatif_types.placed`),
    it keeps the type it asked for (and, with `pin`, plain Slurm's run, the one it ran on), a job no one type holds
    ran across types as submitted, and an inference job runs as submitted; `notes` counts what was assumed. With
    `pin`, a job that ran on an MPS share runs there as submitted (rigid)."""
    skipped: Counter = Counter()
    notes = Counter() if notes is None else notes
    rows, rigid = [], set()
    t0 = min((j.submit for j in jobs), default=0)
    reference = elastic_apps(truth)[0]
    for i, (job, g) in enumerate(zip(jobs, guesses), start=1):
        if job.run_s is None:
            skipped[SKIP_UNFINISHED] += 1
            continue
        if not fits(job, shape):  # the replay's rule: its GPUs of its type in one of its partitions
            skipped[SKIP_TOO_BIG] += 1
            continue
        gpus, partition = max(job.gpus, 1), shape.partition_of(job.partition)
        share = 100 if job.gpus else max(1, min(100, round(100 * job.mps / shape.shares_per_gpu)))
        run_s = max(float(job.run_s), 1.0)
        on, memory = truth, float(sim.gpu_memory_mib)
        asked = ""
        if typed is not None:
            ran, spans = whatif_types.placed(job, shape, typed.speedups, notes)
            on, memory = typed.truth[whatif_types.sim_name(ran)], float(typed.memory[ran])
            if spans:
                g = RIGID
            elif g.kind == "infer":
                notes[whatif_types.INFER_RIGID] += 1
                g = RIGID
            # Kept on its type: the one it asked for; the one it ran on in plain Slurm's run (`pin`) and in both for a
            # job neither policy reshapes (else where the nodes are listed first would decide).
            if job.gpu_type:
                asked = whatif_types.sim_name(job.gpu_type)
            elif (pin or g.kind != "train") and not spans:
                asked = whatif_types.sim_name(ran)
        if g.kind == "infer" and gpus == 1:
            tj = TraceJob(i, float(job.submit - t0), "infer", "llm", 1, 1.0, 0, share, INFER_CONTEXT, INFER_GENERATED,
                          partition)
        else:
            app = g.app or reference
            hi = truth.batch_range(app)[1]
            batch = g.global_batch or hi * gpus
            tj = TraceJob(i, float(job.submit - t0), "train", app, gpus, 1.0, batch, share, partition=partition,
                          gpu_type=asked)
            if g.kind != "train":
                rigid.add(i)
        if pin and share < 100:
            # Plain Slurm ran it on its MPS share: so does its run here (the `static` policy would give a family's
            # default shape a whole GPU, and jobs that shared one would queue for it).
            rigid.add(i)
        speed = _speed(tj, i in rigid, sim, on, memory)
        if not (speed > 0 and math.isfinite(speed)):
            rigid.add(i)
            tj = dataclasses.replace(tj, kind="train", app=reference, global_batch=truth.batch_range(reference)[1] * gpus)
            speed = _speed(tj, True, sim, on, memory)
        rows.append(dataclasses.replace(tj, work=run_s * speed))
    return rows, frozenset(rigid), skipped


def _speed(tj: TraceJob, rigid: bool, sim: sim_settings.SimSettings, truth: GroundTruth, memory_mib: float) -> float:
    """Steps (requests) per second of the job alone at the shape Slurm starts it at, on GPUs of `truth`."""
    fam = None if rigid else family_of(tj, truth, sim.share_levels(), memory_mib, 0.0, 0, False,
                                       sim.max_gpus_per_job, sim.gpus_per_node, sim.whole_gpu_gangs)
    if fam is None:
        return truth.rigid_speed(tj.app, tj.global_batch, tj.gpus, gpus_per_node=sim.gpus_per_node)
    return fam.default_shape.throughput


@dataclass(frozen=True)
class Typed:
    """A cluster of several GPU types, as the what-if runs it (`whatif_types`): each type's speed over the bundled
    profiles', their truths, each type's memory and the simulated nodes."""

    speedups: dict[str, float]
    truth: TypedTruth
    memory: dict[str, int]
    nodes: list[NodeGroup]

    @classmethod
    def of(cls, shape: ClusterShape, settings: Settings) -> Typed | None:
        """None for a cluster of one type; a type nothing describes raises `UnknownGpuType` (a ConfigError)."""
        types = whatif_types.gpu_types(shape)
        if not types:
            return None
        return cls(whatif_types.speedups(types, settings), whatif_types.typed_truth(types, settings),
                   {t: whatif_types.memory_mib(t, settings) for t in types}, whatif_types.node_groups(shape, settings))


def figures(jct: Sequence[float], wait: Sequence[float], idle_gpu_h: float) -> dict:
    """Mean / median / p99 JCT and wait (s) and GPU-hours idle."""
    a, w = np.asarray(jct, dtype=float), np.asarray(wait, dtype=float)
    if not len(a):
        return {k: None for k in ("mean_jct_s", "median_jct_s", "p99_jct_s", "mean_wait_s", "median_wait_s",
                                   "p99_wait_s")} | {"idle_gpu_h": idle_gpu_h, "jobs": 0}
    return {"mean_jct_s": float(a.mean()), "median_jct_s": float(np.median(a)), "p99_jct_s": float(np.percentile(a, 99)),
            "mean_wait_s": float(w.mean()), "median_wait_s": float(np.median(w)),
            "p99_wait_s": float(np.percentile(w, 99)), "idle_gpu_h": idle_gpu_h, "jobs": len(a)}


def measured(jobs: Sequence[PastJob], shape: ClusterShape) -> dict:
    """What the history itself shows, over its finished jobs: their JCT and wait, and the GPU-hours left idle from
    the first submission to the last end."""
    done = [j for j in jobs if j.run_s is not None and j.start is not None and j.end is not None]
    if not done:
        return figures([], [], 0.0)
    span = max(j.end for j in done) - min(j.submit for j in done)
    held = sum((j.gpus or j.mps / shape.shares_per_gpu) * j.run_s for j in done)
    return figures([j.end - j.submit for j in done], [j.wait_s for j in done], max(0.0, shape.gpus * span - held) / H)


def simulated(r: RunResult) -> dict:
    """The same figures of a simulated run (its jobs' JCT and wait; idle GPU-hours over its makespan)."""
    if not r.jobs:
        return figures([], [], 0.0)
    span = max(j.end for j in r.jobs) - min(j.submit for j in r.jobs)
    return figures([j.jct for j in r.jobs], [j.queued for j in r.jobs], r.gpus * span * (1 - r.util_makespan) / H)


@dataclass
class WhatIf:
    assume: str
    runs: dict[str, dict]  # variant label -> {"static": figures, "elastico": figures, "ratio": x, "jct": {policy: [s]}}
    skipped: Counter
    unfinished: dict[str, int]  # policy -> jobs a run left unfinished, summed over variants
    gpu_speedups: dict[str, float] = dataclasses.field(default_factory=dict)
    """Of a cluster of several types: each type's speed over the bundled profiles' ({} on one type)."""
    notes: Counter = dataclasses.field(default_factory=Counter)
    """What a cluster of several types made the what-if assume, counted in jobs (per run of the assumption)."""

    def summary(self) -> dict:
        """Per policy and figure: the median over the variants and their range [lo, hi]; the predicted ratio
        (static / elastico mean JCT) likewise."""
        out: dict = {}
        for policy in ("static", "elastico"):
            out[policy] = {}
            for key in next(iter(self.runs.values()))[policy]:
                vals = [v[policy][key] for v in self.runs.values() if v[policy][key] is not None]
                out[policy][key] = _interval(vals)
        out["ratio"] = _interval([v["ratio"] for v in self.runs.values() if v["ratio"] is not None])
        return out


def _interval(vals: Sequence[float]) -> dict:
    if not vals:
        return {"value": None, "lo": None, "hi": None}
    return {"value": float(np.median(vals)), "lo": float(min(vals)), "hi": float(max(vals))}


def what_if(jobs: Sequence[PastJob], shape: ClusterShape, settings: Settings, assume: str = DEFAULT_ASSUMPTION,
            families: Mapping[str, Guess] | None = None, epoch_s: float = 60.0, max_gpus: int = 8,
            model=None, truth: GroundTruth | None = None,
            on_variant: Callable[[str], None] | None = None) -> WhatIf:
    """Both policies on the history under the assumption, once per variant (see the module docstring)."""
    from slurm_elastico.sim import engine

    truth = truth or GroundTruth()
    typed = Typed.of(shape, settings)
    # The simulated cluster is the history's partition already: the helper's own partition (its `slurm.partition`,
    # another one perhaps) would leave every simulated job unmanaged.
    settings = dataclasses.replace(settings, slurm=dataclasses.replace(settings.slurm, partition=""))
    runs, unfinished = {}, Counter()
    skipped: Counter = Counter()
    notes: Counter = Counter()
    for label, guesses in variants(jobs, assume, truth, families):
        if on_variant is not None:
            on_variant(label)
        out: dict = {"jct": {}}
        for policy, window in (("static", 0.0), ("elastico", float(settings.submit.placement_window_s))):
            sim = sim_settings_for(shape, settings, epoch_s, max_gpus, window)
            notes = Counter()
            rows, rigid, skipped = calibrate(jobs, guesses, shape, sim, truth, typed, notes, pin=policy == "static")
            if not rows:
                raise ConfigError("what-if", ["no job finished in the window: nothing to replay; widen "
                                              "--since/--until"])
            if policy == "elastico" and len(rigid) == len(rows):
                # Every job rigid: elastico has no family to act on, so its run is plain Slurm's (not run twice).
                unfinished[policy] += unfinished_static
                out[policy], out["jct"][policy] = out["static"], out["jct"]["static"]
                continue
            result = engine.run(rows, policy, settings, sim, model, typed.truth if typed else truth, rigid=rigid,
                                nodes=typed.nodes if typed else nodes_of(shape, sim))
            unfinished[policy] += result.unfinished
            unfinished_static = result.unfinished
            out[policy] = simulated(result)
            out["jct"][policy] = [j.jct for j in result.jobs]
        s, e = out["static"]["mean_jct_s"], out["elastico"]["mean_jct_s"]
        out["ratio"] = s / e if s is not None and e else None
        runs[label] = out
    return WhatIf(assume, runs, skipped, dict(unfinished), typed.speedups if typed else {}, notes)
