"""A new cluster: the ground truth is one GPU type's measured pairs, the planner's model was trained on another.

What a site meets on day one. The simulator's co-location truth (`truth.GroundTruth`, rule `gavel`) is built from
the measured pairs of one GPU type (`truth_of`); the planner is given a model trained on other types only, and
learns the new type from what it observes. Four ways to run elastico on the same traces (`MODES`):

- `off`: sharing off (every pair refused: each job alone on its GPU or share);
- `unadapted`: the trained model's view of the new type, as it is;
- `adapted`: the same model adapting online (`interference.adapt_online.OnlineAdapted`) from every pair the
  observer measures;
- `probing`: `adapted` that also probes: while the pairs first measured (probes) have taken less than
  `PROBE_BUDGET` of the GPU-seconds so far, pairs never measured are predicted optimistically, by the error of an
  untrained model until a pair is measured, then by the model's own under-prediction of the measured pairs
  (`OnlineAdapted.probing`, `OnlineAdapted.optimism`, `planner.slowdown.UNCALIBRATED_GAIN_MARGIN`);
- `true`: the true model's predictions (the truth's own measured pairs: the bound adaptation aims at).

The planner sees its jobs as the simulator's families (Pollux apps, micro-batches); the measured pairs are of
Gavel's jobs. Each job stands for a Gavel job (`GroundTruth.identity`, as the truth maps it), so the model is
asked about the Gavel jobs' solo profiles on the new type (`Translated`): what `elastico iac measure` would have
recorded of them there alone.

The observer (`PairObserver`): each epoch, every two jobs that shared a GPU since the previous epoch at the same
shapes were measured side by side. Their measurement (the truth's measured normalized throughputs of their Gavel
jobs) goes to the adapting model, and the pairing is judged as the helper's probe judges it
(`interference.probe`): it is reverted (undone by the epoch, `helper.revert`, and refused) when the jobs' observed
speeds next to each other, each a fraction of its speed alone at that shape, sum to less than 1 + the model's
gain margin (at least `MIN_GAIN`). A first measurement of a pair of Gavel jobs is a probe; its cost is the work
the pair lost, next to running the two one after the other, while it ran: (1 − their sum)⁺ × the seconds.

Where sharing can pay at all: under MPS a job's speed at a share is capped by the share (`truth`), so two jobs
that each fill the GPU alone never gain by sharing it, whatever the model; on the bundled mixed traces even the
true model pairs nothing. `small_jobs` is a trace of the other kind: training jobs at their app's smallest
measured batch, of the apps that fill at most `SMALL_DEMAND` of the GPU there (`GroundTruth.demand`).

Deterministic; the report (`NewClusterRun`) says how many pairs were measured and reverted, what they cost, when
the model was first adapted and when a kept pairing first gained.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from slurm_elastico.helper.epoch import run_once
from slurm_elastico.interference.adapt_online import OnlineAdapted
from slurm_elastico.interference.base import MIN_GAIN, SoloProfile
from slurm_elastico.interference.gavel import import_gavel
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.interference.probe import Refusals, Verdict
from slurm_elastico.model import JobState
from slurm_elastico.planner.slowdown import UNCALIBRATED_GAIN_MARGIN
from slurm_elastico.shapes.solo import solo_profile
from slurm_elastico.sim.engine import Engine
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth, bundled

MODES = ("off", "unadapted", "adapted", "probing", "true")
SMALL_DEMAND = 0.6
"""`small_jobs`: the most of the GPU an app may fill alone at its smallest measured batch."""
PROBE_BUDGET = 0.05
"""Share of the cluster's GPU-seconds that probes may take (`probing` mode)."""


def gavel_pairs(pairs_csv: str | Path, isolated_csv: str | Path, gpu_type: str) -> list[Colocation]:
    """The measured pairs of one GPU type in Gavel's flattened CSV files (`interference.gavel.import_gavel`)."""
    got = [o for o in import_gavel(pairs_csv, isolated_csv).observations if o.gpu_type == gpu_type]
    if not got:
        raise ValueError(f"no pairs of GPU type {gpu_type!r} in {pairs_csv}")
    return got


def _identity(p: SoloProfile) -> tuple[str, int]:
    return p.model_family, int(p.batch) if p.batch == p.batch else 0


