"""GPU counters during a job's run: the report elastico-run writes (fake NVML here: no GPU) and what the helper
does with them (solo counters per shape, measured shapes in the planner and in observations)."""

import dataclasses
import math
import sys
import time

import pytest

from slurm_elastico.helper.epoch import run_once
from slurm_elastico.helper.observer import ProgressObserver
from slurm_elastico.interference.measurements import load_from_store
from slurm_elastico.model import Counters
from slurm_elastico.helper.observe import observe, with_measured
from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.runtime.counters import CounterRecorder, counters_path, gpu_of, read_counters, write_counters
from slurm_elastico.runtime.progress import ReportError, progress_path
from slurm_elastico.shapes.solo import solo_profile
from slurm_elastico.store import Store
from test_interference_nvml import _fake_pynvml, _no_nvml
from test_observe import FAM, T0, alone_then_shared, job, report, snap


@pytest.mark.parametrize("env, gpu", [
    ({}, None),
    ({"CUDA_VISIBLE_DEVICES": ""}, None),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None),
    ({"CUDA_VISIBLE_DEVICES": "0"}, 0),
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, 2),
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f2a,GPU-1"}, "GPU-8f2a"),
])
def test_which_gpu_a_job_watches(env, gpu):
    assert gpu_of(env) == gpu


def test_a_counters_report_round_trips_and_a_bad_one_is_refused(tmp_path):
    path = counters_path(tmp_path, 9)
    assert path == progress_path(tmp_path, 9).with_name("counters.json")
    assert read_counters(path) is None
    write_counters(path, Counters(0.5, math.nan, 1024.0, 200.0), 10.0, 20.0)
    c, since, updated = read_counters(path)
    assert (c.sm_util, c.mem_used_mib, c.power_w, since, updated) == (0.5, 1024.0, 200.0, 10.0, 20.0)
    assert math.isnan(c.membw_util)
    path.write_text('{"version": 1, "sm_util": 1.5, "since": 0, "updated": 1}')
    with pytest.raises(ReportError, match="sm_util = 1.5"):
        read_counters(path)


