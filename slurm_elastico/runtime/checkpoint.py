"""Atomic, verified checkpoints: a new one never damages the previous one, and a damaged one is refused.

Layout of a checkpoint directory:

  ckpt-00000012.pt     the state, a plain `torch.save` file (loadable without this module)
  ckpt-00000012.json   its manifest: step, data position, the state file's name, size, SHA-256, time

A checkpoint exists only once its manifest exists. Saving writes each file to
a temporary name in the same directory, flushes and fsyncs it, renames it into
place and fsyncs the directory: first the state, then the manifest (the commit
record). A kill at any moment therefore leaves either the old set or the new
complete pair, plus perhaps a temporary file or a manifest-less state file,
both ignored and cleaned up by the next save. The previous checkpoints are
deleted only after the new one is committed (`keep` newest are kept).

Saving a step that is already committed (a resume that saves before running a
step) writes the new state beside the committed one, as ckpt-00000012.alt.pt
(the next re-save goes back to ckpt-00000012.pt), and the manifest's rename
switches to it: until that rename the old pair is whole, so even a directory's
only checkpoint survives a kill during its own re-save. A re-save killed at that
point leaves the state its manifest does not name; the next save removes it.

Loading verifies size and SHA-256 against the manifest before unpickling
(with `weights_only=True`, so a checkpoint cannot run code); a mismatch raises
`CheckpointCorruptError` naming the file, and `load_latest()` falls back to the
newest good one. The SHA-256 is computed while writing, so saving reads nothing back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slurm_elastico.atomic import write_atomic
from slurm_elastico.errors import ElasticoError

log = logging.getLogger(__name__)

FORMAT = "slurm-elastico-checkpoint/1"
_NAME = re.compile(r"^ckpt-(\d{8,})\.json$")
_STATE = re.compile(r"^ckpt-(\d{8,})(?:\.alt)?\.pt$")
_ALT = ".alt.pt"
_CHUNK = 1 << 20


class CheckpointError(ElasticoError):
    """A checkpoint could not be saved or loaded."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is truncated, altered, or has no manifest: refused, never half-loaded."""


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: the user's state plus what a resume needs (step, data position, RNG states)."""

    path: Path
    step: int
    data_position: int | None
    state: dict[str, Any]
    rng: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    refused: tuple[str, ...] = ()
    """Newer checkpoints that `load_latest()` skipped as corrupt, each with the reason."""


def state_path(directory: Path, step: int) -> Path:
    """The state file a first save of `step` writes (a re-save alternates with `alt_state_path`)."""
    return Path(directory) / f"ckpt-{step:08d}.pt"


def alt_state_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:08d}{_ALT}"


def manifest_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:08d}.json"


# --------------------------------------------------------------------------
# RNG states


