"""etc/prolog/elastico-prolog-slurmctld: starts one epoch in the background and returns at once with exit 0."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "etc" / "prolog" / "elastico-prolog-slurmctld"


def fake_elastico(tmp_path: Path, sleep_s: float, code: int = 0) -> Path:
    """An `elastico` that sleeps, then records its arguments (a slow epoch that the prolog must not wait for)."""
    path = tmp_path / "elastico"
    path.write_text(f"#!/bin/sh\nsleep {sleep_s}\necho \"$@\" > {tmp_path / 'called'}\necho output\nexit {code}\n")
    path.chmod(0o755)
    return path


def run(env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([str(SCRIPT)], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True,
                          timeout=30)
    return done, time.monotonic() - started


def test_the_prolog_returns_at_once_and_the_epoch_runs_in_the_background(tmp_path):
    log = tmp_path / "logs" / "prolog.log"
    done, took = run({"ELASTICO_BIN": str(fake_elastico(tmp_path, 1.5, code=1)), "ELASTICO_PROLOG_LOG": str(log)})
    assert done.returncode == 0 and took < 1.0, (done, took)
    deadline = time.monotonic() + 10
    while not (tmp_path / "called").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (tmp_path / "called").read_text().split() == ["sched", "--once"]
    time.sleep(0.2)
    assert "output" in log.read_text()


def test_a_missing_elastico_still_lets_the_job_start(tmp_path):
    done, _ = run({"ELASTICO_BIN": str(tmp_path / "nope"), "ELASTICO_PROLOG_LOG": str(tmp_path / "p.log")})
    assert done.returncode == 0 and "is not executable; no epoch started" in done.stderr


def test_the_script_is_executable():
    assert os.access(SCRIPT, os.X_OK)
