#!/usr/bin/env python3
"""A tiny training job for slurm-elastico: a small transformer LM on a synthetic corpus, seconds on a CPU.

Run under `elastico-run` it reads its shape from ELASTICO_* variables
(see slurm_elastico/runtime/shape.py), resumes from ELASTICO_CKPT_DIR, and on
SIGUSR1/SIGTERM finishes the current optimizer step, checkpoints and exits 75
("relaunch me"). Run by hand without those variables it uses --micro-batch etc.
The last line printed is a JSON summary, with a SHA-256 of the parameters so
a test can compare runs bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import torch

from slurm_elastico.errors import ElasticoError
from slurm_elastico.runtime import checkpoint_dir, current_train_shape, install_signal_handlers, requested_by
from slurm_elastico.runtime.dist import local_device
from slurm_elastico.runtime.shape import TrainShape
from slurm_elastico.runtime.tinylm import TinyConfig, build_tiny_lm, lm_loss, synthetic_tokens
from slurm_elastico.runtime.train import train

CONFIG = TinyConfig(vocab_size=64, max_positions=32, d_model=32, n_heads=2, n_layers=2, d_ff=64)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", help="checkpoint directory (default: $ELASTICO_CKPT_DIR or ./elastico-ckpt)")
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--model-seed", type=int, default=0)
    p.add_argument("--device", default=str(local_device()), help="default: cuda:LOCAL_RANK with CUDA, else cpu")
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step, to make a demo reshape observable")
    p.add_argument("--checkpoint-every", type=int, default=None, help="also checkpoint every N steps")
    p.add_argument("--deterministic", action="store_true", help="deterministic algorithms, one thread (for bit-exact tests)")
    g = p.add_argument_group("shape when not run under elastico-run (no ELASTICO_KIND)")
    g.add_argument("--global-batch", type=int, default=32)
    g.add_argument("--micro-batch", type=int, default=8)
    g.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    g.add_argument("--checkpointing", action="store_true")
    g.add_argument("--steps", type=int, default=20)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()  # first: a signal during start-up must not kill the job
    try:
        if os.environ.get("ELASTICO_KIND"):
            shape = current_train_shape()
        else:
            shape = TrainShape(
                args.global_batch, args.micro_batch, args.global_batch // max(args.micro_batch, 1),
                args.precision, args.checkpointing, args.steps, name="manual",
            )
    except ElasticoError as exc:
        print(f"train_tiny: {exc}", file=sys.stderr)
        return 2
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)
    ckpt_dir = args.ckpt_dir or checkpoint_dir()
    model = build_tiny_lm(CONFIG, seed=args.model_seed).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, eps=1e-6)  # eps: see tests/unit/test_runtime_train.py
    data = synthetic_tokens(1024, 16, CONFIG.vocab_size, seed=1)
    main_rank = os.environ.get("RANK", "0") == "0"  # several ranks (elastico-run's srun step): rank 0 speaks
    say = print if main_rank else (lambda *a, **k: None)
    ranks = f" x {shape.ranks} ranks" if shape.ranks > 1 else ""
    if shape.global_batch % shape.ranks:  # each rank its part (one sample apart), in micro-batches of at most micro
        parts = " + ".join(str(shape.rank_part(r)[1]) for r in range(shape.ranks))
        ranks = f" at most a rank, {shape.ranks} ranks of {parts}"
    say(f"train_tiny: shape {shape.name or '-'}: micro {shape.micro_batch} x {shape.accumulation}{ranks} = "
        f"{shape.global_batch}, {shape.precision}, checkpointing {'on' if shape.checkpointing else 'off'}, "
        f"{shape.steps} steps" + (f" of batch {shape.base_batch} ({shape.lr_scaling} learning rate)"
                                  if shape.adaptive else "") + f", on {args.device}", flush=True)

    def on_step(step: int, loss: float) -> None:
        say(f"step {step}/{shape.steps} loss {loss:.4f}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)

    started = time.perf_counter()
    result = train(model, optimizer, shape, data, lm_loss, ckpt_dir=ckpt_dir, data_seed=args.data_seed,
                   device=args.device, checkpoint_every=args.checkpoint_every, on_step=on_step)
    params = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    summary = {
        "status": result.status,
        "step": result.step,
        "steps_run": result.steps_run,
        "resumed_from": result.resumed_from,
        "requested_by": requested_by(),
        "checkpoint": str(result.checkpoint) if result.checkpoint else None,
        "checkpoint_seconds": round(result.checkpoint_seconds, 4),
        "run_seconds": round(time.perf_counter() - started, 3),
        "loss": result.last_loss,
        "samples": result.samples,
        "progress": result.progress,  # in steps of the submitted batch: `step` unless the family adapts its batch
        "grad_noise_scale": result.grad_noise_scale,
        "switches": result.switches,  # new batches taken in process (goodput mode), without a relaunch
        "params_sha256": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
    }
    say(json.dumps(summary), flush=True)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
