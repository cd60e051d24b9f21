"""Data-parallel training through real process groups (gloo, CPU): one process per rank, as `elastico-run` starts them.

Each launch starts WORLD_SIZE processes of `dp_worker.py` with torch's env://
variables and a free port; a relaunch at another world size resumes from the
checkpoint rank 0 wrote. Fp32, deterministic algorithms, one thread per rank.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slurm_elastico.errors import ConfigError
from slurm_elastico.runtime.dist import Membership, membership
from slurm_elastico.runtime.shape import EXIT_CHECKPOINTED, TrainShape
from slurm_elastico.runtime.tinylm import build_tiny_lm, lm_loss, synthetic_tokens
from slurm_elastico.runtime.train import train

WORKER = Path(__file__).with_name("dp_worker.py")
ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
GLOBAL = 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(ckpt: Path, out: Path, shape: TrainShape, stop_after: int = -1, *, data_seed: int = 0, rank_env: bool = True):
    """Start one launch of `shape.ranks` processes; the last rank alone asks to stop after `stop_after` steps (-1: never).

    `rank_env=False` starts one process without any env:// variable: the plain single-process run.
    """
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    base.update(shape.to_env(), ELASTICO_CKPT_DIR=str(ckpt), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    port = str(free_port())
    procs = []
    for rank in range(shape.ranks):
        env = dict(base)
        if rank_env:
            env.update(RANK=str(rank), WORLD_SIZE=str(shape.ranks), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        argv = [sys.executable, str(WORKER), str(out), str(data_seed), str(stop_after), str(shape.ranks - 1)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return shape, out, procs


def finish(launch) -> list:
    """Wait for a started launch; each rank's (exit code, result dict, flat parameters), all checked to agree."""
    shape, out, procs = launch
    ranks = []
    for rank, p in enumerate(procs):
        try:
            output, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode in (0, EXIT_CHECKPOINTED), f"rank {rank} of {shape} exited {p.returncode}:\n{output}"
        ranks.append((p.returncode, json.loads((out / f"rank{rank}.json").read_text()), torch.load(out / f"rank{rank}.pt")))
    for code, result, params in ranks[1:]:  # every rank stopped at the same step, in the same state as rank 0
        assert (code, result["status"], result["step"]) == (ranks[0][0], ranks[0][1]["status"], ranks[0][1]["step"])
        assert torch.equal(params, ranks[0][2])
    return ranks


def run_jobs(*jobs: tuple[Path, list[tuple[TrainShape, int]], int], rank_env: bool = True):
    """Jobs side by side (launch i of each at the same time), each (directory, [(shape, stop_after), ...], data seed)
    on its own checkpoint directory; returns per job rank 0's final parameters and every launch's ranks."""
    runs: list[list] = [[] for _ in jobs]
    for i in range(max(len(launches) for _, launches, _ in jobs)):
        started = [
            (j, start(tmp / "ckpt", tmp / f"launch{i}", *launches[i], data_seed=seed, rank_env=rank_env))
            for j, (tmp, launches, seed) in enumerate(jobs)
            if i < len(launches)
        ]
        for j, launch in started:
            runs[j].append(finish(launch))
    return [(r[-1][0][2], r) for r in runs]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max absolute parameter difference relative to the largest parameter."""
    return ((a - b).abs().max() / b.abs().max()).item()


def shape(micro: int, accumulation: int, ranks: int) -> TrainShape:
    return TrainShape(GLOBAL, micro, accumulation, steps=STEPS, ranks=ranks, name=f"r{ranks}-mb{micro}x{accumulation}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted single-process run (no env:// variables at all) and the same with another data seed."""
    (params, _), (other, _) = run_jobs(
        (tmp_path_factory.mktemp("ref"), [(shape(8, 4, 1), -1)], 0),
        (tmp_path_factory.mktemp("seed1"), [(shape(8, 4, 1), -1)], 1),
        rank_env=False,
    )
    return params, other


