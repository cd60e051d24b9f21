"""The planner sees only what it could know live: no truth while it plans, estimates whose errors are shared per
app, speeds refined only by what a job measured alone, efficiency only once gradients were measured."""

from __future__ import annotations

import inspect
import math

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.helper import epoch as helper_epoch
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import Family, Resources, Shape
from slurm_elastico.shapes.measured_speed import refined
from slurm_elastico.sim import engine, trace_synthetic
from slurm_elastico.sim.families import NO_ERRORS, family_of
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth

EXACT = dict(profile_noise=0.0, estimate_app_sigma=0.0, estimate_job_sigma=0.0, estimate_share_sigma=0.0,
             estimate_scaling_sigma=0.0, efficiency_noise=0.0)


@pytest.fixture(scope="module")
def truth() -> GroundTruth:
    return GroundTruth()


def _seen(monkeypatch) -> list[tuple[float, dict[int, Family]]]:
    """Every epoch's families as the planner received them."""
    got: list[tuple[float, dict[int, Family]]] = []
    real = helper_epoch.run_epoch

    def spy(snap, fams, settings, model, now, progress):
        got.append((now, dict(fams)))
        return real(snap, fams, settings, model, now, progress)
    monkeypatch.setattr(helper_epoch, "run_epoch", spy)
    return got


def test_the_planner_never_reads_the_ground_truth_while_it_plans(monkeypatch, truth):
    # Every public method of the truth raises while the planner runs: a planner (or anything it is handed) that
    # consults the truth fails this run. The engine itself reads it freely outside the planner.
    planning, read = [False], []
    real = helper_epoch.run_epoch

    def guarded(*args, **kw):
        planning[0] = True
        try:
            return real(*args, **kw)
        finally:
            planning[0] = False
    monkeypatch.setattr(helper_epoch, "run_epoch", guarded)
    for name in [n for n in dir(GroundTruth) if not n.startswith("_") and callable(getattr(GroundTruth, n))]:
        static = isinstance(inspect.getattr_static(GroundTruth, name), staticmethod)
        method = getattr(GroundTruth, name)

        def trap(*a, _m=method, _n=name, **k):
            if planning[0]:
                read.append(_n)  # kept, so that nothing on the way can swallow it
                raise AssertionError(f"the planner read the ground truth: GroundTruth.{_n}")
            return _m(*a, **k)
        monkeypatch.setattr(GroundTruth, name, staticmethod(trap) if static else trap)
    jobs = trace_synthetic.synthetic(trace_synthetic.MixSpec(n_jobs=30, gpus=8, load=2.0), 3, truth)
    for policy in ("elastico", "elastico-goodput", "pollux"):
        r = engine.run(jobs, policy, Settings(), SimSettings(gpus=8), ContentionModel(), truth, seed=3)
        assert r.unfinished == 0 and r.epochs_planned > 0
    assert read == []


def test_estimates_err_alike_for_every_job_of_an_app_and_learn_from_a_measured_shape(monkeypatch, truth):
    # Two jobs of one app, one after the other on one GPU at its default shape (no-shapes): the second waits
    # while the first runs alone.
    jobs = [TraceJob(1, 0.0, "train", "cifar10", 1, 3000.0, 128), TraceJob(2, 0.0, "train", "cifar10", 1, 3000.0, 128)]
    sim = SimSettings(gpus=1, gpus_per_node=1, epoch_s=30.0, placement_window_s=-1, profile_noise=0.0,
                      estimate_job_sigma=0.0, colocation="none")
    seen = _seen(monkeypatch)
    r = engine.run(jobs, "no-shapes", Settings(), sim, ContentionModel(), truth, seed=1)
    assert r.unfinished == 0
    exact = family_of(jobs[0], truth, sim.share_levels(), sim.gpu_memory_mib, 0.0, 1, max_gpus=sim.max_gpus_per_job,
                      gpus_per_node=1, whole_gpu_gangs=True, errors=NO_ERRORS)
    true = {s.name: s.throughput for s in exact.shapes}
    first = seen[0][1]
    ratios = {j: {s.name: s.throughput / true[s.name] for s in first[j].shapes if s.name in true} for j in (1, 2)}
    # the app's bias is shared: the same error on both jobs' shapes, and not none
    assert ratios[1] == pytest.approx(ratios[2], rel=1e-9)
    assert all(abs(math.log(v)) > 1e-3 for v in ratios[1].values())
    # once job 1 has run a shape alone, the planner sees that shape at its true speed and job 2 (not run) keeps
    # its estimate
    later = next(f for _, f in seen if 1 in f and any(abs(s.throughput / true.get(s.name, math.nan) - 1) < 1e-9
                                                      for s in f[1].shapes))
    assert any(abs(s.throughput / true[s.name] - 1) > 1e-3 for s in later[2].shapes if s.name in true)


