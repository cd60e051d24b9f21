"""The example jobs as processes: a real SIGUSR1/SIGTERM mid-run, exit 75, relaunch with a new shape, same result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastico.runtime.shape import EXIT_CHECKPOINTED, current_shape, runtime_shape, shape_env
from slurm_elastico.shapes import load_family

EXAMPLES = Path(__file__).resolve().parents[2] / "wrappers" / "examples"


def launch(script: str, env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, dict, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, json.loads(out.strip().splitlines()[-1]), out + err


def signal_after(proc: subprocess.Popen, marker: str, sig: signal.Signals) -> None:
    """Send `sig` once the job printed a line starting with `marker` (it is mid-run, handlers installed)."""
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(marker):
            proc.send_signal(sig)
            return
    pytest.fail("job ended before " + marker + ":\n" + "".join(lines))


@pytest.mark.parametrize("name", ["train_tiny.family.yaml", "infer_tiny.family.yaml"])
def test_example_families_parse_and_every_shape_exports_a_readable_environment(name):
    family = load_family(EXAMPLES / name, gpu_memory_mib=81920)
    assert family.shapes
    for planned in family.shapes:
        shape = runtime_shape(family, planned)
        assert current_shape(shape_env(shape)) == shape
        assert shape.name == planned.name


def train_env(ckpt: Path, micro: int, checkpointing: bool = False) -> dict[str, str]:
    from slurm_elastico.runtime.shape import TrainShape

    return {**TrainShape(32, micro, 32 // micro, "fp32", checkpointing, 12, name=f"mb{micro}").to_env(), "ELASTICO_CKPT_DIR": str(ckpt)}


def test_training_example_survives_sigusr1(tmp_path):
    rc, ref, _ = finish(launch("train_tiny.py", train_env(tmp_path / "ref", 8), "--deterministic"))
    assert rc == 0 and ref["status"] == "done" and ref["step"] == 12

    job = tmp_path / "job"
    proc = launch("train_tiny.py", train_env(job, 8), "--deterministic", "--step-sleep", "0.05")
    signal_after(proc, "step 3/", signal.SIGUSR1)
    rc, first, log = finish(proc)
    assert rc == EXIT_CHECKPOINTED, log
    assert first["status"] == "checkpointed" and first["requested_by"] == "SIGUSR1" and 3 <= first["step"] < 12

    rc, last, log = finish(launch("train_tiny.py", train_env(job, 8, checkpointing=True), "--deterministic"))
    assert rc == 0 and last["step"] == 12 and last["resumed_from"] == first["step"], log
    # relaunched with activation checkpointing toggled: bit-identical to the uninterrupted run
    assert last["params_sha256"] == ref["params_sha256"]


def test_inference_example_reshaped_by_signal_matches_uninterrupted(tmp_path):
    from slurm_elastico.runtime.shape import InferShape

    def env(seqs: int) -> dict[str, str]:
        return InferShape(seqs, name=f"seqs{seqs}").to_env()

    rc, ref, _ = finish(launch("infer_tiny.py", env(8), "--journal", str(tmp_path / "ref.jsonl")))
    assert rc == 0 and ref["done"] == ref["total"] == 24

    journal = tmp_path / "job.jsonl"
    proc = launch("infer_tiny.py", env(3), "--journal", str(journal), "--batch-sleep", "0.2")
    signal_after(proc, "journaled 6/", signal.SIGTERM)  # as Slurm sends for a requeue or the time limit
    rc, first, log = finish(proc)
    assert rc == EXIT_CHECKPOINTED and first["requested_by"] == "SIGTERM" and 6 <= first["done"] < 24, log
    rc, second, log = finish(launch("infer_tiny.py", env(16), "--journal", str(journal)))
    assert rc == 0 and second["written"] == 24 - first["done"], log

    def outputs(path: Path) -> dict[str, str]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == len({r["id"] for r in rows})  # each request once
        return {r["id"]: r["text"] for r in rows}

    assert outputs(journal) == outputs(tmp_path / "ref.jsonl")
