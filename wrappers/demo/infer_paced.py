#!/usr/bin/env python3
"""The demo's inference job: the tiny CPU engine of wrappers/examples/infer_tiny.py, paced like an emulated GPU.

Each batch of requests really runs (tiny LM, greedy) and is journaled; then it
is padded to the time the simulator's decode model gives the emulated engine
(`--emulate`, JSON of `slurm_elastico.cluster.pacing.Emulated`) at the job's
current vLLM arguments (gpu_memory_utilization, max_num_seqs, kv_cache_dtype),
MPS share and co-runners (see slurm_elastico/cluster/pacing.py). The tiny
engine answers at most `--batch-cap` requests at a time whatever max_num_seqs
is (an emulated engine batches continuously, so a checkpoint request waits for
a few requests, not for hundreds); the pace is the truth's requests/s at the
real max_num_seqs. Under `elastico-run` the shape comes from ELASTICO_*;
with plain sbatch from the options. The last line printed is a JSON summary.
"""

from __future__ import annotations

import time

PROGRAM_START = time.time()  # before the imports: start-up overlaps the emulated work (cluster.pacing.origin)

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from slurm_elastico.cluster import pacing
from slurm_elastico.errors import ElasticoError
from slurm_elastico.runtime import checkpoint_dir, current_infer_shape, install_signal_handlers
from slurm_elastico.runtime.engines import ENGINES
from slurm_elastico.runtime.infer import run_inference
from slurm_elastico.runtime.journal import Journal
from slurm_elastico.runtime.shape import InferShape


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--emulate", required=True, help="the emulated job, JSON of slurm_elastico.cluster.pacing.Emulated")
    p.add_argument("--pace-dir", required=True, help="directory where paced jobs publish what they are to co-runners")
    p.add_argument("--requests", required=True, help="requests JSONL")
    p.add_argument("--refresh-s", type=float, default=5.0, help="seconds between reads of the job's allocation")
    p.add_argument("--batch-cap", type=int, default=8, help="requests the tiny engine answers at a time (at most)")
    p.add_argument("--journal", help="results journal (default: journal.jsonl in $ELASTICO_CKPT_DIR or ./elastico-ckpt)")
    g = p.add_argument_group("shape when not run under elastico-run (no ELASTICO_KIND)")
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--kv-cache-dtype", default="auto")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    try:
        if os.environ.get("ELASTICO_KIND"):
            shape = current_infer_shape()
        else:
            shape = InferShape(args.max_num_seqs, args.gpu_memory_utilization, args.kv_cache_dtype, name="sbatch")
        if args.batch_cap < 1:
            raise ElasticoError(f"--batch-cap {args.batch_cap}: must be >= 1")
        job = pacing.Emulated.from_json(args.emulate)
        knobs = pacing.Knobs(gpu_memory_utilization=shape.gpu_memory_utilization or 0.9,
                             max_num_seqs=shape.max_num_seqs, kv_cache_dtype=shape.kv_cache_dtype)
        pacer = pacing.from_environment(job, knobs, Path(args.pace_dir), PROGRAM_START,
                                        refresh_s=args.refresh_s)
    except ElasticoError as exc:
        print(f"infer_paced: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    engine = ENGINES["torch"](seed=0)
    journal = Path(args.journal) if args.journal else checkpoint_dir() / "journal.jsonl"
    print(f"infer_paced: shape {shape.name}: max_num_seqs {shape.max_num_seqs}, emulating {job.app}", flush=True)
    last = {"done": 0}

    def on_batch(done: int, total: int) -> None:
        pacer.pad(done - last["done"])
        last["done"] = done
        print(f"journaled {done}/{total} share {pacer.current.share} co-runners {len(pacer.current.others)} "
              f"rate {pacer.speed:.3f}/s", flush=True)

    started = time.perf_counter()
    # The first batch's count is only known after it: remember where the journal stood.
    last["done"] = len(Journal(journal).done) if journal.exists() else 0
    batched = dataclasses.replace(shape, max_num_seqs=min(shape.max_num_seqs, args.batch_cap))
    result = run_inference(args.requests, journal, engine, batched, on_batch=on_batch)
    print(json.dumps({"status": result.status, "done": result.done, "total": result.total, "written": result.written,
                      "shape": shape.name, **pacing.finish(pacer, Path(args.pace_dir), result.status == "checkpointed"),
                      "run_seconds": round(time.perf_counter() - started, 3)}), flush=True)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
