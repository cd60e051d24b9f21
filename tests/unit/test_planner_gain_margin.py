"""The gain rule's margin for a model without one of its own, and a running job leaving a share for idle GPUs."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import MIN_GAIN, ContentionModel, SoloProfile
from slurm_elastico.interference.probe import Refusals
from slurm_elastico.model import ActionKind, GpuUse, Snapshot
from slurm_elastico.planner import run_epoch
from slurm_elastico.planner.slowdown import UNCALIBRATED_GAIN_MARGIN, PairCache, for_gpu
from tests.synthetic import cluster, family, running, with_users

PAIRS = Path(__file__).resolve().parents[2] / "slurm_elastico" / "sim" / "data" / "gavel_pairs_p100.csv"


def test_the_stand_in_margin_covers_its_measured_error_on_gavels_pairs():
    rows = [r for r in csv.DictReader(PAIRS.open()) if r["norm1"] and r["norm2"]]
    measured = np.array([float(r["norm1"]) + float(r["norm2"]) for r in rows])
    measured = measured[measured > 0]  # pairs that fit
    whole = SoloProfile(kind="train", mps_share=100)
    predicted = 2.0 / float(ContentionModel().predict([whole], [whole])[0])  # the stand-in knows nothing else
    over = predicted - measured
    assert len(measured) > 300
    # the margin is about the stand-in's 95th-percentile over-prediction of a pair's summed fraction
    assert abs(UNCALIBRATED_GAIN_MARGIN - np.percentile(over, 95)) < 0.02
    assert np.percentile(over, 50) > 0.2  # the stand-in is optimistic, not merely noisy


def test_a_model_with_no_margin_gets_the_stand_in_margin_and_none_means_no_interference():
    assert PairCache(ContentionModel()).gain_margin == UNCALIBRATED_GAIN_MARGIN
    assert PairCache(ContentionModel()).margin == 0.0  # the floors' margin stays the model's own
    assert PairCache(None).gain_margin == 0.0


class Calibrated:
    """A trained model's interface, reduced: predictions and its own gain margin."""

    def __init__(self, gain_margin: float):
        self.gain_margin = gain_margin

    def predict(self, a, b):
        return np.ones(len(a))


def test_refusing_some_pairs_keeps_the_stand_in_margin_for_the_others():
    refusals = Refusals()
    refusals.add(SoloProfile(kind="train", model_family="a"), SoloProfile(kind="infer", model_family="b"), now=0.0)
    wrapped = refusals.model(ContentionModel(), now=1.0)
    assert not isinstance(wrapped, ContentionModel) and PairCache(wrapped).per_pair  # margins per pair
    assert PairCache(for_gpu(wrapped, "a100-80g")).gain_margin == UNCALIBRATED_GAIN_MARGIN
    assert PairCache(refusals.model(Calibrated(0.05), now=1.0)).gain_margin == MIN_GAIN  # a trained one: its own


NOW = 100_000.0


def test_a_running_job_on_a_quarter_moves_to_an_idle_gpu_when_that_pays_its_restart():
    nodes = cluster(2, gpus_per_node=2)
    # job 1 runs on a quarter of GPU 0 beside job 2 (three quarters); GPU 1 sits idle
    nodes = with_users(nodes, {("n0000", 0): (GpuUse(1, 25), GpuUse(2, 75))})
    fam = family((25, 0.25, 1000), (100, 1.0, 1000), work=50_000.0)
    jobs = [running(1, "n0000", 0, 25, start=NOW - 3600, shape="mps25-0"),
            running(2, "n0000", 0, 75, start=NOW - 3600, shape="mps75-0")]
    fams = {1: fam, 2: family((75, 0.75, 1000), work=1e9)}
    p = run_epoch(Snapshot(NOW, "24.11.5", nodes, tuple(jobs)), fams, Settings(), ContentionModel(), NOW,
                  progress={1: 1000.0, 2: 0.0})
    move = [a for a in p.actions if a.job_id == 1 and a.kind is ActionKind.RESHAPE_RUNNING]
    assert len(move) == 1 and move[0].share == 100 and move[0].nodes == ("n0000",)
    assert not any(a.kind is ActionKind.SIGNAL for a in p.actions)  # another GPU: a requeue, not a relaunch
    # nearly done: the restart would cost more than the move saves, so it stays
    p = run_epoch(Snapshot(NOW, "24.11.5", nodes, tuple(jobs)), fams, Settings(), ContentionModel(), NOW,
                  progress={1: 49_990.0, 2: 0.0})
    assert not any(a.job_id == 1 for a in p.actions)
