"""Reshape overhead on a live local Slurm cluster: signal → checkpoint → running again with the new shape.

Run from the repo root (as root: the local cluster runs its daemons as root):

    python benchmarks/reshape.py [--quick] [--reps N] [--state-dir DIR] [--port-base N]

It uses the cluster in $ELASTICO_CLUSTER_DIR if that is set (started if it is
not running), else brings one up in a temporary directory on --port-base
(default 18817, beside a developer's cluster on the default ports) and stops it
at the end. One training job (wrappers/examples/train_tiny.py under
elastico-submit) is reshaped the way the helper does it, N times each way:

  requeue   AdminComment, then requeuehold → SIGTERM → checkpoint, exit 75 →
            Gres=mps:N → StartTime=now → release (new share)
  in place  AdminComment, then `scancel --signal=USR1 --batch` (same share)

and a plain bash job without checkpointing is moved with the same requeue
(baseline: what Slurm alone costs). A job on a family with GPU counts
[1, 2, 4] is moved between whole-GPU counts the same way (AdminComment, then
`requeue_with_gpus`: requeuehold → SIGTERM to every rank → Gres=gpu:N → StartTime=now
→ release), 1 → 2 and 2 → 4 (and back to 1, untimed, between repetitions), its n ranks started as
one srun step by elastico-run (`slurm_elastico.jobwrap.ranks`). Its program
is a stand-in rank (Python, no torch) that prints when it is up and exits 75
on SIGTERM at once, so the figure is the launcher's and Slurm's part; a real
program adds its own checkpoint write (the `checkpoint save` column of the
requeue row, for the tiny model) and start-up. On a cluster of two GPU types
(one this benchmark starts has t4 on n1-n2 and a100 on n3-n4) the training
job is moved between them N times (`requeue_with_gpus` with the type:
Gres=gpu:TYPE:1), and its final parameters are compared with an unmoved
run's: `type_move_s` (median seconds to the program running again) and
`type_move_max_rel_diff` (0 = bit-identical) in the JSON; null on a cluster of
one type. Times are from the moment the
helper acts, read off the job's output (polled every 20 ms). Prints a table,
then one line of JSON with the figures.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from slurm_elastico import jsonout
from slurm_elastico.cli.submit import submit
from slurm_elastico.cluster import STATE_DIR_ENV, LocalCluster
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.runner import SubprocessRunner

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "wrappers" / "examples" / "train_tiny.py"
FAMILY = """kind: train
global_batch: 32
micro_batches: [8, 16]
precisions: [fp32]
checkpointing: [false]
steps: 100000
mps_shares: [25, 50]
default: mb8-fp32-mps25
"""
PLAIN = """#!/bin/bash
echo "start restarts=${SLURM_RESTART_COUNT:-0}"
while true; do sleep 0.1; done
"""
GPU_FAMILY = """kind: train
global_batch: 16
micro_batches: [4]
precisions: [fp32]
checkpointing: [false]
steps: 100000
mps_shares: [100]
gpus: [1, 2, 4]
gpus_per_node: 4
default: mb4-fp32-mps100
"""
RANK = """#!/usr/bin/env python3
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))
signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75))
e = os.environ
print("rank {} of {} up restarts={}".format(e.get("RANK", "0"), e.get("WORLD_SIZE", "1"),
                                             e.get("SLURM_RESTART_COUNT", "0")), flush=True)
while True:
    time.sleep(0.05)
