"""Ground truth's multi-GPU speed (`gang_speed`, `rigid_speed`) against rows of the bundled Pollux placements."""

from __future__ import annotations

import csv
import gzip
import math

import pytest

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.datafiles import DATA
from slurm_elastico.sim.step_times import slurm_placement
from slurm_elastico.sim.truth import GroundTruth

APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


@pytest.fixture(scope="module")
def truth() -> GroundTruth:
    return GroundTruth()


@pytest.fixture(scope="module")
def rows() -> dict[tuple[str, str, int], tuple[float, float]]:
    """(app, placement digits, per-GPU batch) → (step, sync) as bundled, placement rows only."""
    with gzip.open(DATA / "pollux_placements.csv.gz", "rt", newline="") as f:
        return {(r["app"], r["placement"], int(r["local_bsz"])): (float(r["step_time"]), float(r["sync_time"]))
                for r in csv.DictReader(f) if r["placement"]}


def test_bundle_covers_both_pollux_files(rows):
    with gzip.open(DATA / "pollux_placements.csv.gz", "rt", newline="") as f:
        all_rows = list(csv.DictReader(f))
    assert {r["app"] for r in all_rows} == set(APPS)
    scal = [r for r in all_rows if not r["placement"]]
    assert {int(r["num_nodes"]) for r in scal} == {6, 8, 12, 16}
    for r in all_rows:
        assert float(r["step_time"]) >= float(r["sync_time"]) > 0
        if r["placement"]:
            assert int(r["num_nodes"]) == len(r["placement"])
            assert int(r["num_replicas"]) == sum(map(int, r["placement"]))


def test_measured_placement_is_the_hand_computed_row(truth, rows):
    step, sync = rows[("cifar10", "24", 513)]
    # 6 GPUs at 513 samples each: one micro-step, the measured step time.
    assert truth.gang_speed("cifar10", 6 * 513, (4, 2)) == pytest.approx(1 / step, rel=1e-12)
    assert truth.gang_speed("cifar10", 6 * 513, (2, 4)) == truth.gang_speed("cifar10", 6 * 513, (4, 2))
    assert truth.gang_speed("cifar10", 6 * 513, (0, 2, 4, 0)) == truth.gang_speed("cifar10", 6 * 513, (2, 4))
    # 2048 per GPU on (4, 4): two micro-steps of the largest measured batch (1024), one all-reduce.
    step, sync = rows[("cifar10", "44", 1024)]
    assert truth.gang_speed("cifar10", 8 * 2048, (4, 4)) == pytest.approx(1 / (2 * (step - sync) + sync), rel=1e-12)
    # An explicit micro-batch: 514 per GPU in ceil(514 / 257) = 2 micro-steps of 257.
    step, sync = rows[("cifar10", "44", 257)]
    assert truth.gang_speed("cifar10", 8 * 514, (4, 4), micro=257) == pytest.approx(1 / (2 * (step - sync) + sync),
                                                                                    rel=1e-12)


def test_one_gpu_gang_matches_the_single_gpu_rows(truth, rows):
    for app in APPS:
        for (a, p, b), (step, _) in rows.items():
            if a == app and p == "1":
                assert truth.gang_speed(app, b, (1,)) == pytest.approx(1 / step, rel=1e-12)


def test_more_ranks_at_a_fixed_global_batch_is_the_measured_speedup(truth, rows):
    # cifar10 at global batch 2048: 512 per GPU on (4,), 256 on (4, 4); measured at 513 and 257.
    measured = rows[("cifar10", "4", 513)][0] / rows[("cifar10", "44", 257)][0]
    got = truth.gang_speed("cifar10", 2048, (4, 4)) / truth.gang_speed("cifar10", 2048, (4,))
    assert measured > 1.4
    assert got == pytest.approx(measured, rel=0.01)
    assert truth.gang_speed("cifar10", 2048, (4, 4, 4, 4)) > truth.gang_speed("cifar10", 2048, (4, 4))


@pytest.mark.parametrize("app", APPS)
def test_the_same_ranks_over_more_nodes_is_slower(truth, rows, app):
    b = min(k[2] for k in rows if k[0] == app and k[1] == "4")
    four = truth.gang_speed(app, 4 * b, (4,))
    for split in ("22", "1111"):
        got = truth.gang_speed(app, 4 * b, tuple(int(c) for c in split))
        assert got == pytest.approx(1 / rows[(app, split, b)][0], rel=1e-12)
        assert got < four