def truth_of(pairs: Sequence[Colocation]) -> GroundTruth:
    """The bundled ground truth with `pairs` (one GPU type's measured pairs) as its co-location data."""
    rows = [{"model1": _identity(o.a)[0], "bs1": str(_identity(o.a)[1]), "model2": _identity(o.b)[0],
             "bs2": str(_identity(o.b)[1]), "norm1": f"{o.norm_a!r}" if o.fits else "",
             "norm2": f"{o.norm_b!r}" if o.fits else ""} for o in pairs]
    return GroundTruth.from_rows(bundled("pollux_placements.csv.gz"), bundled("pollux_profiles.csv"),
                                 bundled("pollux_validation.csv.gz"), bundled("pollux_iterations.csv"), rows)


def small_jobs(truth: GroundTruth, n_jobs: int, gpus: int, load: float, seed: int = 0,
               min_s: float = 1800.0, max_s: float = 7200.0) -> list[TraceJob]:
    """`n_jobs` one-GPU training jobs at their app's smallest measured batch, of the apps that fill at most
    `SMALL_DEMAND` of the GPU there, drawn uniformly (seeded); each runs `min_s`..`max_s` alone on a whole GPU
    (uniform), and Poisson arrivals make the offered load `load` of `gpus` GPUs."""
    apps = [a for a in truth.apps if truth.demand(a, truth.batch_range(a)[0]) <= SMALL_DEMAND]
    if not apps:
        raise ValueError(f"no app fills at most {SMALL_DEMAND} of the GPU at its smallest batch")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(apps), n_jobs)
    seconds = rng.uniform(min_s, max_s, n_jobs)
    gap = float(np.mean(seconds)) / (gpus * load)
    arrivals = np.cumsum(rng.exponential(gap, n_jobs))
    jobs = []
    for i in range(n_jobs):
        app = apps[int(picks[i])]
        batch = truth.batch_range(app)[0]
        speed = truth.train_speed(app, batch, batch, 100)
        jobs.append(TraceJob(i + 1, float(arrivals[i]), "train", app, 1, float(speed * seconds[i]), batch))
    return jobs


def solo_profiles(pairs: Sequence[Colocation]) -> dict[tuple[str, int], SoloProfile]:
    """Each Gavel job's solo profile on the pairs' GPU type."""
    return {_identity(p): p for o in pairs for p in (o.a, o.b)}