"""
TYPE_FAMILY = """kind: train
global_batch: 32
micro_batches: [8]
precisions: [fp32]
checkpointing: [false]
steps: 60
mps_shares: [100]
default: mb8-fp32-mps100
"""
TYPES = "t4:2,a100:2"
"""The fake GPU types of a cluster this benchmark starts (n1-n2 t4, n3-n4 a100): its type moves go between them."""
GPU_MOVES = (("mb4-fp32-gpus2", 2), ("mb4-fp32-gpus4", 4), ("mb4-fp32-mps100", 1))
"""1 -> 2, 2 -> 4 (timed), 4 -> 1 (untimed: back to the start for the next repetition, if any)."""
POLL_S = 0.02


class Output:
    """A job's output file, read incrementally: wait for a line matching a pattern after a mark."""

    def __init__(self, path: Path):
        self.path = path

    def size(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def wait(self, pattern: str, after: int, timeout: float = 120.0) -> tuple[float, re.Match, int]:
        """Time the first line matching `pattern` appears after byte `after`; also the match and its end offset."""
        rx = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.path.exists():
                with open(self.path, "rb") as f:
                    f.seek(after)
                    text = f.read().decode(errors="replace")
                m = rx.search(text)
                if m:
                    return time.monotonic(), m, after + len(text[:m.end()].encode())
            time.sleep(POLL_S)
        raise TimeoutError(f"{self.path}: no line matching {pattern!r} within {timeout:g} s")


def start_cluster(args) -> tuple[LocalCluster, bool, str]:
    """The cluster, whether this run started it (and so stops it), and its Slurm's version (`slurmd -V`)."""
    if args.state_dir or os.environ.get(STATE_DIR_ENV):
        cluster = LocalCluster.from_state_dir(args.state_dir or None)
    else:
        cluster = LocalCluster(tempfile.mkdtemp(prefix="elastico-bench-"), port_base=args.port_base, gpu_types=TYPES)
    result = cluster.up()
    return cluster, not result.already_running, result.version


def elastico_job(work: Path, env: dict[str, str]) -> int:
    (work / "family.yaml").write_text(FAMILY)
    (work / "elastico.yaml").write_text(f"state_dir: {work / 'state'}\nsubmit: {{placement_window_s: 0, grace_s: 20}}\n")
    out = io.StringIO()
    rc = submit(["--parsable", f"--output={work}/%j.out", "--family", str(work / "family.yaml"), str(TRAIN),
                 "--step-sleep", "0.05"], env={**env, "ELASTICO_CONFIG": str(work / "elastico.yaml")}, out=out)
    if rc != 0:
        raise SystemExit(f"elastico-submit failed with {rc}")
    return int(out.getvalue().split(";")[0])


def gpu_job(work: Path, env: dict[str, str]) -> int:
    (work / "gpus.yaml").write_text(GPU_FAMILY)
    (work / "rank.py").write_text(RANK)
    out = io.StringIO()
    rc = submit(["--parsable", f"--output={work}/%j.out", "--gres=gpu:1", "--nodes=1", "--family",
                 str(work / "gpus.yaml"), str(work / "rank.py")],
                env={**env, "ELASTICO_CONFIG": str(work / "elastico.yaml")}, out=out)
    if rc != 0:
        raise SystemExit(f"elastico-submit failed with {rc}")
    return int(out.getvalue().split(";")[0])


def bench_gpus(gw: SlurmGateway, job: int, out: Output, reps: int) -> dict[str, list[dict[str, float]]]:
    """Seconds from the helper's action to every rank of the new GPU count up, per move ("1->2", "2->4")."""
    rows: dict[str, list[dict[str, float]]] = {"1->2": [], "2->4": []}
    _, _, mark = out.wait(r"^rank 0 of 1 up restarts=0$", 0)
    restarts, held = 0, 1
    for rep in range(reps):
        for shape, gpus in GPU_MOVES if rep + 1 < reps else GPU_MOVES[:2]:  # no way back after the last
            mark, t0, t_stop, _ = helper_move(gw.requeue_with_gpus, gw, job, out, shape, gpus,
                                              r"program exited .* after the stop signal")
            restarts += 1
            t_up = max(out.wait(rf"^rank {r} of {gpus} up restarts={restarts}$", mark)[0] for r in range(gpus))
            key = f"{held}->{gpus}"
            if key in rows:
                rows[key].append({"stop_s": t_stop - t0, "running_s": t_up - t0})
            held = gpus
    return rows


def type_job(work: Path, env: dict[str, str], gpu: tuple[str, ...], name: str) -> int:
    """The tiny training job on one GPU (`gpu`: its sbatch options, a type or a node), deterministic, its
    checkpoints in work/ckpt-`name` (read at the end to compare its parameters)."""
    (work / "types.yaml").write_text(TYPE_FAMILY)
    out = io.StringIO()
    rc = submit(["--parsable", f"--output={work}/%j.out", *gpu, "--family", str(work / "types.yaml"), str(TRAIN),
                 "--deterministic", "--step-sleep", "0.1"],
                env={**env, "ELASTICO_CONFIG": str(work / "elastico.yaml"), "ELASTICO_CKPT_DIR": str(work / f"ckpt-{name}")},
                out=out)
    if rc != 0:
        raise SystemExit(f"elastico-submit failed with {rc}")
    return int(out.getvalue().split(";")[0])


def final_params(directory: Path):
    """The parameters of the last checkpoint in `directory`, one flat float64 tensor."""
    import torch

    from slurm_elastico.runtime.checkpoint import load_latest

    ck = load_latest(directory)
    if ck is None:
        raise SystemExit(f"no checkpoint in {directory}")
    return torch.cat([v.flatten().double() for v in ck.state["model"].values()])


def bench_type_move(gw: SlurmGateway, work: Path, env: dict[str, str], reps: int, jobs: list[int]) -> dict | None:
    """Seconds from the helper's action to the program running again on the other GPU type, `reps` moves back and
    forth (AdminComment, then requeuehold → SIGTERM → checkpoint → the typed update → StartTime=now → release),
    and the largest relative difference of the moved job's final parameters from an unmoved run's (0:
    bit-identical). None on a cluster with fewer than two GPU types.

    The job asks `--gres=gpu:1` (untyped: a typed --gres would limit its family to that type) on a node of the
    first type; each move gives it `Gres=gpu:TYPE:1` where Slurm replaces a request (`gpu_count.TYPED_UPDATE_FROM`),
    and on 22.05, which keeps a job's first type, `ExcNodeList=` of every node of another type."""
    snap = gw.snapshot()
    first: dict[str, str] = {}
    for n in snap.nodes:
        if n.gpu_type:
            first.setdefault(n.gpu_type, n.name)
    types = list(first)[:2]
    if len(types) < 2:
        return None
    gpu = ("--gres=gpu:1", f"--nodelist={first[types[0]]}")
    ref, job = type_job(work, env, gpu, "ref"), type_job(work, env, gpu, "moved")
    jobs += [ref, job]
    out, rows = Output(work / f"{job}.out"), []
    _, m, mark = out.wait(r"starting the program as shape (\S+) ", 0)
    shape = m.group(1)  # "mb8-fp32-mps100", or "...@TYPE" where elastico.yaml names the types
    for i in range(reps):
        source, target = types[i % 2], types[(i + 1) % 2]
        for _ in range(3):  # three steps on this type first
            mark = out.wait(r"^step \d+", mark)[2]
        shape = shape.replace(f"@{source}", f"@{target}")
        t0 = time.monotonic()
        gw.set_admin_comment(job, f"elastico:shape={shape}")
        gw.requeue_with_gpus(job, 1, gpu_type=target)
        t_run, _, after = out.wait(rf"starting the program as shape {re.escape(shape)} ", mark)
        t_step, _, mark = out.wait(r"^step \d+", after)
        on = {n.name: n.gpu_type for n in snap.nodes}
        if any(on.get(node) != target for node in gw.job(job).nodes):
            raise SystemExit(f"job {job} runs on {gw.job(job).nodes} after its move to {target}")
        rows.append({"running_s": t_run - t0, "first_step_s": t_step - t0})
    for j in (ref, job):
        Output(work / f"{j}.out").wait(r"program finished \(exit 0\)", 0, timeout=300)
    a, b = final_params(work / "ckpt-ref"), final_params(work / "ckpt-moved")
    return {"moves": rows, "types": types, "max_rel_diff": float((a - b).abs().max() / a.abs().max())}


def plain_job(work: Path, env: dict[str, str]) -> int:
    (work / "plain.sh").write_text(PLAIN)
    done = subprocess.run(["sbatch", "--parsable", "--requeue", "--open-mode=append", "--gres=mps:25",
                           f"--output={work}/%j.out", str(work / "plain.sh")], env=env, capture_output=True,
                          text=True, timeout=30, check=True)
    return int(done.stdout.split(";")[0])


def helper_move(requeue, gw: SlurmGateway, job: int, out: Output, shape: str, target: int,
                stopped: str) -> tuple[int, float, float, re.Match]:
    """The helper's move: AdminComment, then `requeue(job, target)`; the output mark, start, stop time and match.

    The requeue blocks until the release: it runs aside, so the stop (`stopped`, a pattern) is timed as it lands.
    """
    mark = out.size()
    t0 = time.monotonic()
    gw.set_admin_comment(job, f"elastico:shape={shape}")
    mover = threading.Thread(target=requeue, args=(job, target))
    mover.start()
    t_stop, m, _ = out.wait(stopped, mark)
    mover.join()
    return mark, t0, t_stop, m


def bench_requeue(gw: SlurmGateway, job: int, out: Output, reps: int) -> list[dict[str, float]]:
    rows = []
    targets = [("mb16-fp32-mps50", 50), ("mb8-fp32-mps25", 25)]
    _, _, mark = out.wait(r"^step \d+", 0)
    for i in range(reps):
        shape, share = targets[i % 2]
        mark, t0, t_stop, m = helper_move(gw.requeue_with_share, gw, job, out, shape, share,
                                          r'^\{"status": "checkpointed".*$')
        ckpt_s = json.loads(m.group(0))["checkpoint_seconds"]
        t_run, _, after = out.wait(rf"starting the program as shape {re.escape(shape)} ", mark)
        t_step, _, _ = out.wait(r"^step \d+", after)
        rows.append({"stop_s": t_stop - t0, "checkpoint_s": ckpt_s, "running_s": t_run - t0, "first_step_s": t_step - t0})
    return rows


def bench_in_place(gw: SlurmGateway, job: int, out: Output, reps: int) -> list[dict[str, float]]:
    rows = []
    share = gw.job(job).mps_share  # in place means at the share the job holds now
    current = re.findall(r"starting the program as shape mb(\d+)-", out.path.read_text())[-1]
    order = [f"mb{m}-fp32-mps{share}" for m in (("16", "8") if current == "8" else ("8", "16"))]
    for i in range(reps):
        shape = order[i % 2]
        _, _, mark = out.wait(r"^step \d+", out.size())  # the program is stepping (handlers installed)
        t0 = time.monotonic()
        gw.set_admin_comment(job, f"elastico:shape={shape}")
        gw.signal(job, "USR1")
        t_stop, m, _ = out.wait(r'^\{"status": "checkpointed".*$', mark)
        t_run, _, after = out.wait(rf"starting the program as shape {re.escape(shape)} ", mark)
        t_step, _, _ = out.wait(r"^step \d+", after)
        rows.append({"stop_s": t_stop - t0, "checkpoint_s": json.loads(m.group(0))["checkpoint_seconds"],
                     "running_s": t_run - t0, "first_step_s": t_step - t0})
    return rows


def bench_plain(gw: SlurmGateway, job: int, out: Output, reps: int) -> list[dict[str, float]]:
    rows = []
    out.wait(r"^start restarts=0", 0)
    for i in range(reps):
        mark = out.size()
        t0 = time.monotonic()
        gw.requeue_with_share(job, (50, 25)[i % 2])
        t_run, _, _ = out.wait(rf"^start restarts={i + 1}$", mark)
        rows.append({"running_s": t_run - t0})
    return rows


def summary(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    keys = rows[0].keys() if rows else ()
    return {k: {"median": statistics.median(r[k] for r in rows), "min": min(r[k] for r in rows),
                "max": max(r[k] for r in rows)} for k in keys}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 repetitions of each (under a minute once the cluster is up)")
    p.add_argument("--reps", type=int, default=None, help="repetitions of each path (default 5, --quick 2)")
    p.add_argument("--state-dir", default="", help=f"cluster state directory (default: ${STATE_DIR_ENV}, else a new temporary one)")
    p.add_argument("--port-base", type=int, default=18817, help="ports of a new cluster (default 18817)")
    args = p.parse_args()
    reps = args.reps or (2 if args.quick else 5)
    gpu_reps = 1 if args.quick else reps  # each is three moves (1 -> 2 -> 4 -> 1)
    started = time.monotonic()
    cluster, ours, slurm_version = start_cluster(args)
    env = {**os.environ, **cluster.env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("ELASTICO_CKPT_DIR", None)
    gw = SlurmGateway(SubprocessRunner(env=cluster.env(), timeout=30))
    jobs: list[int] = []
    try:
        with tempfile.TemporaryDirectory(prefix="elastico-reshape-") as tmp:
            work = Path(tmp)
            ej = elastico_job(work, env)
            jobs.append(ej)
            eout = Output(work / f"{ej}.out")
            requeue = bench_requeue(gw, ej, eout, reps)
            in_place = bench_in_place(gw, ej, eout, reps)
            subprocess.run(["scancel", str(ej)], env=env, capture_output=True, timeout=30)
            pj = plain_job(work, env)
            jobs.append(pj)
            plain = bench_plain(gw, pj, Output(work / f"{pj}.out"), reps)
            subprocess.run(["scancel", str(pj)], env=env, capture_output=True, timeout=30)
            gj = gpu_job(work, env)
            jobs.append(gj)
            gpus = bench_gpus(gw, gj, Output(work / f"{gj}.out"), gpu_reps)
            subprocess.run(["scancel", str(gj)], env=env, capture_output=True, timeout=30)
            typed = bench_type_move(gw, work, env, reps, jobs)
    finally:
        if jobs:
            subprocess.run(["scancel", *map(str, jobs)], env=env, capture_output=True, timeout=30)
        if ours:
            cluster.down()
    figures = {"requeue": summary(requeue), "in_place": summary(in_place), "plain_requeue": summary(plain),
               "gpus_1_to_2": summary(gpus["1->2"]), "gpus_2_to_4": summary(gpus["2->4"]),
               "type_move": summary(typed["moves"]) if typed else {}}
    print(f"reshape overhead on the local Slurm cluster, {reps} repetitions each (median [min-max] seconds from the helper's action)")
    print(f"{'path':<36}{'checkpointed, exit':>22}{'checkpoint save':>22}{'running, new shape':>22}{'first step':>22}")

    def cell(fig, key):
        f = fig.get(key)
        return f"{f['median']:.2f} [{f['min']:.2f}-{f['max']:.2f}]" if f else "-"

    for name, label in (("requeue", "requeue, new share (elastico)"), ("in_place", "in place, same share (elastico)"),
                        ("plain_requeue", "requeue, no checkpoint (baseline)"),
                        ("gpus_1_to_2", "GPUs 1 -> 2, every rank up"), ("gpus_2_to_4", "GPUs 2 -> 4, every rank up"),
                        ("type_move", f"GPU type {' <-> '.join(typed['types']) if typed else '(one type)'}")):
        fig = figures[name]
        print(f"{label:<36}{cell(fig, 'stop_s'):>22}{cell(fig, 'checkpoint_s'):>22}{cell(fig, 'running_s'):>22}"
              f"{cell(fig, 'first_step_s'):>22}")
    extra = figures["requeue"]["running_s"]["median"] - figures["plain_requeue"]["running_s"]["median"]
    print(f"elastico's requeue path costs {extra:+.2f} s over a plain requeue until the job runs again "
          f"(first training step: +{figures['requeue']['first_step_s']['median'] - figures['plain_requeue']['running_s']['median']:.2f} s, "
          "mostly the program's own start-up)")
    for name, move in (("gpus_1_to_2", "1 -> 2"), ("gpus_2_to_4", "2 -> 4")):
        print(f"GPU count {move}: every rank up {figures[name]['running_s']['median']:.2f} s after the helper's action "
              f"(target 10 s plus the checkpoint write, {figures['requeue']['checkpoint_s']['median']:.2f} s for the tiny "
              f"model), {figures[name]['running_s']['median'] - figures['plain_requeue']['running_s']['median']:+.2f} s "
              "over a plain requeue")
    type_move_s = figures["type_move"]["running_s"]["median"] if typed else None
    if typed:
        print(f"GPU type move {' <-> '.join(typed['types'])}: the program running again {type_move_s:.2f} s after the "
              f"helper's action (target 10 s), {type_move_s - figures['plain_requeue']['running_s']['median']:+.2f} s "
              f"over a plain requeue; final parameters against an unmoved run: max relative difference "
              f"{typed['max_rel_diff']:.2e}")
    else:
        print("GPU type move: not measured, the cluster has fewer than two GPU types (a cluster this benchmark starts "
              f"has {TYPES})")
    print(f"total {time.monotonic() - started:.0f} s")
    print(jsonout.dumps({"benchmark": "reshape", "quick": args.quick, "slurm_version": slurm_version, "reps": reps,
                         "gpu_reps": gpu_reps, **figures,
                         "requeue_extra_running_s": extra, "type_move_s": type_move_s,
                         "type_move_max_rel_diff": typed["max_rel_diff"] if typed else None}))


if __name__ == "__main__":
    main()
