"""Checkpoint save and verified-load time by state size (atomic write + fsync + SHA-256).

Run from the repo root: `python benchmarks/checkpoint.py [--quick] [--dir DIR]`.
DIR should be on the file system the jobs checkpoint to (default: a temporary
directory, often tmpfs or local disk, which flatters a network file system).
Prints a table, then one line of JSON with the figures.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from slurm_elastico import jsonout
from slurm_elastico.runtime.checkpoint import load_latest, save_checkpoint
from slurm_elastico.runtime.tinylm import TinyConfig, build_tiny_lm


def measure(directory: Path, mib: float, repeats: int) -> dict[str, float]:
    """Median save and load seconds for a state of `mib` MiB of float32 (model-like: weights + 2 Adam moments)."""
    n = int(mib * 2**20 / 4 / 3)
    state = {"model": {"w": torch.randn(n)}, "optimizer": {"m": torch.randn(n), "v": torch.rand(n)}}
    saves, loads = [], []
    for step in range(1, repeats + 1):
        t0 = time.perf_counter()
        save_checkpoint(directory, step, state)
        saves.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ckpt = load_latest(directory)
        loads.append(time.perf_counter() - t0)
        assert ckpt is not None and ckpt.step == step
    save_s, load_s = statistics.median(saves), statistics.median(loads)
    return {"mib": mib, "save_s": save_s, "load_s": load_s, "save_mib_s": mib / save_s, "load_mib_s": mib / load_s}


def tiny_example(directory: Path) -> float:
    """Save time of the example job's full checkpoint (TinyLM + AdamW state)."""
    model = build_tiny_lm(TinyConfig(vocab_size=64, max_positions=32, d_model=32, n_heads=2, n_layers=2, d_ff=64))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    times = []
    for step in range(1, 6):
        t0 = time.perf_counter()
        save_checkpoint(directory, step, {"model": model.state_dict(), "optimizer": opt.state_dict()})
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes only (< 1 minute)")
    p.add_argument("--dir", type=Path, help="where to write (default: a temporary directory)")
    args = p.parse_args()
    sizes = [1, 16, 64] if args.quick else [1, 16, 64, 256, 1024]
    repeats = 3 if args.quick else 5
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        rows = [measure(root / f"s{mib}", mib, repeats) for mib in sizes]
        tiny_s = tiny_example(root / "tiny")
    print(f"{'state MiB':>10} {'save s':>9} {'load s':>9} {'save MiB/s':>11} {'load MiB/s':>11}")
    for r in rows:
        print(f"{r['mib']:>10g} {r['save_s']:>9.4f} {r['load_s']:>9.4f} {r['save_mib_s']:>11.0f} {r['load_mib_s']:>11.0f}")
    print(f"example job (train_tiny) checkpoint save: {tiny_s * 1000:.1f} ms")
    print(jsonout.dumps({"benchmark": "checkpoint", "quick": args.quick, "rows": rows, "tiny_example_save_s": tiny_s}))


if __name__ == "__main__":
    main()
