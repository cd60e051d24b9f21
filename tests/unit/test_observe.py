"""Progress reports → work done, solo rates and observed co-location slowdowns; the store and online refinement around it."""

from dataclasses import replace
from pathlib import Path

import pytest

from slurm_elastico.helper.observer import ProgressObserver
from slurm_elastico.interference.gavel import import_gavel
from slurm_elastico.interference.measurements import load_from_store
from slurm_elastico.interference.predictor import MlpPredictor, TrainConfig, train
from slurm_elastico.helper.observe import estimated_solo, merge_solo, observe, pair_observations, unjudged
from tests.synthetic import cluster, family, running, snapshot
from slurm_elastico.model import JobState
from slurm_elastico.runtime.progress import Progress, progress_path, write_progress
from slurm_elastico.store import Store

T0 = 1_000_000.0
FAM = family((50, 2.0, 1000), (100, 3.0, 1000), work=1000.0)


def job(job_id, gpu, share, start=T0 - 100, work_dir=""):
    shape = "mps50-0" if share == 50 else "mps100-1"
    return replace(running(job_id, "n0000", gpu, share, start=start, shape=shape),
                   gpu_alloc=(("n0000", gpu, share),), work_dir=work_dir)


def snap(*jobs):
    return snapshot(cluster(2), list(jobs))


def report(done, at, shape="", restarts=0):
    return Progress(done, 1000, at, shape, restarts)


def epochs(steps, solo=None, gpu_type="cpu"):
    """observe + pair_observations over [(snapshot, reports)], carrying state the way ProgressObserver does.

    `solo` fixes the solo rates instead of accumulating them. Returns, per epoch, (observation, found, notes).
    """
    previous, solo_ws, beside, outs = {}, {}, {}, []
    for s, reps in steps:
        out = observe(s, {1: FAM, 2: FAM}, reps, previous)
        for j, shape, w, t in out.solo:
            a, b = solo_ws.get((j, shape), (0.0, 0.0))
            solo_ws[(j, shape)] = (a + w, b + t)
        for key, w, t in out.beside:
            a, b = beside.get(key, (0.0, 0.0))
            beside[key] = (a + w, b + t)
        rates = merge_solo(solo_ws) if solo is None else solo
        found, spent, notes, _ = pair_observations(beside, rates, {1: FAM, 2: FAM}, gpu_type)
        for key in spent:
            del beside[key]
        previous = out.readings
        outs.append((out, found, notes))
    return outs, solo_ws


ALONE = snap(job(1, 0, 50), job(2, 1, 50))
SHARED = snap(job(1, 0, 50), job(2, 0, 50, start=T0 + 25))  # job 2 moved onto job 1's GPU
ALONE_THEN_SHARED = [
    (ALONE, {1: report(10, T0), 2: report(0, T0)}),
    (ALONE, {1: report(50, T0 + 20), 2: report(20, T0 + 20)}),      # solo: 2.0 and 1.0 units/s
    (SHARED, {1: report(60, T0 + 30), 2: report(20, T0 + 30)}),     # context changed: no sample
    (SHARED, {1: report(72, T0 + 40), 2: report(25, T0 + 40)}),     # 1.2 and 0.5 units/s for 10 s
]


def test_solo_then_shared_gives_one_observation_with_each_jobs_share_of_its_solo_speed():
    outs, solo = epochs(ALONE_THEN_SHARED)
    assert solo == {(1, "mps50-0"): (40.0, 20.0), (2, "mps50-0"): (20.0, 20.0)}
    assert [len(found) for _, found, _ in outs] == [0, 0, 0, 1]
    (obs,) = outs[3][1]
    assert (obs.norm_a, obs.norm_b) == pytest.approx((0.6, 0.5))
    assert obs.source == "observed" and obs.gpu_type == "cpu" and obs.a.mps_share == 50
    assert outs[3][0].progress == {1: 72, 2: 25}


def test_jobs_that_start_side_by_side_are_observed_once_they_have_run_alone():
    shared = snap(job(1, 0, 50), job(2, 0, 50))
    apart = snap(job(1, 0, 50), job(2, 1, 50, start=T0 + 25))  # job 2 moved to another GPU
    outs, _ = epochs([
        (shared, {1: report(10, T0), 2: report(10, T0)}),
        (shared, {1: report(22, T0 + 10), 2: report(15, T0 + 10)}),     # together: 1.2 and 0.5 units/s
        (apart, {1: report(30, T0 + 30), 2: report(15, T0 + 30)}),
        (apart, {1: report(50, T0 + 40), 2: report(25, T0 + 40)}),      # alone: 2.0 and 1.0 units/s
    ])
    assert [len(found) for _, found, _ in outs] == [0, 0, 0, 1]
    (obs,) = outs[3][1]
    assert (obs.norm_a, obs.norm_b) == pytest.approx((0.6, 0.5))


