#!/usr/bin/env python3
"""A tiny offline inference job for slurm-elastico: greedy generation for requests.jsonl, journaled per batch.

Run under `elastico-run` it reads its shape (max_num_seqs and the vLLM engine
arguments) from ELASTICO_* variables (see slurm_elastico/runtime/shape.py) and
keeps its journal in ELASTICO_CKPT_DIR; on SIGUSR1/SIGTERM it finishes the
current batch and exits 75 ("relaunch me"); a relaunch skips the journaled
requests. `--engine torch` (default) and `transformers` run on a CPU with a
tiny model built from a config; `--engine vllm --model NAME` is the real path
(needs vLLM and, from its official wheel, a GPU). The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from slurm_elastico.errors import ElasticoError
from slurm_elastico.runtime import checkpoint_dir, current_infer_shape, install_signal_handlers, requested_by
from slurm_elastico.runtime.engines import ENGINES, VllmEngine
from slurm_elastico.runtime.infer import run_inference
from slurm_elastico.runtime.shape import InferShape

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", default=str(HERE / "requests.jsonl"), help="requests JSONL (default: requests.jsonl beside this script)")
    p.add_argument("--journal", help="results journal (default: journal.jsonl in $ELASTICO_CKPT_DIR or ./elastico-ckpt)")
    p.add_argument("--engine", default="torch", choices=sorted(ENGINES))
    p.add_argument("--model", help="model name or path, for --engine vllm")
    p.add_argument("--seed", type=int, default=0, help="weights seed of the tiny CPU engines")
    p.add_argument("--batch-sleep", type=float, default=0.0, help="extra seconds per batch, to make a demo reshape observable")
    p.add_argument("--max-num-seqs", type=int, default=4, help="batch size when not run under elastico-run (no ELASTICO_KIND)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    try:
        shape = current_infer_shape() if os.environ.get("ELASTICO_KIND") else InferShape(args.max_num_seqs, name="manual")
        if args.engine == "vllm":
            if not args.model:
                raise ElasticoError("--engine vllm needs --model")
            engine = VllmEngine(args.model, shape)
        else:
            engine = ENGINES[args.engine](seed=args.seed)
    except ElasticoError as exc:
        print(f"infer_tiny: {exc}", file=sys.stderr)
        return 2
    journal = Path(args.journal) if args.journal else checkpoint_dir() / "journal.jsonl"
    print(f"infer_tiny: shape {shape.name or '-'}: max_num_seqs {shape.max_num_seqs}, engine {engine.name}", flush=True)

    def on_batch(done: int, total: int) -> None:
        print(f"journaled {done}/{total}", flush=True)
        if args.batch_sleep:
            time.sleep(args.batch_sleep)

    started = time.perf_counter()
    try:
        result = run_inference(args.requests, journal, engine, shape, on_batch=on_batch)
    except ElasticoError as exc:
        print(f"infer_tiny: {exc}", file=sys.stderr)
        return 2
    summary = {
        "status": result.status,
        "done": result.done,
        "total": result.total,
        "written": result.written,
        "requested_by": requested_by(),
        "journal": str(journal),
        "run_seconds": round(time.perf_counter() - started, 3),
    }
    print(json.dumps(summary), flush=True)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
