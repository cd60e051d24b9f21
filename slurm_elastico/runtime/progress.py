"""A job's progress report: how much of its work is done, written by the job, read by the helper.

The training loop (`runtime.train.train`) and the inference runner
(`runtime.infer.run_inference`) report after every optimizer step or batch;
a program with its own loop calls `report_progress(done, total)`. A report
is a small JSON file, replaced atomically (write, fsync, rename), at most
every `min_interval_s` seconds and always at the end of a run:

    {"version": 1, "done": 120, "total": 400, "shape": "m16-fp32", "restarts": 2, "updated": 1764489600.0}

`done` and `total` are in the family's work units (optimizer steps for
training, requests for inference). `updated` is the writer's Unix time.

Where: `elastico-run` sets ELASTICO_PROGRESS_FILE to
`progress_path(<job's working directory>, <job id>)`, a path the helper can
compute from squeue alone (the job's `current_working_directory` and id), so
nothing else has to be recorded. The helper must be able to read it: on a
shared file system with root squashing, give the helper's user read access.
Without ELASTICO_PROGRESS_FILE nothing is written. Writing never fails a job:
an I/O error is logged once and reporting stops for that run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

VERSION = 1
ENV = "ELASTICO_PROGRESS_FILE"
MIN_INTERVAL_S = 2.0


def progress_path(work_dir: str | os.PathLike[str], job_id: int | str) -> Path:
    """Where the job with this id and working directory reports its progress (the one rule both sides use)."""
    return Path(work_dir) / ".elastico" / str(job_id) / "progress.json"


@dataclass(frozen=True)
class Progress:
    done: float
    total: float
    updated: float
    shape: str = ""
    restarts: int = 0

    def to_json(self) -> str:
        return json.dumps({"version": VERSION, "done": self.done, "total": self.total, "shape": self.shape,
                           "restarts": self.restarts, "updated": self.updated}, sort_keys=True)


class ReportError(ValueError):
    """A report that cannot be used; the message names the file and what is wrong."""


def parse_progress(text: str, source: str) -> Progress:
    """A report's JSON text as `Progress`; raises `ReportError` naming `source` and the bad field."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{source}: not JSON ({exc.msg})") from None
    if not isinstance(d, dict) or d.get("version") != VERSION:
        raise ReportError(f"{source}: not a progress report of version {VERSION}")
    values = {}
    for key in ("done", "total", "updated"):
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ReportError(f"{source}: {key} = {v!r}, expected a finite number >= 0")
        values[key] = float(v)
    if values["done"] > values["total"]:
        raise ReportError(f"{source}: done {values['done']:g} exceeds total {values['total']:g}")
    restarts = d.get("restarts", 0)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise ReportError(f"{source}: restarts = {restarts!r}, expected an integer >= 0")
    return Progress(values["done"], values["total"], values["updated"], str(d.get("shape", "")), restarts)


def read_progress(path: str | os.PathLike[str]) -> Progress | None:
    """The report at `path`, or None when there is none yet; `ReportError` when it is unreadable or invalid."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None
    return parse_progress(text, str(path))


def write_progress(path: str | os.PathLike[str], progress: Progress) -> None:
    """Replace the report at `path` atomically: a reader sees the old or the new report, never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(progress.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ProgressReporter:
    """Writes this run's reports to `path` (default: $ELASTICO_PROGRESS_FILE; unset = reports nothing)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, min_interval_s: float = MIN_INTERVAL_S,
                 env: dict[str, str] | None = None, clock=time.time):
        env = dict(os.environ) if env is None else env
        target = path if path is not None else env.get(ENV)
        self.path = Path(target) if target else None
        self.shape = env.get("ELASTICO_SHAPE", "")
        restarts = env.get("SLURM_RESTART_COUNT", "0")
        self.restarts = int(restarts) if restarts.isdigit() else 0
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._last = -math.inf

    def report(self, done: float, total: float, final: bool = False) -> bool:
        """Write a report if `min_interval_s` has passed since the last one (always when `final`); True if written."""
        if self.path is None:
            return False
        now = self.clock()
        if not final and now - self._last < self.min_interval_s:
            return False
        try:
            write_progress(self.path, Progress(float(done), float(total), now, self.shape, self.restarts))
        except OSError as exc:
            log.warning("progress reports stop for this run: %s: %s", self.path, exc)
            self.path = None
            return False
        self._last = now
        return True


_default: ProgressReporter | None = None


def report_progress(done: float, total: float, final: bool = False) -> bool:
    """For programs with their own loop: report `done` of `total` work units (rate-limited; see `ProgressReporter`)."""
    global _default
    if _default is None:
        _default = ProgressReporter()
    return _default.report(done, total, final)
