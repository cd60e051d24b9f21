"""Atomic checkpoints: a kill -9 mid-save leaves the previous one loadable; damaged files are refused by name."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from slurm_elastico.runtime.checkpoint import (
    CheckpointCorruptError,
    capture_rng,
    committed_steps,
    load_checkpoint,
    load_latest,
    manifest_path,
    restore_rng,
    save_checkpoint,
    state_path,
)

REPO = Path(__file__).resolve().parents[2]


def _state(step: int, n: int = 1000) -> dict:
    return {"w": torch.full((n,), float(step)), "note": f"step {step}"}


def test_round_trip_keeps_state_position_and_rng(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    save_checkpoint(tmp_path, 5, _state(5), data_position=160)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    ckpt = load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 5 and ckpt.data_position == 160
    assert torch.equal(ckpt.state["w"], _state(5)["w"]) and ckpt.state["note"] == "step 5"
    restore_rng(ckpt.rng)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_keeps_the_last_two_and_cleans_leftovers(tmp_path):
    (tmp_path / ".ckpt-00000009.pt.tmp-123").write_bytes(b"half")
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, _state(step))
    assert committed_steps(tmp_path) == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-00000003.json",
        "ckpt-00000003.pt",
        "ckpt-00000004.json",
        "ckpt-00000004.pt",
    ]


def test_truncated_checkpoint_is_refused_by_name_and_the_previous_one_used(tmp_path):
    save_checkpoint(tmp_path, 1, _state(1))
    save_checkpoint(tmp_path, 2, _state(2))
    newest = state_path(tmp_path, 2)
    newest.write_bytes(newest.read_bytes()[:-100])
    with pytest.raises(CheckpointCorruptError, match=r"ckpt-00000002\.pt: \d+ bytes but its manifest says \d+: truncated"):
        load_checkpoint(newest)
    ckpt = load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 1
    assert len(ckpt.refused) == 1 and "ckpt-00000002.pt" in ckpt.refused[0]


def test_a_save_after_falling_back_removes_the_refused_newer_checkpoint(tmp_path):
    for step in (4, 6):
        save_checkpoint(tmp_path, step, _state(step))
    state_path(tmp_path, 6).write_bytes(b"garbage")
    assert load_latest(tmp_path).step == 4  # type: ignore[union-attr]
    save_checkpoint(tmp_path, 5, _state(5))  # the resumed run goes on from 4
    assert committed_steps(tmp_path) == [4, 5]  # 6 gone; the good 4 was not pushed out by it
    assert load_latest(tmp_path).refused == ()  # type: ignore[union-attr]


def test_flipped_byte_is_refused_by_checksum(tmp_path):
    save_checkpoint(tmp_path, 1, _state(1))
    path = state_path(tmp_path, 1)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match=r"ckpt-00000001\.pt: SHA-256 does not match"):
        load_checkpoint(path)
    # The only checkpoint is bad: refusing to start from scratch silently.
    with pytest.raises(CheckpointCorruptError, match="no usable checkpoint"):
        load_latest(tmp_path)


def test_torch_load_failure_is_reported_even_with_a_matching_manifest(tmp_path):
    save_checkpoint(tmp_path, 1, _state(1))
    path = state_path(tmp_path, 1)
    path.write_bytes(b"not a zip file at all")
    m = json.loads(manifest_path(tmp_path, 1).read_text())
    import hashlib

    m.update(size=path.stat().st_size, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    manifest_path(tmp_path, 1).write_text(json.dumps(m))
    with pytest.raises(CheckpointCorruptError, match=r"ckpt-00000001\.pt: torch\.load failed"):
        load_checkpoint(path)


def test_state_without_manifest_is_an_unfinished_save(tmp_path):
    save_checkpoint(tmp_path, 1, _state(1))
    torch.save({"w": 1}, state_path(tmp_path, 2))
    with pytest.raises(CheckpointCorruptError, match="did not finish"):
        load_checkpoint(state_path(tmp_path, 2))
    assert load_latest(tmp_path).step == 1  # type: ignore[union-attr]


def test_no_checkpoint_means_a_fresh_start(tmp_path):
    assert load_latest(tmp_path / "absent") is None
    assert load_latest(tmp_path) is None


def test_capture_rng_loads_with_weights_only(tmp_path):
    # weights_only=True is what stops a checkpoint from running code; the RNG record must fit it.
    rng = capture_rng()
    torch.save(rng, tmp_path / "rng.pt")
    back = torch.load(tmp_path / "rng.pt", weights_only=True)
    assert back["numpy"]["pos"] == rng["numpy"]["pos"]
    assert torch.equal(back["torch"], rng["torch"])


# --------------------------------------------------------------------------
# kill -9 in the middle of a save

CHILD = r"""
import os, signal, sys, torch
import slurm_elastico.runtime.checkpoint as c
directory, mode, arg = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "bytes":  # die after `arg` bytes of the state file
    real = c._HashingFile.write
    def write(self, data):
        if self.size + len(data) > arg:
            real(self, data[: arg - self.size]); self.f.flush(); os.kill(os.getpid(), signal.SIGKILL)
        return real(self, data)
    c._HashingFile.write = write
elif mode == "replace":  # die just before the arg-th rename (1: state, 2: manifest)
    real_replace, calls = os.replace, [0]
    def replace(a, b):
        calls[0] += 1
        if calls[0] == arg: os.kill(os.getpid(), signal.SIGKILL)
        real_replace(a, b)
    c.os.replace = replace
print("ready", flush=True)
step = 2
while True:  # mode "loop": save forever until killed from outside
    c.save_checkpoint(directory, step, {"w": torch.full((%d,), float(step))})
    step += 1
