"""What the planner knows of a simulated job's speeds: estimates with shared errors, refined only by the job itself.

The engine knows the truth (`sim.truth`); the planner must see only what the
live helper would. Live, a family's throughputs are the first-order model's
(`shapes.estimate`) or the user's declared figures, both made before the job
ran, and there is no profiling run, so there is no profiling time to charge.
Their errors are not independent per shape: the model's hints are the same
for every job of one app, and its rules (how speed grows with the MPS share,
how it scales over GPUs) err alike on every shape they size. So a family's
figure for a shape, before the job has run it, is (`families.Errors`)

    true × exp(a_app + j_job + e_shape) × (share / 100) ** d_app × ranks ** r_app

with a, j, e, d, r drawn once per seed (a, d, r per app: every job of the app
shares them; j per job; e per shape, `SimSettings.profile_noise`), each a
normal of the sigma its `SimSettings` key gives (`estimate_*_sigma`). The
sigmas are chosen, not fitted: a factor of about 1.35 per sigma on an app's
level, 1.1 on a job's, and exponents that put a quarter GPU or a 16-GPU gang
15-30 % off.

What the job measured (`record`): once it has run a shape alone for a while,
the epoch's observer gives the planner that shape at its measured speed and
moves the job's other shapes by the same factor (`shapes.measured_speed`, the
rule the live observer applies to the `solo_rate` its jobs' progress showed).
At another global batch, the goodput it showed is turned into the shape's
figure at the efficiency its progress was counted at, the truth's (`record`),
as the live observer does with the noise scale the job counted it with: the
figure is the job's speed there, and the planner's efficiency error (below)
stays out of the job's other shapes.
A speed beside another job on its GPU is not a solo speed and teaches nothing
here (the interference model learns from it).

Goodput shapes (other global batches): Pollux and the live runtime estimate
the statistical efficiency from the gradient noise scale the job measures
while it trains (`shapes.goodput`). So before the job has made progress no
other batch is offered (its efficiency is unknown, as AdaptDL starts every
job at its submitted batch); afterwards each other batch's goodput is the
truth's efficiency in the job's current epoch times a lognormal error
(`SimSettings.efficiency_noise`, drawn per job, epoch and batch): an
estimate from noisy gradients, never the truth itself.

On a cluster of GPU types (Sia's calibration) families are as each type's
profile gives them (`families_typed`): Sia profiles every job on every type
when it arrives. There a goodput job's efficiency, once it has trained, is
the truth's, without error: Sia's simulator (Pollux's, extended) hands its
policy the true gradient statistics at the job's progress, and every policy
there plans with exact profiles, so an error on the efficiency alone would
handicap only the goodput policies (sia, pollux).
"""

from __future__ import annotations

import dataclasses

from slurm_elastico.model import Family
from slurm_elastico.shapes.measured_speed import refined
from slurm_elastico.sim.families import Errors, _noise, at_epoch, efficiency_epoch
from slurm_elastico.sim.job import SimJob
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.truth import GroundTruth

MIN_SOLO_S = 10.0
"""Seconds a job must have run a shape alone, at one speed, before that speed is a measurement (the live observer
needs two progress reports in that time): counted from its start on the shape, or from when who shares its GPU
last changed (`SimJob.context_since`), whichever is later."""


def errors(sim: SimSettings) -> Errors:
    """The estimate's shared errors the settings ask for."""
    return Errors(sim.estimate_app_sigma, sim.estimate_job_sigma, sim.estimate_share_sigma,
                  sim.estimate_scaling_sigma)


def efficiency_sigma(sim: SimSettings) -> float:
    """The error of a goodput job's efficiency: `SimSettings.efficiency_noise`, none on a cluster of GPU types
    (module docstring)."""
    return 0.0 if sim.cluster else sim.efficiency_noise


class Belief:
    """The planner's view of each job's family: the estimate, what the job measured, its online efficiency."""

    def __init__(self, truth: GroundTruth, sim: SimSettings, seed: int):
        self.truth, self.sim, self.seed = truth, sim, seed
        self.efficiency_sigma = efficiency_sigma(sim)
        self.measured: dict[int, dict[str, float]] = {}
        """Per job, each shape's solo speed as its progress showed it."""
        self.shown: dict[int, tuple[tuple, Family]] = {}
        """Per job, the last view and what it was made from: an unchanged view is the same object (the planner's
        caches know it)."""

    def record(self, job: SimJob, shape: str, alone: bool, now: float) -> None:
        """Note what a running job's progress shows now: its speed at `shape` if it ran there alone long enough.
        At another global batch than its own, progress is goodput: it is noted as the shape's figure (the first
        epoch's goodput, as `family_of` values the shape) at the efficiency the progress was counted at, the
        truth's, as the live observer turns it into the figure at the noise scale the job counted its progress
        with (`shapes.goodput.to_figure`): the figure is then the job's speed at that shape, free of the planner's
        efficiency error, which the planner's view of every other batch carries (`view`)."""
        if not (alone and job.rate > 0 and now - max(job.shape_since, job.ready_at, job.context_since) >= MIN_SOLO_S):
            return
        rate, own = job.rate, job.trace.global_batch
        b = int(job.family_shape(shape).knob("global_batch", own))
        if b != own:
            epoch, app = efficiency_epoch(self.truth, job.trace, job.done), job.trace.app
            rate *= self.truth.efficiency_ratio(app, own, b, 0) / self.truth.efficiency_ratio(app, own, b, epoch)
        self.measured.setdefault(job.job_id, {})[shape] = rate

    def _error(self, job: SimJob, epoch: int, batch: int) -> float:
        """The factor by which the planner's efficiency of `batch` errs in the job's `epoch` (lognormal,
        `SimSettings.efficiency_noise`; drawn once per job, epoch and batch)."""
        return _noise(job.job_id, f"efficiency:{epoch}:{batch}", self.seed, self.efficiency_sigma)

    def forget(self, job_id: int) -> None:
        self.measured.pop(job_id, None)
        self.shown.pop(job_id, None)

    def view(self, job: SimJob, fam: Family, done: float | None, adaptive: bool) -> Family:
        """The family the planner sees for `job` (its estimate `fam`) after `done` work (None: it has not run)."""
        goodput = adaptive and fam.kind == "train"
        key = (id(fam), tuple(sorted(self.measured.get(job.job_id, {}).items())),
               (efficiency_epoch(self.truth, job.trace, done) if done else -1) if goodput else None)
        last = self.shown.get(job.job_id)
        if last is not None and last[0] == key:
            return last[1]
        out = self._view(job, fam, done, goodput)
        self.shown[job.job_id] = (key, out)
        return out

    def _view(self, job: SimJob, fam: Family, done: float | None, goodput: bool) -> Family:
        fam = refined(fam, self.measured.get(job.job_id, {}))
        if not goodput:
            return fam
        own = job.trace.global_batch
        if not done:  # no gradient measured yet: its own batch only
            keep = tuple(s for s in fam.shapes if s.knob("global_batch", own) == own)
            return dataclasses.replace(fam, shapes=keep)
        epoch = efficiency_epoch(self.truth, job.trace, done)
        seen = at_epoch(fam, job.trace, self.truth, epoch)
        return dataclasses.replace(seen, shapes=tuple(
            s if s.knob("global_batch", own) == own else
            dataclasses.replace(s, throughput=s.throughput * self._error(job, epoch, s.knob("global_batch")))
            for s in seen.shapes))
