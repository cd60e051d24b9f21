#!/usr/bin/env python3
"""The demo's training job: the tiny transformer LM of wrappers/examples/train_tiny.py, paced like an emulated GPU.

Each optimizer step really runs (tiny model, CPU) and is then padded to the
time the simulator's truth gives the emulated app (`--emulate`, JSON of
`slurm_elastico.cluster.pacing.Emulated`) at the job's current micro-batch,
MPS share and co-runners (see slurm_elastico/cluster/pacing.py), or, for a
shape of several data-parallel ranks (one srun task each, started by
elastico-run), the truth's gang speed on the job's GPUs: rank 0 paces and
prints, the others follow it through the step's collectives. Under
`elastico-run` the shape comes from the ELASTICO_* variables; submitted with
plain sbatch it is `--micro-batch` of `--global-batch`, on a whole GPU. On
SIGUSR1/SIGTERM it finishes the step, checkpoints and exits 75. The last line
printed is a JSON summary (status, step, seconds padded).
"""

from __future__ import annotations

import time

PROGRAM_START = time.time()  # before the imports: start-up overlaps the emulated work (cluster.pacing.origin)

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from slurm_elastico.cluster import pacing
from slurm_elastico.errors import ElasticoError
from slurm_elastico.runtime import checkpoint_dir, current_train_shape, install_signal_handlers
from slurm_elastico.runtime.shape import TrainShape
from slurm_elastico.runtime.tinylm import TinyConfig, build_tiny_lm, lm_loss, synthetic_tokens
from slurm_elastico.runtime.train import train

CONFIG = TinyConfig(vocab_size=64, max_positions=32, d_model=32, n_heads=2, n_layers=2, d_ff=64)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--emulate", required=True, help="the emulated job, JSON of slurm_elastico.cluster.pacing.Emulated")
    p.add_argument("--pace-dir", required=True, help="directory where paced jobs publish what they are to co-runners")
    p.add_argument("--refresh-s", type=float, default=5.0, help="seconds between reads of the job's allocation")
    p.add_argument("--ckpt-dir", help="checkpoint directory (default: $ELASTICO_CKPT_DIR or ./elastico-ckpt)")
    g = p.add_argument_group("shape when not run under elastico-run (no ELASTICO_KIND)")
    g.add_argument("--global-batch", type=int, default=12)
    g.add_argument("--micro-batch", type=int, default=12)
    g.add_argument("--steps", type=int, default=60)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()  # first: a signal during start-up must not kill the job
    try:
        if os.environ.get("ELASTICO_KIND"):
            shape = current_train_shape()
        else:
            shape = TrainShape(args.global_batch, args.micro_batch, args.global_batch // args.micro_batch,
                               steps=args.steps, name="sbatch")
        job = pacing.Emulated.from_json(args.emulate)
        main_rank = os.environ.get("RANK", "0") == "0"  # torch's env:// rank; absent: the only one
        pacer = pacing.from_environment(job, pacing.Knobs(micro_batch=shape.micro_batch, ranks=shape.ranks),
                                        Path(args.pace_dir), PROGRAM_START,
                                        refresh_s=args.refresh_s) if main_rank else None
    except ElasticoError as exc:
        print(f"train_paced: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # many jobs share a few cores
    model = build_tiny_lm(CONFIG, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, eps=1e-6)
    data = synthetic_tokens(1024, 16, CONFIG.vocab_size, seed=1)
    if pacer is not None:
        print(f"train_paced: shape {shape.name}: micro {shape.micro_batch} x {shape.accumulation} x {shape.ranks} "
              f"rank(s) = {shape.global_batch}, {shape.steps} steps, emulating {job.app}", flush=True)

    def on_step(step: int, loss: float) -> None:
        if pacer is None:
            return
        pacer.pad()
        print(f"step {step}/{shape.steps} share {pacer.current.share} co-runners {len(pacer.current.others)} "
              f"rate {pacer.speed:.3f}/s", flush=True)

    started = time.perf_counter()
    result = train(model, optimizer, shape, data, lm_loss, ckpt_dir=args.ckpt_dir or checkpoint_dir(), on_step=on_step)
    if pacer is None:
        return result.exit_code
    print(json.dumps({"status": result.status, "step": result.step, "steps": shape.steps, "shape": shape.name,
                      "steps_run": result.steps_run, "resumed_from": result.resumed_from,
                      **pacing.finish(pacer, Path(args.pace_dir), result.status == "checkpointed"),
                      "run_seconds": round(time.perf_counter() - started, 3)}), flush=True)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