"""
N = 2_000_000  # 8 MB of float32: a save takes long enough to be hit mid-write


def _child(tmp_path: Path, mode: str, arg: int) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD % N)
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "ck"), mode, str(arg)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )


def _assert_good(directory: Path, at_least: int) -> int:
    ckpt = load_latest(directory)
    assert ckpt is not None and ckpt.step >= at_least
    assert torch.equal(ckpt.state["w"], torch.full((N,), float(ckpt.step)))
    assert ckpt.refused == ()  # a killed save never commits anything that then fails to verify
    return ckpt.step


@pytest.mark.parametrize(("mode", "arg"), [("bytes", 100), ("bytes", 4_000_000), ("replace", 1), ("replace", 2)])
def test_sigkill_at_each_stage_of_a_save_keeps_the_previous_checkpoint(tmp_path, mode, arg):
    save_checkpoint(tmp_path / "ck", 1, {"w": torch.full((N,), 1.0)})
    proc = _child(tmp_path, mode, arg)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _assert_good(tmp_path / "ck", 1) == 1
    leftovers = {p.name for p in (tmp_path / "ck").iterdir()} - {"ckpt-00000001.pt", "ckpt-00000001.json"}
    assert leftovers  # the kill really landed mid-save (a temporary or uncommitted file is left)
    save_checkpoint(tmp_path / "ck", 2, {"w": torch.full((N,), 2.0)})  # and the next save cleans up
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "ckpt-00000001.json",
        "ckpt-00000001.pt",
        "ckpt-00000002.json",
        "ckpt-00000002.pt",
    ]


@pytest.mark.parametrize(("mode", "arg"), [("bytes", 100), ("replace", 1), ("replace", 2)])
def test_sigkill_while_re_saving_the_only_checkpoint_keeps_it(tmp_path, mode, arg):
    """A resume that saves its step again before running one: the directory's only checkpoint is that step,
    so it must stay whole until the new one is committed (it was uncommitted first, and a kill lost it)."""
    save_checkpoint(tmp_path / "ck", 2, {"w": torch.full((N,), 2.0)})
    proc = _child(tmp_path, mode, arg)  # saves step 2 again
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _assert_good(tmp_path / "ck", 2) == 2
    save_checkpoint(tmp_path / "ck", 3, {"w": torch.full((N,), 3.0)})  # and the next save cleans up
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "ckpt-00000002.json", "ckpt-00000002.pt", "ckpt-00000003.json", "ckpt-00000003.pt"
    ]
    assert load_checkpoint(manifest_path(tmp_path / "ck", 2)).step == 2  # the kept older one still verifies


def test_a_manifest_without_a_file_name_keeps_its_namesake_state(tmp_path):
    save_checkpoint(tmp_path, 1, _state(1))
    m = json.loads(manifest_path(tmp_path, 1).read_text())
    del m["file"]  # a manifest not written by this module: its state is ckpt-00000001.pt, as loading reads it
    manifest_path(tmp_path, 1).write_text(json.dumps(m))
    save_checkpoint(tmp_path, 2, _state(2))
    assert load_checkpoint(manifest_path(tmp_path, 1)).step == 1


def test_a_re_save_switches_state_files_and_refuses_the_superseded_one(tmp_path):
    save_checkpoint(tmp_path, 4, _state(4))
    first = (tmp_path / "ckpt-00000004.pt").read_bytes()
    path = save_checkpoint(tmp_path, 4, {"w": torch.full((1000,), 4.0), "note": "again"})
    assert path.name == "ckpt-00000004.alt.pt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000004.alt.pt", "ckpt-00000004.json"]
    assert load_latest(tmp_path).state["note"] == "again"  # type: ignore[union-attr]
    assert load_checkpoint(path).state["note"] == "again"
    (tmp_path / "ckpt-00000004.pt").write_bytes(first)  # the old state put back beside the new manifest
    with pytest.raises(CheckpointCorruptError, match=r"ckpt-00000004\.pt: not the committed state .* commits ckpt-00000004\.alt\.pt"):
        load_checkpoint(tmp_path / "ckpt-00000004.pt")
    path = save_checkpoint(tmp_path, 4, _state(4))  # a third save alternates back
    assert path.name == "ckpt-00000004.pt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000004.json", "ckpt-00000004.pt"]
    assert load_latest(tmp_path).state["note"] == "step 4"  # type: ignore[union-attr]


def test_sigkill_at_random_moments_of_repeated_saves(tmp_path):
    save_checkpoint(tmp_path / "ck", 1, {"w": torch.full((N,), 1.0)})
    rng = random.Random(0)
    last = 1
    for _ in range(4):
        proc = _child(tmp_path, "loop", 0)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        last = _assert_good(tmp_path / "ck", 1)
    assert last >= 1


def test_an_io_error_is_not_taken_for_corruption(tmp_path):
    """A manifest that cannot be read (here: a directory in its place) stops the resume instead of falling
    back to an older checkpoint, which would let the next save prune the newer, good one."""
    from slurm_elastico.runtime.checkpoint import CheckpointCorruptError, CheckpointError, load_latest, manifest_path

    save_checkpoint(tmp_path, 1, {"w": torch.zeros(2)})
    save_checkpoint(tmp_path, 2, {"w": torch.ones(2)})
    m = manifest_path(tmp_path, 2)
    text = m.read_text()
    m.unlink()
    m.mkdir()  # reading it raises IsADirectoryError, an OSError
    (m / "x").write_text(text)
    with pytest.raises(CheckpointError) as e:
        load_latest(tmp_path)
    assert not isinstance(e.value, CheckpointCorruptError) and "cannot be read" in str(e.value)
