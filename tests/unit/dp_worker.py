"""One rank of a data-parallel training run for the tests: `python dp_worker.py OUT_DIR DATA_SEED STOP_AFTER STOP_RANK`.

Reads its shape from the ELASTICO_* variables and its rank from torch's env://
variables, exactly as a program under `elastico-run` does, trains the tiny LM
of the training tests, and writes `rank<r>.pt` (its flat parameters) and
`rank<r>.json` (how the run ended) to OUT_DIR. Only rank STOP_RANK's
`should_stop()` says yes, after STOP_AFTER steps of this run (-1: never), so
the other ranks stop only because the ranks agree.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from slurm_elastico.runtime.shape import checkpoint_dir, current_train_shape
from slurm_elastico.runtime.tinylm import TinyConfig, build_tiny_lm, lm_loss, synthetic_tokens
from slurm_elastico.runtime.train import train

CFG = TinyConfig(vocab_size=64, max_positions=32, d_model=32, n_heads=2, n_layers=2, d_ff=64)


def main(out: Path, data_seed: int, stop_after: int, stop_rank: int) -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    shape = current_train_shape()
    model = build_tiny_lm(CFG, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, eps=1e-6)
    done = [0]
    losses: list[float] = []

    def on_step(step: int, loss: float) -> None:
        done[0] += 1
        losses.append(loss)

    result = train(
        model,
        opt,
        shape,
        synthetic_tokens(256, 16, 64, seed=1),
        lm_loss,
        ckpt_dir=checkpoint_dir(),
        data_seed=data_seed,
        should_stop=lambda: rank == stop_rank and stop_after >= 0 and done[0] >= stop_after,
        on_step=on_step,
    )
    out.mkdir(parents=True, exist_ok=True)
    torch.save(torch.cat([p.detach().flatten() for p in model.parameters()]), out / f"rank{rank}.pt")
    (out / f"rank{rank}.json").write_text(
        json.dumps({"status": result.status, "step": result.step, "steps_run": result.steps_run,
                    "resumed_from": result.resumed_from, "losses": losses, "samples": result.samples,
                    "progress": result.progress, "grad_noise_scale": result.grad_noise_scale,
                    "switches": result.switches})
    )
    sys.exit(result.exit_code)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