class TruthPairs:
    """The true model: the truth's measured slowdown of each pair of Gavel jobs (a `SlowdownModel`, no margins)."""

    def __init__(self, truth: GroundTruth):
        self.truth = truth

    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        return np.array([1.0 / self.truth.norm.get((_identity(p), _identity(q)), 0.5) for p, q in zip(a, b)])

    def admission_margins(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        return np.zeros(len(a))

    gain_margin = 0.0


class NoSharing:
    """Sharing off: every pair refused."""

    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        return np.full(len(a), math.inf)

    gain_margin = 0.0
    admission_margin = 0.0


class Translated:
    """A model of Gavel jobs asked about the simulator's jobs: each profile becomes its Gavel job's solo profile on
    the cluster's GPU type (`GroundTruth.identity`); a job with no such profile is never paired (slowdown inf)."""

    def __init__(self, inner, truth: GroundTruth, profiles: dict[tuple[str, int], SoloProfile]):
        self.inner, self.truth, self.profiles = inner, truth, profiles

    def gavel(self, p: SoloProfile) -> SoloProfile | None:
        return self.profiles.get(self.truth.identity(p.kind, p.model_family, p.batch))

    def _map(self, a, b):
        ga, gb = [self.gavel(p) for p in a], [self.gavel(q) for q in b]
        ok = np.array([x is not None and y is not None for x, y in zip(ga, gb)], dtype=bool)
        return [x for x, k in zip(ga, ok) if k], [y for y, k in zip(gb, ok) if k], ok

    def predict(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        ga, gb, ok = self._map(a, b)
        out = np.full(len(a), math.inf)
        if ga:
            out[ok] = np.asarray(self.inner.predict(ga, gb), dtype=float)
        return out

    def admission_margins(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        ga, gb, ok = self._map(a, b)
        out = np.full(len(a), math.inf)
        if ga:
            own = getattr(self.inner, "admission_margins", None)
            out[ok] = (np.asarray(own(ga, gb), dtype=float) if own is not None
                       else float(getattr(self.inner, "admission_margin", 0.0)))
        return out

    @property
    def gain_margin(self) -> float:
        return float(getattr(self.inner, "gain_margin", getattr(self.inner, "admission_margin", 0.0)))


@dataclass
class Probes:
    """What the observer measured and judged in one run."""

    measured: int = 0  # pairings measured (a pair of jobs at their shapes, once)
    probes: int = 0  # of which the first measurement of their pair of Gavel jobs
    reverted: int = 0
    kept: int = 0
    cost_gpu_s: float = 0.0  # work lost by pairings that ran below one GPU's worth, in GPU-seconds
    paired_gpu_s: float = 0.0  # GPU-seconds of measured pairings
    probe_gpu_s: float = 0.0  # of which those of probes
    probing_epochs: int = 0  # epochs the budget allowed probing in (`probing` mode)
    first_measured_s: float = math.nan  # since the first arrival
    first_adapted_s: float = math.nan
    first_gain_s: float = math.nan  # a kept pairing whose jobs together ran above one GPU's worth
    events: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "events"}


class PairObserver:
    """The simulated helper's observer of pairs (module docstring): measures, feeds the model, judges."""

    def __init__(self, engine: NewClusterEngine, learner: OnlineAdapted | None, gpu_type: str,
                 probe_budget: float = 0.0):
        self.engine, self.learner, self.gpu_type = engine, learner, gpu_type
        self.probe_budget = probe_budget
        self.refusals = Refusals()
        self.reverted: list[Verdict] = []
        self.since: dict[tuple, float] = {}  # (job, shape, partner, shape) -> when first seen together
        self.judged: set[tuple] = set()
        self.seen_pairs: set[frozenset] = set()
        self.stats = Probes()

    def _together(self) -> dict[tuple, tuple]:
        """Pairs of running jobs sharing a GPU now, both past their restart: key -> (job a, job b)."""
        cl, now = self.engine.cluster, self.engine.cluster.now
        out = {}
        for node in cl.nodes:
            for uses in node.gpus:
                if len(uses) < 2:
                    continue
                jobs = [cl.jobs[j] for j in sorted(uses)]
                for i, a in enumerate(jobs):
                    for b in jobs[i + 1:]:
                        if a.family is None or b.family is None or max(a.ready_at, b.ready_at) > now:
                            continue
                        out[(a.job_id, a.shape, b.job_id, b.shape)] = (a, b)
        return out

    def __call__(self, snap, families, dry_run, source):
        progress, families, notes = self.engine._observe(snap, families, dry_run, source)
        self.reverted = []
        eng, now = self.engine, self.engine.cluster.now
        t0 = eng.t0
        now_pairs = self._together()
        for key in list(self.since):
            if key not in now_pairs:
                del self.since[key]
        found: list[Colocation] = []
        margin = max(MIN_GAIN, float(getattr(eng.model, "gain_margin", 0.0)))
        for key, (a, b) in now_pairs.items():
            start = self.since.setdefault(key, now)
            if key in self.judged or now - start < eng.sim.epoch_s * 0.5:
                continue
            self.judged.add(key)
            ia, ib = eng._solo(a)[2], eng._solo(b)[2]
            ga, gb = eng.gavel_profiles.get(ia), eng.gavel_profiles.get(ib)
            fits = (ia, ib) in eng.truth.norm
            if ga is not None and gb is not None:
                found.append(Colocation(self.gpu_type, ga, gb, eng.truth.norm.get((ia, ib), math.nan),
                                        eng.truth.norm.get((ib, ia), math.nan), fits, "sim"))
            fa = a.rate / max(eng._solo(a)[0], 1e-12)
            fb = b.rate / max(eng._solo(b)[0], 1e-12)
            combined = fa + fb
            seconds = now - start
            st = self.stats
            st.measured += 1
            pair = frozenset((ia, ib))
            if pair not in self.seen_pairs:
                self.seen_pairs.add(pair)
                st.probes += 1
                st.probe_gpu_s += seconds
            if math.isnan(st.first_measured_s):
                st.first_measured_s = now - t0
            st.paired_gpu_s += seconds
            st.cost_gpu_s += max(0.0, 1.0 - combined) * seconds
            revert = combined < 1.0 + margin
            st.events.append((now - t0, a.job_id, b.job_id, round(combined, 4), revert))
            if revert:
                st.reverted += 1
                pa, pb = self._profile(a), self._profile(b)
                if pa is not None and pb is not None:
                    self.refusals.add(pa, pb, now)
                self.reverted.append(Verdict((a.job_id, b.job_id), (a.shape, b.shape), (fa, fb), combined, True,
                                             f"jobs {a.job_id} and {b.job_id} together run at {combined:.2f}, below "
                                             f"1 + margin {margin:g}"))
            else:
                st.kept += 1
                if combined > 1.0 and math.isnan(st.first_gain_s):
                    st.first_gain_s = now - t0
        self.refusals.expire(now)
        if found and self.learner is not None:
            self.learner.observe(found)
            if self.learner.fit is not None and math.isnan(self.stats.first_adapted_s):
                self.stats.first_adapted_s = now - t0
        if self.learner is not None and self.probe_budget > 0:
            elapsed = eng.cluster.n_gpus * max(now - t0, eng.sim.epoch_s)
            self.learner.probing = self.stats.probe_gpu_s < self.probe_budget * elapsed
            self.stats.probing_epochs += self.learner.probing
        return progress, families, notes

    def _profile(self, job) -> SoloProfile | None:
        fam = self.engine.families.get(job.job_id)
        if fam is None:
            return None
        try:
            shape = fam.shape(job.shape)
        except KeyError:
            return None
        return solo_profile(shape, fam.kind, fam.name)


class NewClusterEngine(Engine):
    """`Engine` whose epochs observe pairs through a `PairObserver` (probe, revert, feed the learner)."""

    def __init__(self, trace, settings, sim, model, truth: GroundTruth, gavel_profiles, learner=None, seed=0,
                 gpu_type: str = "", probe_budget: float = 0.0):
        super().__init__(trace, "elastico", settings, sim, model, truth, seed)
        self.gavel_profiles = gavel_profiles
        self.t0 = self.trace[0].submit_s if self.trace else 0.0
        self.pair_observer = PairObserver(self, learner, gpu_type, probe_budget)
        self.observe = self.pair_observer  # each epoch's observer: probe, revert, feed the learner


def model_for(mode: str, truth: GroundTruth, profiles: dict, base=None, gpu_type: str = ""):
    """(the planner's model, the online learner or None) of `mode` (`MODES`); `base` is the trained model."""
    if mode == "off":
        return NoSharing(), None
    if mode == "true":
        return Translated(TruthPairs(truth), truth, profiles), None
    if base is None:
        raise ValueError(f"mode {mode!r} needs a trained model")
    if mode == "unadapted":
        return Translated(base.on_gpu(gpu_type) if hasattr(base, "on_gpu") else base, truth, profiles), None
    if mode in ("adapted", "probing"):
        learner = OnlineAdapted(base, gpu_type, probe_optimism=UNCALIBRATED_GAIN_MARGIN if mode == "probing" else 0.0)
        return Translated(learner, truth, profiles), learner
    raise ValueError(f"mode {mode!r}: allowed {', '.join(MODES)}")


@dataclass
class NewClusterRun:
    mode: str
    seed: int
    result: object  # RunResult
    probes: Probes
    learner: dict | None


def run_mode(mode: str, trace, settings, sim, truth: GroundTruth, profiles: dict, base=None, gpu_type: str = "",
             seed: int = 0) -> NewClusterRun:
    """One run of elastico on `trace` under `mode` (`MODES`)."""
    model, learner = model_for(mode, truth, profiles, base, gpu_type)
    eng = NewClusterEngine(trace, settings, sim, model, truth, profiles, learner, seed, gpu_type,
                           PROBE_BUDGET if mode == "probing" else 0.0)
    res = eng.run()
    return NewClusterRun(mode, seed, res, eng.pair_observer.stats, learner.summary() if learner is not None else None)


def running_pairs(engine: Engine) -> int:
    """Jobs now running next to another on a GPU (tests)."""
    return sum(len(u) for n in engine.cluster.nodes for u in n.gpus if len(u) > 1
               and all(engine.cluster.jobs[j].state is JobState.RUNNING for j in u))
