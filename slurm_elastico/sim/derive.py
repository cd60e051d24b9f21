"""Derive the simulator's bundled data files from the public sources (run once, by hand).

`python -m slurm_elastico.sim.derive SOURCE_DIR OUT_DIR`, with SOURCE_DIR the
folder holding `pollux/`, `gavel-colocation/` and `azure-llm-2023/` as their
READMEs describe. The simulator never reads the sources at run time, only
what this writes (small, column-trimmed copies); rerun it to refresh them or
to derive the same files from other measurements. The Alibaba trace states
no license, so it is not bundled: `trace_alibaba.alibaba` reads its original CSV
from a path you give.
"""

from __future__ import annotations

import csv
import gzip
import shutil
import sys
from datetime import datetime
from pathlib import Path

POLLUX_APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _write(path: Path, header: list[str], rows: list[list], gz: bool = False) -> None:
    opener = gzip.open if gz else open
    with opener(path, "wt", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)


def pollux(src: Path, out: Path) -> None:
    """Single-node step times per (app, GPUs, per-GPU batch), and iterations to the end per global batch."""
    prof, iters = [], []
    for app in POLLUX_APPS:
        d = src / "pollux" / "traces" / app
        for r in _rows(d / "placements.csv"):
            if len(r["placement"]) == 1:  # one node: the simulator places a job on one node
                prof.append([app, int(r["placement"]), int(r["local_bsz"]),
                             f"{float(r['step_time']):.6g}", f"{float(r['sync_time']):.6g}"])
        for f in sorted(d.glob("validation-*.csv")):
            rows = _rows(f)
            last = rows[-1]
            iters.append([app, int(f.stem.split("-")[1]), int(float(last["iteration"])),
                          f"{float(last['progress']):.6g}", f"{float(last['metric']):.6g}"])
    _write(out / "pollux_profiles.csv", ["app", "gpus", "local_bsz", "step_time", "sync_time"], prof)
    _write(out / "pollux_iterations.csv", ["app", "global_batch", "iterations", "progress", "metric"], iters)
    workloads = out / "pollux_workloads"
    workloads.mkdir(exist_ok=True)
    for f in sorted((src / "pollux" / "workloads").glob("workload-*.csv")):
        shutil.copyfile(f, workloads / f.name)
    rows = []
    for r in _rows(src / "pollux" / "traces" / "philly.csv"):
        t = datetime.strptime(r["timestamp"], "%Y-%m-%d %H:%M:%S")
        rows.append((t, int(float(r["duration"])), int(r["num_gpus"])))
    rows.sort(key=lambda x: x[0])
    t0 = rows[0][0]
    _write(out / "philly.csv.gz", ["submit_s", "duration_s", "num_gpus"],
           [[int((t - t0).total_seconds()), d, g] for t, d, g in rows], gz=True)
    shutil.copyfile(src / "pollux" / "LICENSE", out / "LICENSE.pollux")


def gavel(src: Path, out: Path) -> None:
    """P100 single-GPU pairs, one row per unordered pair: who slowed whom how much (0,0 = did not fit)."""
    seen, rows = set(), []
    for r in _rows(src / "gavel-colocation" / "throughputs_pairs.csv"):
        if r["gpu_type"] != "p100" or r["scale1"] != "1" or r["scale2"] != "1":
            continue
        a, b = (r["model1"], r["bs1"]), (r["model2"], r["bs2"])
        key = tuple(sorted((a, b)))
        if key in seen:
            continue
        seen.add(key)
        fits = float(r["colo_tput1"]) > 0 or float(r["colo_tput2"]) > 0
        rows.append([a[0], a[1], b[0], b[1], f"{float(r['norm_tput1']):.4f}" if fits else "",
                     f"{float(r['norm_tput2']):.4f}" if fits else ""])
    _write(out / "gavel_pairs_p100.csv", ["model1", "bs1", "model2", "bs2", "norm1", "norm2"], rows)
    shutil.copyfile(src / "gavel-colocation" / "LICENSE", out / "LICENSE.gavel")


def azure(src: Path, out: Path) -> None:
    """Request token counts with seconds from each trace's start, both services in one file."""
    rows = []
    for service in ("conv", "code"):
        recs = _rows(src / "azure-llm-2023" / f"AzureLLMInferenceTrace_{service}.csv")
        t0 = None
        for r in recs:
            t = datetime.strptime(r["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f")
            t0 = t0 or t
            rows.append([service, f"{(t - t0).total_seconds():.2f}", int(r["ContextTokens"]), int(r["GeneratedTokens"])])
    _write(out / "azure_llm.csv.gz", ["service", "t_s", "context_tokens", "generated_tokens"], rows, gz=True)
    shutil.copyfile(src / "azure-llm-2023" / "LICENSE", out / "LICENSE.azure")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m slurm_elastico.sim.derive SOURCE_DIR OUT_DIR", file=sys.stderr)
        return 2
    src, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    pollux(src, out)
    gavel(src, out)
    azure(src, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
