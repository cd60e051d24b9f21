"""Goodput mode across data-parallel ranks (gloo on the CPU, real processes): the noise scale comes from every
rank's micro-batch gradients, and 2 ranks, stopped and resumed, agree with one process within rounding."""

from __future__ import annotations

import shutil

import torch

from slurm_elastico.runtime import rebatch
from slurm_elastico.runtime.shape import EXIT_CHECKPOINTED, TrainShape
from tests.unit.test_runtime_dp import finish, rel, run_jobs, start

BASE = 32
WORK = 6


def ada(micro: int, accumulation: int, ranks: int) -> TrainShape:
    return TrainShape(micro * accumulation * ranks, micro, accumulation, steps=WORK, ranks=ranks,
                      lr_scaling="adascale", base_batch=BASE, name=f"gb{micro * accumulation * ranks}-r{ranks}")


def test_two_ranks_measure_what_one_process_measures(tmp_path, capsys):
    (one, one_runs), (two, two_runs) = run_jobs(
        (tmp_path / "one", [(ada(8, 8, 1), -1)], 0),
        (tmp_path / "two", [(ada(8, 4, 2), 2), (ada(8, 4, 2), -1)], 0),
    )
    assert [r[0][0] for r in two_runs] == [EXIT_CHECKPOINTED, 0]
    a, b = one_runs[-1][0][1], two_runs[-1][0][1]
    for r in two_runs[-1]:  # every rank counted the same progress
        assert (r[1]["progress"], r[1]["samples"]) == (b["progress"], b["samples"])
    with capsys.disabled():
        print(f"\n  goodput at batch 64 (submitted 32): 1 process {a['step']} steps, progress {a['progress']:.6f},"
              f" noise scale {a['grad_noise_scale']:.4f}; 2 ranks (stopped and resumed) {b['step']} steps,"
              f" progress {b['progress']:.6f}, noise scale {b['grad_noise_scale']:.4f}; params {rel(two, one):.1e}")
    assert a["step"] == b["step"] < WORK and a["samples"] == b["samples"] == 64 * a["step"]
    assert abs(a["grad_noise_scale"] - b["grad_noise_scale"]) <= 1e-4 * a["grad_noise_scale"]
    assert abs(a["progress"] - b["progress"]) <= 1e-6 * WORK
    assert rel(two, one) <= 1e-5


def test_two_ranks_take_a_new_batch_in_process_as_a_relaunch_at_it_would_bit_for_bit(tmp_path):
    # Stopped after 2 steps at 8 x 2 x 2 = 32; from a copy of that checkpoint, relaunched at 8 x 4 x 2 = 64, beside
    # a launch at 32 whose rank 0 finds 64 offered at its first boundary, both ranks going on at it.
    first = finish(start(tmp_path / "ckpt", tmp_path / "launch0", ada(8, 2, 2), 2))
    assert first[0][0] == EXIT_CHECKPOINTED
    shutil.copytree(tmp_path / "ckpt", tmp_path / "relaunch")
    rebatch.offer(tmp_path / "ckpt", ada(8, 4, 2))
    relaunch = start(tmp_path / "relaunch", tmp_path / "launch1-relaunch", ada(8, 4, 2), -1)
    in_process = start(tmp_path / "ckpt", tmp_path / "launch1", ada(8, 2, 2), -1)
    relaunched, ranks = finish(relaunch), finish(in_process)
    assert [(code, r["status"], r["switches"]) for code, r, _ in relaunched] == [(0, "done", 0)] * 2
    assert [(code, r["status"], r["switches"]) for code, r, _ in ranks] == [(0, "done", 1)] * 2
    assert torch.equal(ranks[0][2], relaunched[0][2])
    assert not rebatch.waiting(tmp_path / "ckpt")


def test_three_ranks_on_a_batch_they_do_not_divide_measure_the_noise_of_their_uneven_pieces(tmp_path, capsys):
    # 64 samples on 3 ranks: parts of 22, 21, 21 in micro-batches of at most 8 (8, 8, 6 and 8, 8, 5): each piece's
    # gradient counts at its own weight, and its squared norm in the estimate at its size (`NoiseGauge.measure`).
    # The estimate differs from one process's (8 pieces of 8) only by what other pieces measure: 7 % here,
    # deterministic; the plain mean of the pieces' norms read 13 % high, and weighting every piece as a full one
    # 32 % low and took one step more to the same work.
    three = TrainShape(64, 8, 3, steps=WORK, ranks=3, lr_scaling="adascale", base_batch=BASE, name="gb64-r3")
    assert [three.rank_part(r)[1] for r in range(3)] == [22, 21, 21] and three.micro_count == 9
    (one, one_runs), (uneven, runs) = run_jobs(
        (tmp_path / "one", [(ada(8, 8, 1), -1)], 0),
        (tmp_path / "three", [(three, -1)], 0),
    )
    a, b = one_runs[-1][0][1], runs[-1][0][1]
    with capsys.disabled():
        print(f"\n  goodput at batch 64: 1 process noise scale {a['grad_noise_scale']:.3f} in {a['step']} steps; "
              f"3 ranks (22, 21, 21) {b['grad_noise_scale']:.3f} in {b['step']} steps; params {rel(uneven, one):.1e}")
    assert b["step"] == a["step"] and b["samples"] == 64 * b["step"]
    assert abs(b["grad_noise_scale"] - a["grad_noise_scale"]) <= 0.1 * a["grad_noise_scale"]
