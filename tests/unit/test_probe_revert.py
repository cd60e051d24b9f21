"""Probe and revert in the helper: the observer judges a pair before spending it, refuses and keeps what did not
pay, the epoch undoes it and plans with the refusals (`helper.observer`, `helper.revert`, `helper.epoch`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.errors import ElasticoError
from slurm_elastico.helper.epoch import run_once
from slurm_elastico.helper.journal import Journal
from slurm_elastico.helper.observer import ProgressObserver
from slurm_elastico.helper.revert import undo_actions
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.interference.probe import RefusingModel, Verdict
from slurm_elastico.model import ActionKind, GpuUse, JobState
from slurm_elastico.runtime.progress import Progress, progress_path, write_progress
from slurm_elastico.shapes.solo import solo_profile
from slurm_elastico.store import Store
from tests.synthetic import cluster, family, running, snapshot, with_users
from tests.unit.test_inflight import Fixed, Gateway

T0 = 1_000_000.0
FAM = family((50, 2.0, 1000), (100, 3.0, 1000), work=1000.0)
PROFILE = solo_profile(FAM.shape("mps50-0"), FAM.kind, FAM.name)


class Margin(ContentionModel):
    """The contention model with a gain margin, as a calibrated predictor has."""

    def __init__(self, gain_margin):
        super().__init__()
        self.gain_margin = gain_margin


def job(job_id, gpu, share, start, work_dir):
    shape = "mps50-0" if share == 50 else "mps100-1"
    return replace(running(job_id, "n0000", gpu, share, start=start, shape=shape),
                   gpu_alloc=(("n0000", gpu, share),), work_dir=str(work_dir))


def shared_snapshot(d1, d2, at, n_gpus=1):
    jobs = [job(1, 0, 50, T0 - 100, d1), job(2, 0, 50, T0 + 25, d2)]
    return snapshot(with_users(cluster(n_gpus), {("n0000", 0): (GpuUse(1, 50), GpuUse(2, 50))}), jobs, at)


def steps(root):
    """Jobs 1 and 2 alone (2.0 and 1.0 units/s), then on one GPU for 10 s (1.3 and 0.5 units/s: 0.65 + 0.5 = 1.15)."""
    d1, d2 = root / "w1", root / "w2"
    alone = lambda at: snapshot(cluster(2), [job(1, 0, 50, T0 - 100, d1), job(2, 1, 50, T0 - 100, d2)], at)
    return d1, d2, [(alone(T0), 10, 0, T0), (alone(T0 + 20), 50, 20, T0 + 20),
                    (shared_snapshot(d1, d2, T0 + 25), 60, 20, T0 + 30),  # squeue read as job 2 joined
                    (shared_snapshot(d1, d2, T0 + 40), 73, 25, T0 + 40)]


def write(d1, d2, done1, done2, at):
    write_progress(progress_path(d1, 1), Progress(done1, 1000, at, "mps50-0", 0))
    write_progress(progress_path(d2, 2), Progress(done2, 1000, at, "mps50-0", 0))


def observed(observer, root):
    d1, d2, epochs = steps(root)
    for s, done1, done2, at in epochs:
        write(d1, d2, done1, done2, at)
        out = observer(s, {1: FAM, 2: FAM}, dry_run=False)
    return out


@pytest.mark.parametrize("margin,reverted", [(0.0, False), (0.2, True)])
def test_a_pair_below_one_plus_the_gain_margin_is_refused_and_kept_in_the_store(tmp_path, margin, reverted):
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", Margin(margin))
        _, _, notes = observed(observer, tmp_path)
        assert [v.jobs for v in observer.reverted] == ([(1, 2)] if reverted else [])
        assert observer.refusals.refused(PROFILE, PROFILE, T0 + 41) is reverted
        if not reverted:
            assert any(n.startswith("probe: jobs 1 and 2 together run at 1.15") and "kept" in n for n in notes)
        again = ProgressObserver(store, "p100", Margin(margin))  # the next run of a helper run once per epoch
        assert again.refusals.refused(PROFILE, PROFILE, T0 + 41) is reverted and again.reverted == []


def test_a_floor_is_a_speed_judged_against_the_observed_co_located_speed(tmp_path):
    floored = replace(FAM, throughput_floor=0.6)  # job 2 runs at 0.5 units/s beside job 1
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", Margin(0.0))
        d1, d2, epochs = steps(tmp_path)
        for s, done1, done2, at in epochs:
            write(d1, d2, done1, done2, at)
            observer(s, {1: floored, 2: floored}, dry_run=False)
        (v,) = observer.reverted
        assert "job 2 runs at 0.50 of its solo speed" in v.reason and "below its floor 0.6" in v.reason


@pytest.mark.parametrize("body,says", [('{"a": [1]}', "refusal 0: not a pair of solo profiles"),
                                       ("not json", "Expecting value")])
def test_a_pair_refusal_row_the_helper_did_not_write_is_a_clear_error(tmp_path, body, says):
    with Store(tmp_path / "s.sqlite") as store:
        ProgressObserver(store, "p100")
        store.execute("INSERT INTO pair_refusal (body) VALUES (?)", (body,))
        with pytest.raises(ElasticoError, match=f"pair_refusal table: {says}.*allowed: rows the helper wrote"):
            ProgressObserver(store, "p100")


VERDICT = Verdict((1, 2), ("mps50-0", "mps50-0"), (0.6, 0.5), 1.1, True, "sharing does not gain")


def jobs(tmp_path):
    return list(shared_snapshot(tmp_path, tmp_path, T0).jobs)


def test_the_job_that_joined_last_moves_to_its_fastest_whole_gpu_shape(tmp_path):
    actions, notes = undo_actions([VERDICT], jobs(tmp_path), {1: FAM, 2: FAM}, set(), 100)
    assert [(a.kind, a.job_id, a.share, a.nodes, a.shape, a.text) for a in actions] == [
        (ActionKind.SET_ADMIN_COMMENT, 2, None, (), "mps100-1", "elastico:shape=mps100-1"),
        (ActionKind.RESHAPE_RUNNING, 2, 100, ("n0000",), "mps100-1", None)]
    assert notes == ["revert jobs 1 and 2: sharing does not gain"]
    (_, reshape), _ = undo_actions([VERDICT], jobs(tmp_path), {1: FAM, 2: FAM}, set(), 50)
    assert reshape.share == 50  # a whole GPU in Slurm's share count
    pinned = [jobs(tmp_path)[0], replace(jobs(tmp_path)[1], requeue=False)]  # job 2 cannot move: job 1 does
    assert [a.job_id for a in undo_actions([VERDICT], pinned, {1: FAM, 2: FAM}, set(), 100)[0]] == [1, 1]


@pytest.mark.parametrize("case,says", [
    ("kept", None), ("acted", "is planned this epoch or still in progress"), ("apart", "no longer share a GPU"),
    ("ended", "no longer both running"), ("no whole shape", "neither can be requeued"),
    ("no requeue", "neither can be requeued")])
def test_no_undo_where_there_is_nothing_to_undo_or_the_plan_already_acts(tmp_path, case, says):
    js, fams, acted, verdict = jobs(tmp_path), {1: FAM, 2: FAM}, set(), VERDICT
    if case == "kept":
        verdict = replace(VERDICT, revert=False)
    elif case == "acted":
        acted = {1}
    elif case == "apart":
        js[1] = replace(js[1], gpu_alloc=(("n0000", 1, 50),))
    elif case == "ended":
        js[1] = replace(js[1], state=JobState.PENDING)
    elif case == "no whole shape":
        fams = {j: family((50, 2.0, 1000), (25, 1.0, 1000)) for j in (1, 2)}
    else:
        js = [replace(j, requeue=False) for j in js]
    actions, notes = undo_actions([verdict], js, fams, acted, 100)
    assert actions == []
    assert (notes == []) if says is None else (len(notes) == 1 and says in notes[0])


def test_the_epoch_undoes_a_reverted_pair_journaled_and_plans_with_the_refusals(tmp_path, monkeypatch):
    import slurm_elastico.helper.epoch as epoch
    from slurm_elastico.planner import run_epoch

    seen = []  # the model the planner is handed (the plan itself is the real planner's)
    monkeypatch.setattr(epoch, "run_epoch", lambda *a, **k: seen.append(a[3]) or run_epoch(*a, **k))
    d1, d2, epochs = steps(tmp_path)
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", Margin(0.2))
        for s, done1, done2, at in epochs[:-1]:
            write(d1, d2, done1, done2, at)
            observer(s, {1: FAM, 2: FAM}, dry_run=False)
        s, done1, done2, at = epochs[-1]
        write(d1, d2, done1, done2, at)
        gw = Gateway(s)
        result = run_once(gw, Settings(), Fixed({1: FAM, 2: FAM}), Margin(0.2), Journal(store), at, observer=observer)
        assert isinstance(seen[-1], RefusingModel)  # the planner saw the refusal
        assert (ActionKind.RESHAPE_RUNNING, 2) in gw.did and not any(j == 1 for _, j in gw.did)
        rows = store.query("SELECT kind, status, reason, action FROM journal WHERE job_id = 2 ORDER BY id")
        assert [(r["kind"], r["status"]) for r in rows] == [("set_admin_comment", "done"), ("reshape_running", "done")]
        assert all(r["reason"].startswith("undo a co-location that did not pay") for r in rows)
        assert json.loads(rows[1]["action"])["share"] == 100  # a whole GPU
        assert any(n.startswith("revert jobs 1 and 2") for n in result.plan.notes)


def from_the_queue(root):
    """Job 1 alone (2.0 units/s measured), then job 2 starts from the queue on its GPU, never having run alone:
    10 s side by side at 1.3 and 1.0 units/s (job 2's family figure at its shape is 2.0: 0.65 + 0.5 = 1.15)."""
    d1, d2 = root / "w1", root / "w2"
    alone = lambda at: snapshot(cluster(2), [job(1, 0, 50, T0 - 100, d1)], at)
    return d1, d2, [(alone(T0), 10, None, T0), (alone(T0 + 20), 50, None, T0 + 20),
                    (shared_snapshot(d1, d2, T0 + 25), 60, 0, T0 + 30),  # squeue read as job 2 started
                    (shared_snapshot(d1, d2, T0 + 40), 73, 10, T0 + 40)]


def write_reports(d1, d2, done1, done2, at):
    """Each job's report at `at` (None: the job is not running)."""
    for path, done in ((progress_path(d1, 1), done1), (progress_path(d2, 2), done2)):
        if done is not None:
            write_progress(path, Progress(done, 1000, at, "mps50-0", 0))


def adapting():
    from slurm_elastico.interference.adapt_online import OnlineAdapted
    from test_adapt_online_helper import Flat

    return OnlineAdapted(Flat(), "p100", untrained_margin=0.0, probe_optimism=0.4)


@pytest.mark.parametrize("floor,undone", [(0.6, False), (1.2, True)])
def test_a_probe_started_from_the_queue_is_judged_against_its_familys_figure_charged_and_undone_below_its_floor(
        tmp_path, floor, undone):
    floored = replace(FAM, throughput_floor=floor)  # job 2 runs at 1.0 units/s beside job 1: the floor is a speed
    fams = {1: floored, 2: floored}
    model = adapting()
    d1, d2, epochs = from_the_queue(tmp_path)
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", model, probe_budget=0.5)
        for s, done1, done2, at in epochs[:-1]:
            write_reports(d1, d2, done1, done2, at)
            observer(s, {j: f for j, f in fams.items() if j in {x.job_id for x in s.jobs}}, dry_run=False)
        assert store.query("SELECT probe_gpu_s FROM probe_ledger")[0]["probe_gpu_s"] == 0
        s, done1, done2, at = epochs[-1]
        write_reports(d1, d2, done1, done2, at)
        gw = Gateway(s)
        result = run_once(gw, Settings(), Fixed(fams), Margin(0.0), Journal(store), at, observer=observer)
        # measured the epoch its 10 s side by side were there, and charged to the ledger as a probe
        assert store.query("SELECT probe_gpu_s FROM probe_ledger")[0]["probe_gpu_s"] == pytest.approx(10.0)
        (v,) = [n for n in result.plan.notes if n.startswith(("probe: jobs 1 and 2", "probe: job 2", "revert jobs 1"))]
        assert "job 2's at mps50-0: its family's figure, never measured alone" in v, result.plan.notes
        # a ratio against a figure is no observation: the model and the store learn nothing from it
        assert model.measured == {} and store.query("SELECT COUNT(*) AS n FROM colocation")[0]["n"] == 0
        moved = [j for kind, j in gw.did if kind == ActionKind.RESHAPE_RUNNING]
        if undone:
            assert "job 2 runs at 0.50 of its solo speed beside job 1, below its floor 0.6" in v
            assert moved == [2] and observer.refusals.refused(PROFILE, PROFILE, at + 1)
        else:
            assert "together run at 1.15" in v and "kept" in v
            assert moved == [] and not observer.refusals.refused(PROFILE, PROFILE, at + 1)
        # the next epoch judges only new time: nothing new, no second verdict and no second charge
        observer(s, fams, dry_run=False)
        assert observer.reverted == []
        assert store.query("SELECT probe_gpu_s FROM probe_ledger")[0]["probe_gpu_s"] == pytest.approx(10.0)


def test_a_kept_pair_from_the_queue_is_judged_on_each_new_window_and_observed_once_the_job_ran_alone(tmp_path):
    model = adapting()
    d1, d2, epochs = from_the_queue(tmp_path)
    shared = epochs[-1][0]
    alone2 = lambda at: snapshot(cluster(2), [job(2, 0, 50, T0 + 25, d2)], at)  # job 1 left; job 2 alone, same shape
    epochs += [(shared, 86, 15, T0 + 50),  # another 10 s side by side: 1.3 and 0.5 units/s, below the gain rule now
               (alone2(T0 + 55), None, 15, T0 + 60), (alone2(T0 + 60), None, 35, T0 + 80)]  # alone: 1.0 units/s
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", model, probe_budget=0.5)
        verdicts, charged = [], []
        for s, done1, done2, at in epochs:
            write_reports(d1, d2, done1, done2, at)
            here = {x.job_id for x in s.jobs}
            observer(s, {j: FAM for j in here}, dry_run=False, source=Fixed({1: FAM, 2: FAM}))
            verdicts.append([(v.norms, v.revert) for v in observer.reverted])
            charged.append(store.query("SELECT probe_gpu_s FROM probe_ledger")[0]["probe_gpu_s"])
        # the second window is judged on its own 10 s (job 2 at 0.25 of its figure: 0.65 + 0.25 < 1.1, reverted)
        assert verdicts[4] == [(pytest.approx((0.65, 0.25)), True)]
        # charged once, at its first judgement: a pair kept after it is sharing, not a probe
        assert charged == pytest.approx([0, 0, 0, 10, 10, 10, 10])
        # once job 2 ran alone at that shape, the pair's whole time is an observation against the measured speed
        (pair,) = model.measured.values()
        assert (pair.norm_a, pair.norm_b) == pytest.approx((0.65, 0.75))  # 26/20 / 2.0; 15/20 / 1.0
        assert store.query("SELECT COUNT(*) AS n FROM pair_judged")[0]["n"] == 0


def test_a_pair_whose_solo_speeds_were_both_measured_is_judged_as_before_and_never_marked_judged(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100", Margin(0.0))
        _, _, notes = observed(observer, tmp_path)
        (note,) = [n for n in notes if n.startswith("probe: ")]
        assert note == "probe: jobs 1 and 2 together run at 1.15 (0.65 + 0.50): kept"
        assert store.query("SELECT COUNT(*) AS n FROM pair_judged")[0]["n"] == 0
        assert store.query("SELECT COUNT(*) AS n FROM colocation")[0]["n"] == 1