def capture_rng() -> dict[str, Any]:
    """The RNG states a resume must restore: Python, NumPy (legacy global), torch CPU, and CUDA when present."""
    np_state = np.random.get_state(legacy=False)
    rng: dict[str, Any] = {
        "python": random.getstate(),
        # The key array is stored as a list so the file loads with weights_only=True.
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": np_state["state"]["key"].tolist(),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()  # the saving rank's own GPU (a relaunch may have fewer GPUs)
    return rng


def restore_rng(rng: Mapping[str, Any], device: Any = None) -> None:
    """Put back what `capture_rng()` recorded; the CUDA state onto `device`'s GPU (None: the current one), only
    when CUDA is present here too. States come back to the CPU first: a checkpoint loaded onto a GPU
    (`load_latest(map_location=...)`) has them there, and torch takes them only from the CPU. (The CUDA path is
    not exercised by the tests here, which run without a GPU.)"""
    random.setstate(_as_tuple(rng["python"]))
    n = rng["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": np.asarray(n["key"], dtype=np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(rng["torch"].cpu())
    cuda = rng.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        d = torch.device(device) if device is not None else None
        index = d.index if d is not None and d.type == "cuda" and d.index is not None else torch.cuda.current_device()
        if isinstance(cuda, (list, tuple)):  # written before: one state per GPU the saving process saw
            cuda = cuda[index] if index < len(cuda) else None
        if cuda is not None:
            torch.cuda.set_rng_state(cuda.cpu(), index)


def _as_tuple(value: Any) -> Any:
    """random.setstate needs tuples; a round trip through a serializer may have made lists."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuple(v) for v in value)
    return value


# --------------------------------------------------------------------------
# saving


class _HashingFile:
    """Passes writes through to a file while hashing and counting them (torch.save accepts any `write`)."""

    def __init__(self, f: Any):
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        self.f.write(data)
        return len(data)

    def flush(self) -> None:
        self.f.flush()


def save_checkpoint(
    directory: str | os.PathLike[str],
    step: int,
    state: Mapping[str, Any],
    *,
    data_position: int | None = None,
    keep: int = 2,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Durably save `state` (plus RNG states) as the checkpoint of `step`; returns the state file's path.

    When this returns, the checkpoint survives a power cut; until it returns,
    the previous checkpoints are untouched (except one of the same `step`, which
    is replaced). `keep` (>= 1) newest are kept.
    """
    if keep < 1:
        raise CheckpointError(f"keep={keep}: at least 1 checkpoint must be kept")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    payload = {"format": FORMAT, "step": step, "data_position": data_position, "state": dict(state), "rng": capture_rng()}
    target, superseded = state_path(directory, step), alt_state_path(directory, step)
    if _committed_file(manifest_path(directory, step)) == target.name:
        target, superseded = superseded, target  # a re-save: the committed pair stays whole until the switch

    def write_state(f: Any) -> _HashingFile:
        hashing = _HashingFile(f)
        torch.save(payload, hashing)
        return hashing

    hashing = write_atomic(target, write_state)
    manifest = {
        "format": FORMAT,
        "step": step,
        "data_position": data_position,
        "file": target.name,
        "size": hashing.size,
        "sha256": hashing.sha.hexdigest(),
        "saved_at": time.time(),
        "save_seconds": round(time.perf_counter() - started, 6),
        "meta": dict(meta or {}),
    }
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    write_atomic(manifest_path(directory, step), lambda f: f.write(text))
    superseded.unlink(missing_ok=True)
    _prune(directory, keep, step)
    return target


def _prune(directory: Path, keep: int, saved: int) -> None:
    """Delete checkpoints newer than the one just `saved`, all but the `keep` newest, and leftovers.

    A checkpoint newer than the one just saved belongs to an abandoned run
    (it was refused as corrupt and the job resumed from an older one); kept, it
    would count towards `keep` and push out a good one.
    """
    for step in committed_steps(directory):
        if step > saved:
            log.warning("%s: removing checkpoint of step %d, newer than the one just saved (%d)", directory, step, saved)
            _remove(directory, step)
    steps = committed_steps(directory)
    for step in steps[:-keep]:
        _remove(directory, step)
    newest = steps[-1] if steps else None
    for p in directory.iterdir():
        if p.name.startswith(".ckpt-") and ".tmp-" in p.name:
            p.unlink(missing_ok=True)  # a temporary file of a killed save (we are the only writer)
        elif (m := _STATE.match(p.name)) and _stale(p, manifest_path(directory, int(m.group(1))),
                                                    newest is not None and int(m.group(1)) < newest):
            p.unlink(missing_ok=True)


def _stale(state: Path, manifest: Path, older: bool) -> bool:
    """Whether a state file is left over: of a save killed before its manifest (kept while it may be the newest
    save's, not `older`), or the one its step's manifest does not commit (a re-save killed before removing it)."""
    if not manifest.exists():
        return older
    try:
        return _committed_file(manifest, missing=state.name) != state.name
    except CheckpointError:  # an I/O error: the save that prunes is committed, keep the file for now
        return False


def _remove(directory: Path, step: int) -> None:
    manifest_path(directory, step).unlink(missing_ok=True)  # uncommit first, then the state
    state_path(directory, step).unlink(missing_ok=True)
    alt_state_path(directory, step).unlink(missing_ok=True)


def _committed_file(manifest_file: Path, missing: str | None = None) -> str | None:
    """The state file name a manifest commits; `missing` when there is no manifest or it is unreadable junk
    (a refused checkpoint, which a save may overwrite). An I/O error raises: nothing is saved over it."""
    try:
        # no "file" (a manifest not written here): the state is the manifest's namesake, as `load_checkpoint` reads it
        return str(json.loads(manifest_file.read_text()).get("file", manifest_file.with_suffix(".pt").name))
    except (FileNotFoundError, ValueError, AttributeError):
        return missing
    except OSError as exc:
        raise CheckpointError(f"{manifest_file}: cannot be read ({exc}); not saving over it") from None


# --------------------------------------------------------------------------
# loading


def committed_steps(directory: str | os.PathLike[str]) -> list[int]:
    """Steps that have a manifest, oldest first (not yet verified)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := _NAME.match(p.name)))


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> Checkpoint:
    """Verify and load one checkpoint given its state (.pt) or manifest (.json) path.

    Raises CheckpointCorruptError naming the file when the manifest is missing
    or unreadable, or the state's size or SHA-256 differs, or torch cannot load it.
    """
    path = Path(path)
    stem = path.name[: -len(_ALT)] if path.name.endswith(_ALT) else path.stem
    state_file, manifest_file = path.with_name(stem + ".pt"), path.with_name(stem + ".json")
    try:
        manifest = json.loads(manifest_file.read_text())
    except FileNotFoundError:
        raise CheckpointCorruptError(
            f"{state_file}: no manifest {manifest_file.name}; the save that wrote it did not finish, refusing it"
        ) from None
    except ValueError as exc:
        raise CheckpointCorruptError(f"{manifest_file}: unreadable manifest ({exc}); refusing checkpoint {state_file.name}") from None
    except OSError as exc:
        # Not corruption: an I/O error (a network filesystem hiccup). Falling back to an older checkpoint
        # would let the next save prune this good one as "abandoned", so stop instead.
        raise CheckpointError(f"{manifest_file}: cannot be read ({exc}); not resuming from an older checkpoint") from None
    if not isinstance(manifest, dict):
        raise CheckpointCorruptError(f"{manifest_file}: not a manifest (a JSON object); refusing checkpoint {state_file.name}")
    for key in ("size", "sha256", "step"):
        if key not in manifest:
            raise CheckpointCorruptError(f"{manifest_file}: manifest lacks {key!r}; refusing checkpoint {state_file.name}")
    if manifest.get("file") == stem + _ALT:  # committed by a re-save of its step
        state_file = path.with_name(stem + _ALT)
    if path.suffix == ".pt" and path.name != state_file.name:
        raise CheckpointCorruptError(
            f"{path}: not the committed state of its checkpoint ({manifest_file.name} commits {state_file.name}); refusing it"
        )
    try:
        size = state_file.stat().st_size
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{state_file}: missing, though its manifest {manifest_file.name} exists") from None
    if size != manifest["size"]:
        raise CheckpointCorruptError(
            f"{state_file}: {size} bytes but its manifest says {manifest['size']}: truncated or overwritten, refusing it"
        )
    sha = hashlib.sha256()
    try:
        with open(state_file, "rb") as f:
            while chunk := f.read(_CHUNK):
                sha.update(chunk)
    except OSError as exc:  # as for the manifest: an I/O error is not proof of corruption
        raise CheckpointError(f"{state_file}: cannot be read ({exc}); not resuming from an older checkpoint") from None
    if sha.hexdigest() != manifest["sha256"]:
        raise CheckpointCorruptError(f"{state_file}: SHA-256 does not match its manifest: the file is corrupt, refusing it")
    try:
        payload = torch.load(state_file, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        raise CheckpointCorruptError(f"{state_file}: torch.load failed ({type(exc).__name__}: {exc}); refusing it") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointCorruptError(f"{state_file}: not a {FORMAT} file; refusing it")
    return Checkpoint(
        path=state_file,
        step=int(payload["step"]),
        data_position=payload["data_position"],
        state=payload["state"],
        rng=payload["rng"],
        meta=manifest,
    )


def load_latest(directory: str | os.PathLike[str], map_location: Any = "cpu") -> Checkpoint | None:
    """The newest checkpoint that verifies, skipping (and logging) corrupt newer ones; None when there is none.

    Raises CheckpointCorruptError listing every file when checkpoints exist but none verifies:
    silently starting from scratch would throw the job's work away.
    """
    refused: list[str] = []
    for step in reversed(committed_steps(directory)):
        try:
            ckpt = load_checkpoint(manifest_path(Path(directory), step), map_location)
        except CheckpointCorruptError as exc:
            log.warning("%s; falling back to an older checkpoint", exc)
            refused.append(str(exc))
            continue
        return Checkpoint(**{**ckpt.__dict__, "refused": tuple(refused)})
    if refused:
        raise CheckpointCorruptError(f"{directory}: no usable checkpoint; every one was refused:\n  " + "\n  ".join(refused))
    return None
