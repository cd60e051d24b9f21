"""Shared by the live tests: submit through elastico-submit into a directory, read job output, reshape like the helper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from slurm_elastico.model import JobState
from slurm_elastico.runtime.progress import progress_path, read_progress
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.runner import SubprocessRunner
from slurm_elastico.store import Store

EXAMPLES = Path(__file__).resolve().parents[2] / "wrappers" / "examples"
BIN = Path(sys.executable).parent
GRACE_S = 3


class Cluster:
    """Submits through elastico-submit (argv, no shell) into `root`, reads job output, reshapes like the helper."""

    def __init__(self, slurm_env: dict[str, str], root: Path, families: dict[str, str], config: str = ""):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "elastico.yaml").write_text(
            f"state_dir: {root / 'state'}\nsubmit: {{placement_window_s: 0, grace_s: {GRACE_S}, signal_lead_s: 60}}\n"
            + config)
        for name, text in families.items():
            (root / name).write_text(text)
        self.env = {**os.environ, **slurm_env, "ELASTICO_CONFIG": str(root / "elastico.yaml"),
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.env.pop("ELASTICO_CKPT_DIR", None)
        self.gateway = SlurmGateway(SubprocessRunner(env=slurm_env, timeout=30))
        self.ids: list[int] = []

    def submit_cmd(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "elastico-submit"), *argv], cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=60)

    def submit(self, family: str, script: Path | str, *args: str, options: tuple[str, ...] = ()) -> int:
        done = self.submit_cmd("--parsable", f"--output={self.root}/%j.out", *options, "--family", family,
                               str(script), *args)
        assert done.returncode == 0, done.stderr
        job_id = int(done.stdout.strip().split(";")[0])
        self.ids.append(job_id)
        return job_id

    def store(self) -> Store:
        """The helper's store (its state directory is `root`/state)."""
        return Store(self.root / "state" / "elastico.sqlite")

    def text(self, job_id: int) -> str:
        p = self.root / f"{job_id}.out"
        return p.read_text(errors="replace") if p.exists() else ""

    def summaries(self, job_id: int) -> list[dict]:
        return [json.loads(line) for line in self.text(job_id).splitlines() if line.startswith('{"status"')]

    def wait_text(self, job_id: int, predicate: Callable[[str], bool], what: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text(job_id)
            if predicate(text):
                return text
            time.sleep(0.2)
        raise AssertionError(f"job {job_id}: timed out waiting for {what}; output so far:\n{self.text(job_id)}")

    def wait_done(self, job_id: int, timeout: float = 120) -> str:
        text = self.wait_text(job_id, lambda t: "program finished (exit 0)" in t or "program failed" in t,
                              "the program to finish", timeout)
        assert "program finished (exit 0)" in text, text
        return text

    def reshape(self, job_id: int, shape: str, share: int) -> None:
        """What the helper does for a running job: the shape first, then the move."""
        self.gateway.set_admin_comment(job_id, f"elastico:shape={shape}")
        self.gateway.requeue_with_share(job_id, share)

    def ckpt(self, job_id: int) -> Path:
        return self.root / ".elastico" / str(job_id)

    def queue(self) -> set[int]:
        out = subprocess.run(["squeue", "--all", "--noheader", "--format=%i"], env=self.env, capture_output=True,
                             text=True, timeout=30, check=True).stdout
        return {int(x) for x in out.split()}

    def cancel_all(self) -> None:
        if self.ids:
            subprocess.run(["scancel", *map(str, self.ids)], env=self.env, capture_output=True, timeout=30)


def wait_for(predicate, what: str, timeout: float = 60.0):
    """Poll `predicate` every 0.2 s until it returns something true (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def step_program(step: str, setup: str = "") -> str:
    """A job program of ELASTICO_STEPS steps that reports its progress through the runtime API (no torch).

    `setup` runs first, `step` (one line) is each step's work. It resumes from its checkpointed step, and on
    SIGUSR1/SIGTERM saves its step and exits 75 (elastico-run's contract)."""
    return f"""#!/usr/bin/env python3
import json, os, signal, sys, time
from slurm_elastico.runtime import report_progress
{setup}
ckpt = os.path.join(os.environ["ELASTICO_CKPT_DIR"], "step")
step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
stop = []
signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
signal.signal(signal.SIGUSR1, lambda s, f: stop.append(s))
total = int(os.environ["ELASTICO_STEPS"])
report_progress(step, total, final=True)
while step < total and not stop:
    {step}
    step += 1
    report_progress(step, total)
open(ckpt, "w").write(str(step))
sys.exit(75 if stop else 0)
"""


KERNEL_S = 0.05
"""Seconds of fake GPU time a step of `fake_gpu_program` takes: a whole GPU runs 20 steps/s."""


def fake_gpu_program(preamble: str = "") -> str:
    """A `step_program` whose every step is a kernel of KERNEL_S seconds on the job's fake GPU: one clock file per
    GPU (in the directory argv[1]) holds when the GPU is next free, so jobs sharing a GPU slow each other, first
    come first served. `preamble`: Python run first."""
    return step_program("work()", setup=f"""
import fcntl

{preamble}
KERNEL_S = {KERNEL_S!r}
clocks = sys.argv[1]  # a directory: one clock file per fake GPU, holding when the GPU is next free
node = os.environ["SLURMD_NODENAME"]
gpu = int((os.environ.get("SLURM_JOB_GPUS") or os.environ["CUDA_VISIBLE_DEVICES"]).split(",")[0])
clock = os.open(os.path.join(clocks, f"{{node}}-{{gpu}}"), os.O_RDWR | os.O_CREAT, 0o600)
print(f"fake GPU {{node}}:{{gpu}}", flush=True)


def work():  # one kernel: the GPU's next free slot of KERNEL_S seconds (first come first served), waited out asleep
    fcntl.flock(clock, fcntl.LOCK_EX)
    try:
        free = float(os.pread(clock, 64, 0) or 0)
        end = max(time.monotonic(), free) + KERNEL_S
        os.pwrite(clock, f"{{end:<24.6f}}".encode(), 0)
    finally:
        fcntl.flock(clock, fcntl.LOCK_UN)
    time.sleep(max(0.0, end - time.monotonic()))""")


def epoch(c: Cluster) -> dict:
    """One `elastico sched --once --json` epoch; its JSON result."""
    done = subprocess.run([str(BIN / "elastico"), "sched", "--once", "--json"], env=c.env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def solo_rates(c: Cluster) -> set[int]:
    """The jobs the helper has a solo speed for."""
    with c.store() as store:
        return {r["job_id"] for r in store.query("SELECT job_id FROM solo_rate")}


def until(c: Cluster, done, what: str, timeout: float = 90) -> None:
    """Helper epochs 6 s apart (a rate needs reports >= 5 s apart, after a 5 s warm-up) until `done(notes)`."""
    deadline = time.monotonic() + timeout
    notes: list[str] = []
    while time.monotonic() < deadline:
        notes = epoch(c)["notes"]
        if done(notes):
            return
        time.sleep(6)
    raise AssertionError(f"no {what} within {timeout:g} s; last epoch's notes: {notes}")


def idle_nodes(c: Cluster, timeout: float = 120) -> tuple[str, str]:
    """Two nodes, once no job runs anywhere: other tests' jobs would share these jobs' GPUs or this machine's CPUs."""
    deadline = time.monotonic() + timeout
    while True:
        snap = c.gateway.snapshot()
        running = sorted(j.job_id for j in snap.jobs if j.state is JobState.RUNNING)
        idle = sorted(n.name for n in snap.nodes if n.usable)
        if not running and len(idle) >= 2:
            return idle[0], idle[1]
        if time.monotonic() > deadline:
            raise AssertionError(f"the cluster did not become idle within {timeout:g} s: jobs {running} still run")
        time.sleep(1)


def wait_report(c: Cluster, job_id: int, restarts: int, timeout: float = 90) -> None:
    """Until the job's run number `restarts` has reported some work done."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = read_progress(progress_path(c.root, job_id))
        if report is not None and report.restarts == restarts and report.done > 0:
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job_id}: no progress report of restart {restarts}; output:\n{c.text(job_id)}")


PLANNED_FAMILY = """kind: train
name: planned-live
global_batch: 32
micro_batches: [8, 32]
precisions: [fp32]
checkpointing: [false]
steps: 1000
mps_shares: [25, 100]
throughput_floor: 0.1
cpus: 1
host_mem_mib: 256
default: mb8-fp32-mps25
declared:
  mb8-fp32-mps25: {throughput: 1.0, gpu_mem_mib: 2000}
  mb32-fp32-mps25: {throughput: 1.1, gpu_mem_mib: 4000}
  mb8-fp32-mps100: {throughput: 3.0, gpu_mem_mib: 2000}
  mb32-fp32-mps100: {throughput: 3.6, gpu_mem_mib: 4000}
"""
"""A family whose best shape is unambiguous (fastest alone on a whole GPU): a helper sets a pending job of it,
submitted at 25 shares, to 100 (set_share 100), with room for all on the test cluster's 16 GPUs."""