def test_reshape_1_2_4_1_ranks_stays_within_rounding(tmp_path, reference, capsys):
    launches = [(shape(8, 4, 1), 2), (shape(4, 4, 2), 1), (shape(8, 1, 4), 2), (shape(32, 1, 1), -1)]
    [(params, runs)] = run_jobs((tmp_path, launches, 0))
    assert [r[0][1]["status"] for r in runs] == ["checkpointed"] * 3 + ["done"]
    assert [r[0][0] for r in runs] == [EXIT_CHECKPOINTED] * 3 + [0]
    assert [r[0][1]["resumed_from"] for r in runs] == [None, 2, 3, 5]
    assert [r[0][1]["steps_run"] for r in runs] == [2, 1, 2, 1]
    reshape_diff, seed_diff = rel(params, reference[0]), rel(reference[1], reference[0])
    with capsys.disabled():
        print(f"\n  ranks 1 -> 2 -> 4 -> 1 (mb 8x4, 4x4, 8x1, 32x1): max rel param diff {reshape_diff:.2e};"
              f" another data seed: {seed_diff:.2e}")
    assert reshape_diff <= 1e-5
    assert seed_diff > 1000 * max(reshape_diff, 1e-8)


def test_three_ranks_on_a_batch_they_do_not_divide_compute_the_one_process_run(tmp_path, reference, capsys):
    # 32 samples on 3 ranks: parts of 11, 11 and 10, each in micro-batches of at most 4 (4, 4, 3 and 4, 4, 2),
    # each weighted by its samples; stopped and resumed at 2 ranks on the way.
    uneven = shape(4, 3, 3)
    assert [uneven.rank_part(r)[1] for r in range(3)] == [11, 11, 10]
    [(params, runs)] = run_jobs((tmp_path, [(uneven, 3), (shape(4, 4, 2), -1)], 0))
    assert [r[0][1]["status"] for r in runs] == ["checkpointed", "done"]
    diff = rel(params, reference[0])
    with capsys.disabled():
        print(f"\n  3 ranks on a batch of 32 (11, 11, 10), then 2: max rel param diff {diff:.2e}")
    assert diff <= 1e-5
    assert rel(reference[1], reference[0]) > 1000 * max(diff, 1e-8)


def test_resume_at_the_same_world_size_is_bit_identical(tmp_path, reference, capsys):
    (straight, _), (resumed, runs) = run_jobs(
        (tmp_path / "straight", [(shape(4, 4, 2), -1)], 0),
        (tmp_path / "resumed", [(shape(4, 4, 2), 3), (shape(4, 4, 2), -1)], 0),
    )
    assert [r[0][1]["resumed_from"] for r in runs] == [None, 3]
    with capsys.disabled():
        print(f"\n  2 ranks, stop at 3 and resume at 2 ranks: max rel param diff {rel(resumed, straight):.2e};"
              f" 2 ranks vs 1 process: {rel(straight, reference[0]):.2e}")
    assert torch.equal(resumed, straight)
    assert rel(straight, reference[0]) <= 1e-5


# --------------------------------------------------------------------------
# membership: pure checks of the env:// variables


def test_membership_defaults_to_one_rank_without_variables():
    assert membership(1, {}) == Membership(0, 1, 0)
    assert membership(2, {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) == Membership(1, 2, 1)


@pytest.mark.parametrize(
    ("ranks", "env", "message"),
    [
        (1, {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "WORLD_SIZE=2 but the shape has ELASTICO_RANKS=1"),
        (2, {}, "WORLD_SIZE=1 but the shape has ELASTICO_RANKS=2"),
        (2, {"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        (2, {"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK is not set"),
        (2, {"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK=2 is not below WORLD_SIZE=2"),
        (2, {"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR is not set"),
    ],
)
def test_bad_rank_variables_are_named(ranks, env, message):
    with pytest.raises(ConfigError) as err:
        membership(ranks, env)
    assert message in str(err.value)


def test_train_refuses_a_world_size_that_is_not_the_shapes_ranks(tmp_path):
    from tests.unit.dp_worker import CFG

    model = build_tiny_lm(CFG, seed=0)
    opt = torch.optim.AdamW(model.parameters())
    env = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    with pytest.raises(ConfigError, match="WORLD_SIZE=2 but the shape has ELASTICO_RANKS=1"):
        train(model, opt, shape(8, 4, 1), synthetic_tokens(64, 16, 64), lm_loss, ckpt_dir=tmp_path, env=env)
    assert not any(tmp_path.iterdir())  # refused before anything was written