def test_without_errors_the_planner_sees_the_profiled_family(monkeypatch, truth):
    # The control of the test above: with every sigma 0 the view is the exact family, so that test can fail.
    jobs = [TraceJob(1, 0.0, "train", "cifar10", 1, 3000.0, 128)]
    sim = SimSettings(gpus=1, gpus_per_node=1, epoch_s=30.0, placement_window_s=-1, colocation="none", **EXACT)
    seen = _seen(monkeypatch)
    engine.run(jobs, "elastico", Settings(), sim, ContentionModel(), truth, seed=1)
    exact = family_of(jobs[0], truth, sim.share_levels(), sim.gpu_memory_mib, 0.0, 1, max_gpus=sim.max_gpus_per_job,
                      gpus_per_node=1, whole_gpu_gangs=True)
    assert {s.name: s.throughput for s in seen[0][1][1].shapes} == pytest.approx(
        {s.name: s.throughput for s in exact.shapes})


def test_goodput_shapes_appear_only_after_the_job_has_measured_its_gradients(monkeypatch, truth):
    jobs = [TraceJob(1, 0.0, "train", "cifar10", 1, 20000.0, 128)]
    sim = SimSettings(gpus=4, gpus_per_node=4, epoch_s=60.0, placement_window_s=-1, colocation="none")
    seen = _seen(monkeypatch)
    engine.run(jobs, "elastico-goodput", Settings(), sim, ContentionModel(), truth, seed=0)
    batches = [{s.knob("global_batch", 128) for s in f[1].shapes} for _, f in seen if 1 in f]
    assert batches[0] == {128}  # nothing measured yet: the submitted batch only
    assert any(len(b) > 1 for b in batches[1:])  # then other batches, at the efficiency its gradients showed


def test_a_goodput_job_measured_at_another_batch_is_planned_at_the_speed_it_showed(monkeypatch, truth):
    """Once a goodput job has run another global batch alone, the planner prices that shape at the speed it showed
    there (its figure from the measured progress at the efficiency the progress was counted at, as the live
    observer's `to_figure`) times the planner's own efficiency estimate, whatever the speed estimate's errors, and
    moves its other shapes by the same factor. Before 3930dfa only shapes at the job's own batch were measured:
    a job that left its batch kept its estimate's error."""
    from slurm_elastico.sim import belief
    from slurm_elastico.sim.families import efficiency_epoch
    from slurm_elastico.sim.speeds import shape_of
    jobs = [TraceJob(i, 300.0 * i, "train", "yolov3", 1, 2000.0, 64) for i in range(1, 7)]
    sim = SimSettings(gpus=4, gpus_per_node=4, epoch_s=60.0, placement_window_s=-1, colocation="none",
                      estimate_app_sigma=0.3, estimate_job_sigma=0.3)
    shown, now_rate = [], {}
    record, view = belief.Belief.record, belief.Belief.view

    def spy_record(self, job, shape, alone, now):
        record(self, job, shape, alone, now)
        if shape in self.measured.get(job.job_id, {}):
            batch = job.family_shape(shape).knob("global_batch", 64)
            err = self._error(job, efficiency_epoch(truth, job.trace, job.done), batch)
            now_rate[job.job_id] = (shape, job.rate * (err if batch != 64 else 1.0), batch)

    def spy_view(self, job, fam, done, adaptive):
        out = view(self, job, fam, done, adaptive)
        if job.job_id in now_rate and job.alloc:
            name, rate, batch = now_rate.pop(job.job_id)
            if name == shape_of(job).name:
                shown.append((batch, rate, out.shape(name).throughput))
        return out
    monkeypatch.setattr(belief.Belief, "record", spy_record)
    monkeypatch.setattr(belief.Belief, "view", spy_view)
    engine.run(jobs, "elastico-goodput", Settings(), sim, ContentionModel(), truth, seed=3)
    other = [(rate, seen) for batch, rate, seen in shown if batch != 64]
    assert len(other) >= 20, shown  # it ran other batches alone, and long enough to measure them
    matched = sum(seen == pytest.approx(rate, rel=1e-9) for rate, seen in other)
    assert matched >= 0.9 * len(other), other


def test_a_speed_measured_at_another_batch_moves_the_jobs_own_batch_without_the_planners_efficiency_error(truth):
    """The planner's efficiency estimate errs (by 0.68 here); the figure it learns from a batch the job ran is the
    job's speed there, so its own-batch shapes, exact before (no speed-estimate errors), stay exact. When the
    figure was taken at the planner's efficiency, they moved by its error (1.48 times too fast)."""
    from slurm_elastico.model import GresRequest
    from slurm_elastico.sim.belief import Belief
    from slurm_elastico.sim.families import efficiency_epoch, efficiency_segment
    from slurm_elastico.sim.job import SimJob
    tj = TraceJob(1, 0.0, "train", "yolov3", 1, 2000.0, 64)
    fam = family_of(tj, truth, (100,), 16000.0, adaptive=True)
    bel = Belief(truth, SimSettings(efficiency_noise=0.3), seed=3)
    other = next(s for s in fam.shapes if s.knob("global_batch") != 64 and (s.resources.gpus or 1) == 1)
    b, m = int(other.knob("global_batch")), int(other.knob("micro_batch"))
    job = SimJob(tj, fam, GresRequest("mps", 100), 4, 16384)
    job.done, job.shape_since, job.ready_at = 900.0, 0.0, 0.0
    job.rate = truth.train_speed("yolov3", b, m, 100) * efficiency_segment(truth, tj, b, job.done)[0]
    err = bel._error(job, efficiency_epoch(truth, tj, job.done), b)
    assert abs(err - 1.0) > 0.2  # a draw far enough from 1 to show
    bel.record(job, other.name, True, 100.0)
    after = bel.view(job, fam, job.done, True)
    assert after.default_shape.throughput == pytest.approx(fam.default_shape.throughput, rel=1e-9)
    assert after.shape(other.name).throughput == pytest.approx(job.rate * err, rel=1e-9)