def test_a_pair_needs_ten_seconds_together_in_both_directions():
    outs, _ = epochs(ALONE_THEN_SHARED[:3] + [(SHARED, {1: report(68, T0 + 36), 2: report(23, T0 + 36)})])
    assert outs[3][1] == []


def test_without_a_gpu_type_nothing_is_recorded_and_the_admin_is_told():
    outs, _ = epochs(ALONE_THEN_SHARED, gpu_type="")
    assert outs[3][1] == [] and any("gpu.type is not set" in n for n in outs[3][2])


def test_a_report_written_before_the_partner_started_gives_no_sample():
    shared_late = snap(job(1, 0, 50), job(2, 0, 50, start=T0 + 15))
    outs, _ = epochs([
        (shared_late, {1: report(10, T0 + 10), 2: report(0, T0 + 16)}),
        (shared_late, {1: report(30, T0 + 30), 2: report(10, T0 + 36)}),
    ])
    assert outs[1][0].beside == []  # job 1's first report predates job 2; job 2's is inside its warm-up


def test_a_restart_resets_the_interval():
    shared = snap(job(1, 0, 50), job(2, 0, 50))
    outs, _ = epochs([
        (shared, {1: report(10, T0), 2: report(10, T0)}),
        (shared, {1: report(20, T0 + 10, restarts=1), 2: report(20, T0 + 10)}),
    ])
    assert [k[0] for k, _, _ in outs[1][0].beside] == [2]


def test_a_shape_taken_in_process_resets_the_interval_and_counts_from_its_own_reports():
    # Goodput mode's new batch on the same GPU: no restart, no new start time; only the report names another shape.
    alone = snap(job(1, 0, 50), job(2, 1, 50))
    outs, solo = epochs([
        (alone, {1: report(10, T0, "mps50-0")}),
        (alone, {1: report(50, T0 + 20, "mps50-0")}),   # 2.0 units/s at mps50-0
        (alone, {1: report(90, T0 + 40, "mps100-1")}),  # switched in between: this interval is neither shape's
        (alone, {1: report(150, T0 + 60, "mps100-1")}),  # 3.0 units/s at mps100-1
    ])
    assert [s[:2] for s in outs[1][0].solo] == [(1, "mps50-0")] and outs[2][0].solo == []
    assert [s[:2] for s in outs[3][0].solo] == [(1, "mps100-1")]
    assert solo == {(1, "mps50-0"): (40.0, 20.0), (1, "mps100-1"): (60.0, 20.0)}


def test_readings_too_close_together_keep_the_earlier_one_as_the_baseline():
    outs, _ = epochs([(s, {1: report(d, T0 + t), 2: report(d, T0 + t)}) for s, d, t in
                      [(ALONE, 10, 0), (ALONE, 16, 3), (ALONE, 22, 6)]])  # epochs 3 s apart
    assert [(j, w, t) for j, _, w, t in outs[2][0].solo] == [(1, 12, 6), (2, 12, 6)]  # measured from 0 s, not 3 s


def test_a_partner_that_restarted_between_two_epochs_makes_another_context():
    before = snap(job(1, 0, 50), job(2, 0, 50))
    after = snap(job(1, 0, 50), replace(job(2, 0, 50, start=T0 - 100), restarts=1))
    outs, _ = epochs([(before, {1: report(10, T0), 2: report(10, T0)}),
                      (after, {1: report(30, T0 + 10), 2: report(15, T0 + 10, restarts=1)})])
    assert outs[1][0].beside == []


def test_a_clock_that_steps_back_gives_no_sample():
    outs, _ = epochs([(ALONE, {1: report(10, T0)}), (ALONE, {1: report(50, T0 - 20)})])
    assert outs[1][0].solo == []


