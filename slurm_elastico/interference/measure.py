"""Measure one co-location: run two workloads solo and together on one GPU, return the observation.

A workload is a command (argv, no shell) that does a fixed amount of work on
the GPU and prints its throughput as a line `ELASTICO_THROUGHPUT=<units per
second>` (the last such line counts). Each runs solo under the NVML sampler
(its solo counters become its profile), then both start together on the same
GPU; normalized throughput = together / solo. The GPU's sharing mode (MPS or
time slicing) is whatever the machine has: record it in `gpu_type` if it
matters. Not yet run on a GPU: written and tested against fakes only.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.errors import MeasurementError, NoGpuError
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.interference.nvml import NvmlSampler, gpu_available

_LINE = re.compile(r"^ELASTICO_THROUGHPUT=([-+0-9.eE]+)\s*$", re.MULTILINE)


def parse_throughput(stdout: str, what: str) -> float:
    """The last `ELASTICO_THROUGHPUT=` value a workload printed; > 0."""
    found = _LINE.findall(stdout)
    if not found:
        raise MeasurementError(f"{what} printed no line ELASTICO_THROUGHPUT=<units per second>")
    try:
        value = float(found[-1])
    except ValueError:
        raise MeasurementError(f"{what}: ELASTICO_THROUGHPUT={found[-1]!r} is not a number") from None
    if not value > 0 or math.isinf(value):
        raise MeasurementError(f"{what}: ELASTICO_THROUGHPUT={value:g} must be a positive number")
    return value


def _start(argv: Sequence[str], gpu_index: int) -> subprocess.Popen:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu_index))
    try:
        return subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    except OSError as exc:
        raise MeasurementError(f"cannot start {argv[0]!r}: {exc.strerror}") from None


def _finish(proc: subprocess.Popen, what: str, timeout: float) -> float:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise MeasurementError(f"{what} did not finish within {timeout:g} s") from None
    if proc.returncode != 0:
        tail = err.strip().splitlines()[-3:]
        raise MeasurementError(f"{what} exited with {proc.returncode}: {' | '.join(tail)}")
    return parse_throughput(out, what)


def measure_pair(cmd_a: Sequence[str], cmd_b: Sequence[str], profile_a: SoloProfile, profile_b: SoloProfile,
                 gpu_type: str, gpu_index: int = 0, timeout: float = 1800.0,
                 interval_s: float = 0.5) -> Colocation:
    """Runs a solo, b solo, then both together on GPU `gpu_index`; the profiles gain throughput and counters."""
    ok, detail = gpu_available(gpu_index)
    if not ok:
        raise NoGpuError(f"`elastico iac measure` needs an NVIDIA GPU: {detail}")
    solo = []
    for argv, profile, name in ((cmd_a, profile_a, "workload a (solo)"), (cmd_b, profile_b, "workload b (solo)")):
        sampler = NvmlSampler(gpu_index, interval_s)
        proc = _start(argv, gpu_index)
        sampler.watch(proc.pid)
        with sampler:
            tput = _finish(proc, name, timeout)
        solo.append(replace(profile, throughput=tput, **sampler.summary()))
    procs = [_start(cmd_a, gpu_index), _start(cmd_b, gpu_index)]
    # Drain both pipes at once: a workload blocked on a full pipe would run slower and bias its figure.
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(_finish, p, f"workload {n} (together)", timeout) for p, n in zip(procs, "ab")]
        together = [f.result() for f in futures]
    norm_a, norm_b = (together[0] / solo[0].throughput, together[1] / solo[1].throughput)
    return Colocation(gpu_type, solo[0], solo[1], norm_a, norm_b, True, "elastico iac measure")


def describe(obs: Colocation) -> str:
    """One line of what `elastico iac measure` measured: each workload's solo speed and its normalized speed."""
    return (f"a: solo {obs.a.throughput:.4g}/s, normalized {obs.norm_a:.3f}; "
            f"b: solo {obs.b.throughput:.4g}/s, normalized {obs.norm_b:.3f}")