def test_the_recorder_writes_the_means_of_each_window(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    path = tmp_path / "counters.json"
    rec = CounterRecorder(path, 0, every_s=0.05, interval_s=0.01).start(42)
    deadline = time.time() + 5
    while read_counters(path) is None and time.time() < deadline:
        time.sleep(0.01)
    rec.stop()
    c, since, updated = read_counters(path)
    assert (c.sm_util, c.membw_util, c.mem_used_mib, c.power_w) == pytest.approx((0.30, 0.20, 1024, 250))
    assert since < updated
    assert len(rec.sampler.samples) == 0  # what was reported is not kept: a job may run for days


def test_without_a_gpu_the_recorder_writes_nothing_and_never_raises(tmp_path, monkeypatch):
    _no_nvml(monkeypatch)
    rec = CounterRecorder(tmp_path / "counters.json", 0, every_s=0.01).start(42)
    time.sleep(0.05)
    rec.stop()
    assert not (tmp_path / "counters.json").exists()


MEASURED = Counters(0.7, 0.4, 3000.0, 180.0)


def test_counters_count_only_when_taken_alone_after_the_warm_up():
    alone = snap(job(1, 0, 50), job(2, 1, 50, start=T0 + 10))
    prev = observe(alone, {1: FAM, 2: FAM}, {1: report(10, T0), 2: report(0, T0 + 11)}, {}).readings
    counters = {1: (MEASURED, T0 + 1, T0 + 15),   # job 1 started at T0 - 100: its window is after its warm-up
                2: (MEASURED, T0 + 11, T0 + 15)}  # job 2 started at T0 + 10: inside its warm-up
    out = observe(alone, {1: FAM, 2: FAM}, {1: report(40, T0 + 20), 2: report(20, T0 + 31)}, prev, counters)
    assert [(j, s) for j, s, _ in out.solo_counters] == [(1, "mps50-0")]


def test_a_counter_nvml_did_not_give_keeps_the_guess():
    fams = with_measured({1: FAM}, {(1, "mps50-0"): Counters(0.7, math.nan, math.nan, 180.0)})
    profile = solo_profile(fams[1].shape("mps50-0"), "train")
    assert (profile.sm_util, profile.membw_util, profile.mem_used_mib) == (0.7, 0.25, 1000.0)  # 0.5 x share 50; GPU MiB


def test_the_planners_profile_is_the_constructors_field_for_field():
    """`solo_profile` builds its profile without the dataclass constructor (`SoloProfile.of`, for speed), which
    checks no field name: every name it sets must be a field, and the profile equal, hash and print as the
    constructor's from the same values (field by field as a tuple: Python 3.13's dataclass `==` holds a NaN field
    unequal to itself)."""
    fams = with_measured({1: FAM, 2: FAM}, {(1, "mps50-0"): Counters(0.7, math.nan, math.nan, 180.0)})
    names = {f.name for f in dataclasses.fields(SoloProfile)}
    for shape, kind in ((fams[1].shape("mps50-0"), "train"), (fams[2].shape("mps50-0"), "train"),
                        (fams[2].shape("mps50-0"), "infer")):
        p = solo_profile(shape, kind, "fam")
        assert set(vars(p)) <= names
        q = SoloProfile(**{n: getattr(p, n) for n in names})
        assert dataclasses.astuple(p) == dataclasses.astuple(q) and hash(p) == hash(q) and repr(p) == repr(q)


def test_a_measured_shape_gives_its_counters_to_the_planner_and_to_observations():
    fams = with_measured({1: FAM, 2: FAM}, {(1, "mps50-0"): MEASURED})
    measured, guessed = fams[1].shape("mps50-0"), fams[2].shape("mps50-0")
    assert measured.measured == MEASURED and guessed.measured is None
    profile = solo_profile(measured, "train")
    assert (profile.sm_util, profile.membw_util, profile.mem_used_mib, profile.power_w) == (0.7, 0.4, 3000.0, 180.0)
    assert solo_profile(guessed, "train").sm_util == pytest.approx(0.45)  # the guess: 0.9 x share 50


def test_the_observer_keeps_solo_counters_and_hands_the_planner_measured_shapes(tmp_path):
    def counters_of_job_1(at, d1, d2):
        if at == T0 + 20:
            write_counters(counters_path(d1, 1), MEASURED, T0 + 5, T0 + 19)

    with Store(tmp_path / "s.sqlite") as store:
        _, fams, _ = alone_then_shared(ProgressObserver(store, "p100"), tmp_path, counters_of_job_1)[-1]
        assert fams[1].shape("mps50-0").measured == MEASURED and fams[2].shape("mps50-0").measured is None
        (obs,) = load_from_store(store, source="observed")
        assert obs.a.sm_util == pytest.approx(0.7) and obs.b.sm_util == pytest.approx(0.45)


def test_run_once_plans_with_the_measured_counters(tmp_path):
    from slurm_elastico.config import Settings
    from slurm_elastico.interference.base import ContentionModel

    class Recording(ContentionModel):
        """The planner's model, noting every profile it is asked about."""

        def __init__(self):
            super().__init__()
            self.seen = []

        def predict_matrix(self, profiles):
            self.seen.extend(profiles)
            return super().predict_matrix(profiles)

        def predict(self, a, b):
            self.seen.extend(a)
            return super().predict(a, b)

    class Gateway:
        def __init__(self, snap):
            self.snap = snap

        def snapshot(self):
            return self.snap

        def argv_for(self, action):
            return []

    def counters_of_job_1(at, d1, d2):
        if at == T0 + 20:
            write_counters(counters_path(d1, 1), MEASURED, T0 + 5, T0 + 19)

    with Store(tmp_path / "s.sqlite") as store:
        observer = ProgressObserver(store, "p100")
        alone_then_shared(observer, tmp_path, counters_of_job_1)
        shared = snap(job(1, 0, 50, work_dir=str(tmp_path / "w1")), job(2, 0, 50, start=T0 + 25,
                                                                           work_dir=str(tmp_path / "w2")))

        class Both:
            def families(self, job_ids):
                return {j: FAM for j in job_ids}, []

        model = Recording()
        run_once(Gateway(shared), Settings(), Both(), model, None, T0 + 50, dry_run=True, observer=observer)
    assert any(p.sm_util == pytest.approx(0.7) and p.power_w == pytest.approx(180.0) for p in model.seen)