def test_no_sample_across_a_long_gap_or_inside_the_runs_own_warm_up():
    gap, _ = epochs([(ALONE, {1: report(10, T0)}), (ALONE, {1: report(5000, T0 + 3600)})])
    assert gap[1][0].solo == []
    # Slurm started job 1 long ago, but this run of its program began reporting at T0 + 8.
    warm, _ = epochs([(ALONE, {1: Progress(10, 1000, T0 + 10, "", 0, T0 + 8)}),
                      (ALONE, {1: Progress(30, 1000, T0 + 20, "", 0, T0 + 8)})])
    assert warm[1][0].solo == []
    relaunched, _ = epochs([(ALONE, {1: Progress(10, 1000, T0 + 10, "", 0, T0 - 50)}),
                            (ALONE, {1: Progress(30, 1000, T0 + 30, "", 0, T0 + 12)})])  # relaunched in place at T0 + 12
    assert relaunched[1][0].solo == []


def test_where_a_gpu_job_sits_is_unknown_no_job_on_that_node_gives_samples():
    lost = replace(job(3, 0, 50), gpu_alloc=())  # squeue gave no GPU index for it
    s = snap(job(1, 0, 50), job(2, 1, 50), lost)
    outs, _ = epochs([(s, {1: report(10, T0), 2: report(10, T0)}), (s, {1: report(30, T0 + 10), 2: report(20, T0 + 10)})])
    assert outs[1][0].solo == [] and outs[1][0].progress == {1: 30, 2: 20}


def test_a_requeued_job_keeps_its_work_done_while_it_waits():
    waiting = snap(job(1, 0, 50), replace(job(2, 1, 50), state=JobState.PENDING, gpu_alloc=()))
    outs, _ = epochs([(ALONE, {1: report(10, T0), 2: report(40, T0)}), (waiting, {1: report(20, T0 + 10)})])
    assert outs[1][0].progress == {1: 20, 2: 40}


def test_an_impossible_ratio_is_dropped_with_a_note():
    outs, _ = epochs([
        (SHARED, {1: report(10, T0 + 30), 2: report(10, T0 + 30)}),
        (SHARED, {1: report(36, T0 + 40), 2: report(20, T0 + 40)}),  # 2.6 units/s, 1.3 x its solo 2.0
    ], solo={(1, "mps50-0"): 2.0, (2, "mps50-0"): 1.0})
    assert outs[1][1] == [] and any("outside" in n for n in outs[1][2])


GAVEL = Path(__file__).parent.parent / "data" / "gavel"


@pytest.fixture(scope="module")
def reference():
    obs = import_gavel(GAVEL / "throughputs_pairs.csv", GAVEL / "throughputs_isolated.csv").observations
    return [o for o in obs if o.fits and o.gpu_type == "p100"][:120]


def alone_then_shared(observer, root, before_epoch=lambda at, d1, d2: None):
    """Jobs 1 and 2 alone for two reports, then on one GPU for two: the observer's result after each epoch.

    `before_epoch(time, work dir 1, work dir 2)` may write more reports first."""
    d1, d2 = root / "w1", root / "w2"
    alone = snap(job(1, 0, 50, work_dir=str(d1)), job(2, 1, 50, work_dir=str(d2)))
    shared = snap(job(1, 0, 50, work_dir=str(d1)), job(2, 0, 50, start=T0 + 25, work_dir=str(d2)))
    out = []
    for s, done1, done2, at in [(alone, 10, 0, T0), (alone, 50, 20, T0 + 20), (shared, 60, 20, T0 + 30),
                                (shared, 72, 25, T0 + 40)]:
        write_progress(progress_path(d1, 1), report(done1, at, "mps50-0"))
        write_progress(progress_path(d2, 2), report(done2, at, "mps50-0"))
        before_epoch(at, d1, d2)
        out.append(observer(s, {1: FAM, 2: FAM}, dry_run=False))
    return out


def test_the_observer_reads_report_files_keeps_state_in_the_store_and_refines_the_model(tmp_path, reference):
    model_path = tmp_path / "iac.pt"
    model = train(reference, TrainConfig(hidden=8, epochs=60, use_family=False), seed=0)
    model.save(model_path)
    before = model_path.read_bytes()
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", model, str(model_path), reference, refine_batch=1)
        progress, _, notes = alone_then_shared(observer, tmp_path)[-1]
        assert progress == {1: 72, 2: 25}
        (obs,) = load_from_store(store, source="observed")
        assert (obs.norm_a, obs.norm_b) == pytest.approx((0.6, 0.5))
        (update,) = store.query("SELECT * FROM model_update")
        assert update["new_observations"] == 1
        assert any("predictor refined from 1 new observation" in n for n in notes)
        assert (model_path.read_bytes() != before) == bool(update["accepted"])
        MlpPredictor.load(model_path)  # whatever happened, the file is a whole model
        # The jobs end: their readings and solo rates go.
        observer(snap(), {}, dry_run=False)
        assert store.query("SELECT COUNT(*) AS n FROM progress_reading")[0]["n"] == 0
        assert store.query("SELECT COUNT(*) AS n FROM solo_rate")[0]["n"] == 0


