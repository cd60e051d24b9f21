"""Goodput mode in the helper: an adaptive family priced at the noise scale its job reports, the planner's batch,
the store's record of what the job's progress cost, and `elastico report`'s columns."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.helper import job_work
from slurm_elastico.helper.observer import ProgressObserver
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import ActionKind, GpuUse
from slurm_elastico.planner import run_epoch
from slurm_elastico.report.metrics import job_rows
from slurm_elastico.report.render import table
from slurm_elastico.report import group_rows
from slurm_elastico.runtime.progress import Progress, progress_path, read_progress, write_progress
from slurm_elastico.shapes import parse_family
from slurm_elastico.shapes.goodput import at_noise_scale, other_batch
from slurm_elastico.store import Store
from tests.synthetic import cluster, running, snapshot, with_users

NOW = 100_000.0

FAMILY = {
    "kind": "train", "name": "goodput", "global_batch": 8, "micro_batches": [8], "precisions": ["fp32"],
    "checkpointing": [False], "steps": 400, "mps_shares": [100], "cpus": 1, "host_mem_mib": 512,
    "batch": {"adaptive": True, "min": 4, "max": 32, "lr_scaling": "adascale"},
    "declared": {"mb8-fp32-mps100": {"throughput": 1.0, "gpu_mem_mib": 1000},
                 "gb16-mb8-fp32-mps100": {"throughput": 0.9, "gpu_mem_mib": 1000},
                 "gb32-mb8-fp32-mps100": {"throughput": 0.8, "gpu_mem_mib": 1000},
                 "gb4-mb4-fp32-mps100": {"throughput": 0.6, "gpu_mem_mib": 1000}},
}
"""Figures are goodput at the worst noise scale (`shapes.enumerate`): gb16/gb32 at their steps/s, gb4 at half."""


def fam():
    data = {**FAMILY, "micro_batches": [4, 8]}
    data["declared"] = {**FAMILY["declared"], "mb4-fp32-mps100": {"throughput": 0.5, "gpu_mem_mib": 1000}}
    return parse_family(data, "test", 16000)


def by_name(family):
    return {s.name: s for s in family.shapes}


def test_other_batches_are_priced_at_the_measured_noise_scale_by_hand():
    f = fam()
    assert other_batch(by_name(f)["gb32-mb8-fp32-mps100"]) == (32, 8)
    assert other_batch(by_name(f)["mb8-fp32-mps100"]) is None  # the submitted batch
    p = by_name(at_noise_scale(f, 24.0))
    # one step at B is worth (B/B0)(phi+B0)/(phi+B) steps of B0: 2*32/40 = 1.6 at 16, 4*32/56 at 32, 0.5*32/28 at 4
    assert p["gb16-mb8-fp32-mps100"].throughput == pytest.approx(0.9 * 1.6)
    assert p["gb32-mb8-fp32-mps100"].throughput == pytest.approx(0.8 * 4 * 32 / 56)
    assert p["gb4-mb4-fp32-mps100"].throughput == pytest.approx(0.6 * (0.5 * 32 / 28) / 0.5)
    assert p["mb8-fp32-mps100"].throughput == 1.0  # the submitted batch: as declared
    # no noise: a step at any batch is worth one step of B0, so goodput is the shape's steps/s
    q = by_name(at_noise_scale(f, 0.0))
    assert q["gb32-mb8-fp32-mps100"].throughput == pytest.approx(0.8)
    assert q["gb4-mb4-fp32-mps100"].throughput == pytest.approx(0.6 / 0.5)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="grad_noise_scale"):
            at_noise_scale(f, bad)


def cfg() -> Settings:
    s = Settings()
    return dataclasses.replace(s, planner=dataclasses.replace(s.planner, reshape_cost_s=5.0))


def relaunches(plan):
    """The shapes a plan relaunches its running job at (the AdminComment, then the in-place signal)."""
    kinds = [a.kind for a in plan.actions]
    return [a.shape for a in plan.actions if a.kind is ActionKind.SET_ADMIN_COMMENT] if ActionKind.SIGNAL in kinds else []


def test_the_planner_relaunches_a_running_adaptive_job_at_the_batch_its_noise_scale_pays_for():
    f = fam()
    job = running(1, "n0000", 0, 100, start=NOW - 30, shape="mb8-fp32-mps100")
    snap = snapshot(with_users(cluster(1), {("n0000", 0): (GpuUse(1, 100),)}), [job], NOW)
    assert run_epoch(snap, {1: f}, cfg(), ContentionModel(), NOW, {1: 20.0}).actions == ()  # worst case: 0.9, 0.8 < 1
    plan = run_epoch(snap, {1: at_noise_scale(f, 20.0)}, cfg(), ContentionModel(), NOW, {1: 20.0})
    assert relaunches(plan) == ["gb32-mb8-fp32-mps100"]  # 0.8 x 4 x 28/52 = 1.72 steps of batch 8 a second
    assert "1.72 steps/s" in plan.actions[0].reason
    # little noise: one step at 32 is worth 4 x 9/33 = 1.09 steps of 8, 0.87 a second: it stays
    assert run_epoch(snap, {1: at_noise_scale(f, 1.0)}, cfg(), ContentionModel(), NOW, {1: 20.0}).actions == ()


def report(done, at, phi=None, steps=None, samples=None):
    return Progress(done, 400, at, "mb8-fp32-mps100", 0, at - 10, phi, steps, samples)


def test_the_observer_prices_with_the_reported_noise_scale_keeps_it_while_requeued_and_records_the_last_report(tmp_path):
    f = fam()
    job = replace(running(1, "n0000", 0, 100, start=NOW - 30, shape="mb8-fp32-mps100"),
                  gpu_alloc=(("n0000", 0, 100),), work_dir=str(tmp_path))
    write_progress(progress_path(tmp_path, 1), report(10.0, NOW, 20.0, 10, 80))
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100")
        progress, fams, _ = observer(snapshot(cluster(1), [job], NOW), {1: f}, dry_run=False)
        assert progress == {1: 10.0}
        assert by_name(fams[1])["gb32-mb8-fp32-mps100"].throughput == pytest.approx(0.8 * 4 * 28 / 52)
        # requeued to change its batch: pending, no report read; the planner still prices its noise scale
        waiting = replace(job, state=type(job.state).PENDING, gpu_alloc=(), nodes=())
        _, fams, _ = observer(snapshot(cluster(1), [waiting], NOW + 5), {1: f}, dry_run=False)
        assert by_name(fams[1])["gb32-mb8-fp32-mps100"].throughput == pytest.approx(0.8 * 4 * 28 / 52)
        # it ran at 32 and finished between two epochs: its last report is read once it has left the queue
        write_progress(progress_path(tmp_path, 1), report(400.0, NOW + 60, 22.0, 160, 4880))
        observer(snapshot(cluster(1), [], NOW + 70), {}, dry_run=False)
        (row,) = store.query("SELECT * FROM job_work")
        assert (row["done"], row["total"], row["steps"], row["samples"], row["final"]) == (400.0, 400.0, 160, 4880, 1)
        # the id seen again is a new job: the old noise scale is not its own
        assert job_work.noise_scales(store, [1], {}) == {}


def test_a_report_carries_steps_and_samples_and_old_reports_read_without_them(tmp_path):
    p = tmp_path / "r.json"
    write_progress(p, report(12.5, NOW, 20.0, 7, 96))
    got = read_progress(p)
    assert (got.done, got.steps, got.samples, got.grad_noise_scale) == (12.5, 7, 96, 20.0)
    write_progress(p, Progress(3, 10, NOW))
    got = read_progress(p)
    assert got.steps is None and got.samples is None
    p.write_text('{"version": 1, "done": 1, "total": 2, "updated": 3, "steps": 1.5}')
    with pytest.raises(ValueError, match="steps = 1.5, expected an integer"):
        read_progress(p)


def test_the_report_lists_progress_work_steps_and_samples(tmp_path):
    from tests.unit.test_report import run  # sacct records of hand-made runs
    from slurm_elastico.model import JobState

    records = [run(7, JobState.COMPLETED, 0, 5, 65), run(8, JobState.COMPLETED, 0, 5, 65)]
    rows = {r.job_id: r for r in job_rows(records, {7: "train", 8: "train"}, {},
                                          work={7: {"done": 400.0, "total": 400.0, "steps": 160, "samples": 4880}})}
    assert (rows[7].progress, rows[7].work, rows[7].steps, rows[7].samples) == (400.0, 400.0, 160, 4880)
    assert rows[8].progress is None and rows[8].steps is None  # no report seen
    # a record written before the job was submitted is an earlier job's of the same id (a rebuilt cluster)
    old = job_rows(records, {7: "train"}, {}, work={7: {"done": 9.0, "total": 10.0, "updated": -1.0}})
    assert old[0].progress is None
    text = table(group_rows(list(rows.values())), list(rows.values()))
    header = next(line for line in text.splitlines() if line.startswith("JOB_ID"))
    assert header.split()[9:13] == ["PROGRESS", "WORK", "STEPS", "SAMPLES"]
    assert "4880" in text


def test_a_speed_measured_at_another_batch_is_kept_in_figure_units():
    from slurm_elastico.shapes.goodput import to_figure

    s = by_name(fam())
    # at phi 20 a step of 32 counted 4 x 28/52 steps of 8: the figure is the steps/s themselves
    assert to_figure(s["gb32-mb8-fp32-mps100"], 20.0) == pytest.approx(52 / (4 * 28))
    assert to_figure(s["gb32-mb8-fp32-mps100"], None) == 1.0  # unmeasured: a step counted one
    assert to_figure(s["gb4-mb4-fp32-mps100"], None) == pytest.approx(0.5)  # the figure is half its steps/s
    assert to_figure(s["mb8-fp32-mps100"], 20.0) == 1.0
    # measured, then priced again: the progress rate it showed
    shape = replace(s["gb32-mb8-fp32-mps100"], throughput=1.72 * to_figure(s["gb32-mb8-fp32-mps100"], 20.0))
    again = at_noise_scale(replace(fam(), shapes=(shape,)), 20.0)
    assert again.shapes[0].throughput == pytest.approx(1.72)


def test_a_speed_measured_at_another_batch_corrects_every_shape_of_the_job():
    """What the observer keeps of a goodput shape (its figure, `to_figure`) moves the job's other shapes, those at
    its submitted batch included, by measured over estimated (`shapes.measured_speed`); priced again at the same
    noise scale, the measured shape is the progress rate the job showed."""
    from slurm_elastico.shapes.goodput import to_figure
    from slurm_elastico.shapes.measured_speed import refined

    f = fam()
    s = by_name(f)
    name = "gb32-mb8-fp32-mps100"
    figure = 1.2 * to_figure(s[name], 20.0)
    factor = figure / s[name].throughput
    got = by_name(at_noise_scale(refined(f, {name: figure}), 20.0))
    assert got[name].throughput == pytest.approx(1.2)
    assert got["mb8-fp32-mps100"].throughput == pytest.approx(s["mb8-fp32-mps100"].throughput * factor)
    assert factor != pytest.approx(1.0, abs=0.05)  # the estimate was off: the test would not see a wrong factor


def test_a_goodput_jobs_floor_is_judged_on_its_progress_not_on_its_figure(tmp_path):
    """Job 1 runs batch 32 beside job 2, each at 0.9 of its solo speed. Job 1's floor, 1.2 steps of 8 a second, is
    met: at its noise scale (20) its solo goodput is 1.72, so it makes 1.55 beside job 2. Judged against its solo
    speed as kept (the figure, 0.8 steps of 32 a second), the floor read as 1.5 times its solo speed and the pair,
    which the planner rightly made, was undone."""
    f = replace(fam(), throughput_floor=1.2)
    g32, own = "gb32-mb8-fp32-mps100", "mb8-fp32-mps100"
    priced = at_noise_scale(f, 20.0)
    assert by_name(priced)[g32].throughput * 0.9 > 1.2
    solo = {(1, g32): 0.8, (2, own): 1.0}  # solo speeds as the observer keeps them: figures
    beside = {(1, g32, 2, own): (0.8 * 0.9 * 20, 20.0), (2, own, 1, g32): (1.0 * 0.9 * 20, 20.0)}
    with Store(tmp_path / "s.sqlite") as store:
        verdicts = ProgressObserver(store, "p100")._judge(beside, solo, {}, {1: priced, 2: fam()}, [], 1e5, {1: 20.0})
        assert [v.revert for v in verdicts] == [False], [v.reason for v in verdicts]
        # At a noise scale where batch 32 is worth less (5: a step of 32 worth 1.41 of 8), 0.9 of its solo
        # goodput (0.9 x 0.8 x 1.41 = 1.01) is below the floor: undone.
        verdicts = ProgressObserver(store, "p100")._judge(beside, solo, {}, {1: at_noise_scale(f, 5.0), 2: fam()},
                                                          [], 1e5, {1: 5.0})
        assert [v.revert for v in verdicts] == [True], [v.reason for v in verdicts]