def _fam(*speeds: tuple[str, float, int]) -> Family:
    shapes = tuple(Shape(n, Resources(s, 1000, 1, 1000), v, (("global_batch", 64),)) for n, v, s in speeds)
    return Family("train", shapes, 100.0, default=shapes[0].name)


def test_refined_takes_the_measured_speed_and_moves_the_rest_by_the_same_factor():
    fam = _fam(("a", 2.0, 100), ("b", 1.0, 50), ("c", 0.5, 25))
    out = refined(fam, {"a": 3.0})
    assert [s.throughput for s in out.shapes] == pytest.approx([3.0, 1.5, 0.75])
    two = refined(fam, {"a": 4.0, "b": 1.0})  # factors 2 and 1: the rest by their geometric mean
    assert [s.throughput for s in two.shapes] == pytest.approx([4.0, 1.0, 0.5 * math.sqrt(2)])
    # nothing usable: the same object
    assert refined(fam, {}) is fam and refined(fam, {"x": 2.0}) is fam and refined(fam, {"a": math.nan}) is fam
    assert refined(fam, {"a": 0.0}) is fam
    # a shape at another global batch counts too: its figure, as the observer turns a goodput into it
    other = Family("train", fam.shapes + (Shape("g", Resources(100, 1000, 1, 1000), 4.0, (("global_batch", 256),
                                                                                         ("lr_scaling", "sqrt"))),),
                   100.0, default="a")
    assert [s.throughput for s in refined(other, {"g": 2.0}).shapes] == pytest.approx([1.0, 0.5, 0.25, 2.0])


def test_on_a_cluster_of_types_the_efficiency_is_exact_and_the_seed_says_what_it_varies():
    """Sia's simulator hands its policy the true gradient statistics, and every policy there plans with exact
    profiles: an error on the efficiency alone would handicap only sia and pollux (`sim.belief`)."""
    from slurm_elastico.sim import settings
    from slurm_elastico.sim.belief import efficiency_sigma
    from slurm_elastico.sim.experiment import seed_varies

    one, typed = SimSettings(), settings.replace(SimSettings(), cluster="aws:2x4", profiles="profiles")
    assert efficiency_sigma(one) == one.efficiency_noise > 0 and efficiency_sigma(typed) == 0.0
    assert "statistical efficiency 0.1" in seed_varies("sia:w.csv", 0.0, one)
    words = seed_varies("sia:w.csv", 0.0, typed)
    assert "shape 0.05" in words and "app" not in words and "efficiency" not in words


def test_a_solo_speed_counts_from_when_the_job_last_saw_its_gpu_change(monkeypatch, truth):
    """The live observer starts a new interval when who shares a job's GPU changes, and needs 10 s of it: a job
    whose partner left half a second ago has no solo speed yet. So in the simulator: the engine notes when a job's
    GPU last changed (`SimJob.context_since`), and the belief counts from then."""
    from slurm_elastico.model import GresRequest
    from slurm_elastico.sim import belief
    from slurm_elastico.sim.belief import Belief
    from slurm_elastico.sim.job import SimJob
    tj = TraceJob(1, 0.0, "train", "yolov3", 1, 2000.0, 64)
    fam = family_of(tj, truth, (50, 100), 16000.0)
    bel = Belief(truth, SimSettings(), seed=0)
    job = SimJob(tj, fam, GresRequest("mps", 100), 4, 16384)
    job.shape_since, job.ready_at, job.context_since, job.rate = 0.0, 0.0, 100.0, 1.0
    bel.record(job, fam.default, True, 100.5)
    assert bel.measured == {}
    bel.record(job, fam.default, True, 110.5)
    assert bel.measured == {1: {fam.default: 1.0}}
    # The engine sets it: two half-GPU jobs share a GPU under plain Slurm; when the first ends, the other's GPU
    # changed then.
    seen: list[tuple[int, float]] = []
    rerate = engine.Engine._rerate

    def spy(self, job):
        seen.append((job.job_id, job.context_since))
        rerate(self, job)
    monkeypatch.setattr(engine.Engine, "_rerate", spy)
    jobs = [TraceJob(k, 0.0, "train", "cifar10", 1, w, 128, 50) for k, w in ((1, 300.0), (2, 200.0))]
    out = engine.run(jobs, "static", Settings(), SimSettings(gpus=1, gpus_per_node=1, placement_window_s=-1),
                     None, truth)
    first, last = sorted(out.jobs, key=lambda j: j.end)
    assert first.end < last.end and (last.job_id, pytest.approx(first.end)) in seen, (seen, out.jobs)