class Families:
    """The family source of run_once: here both jobs were submitted with FAM."""

    def families(self, job_ids):
        return {j: FAM for j in job_ids if j in (1, 2)}, []


def test_a_pair_is_observed_after_the_job_that_ran_alone_first_has_left(tmp_path):
    d1, d2 = tmp_path / "w1", tmp_path / "w2"
    a = job(1, 0, 50, work_dir=str(d1))
    b = job(2, 0, 50, start=T0 + 25, work_dir=str(d2))  # starts beside job 1, never alone while job 1 runs
    steps = [(snap(a), 10, None, T0), (snap(a), 50, None, T0 + 20),   # job 1 alone: 2.0/s
             (snap(a, b), 60, 0, T0 + 30), (snap(a, b), 72, 5, T0 + 40),   # together 10 s: 1.2/s and 0.5/s
             (snap(b), None, 10, T0 + 50), (snap(b), None, 20, T0 + 60)]   # job 1 has finished; job 2 alone: 1.0/s
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100")
        for s, done1, done2, at in steps:
            for d, j, done in ((d1, 1, done1), (d2, 2, done2)):
                if done is not None:
                    write_progress(progress_path(d, j), report(done, at, "mps50-0"))
            observer(s, {j.job_id: FAM for j in s.jobs}, dry_run=False, source=Families())
            if at == T0 + 50:
                assert store.query("SELECT COUNT(*) AS n FROM solo_rate WHERE job_id = 1")[0]["n"] == 1  # still needed
        (obs,) = load_from_store(store, source="observed")
        assert (obs.norm_a, obs.norm_b) == pytest.approx((0.6, 0.5))
        # Nothing of job 1 is left once its pair is done.
        assert store.query("SELECT COUNT(*) AS n FROM solo_rate WHERE job_id = 1")[0]["n"] == 0
        assert store.query("SELECT COUNT(*) AS n FROM pair_rate")[0]["n"] == 0