def test_unmeasured_placements_are_finite_over_the_workloads(truth):
    batches = set()
    for path in sorted((DATA / "pollux_workloads").glob("workload-*.csv")):
        with path.open(newline="") as f:
            batches |= {(r["application"], int(r["batch_size"])) for r in csv.DictReader(f)}
    assert {a for a, _ in batches} == set(APPS)
    placements = {slurm_placement(g, n) for g in range(1, 65) for n in (1, 2, 3, 4, 8)}
    placements |= {(3, 1) * k for k in range(1, 17)} | {(1, 4, 2), (2, 3, 3, 1, 4)}
    for app, batch in sorted(batches):
        for p in sorted(placements):
            v = truth.gang_speed(app, batch, p)
            assert math.isfinite(v) and v > 0, (app, batch, p)


def test_nodes_are_capped_at_the_measured_sixteen(truth):
    # 20 nodes of 2 GPUs reads as 16 nodes with 40 GPUs, as does 8 nodes of 3 plus 8 of 2 (neither measured; 100
    # per GPU lies between the measured 91 and 129, so the nearest measurement would not give the same figure).
    capped = truth.gang_speed("imagenet", 4000, (2,) * 20)
    assert capped == pytest.approx(truth.gang_speed("imagenet", 4000, (3,) * 8 + (2,) * 8), rel=1e-12)
    assert capped != truth.gang_speed("imagenet", 4000, (4,) * 4 + (3,) * 8)  # 12 nodes, 40 GPUs: another point


def test_rigid_speed_places_gpus_as_slurm_does(truth, rows):
    assert slurm_placement(6) == (4, 2) and slurm_placement(8) == (4, 4) and slurm_placement(6, 2) == (2, 2, 2)
    step, _ = rows[("cifar10", "24", 513)]
    assert truth.rigid_speed("cifar10", 6 * 513, 6) == pytest.approx(1 / step, rel=1e-12)
    assert truth.rigid_speed("cifar10", 6 * 513, 6) != truth.gang_speed("cifar10", 6 * 513, (3, 3))
    assert truth.rigid_speed("cifar10", 6 * 513, 6, gpus_per_node=2) == truth.gang_speed("cifar10", 6 * 513, (2, 2, 2))


@pytest.mark.parametrize("app,batch", [("cifar10", 1024), ("cifar10", 2048), ("cifar10", 3000), ("imagenet", 100),
                                       ("bert", 384), ("ncf", 32768), ("yolov3", 64)])
def test_one_gpu_speeds_are_unchanged(truth, app, batch):
    # The formula of earlier versions on one GPU, from the single-GPU profile.
    p = truth.profile(app)
    step, sync = p.at(batch)
    old = 1.0 / (max(1.0, batch / p.bsz[-1]) * step + sync)
    assert truth.rigid_speed(app, batch, 1) == pytest.approx(old, rel=1e-12)


def test_one_gpu_figures_from_the_profile_file(truth):
    # cifar10,1,1024,0.702093,0.000546886 in pollux_profiles.csv.
    assert truth.rigid_speed("cifar10", 1024, 1) == pytest.approx(1 / (0.702093 + 0.000546886), rel=1e-9)
    assert truth.train_speed("cifar10", 1024, 1024, 100) == pytest.approx(1 / (0.702093 + 0.000546886), rel=1e-9)
    assert truth.gang_speed("cifar10", 1024, (1,)) == pytest.approx(1 / 0.702093, rel=1e-9)


def test_bad_requests_are_named(truth):
    with pytest.raises(ConfigError, match="no measured placements for app 'nosuch'"):
        truth.gang_speed("nosuch", 64, (2,))
    for args in ((64, ()), (64, (0, 0)), (0, (2,)), (64, (-1, 2))):
        with pytest.raises(ConfigError):
            truth.gang_speed("cifar10", *args)
    with pytest.raises(ConfigError):
        truth.gang_speed("cifar10", 64, (2,), micro=0)


def test_apps_measured_on_several_gpus(truth, tmp_path):
    assert all(truth.measured_on_several_gpus(app) for app in APPS)
    assert not truth.measured_on_several_gpus("nosuch")
    (tmp_path / "p.csv").write_text("app,num_nodes,placement,num_replicas,local_bsz,step_time,sync_time\n"
                                    "solo,1,1,1,8,0.5,0.01\nsolo,1,1,1,16,1.0,0.01\n")
    one = GroundTruth(placements=tmp_path / "p.csv")
    assert not one.measured_on_several_gpus("solo") and not one.measured_on_several_gpus("cifar10")
    assert one.gang_speed("solo", 32, (1,)) == pytest.approx(1 / (2 * (1.0 - 0.01) + 0.01))
    # Two measurements span no volume to interpolate in: an unmeasured placement takes the nearest (16 per GPU).
    assert one.gang_speed("solo", 32, (2,)) == pytest.approx(1 / 1.0)