def test_a_dry_run_reads_progress_but_writes_nothing(tmp_path, reference):
    model_path = tmp_path / "iac.pt"
    model = train(reference, TrainConfig(hidden=8, epochs=20, use_family=False), seed=0)
    model.save(model_path)
    tables = ("progress_reading", "solo_rate", "pair_rate", "colocation", "model_update")
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", model, str(model_path), reference, refine_batch=1)
        alone_then_shared(observer, tmp_path)  # 4 epochs: readings, solo rates, one observation
        counts = {t: store.query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"] for t in tables}
        readings = store.query("SELECT * FROM progress_reading ORDER BY job_id")
        saved = model_path.read_bytes()
        # The next epoch would give a second observation; as a dry run it only reads.
        d1, d2 = tmp_path / "w1", tmp_path / "w2"
        write_progress(progress_path(d1, 1), report(84, T0 + 50, "mps50-0"))
        write_progress(progress_path(d2, 2), report(30, T0 + 50, "mps50-0"))
        (d2 / ".elastico" / "3").mkdir(parents=True)
        (d2 / ".elastico" / "3" / "progress.json").write_text("{broken")
        shared = snap(job(1, 0, 50, work_dir=str(d1)), job(2, 0, 50, start=T0 + 25, work_dir=str(d2)),
                      job(3, 1, 50, work_dir=str(d2)))
        progress, _, notes = observer(shared, {1: FAM, 2: FAM, 3: FAM}, dry_run=True)
        assert progress == {1: 84, 2: 30}
        assert any("job 3: report ignored" in n and "not JSON" in n for n in notes)
        assert counts["colocation"] == 1 and counts["progress_reading"] == 2
        assert {t: store.query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"] for t in tables} == counts
        assert [tuple(r) for r in store.query("SELECT * FROM progress_reading ORDER BY job_id")] == [
            tuple(r) for r in readings]
    assert model_path.read_bytes() == saved


def test_one_observation_is_not_enough_to_refine_by_default(tmp_path, reference):
    model = train(reference, TrainConfig(hidden=8, epochs=20, use_family=False), seed=0)
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", model, str(tmp_path / "iac.pt"), reference)
        _, _, notes = alone_then_shared(observer, tmp_path)[-1]
        assert store.query("SELECT COUNT(*) AS n FROM model_update")[0]["n"] == 0
        assert not any("refined" in n for n in notes) and not (tmp_path / "iac.pt").exists()


def test_a_rolled_back_refinement_leaves_the_model_file_alone(tmp_path, reference, monkeypatch):
    from slurm_elastico.interference import online

    model_path = tmp_path / "iac.pt"
    model = train(reference, TrainConfig(hidden=8, epochs=60, use_family=False), seed=0)
    model.save(model_path)
    before = model_path.read_bytes()
    # Any change at all counts as drift: the update must be rolled back and the file kept.
    monkeypatch.setattr(online.OnlineLearner, "_worse", lambda self, b, a: True)
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", model, str(model_path), reference, refine_batch=1)
        _, _, notes = alone_then_shared(observer, tmp_path)[-1]
        assert store.query("SELECT accepted FROM model_update")[0]["accepted"] == 0
        assert any("rolled back" in n for n in notes)
    assert model_path.read_bytes() == before


def test_a_failing_refinement_is_a_note_not_a_failed_epoch(tmp_path, reference, monkeypatch):
    from slurm_elastico.interference import online

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(online, "refine", broken)
    model = train(reference, TrainConfig(hidden=8, epochs=20, use_family=False), seed=0)
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", model, str(tmp_path / "iac.pt"), reference, refine_batch=1)
        progress, _, notes = alone_then_shared(observer, tmp_path)[-1]
        assert progress == {1: 72, 2: 25}
        assert "predictor not refined this epoch (its weights are as before): out of memory" in notes
        assert len(load_from_store(store, source="observed")) == 1  # the observation is kept all the same


def test_sched_refuses_a_reference_file_it_cannot_read_naming_the_setting(tmp_path):
    from click.testing import CliRunner

    from slurm_elastico.cli import main

    conf = tmp_path / "elastico.yaml"
    conf.write_text(f"state_dir: {tmp_path / 'state'}\ninterference: {{reference: {tmp_path / 'gone.csv'}}}\n")
    result = CliRunner().invoke(main, ["--config", str(conf), "sched", "--once", "--dry-run"])
    assert result.exit_code == 2
    assert "interference.reference" in result.output and "gone.csv: cannot read it" in result.output
    assert "no model is refined" in result.output  # a reference without a model is pointless: said so


def test_the_planner_gets_the_speeds_a_job_measured_alone_and_its_other_shapes_move_alike(tmp_path):
    # FAM estimates mps50-0 at 2.0/s and mps100-1 at 3.0/s; job 1 runs mps50-0 alone at 1.0/s (half the
    # estimate): the planner then sees mps50-0 at 1.0 and mps100-1 at 1.5. Under 10 s measured: the estimate.
    d = tmp_path / "w1"
    a = job(1, 0, 50, work_dir=str(d))
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100")
        seen = []
        for done, at in ((10, T0), (15, T0 + 5), (30, T0 + 20)):
            write_progress(progress_path(d, 1), report(done, at, "mps50-0"))
            _, fams, _ = observer(snap(a), {1: FAM}, dry_run=False, source=Families())
            seen.append({s.name: s.throughput for s in fams[1].shapes})
        assert seen[0] == seen[1] == {s.name: s.throughput for s in FAM.shapes}  # 0 s, then 5 s: too short
        assert seen[2] == pytest.approx({"mps50-0": 1.0, "mps100-1": 1.5})


def test_an_unmeasured_solo_speed_is_estimated_from_the_familys_figure_and_judged_time_is_taken_off():
    beside = {(1, "mps50-0", 2, "mps50-0"): (13.0, 10.0), (2, "mps50-0", 1, "mps50-0"): (10.0, 10.0),
              (3, "gone", 1, "mps50-0"): (1.0, 10.0)}
    solo = {(1, "mps50-0"): 2.5}
    # job 1 was measured alone: no estimate; job 2's figure is its family's; a shape the family lost has none
    assert estimated_solo(beside, solo, {1: FAM, 2: FAM, 3: FAM}) == {(2, "mps50-0"): 2.0}
    assert estimated_solo(beside, solo, {1: FAM}) == {}  # job 2's family is unknown
    judged = {(2, "mps50-0", 1, "mps50-0"): (4.0, 6.0)}
    assert unjudged(beside, judged) == {**beside, (2, "mps50-0", 1, "mps50-0"): (6.0, 4.0)}
    assert unjudged(beside, {k: (99.0, 99.0) for k in beside}) == {k: (0.0, 0.0) for k in beside}
