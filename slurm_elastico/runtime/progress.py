"""A job's progress report: how much of its work is done, written by the job, read by the helper.

The training loop (`runtime.train.train`) and the inference runner
(`runtime.infer.run_inference`) report after every optimizer step or batch;
a program with its own loop calls `report_progress(done, total)`. A report
is a small JSON file, replaced atomically (write, rename), at most every
`min_interval_s` seconds and always at the start and end of a run:

    {"version": 1, "done": 120, "total": 400, "shape": "m16-fp32", "restarts": 2,
     "started": 1764489500.0, "updated": 1764489600.0}

`done` and `total` are in the family's work units (optimizer steps for
training, requests for inference); `started` and `updated` are the writer's
Unix times of this run's first report and of this one.

A training job of a family that adapts its batch (`batch: {adaptive: true}`,
goodput mode, `runtime.goodput`) reports `done` as its statistical progress:
the steps of the submitted global batch that its steps were worth (a step at
global batch B counts (B/B0)·(φ + B0)/(φ + B)), so `total` stays the
submitted steps. It adds one optional field:

    "grad_noise_scale": 812.5

φ, the job's smoothed gradient noise scale tr(Σ)/|G|² in samples, from which
a reader gets the statistical efficiency of any global batch B relative to
the submitted B0: E(B) = (φ + B0)/(φ + B). Absent until the job has measured
it (and always for a fixed-batch job).

A training job run by `runtime.train` also says what its `done` cost, over
all its runs: `"steps"` (optimizer steps taken, at whatever global batch)
and `"samples"` (samples used). At a fixed batch `steps` equals `done` and
`samples` is `done` times the batch; in goodput mode they are what the
statistical progress `done` was bought with (`elastico report` shows the three).

Where: `elastico-run` sets ELASTICO_PROGRESS_FILE to
`progress_path(<job's working directory>, <job id>)`, a path the helper can
compute from squeue alone (the job's `current_working_directory` and id), so
nothing else has to be recorded. The helper must be able to read it: on a
shared file system with root squashing, give the helper's user read access.
The helper believes a report only if the file and its directory belong to the
job's user and nobody else may write the directory (`check_owner`).
Without ELASTICO_PROGRESS_FILE nothing is written. Writing never fails a job:
an I/O error is logged once and reporting stops for that run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pwd
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from slurm_elastico.model import JobState, JobView

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
    started: float = 0.0  # when this run's reporting began (writer's Unix time; 0 = unknown): warm-up counts from here
    grad_noise_scale: float | None = None
    """Goodput mode: the job's gradient noise scale φ in samples (module docstring); None = not reported."""
    steps: int | None = None
    """Optimizer steps the job has taken, all runs together (module docstring); None = not reported."""
    samples: int | None = None
    """Samples the job has used, all runs together; None = not reported."""

    def to_dict(self) -> dict:
        d = {"version": VERSION, "done": self.done, "total": self.total, "shape": self.shape,
             "restarts": self.restarts, "started": self.started, "updated": self.updated}
        for key in ("grad_noise_scale", "steps", "samples"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d


class ReportError(ValueError):
    """A report that cannot be used; the message names the file and what is wrong."""


MAX_BYTES = 65536
"""A report is a few hundred bytes; anything larger is not one (and is not read into memory)."""
MAX_NUMBER = 1e15
MAX_RESTARTS = 2**31 - 1
MAX_DEPTH = 32
"""The deepest nesting of JSON arrays and objects a report may have: a report is one flat object. Checked before
parsing, so every Python refuses the same reports (3.11 and 3.13's `json` raise RecursionError near 1,000
levels, 3.14's parses 30,000)."""

_STRING_OR_BRACKET = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def nested_too_deep(data: bytes) -> bool:
    """Whether JSON text `data` nests arrays and objects deeper than `MAX_DEPTH` (brackets in strings not counted)."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:  # the usual report: too few brackets to nest that deep
        return False
    depth = 0
    for m in _STRING_OR_BRACKET.finditer(data):
        c = m.group()
        if c in (b"[", b"{"):
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif c in (b"]", b"}"):
            depth -= 1
    return False


def read_report(path: str | os.PathLike[str], kind: str) -> dict | None:
    """The JSON object of a `kind` report at `path` (version checked), None when there is none.

    Reports live in users' directories and the helper may run as root: the
    file must be a regular file (no FIFO, device or symlink: it is opened
    without following one and without blocking) and small; anything else is a
    `ReportError` naming the file, never a hang or a crash.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReportError(f"{path}: not a regular file")
        data = b""
        while len(data) <= MAX_BYTES:  # a network file system may return less than asked
            chunk = os.read(fd, MAX_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ReportError(f"{path}: larger than {MAX_BYTES} bytes, not a {kind} report")
    if nested_too_deep(data):
        raise ReportError(f"{path}: not a {kind} report: JSON nested deeper than {MAX_DEPTH} levels "
                          f"(allowed: at most {MAX_DEPTH})")
    try:
        d = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError are ValueErrors; RecursionError
        # is a backstop (nesting is checked above)
        raise ReportError(f"{path}: not JSON ({type(exc).__name__})") from None
    if not isinstance(d, dict) or d.get("version") != VERSION:
        raise ReportError(f"{path}: not a {kind} report of version {VERSION}")
    return d


def number(d: dict, key: str, source: str, *, required: bool = True, integer: bool = False,
           high: float = MAX_NUMBER) -> float:
    """`d[key]` as a finite number in [0, high] (an int if `integer`); NaN when absent and not `required`."""
    v = d.get(key)
    if v is None and not required:
        return math.nan
    ok = not isinstance(v, bool) and isinstance(v, int if integer else (int, float))
    if not ok or not 0 <= v <= high:  # NaN and inf fail the range; huge ints compare without overflow
        kind = "an integer" if integer else "a finite number"
        raise ReportError(f"{source}: {key} = {str(v)[:40]}, expected {kind} in [0, {high:g}]")
    return v if integer else float(v)


def write_report(path: str | os.PathLike[str], data: dict) -> None:
    """Replace the report at `path` (write, rename): a reader sees the old or the new one, never a torn one.

    No fsync: a report is a hint, and a stalled network file system must not stall the job's training step.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def parse_progress(d: dict, source: str) -> Progress:
    """A progress report's JSON object as `Progress`; raises `ReportError` naming `source` and the bad field."""
    done, total, updated = (number(d, k, source) for k in ("done", "total", "updated"))
    if done > total:
        raise ReportError(f"{source}: done {done:g} exceeds total {total:g}")
    restarts = number(d, "restarts", source, required=False, integer=True, high=MAX_RESTARTS)
    started = number(d, "started", source, required=False)
    phi = number(d, "grad_noise_scale", source, required=False)
    steps, samples = (number(d, k, source, required=False, integer=True, high=MAX_NUMBER) for k in ("steps", "samples"))
    return Progress(done, total, updated, str(d.get("shape", ""))[:200], 0 if math.isnan(restarts) else int(restarts),
                    0.0 if math.isnan(started) else started, None if math.isnan(phi) else phi,
                    None if math.isnan(steps) else int(steps), None if math.isnan(samples) else int(samples))


def read_progress(path: str | os.PathLike[str]) -> Progress | None:
    """The progress report at `path`, or None when there is none yet; `ReportError` when it is unusable."""
    d = read_report(path, "progress")
    return None if d is None else parse_progress(d, str(path))


def check_owner(path: Path, user: str) -> None:
    """`ReportError` unless the report at `path` and its directory belong to the job's `user` and only they may
    write them (nothing to check when there is no report yet).

    The helper believes a report only from the job's owner: a file someone else wrote (another user with
    write access to the job's working directory) must not steer the planning of this user's job. The
    directory must not be writable by group or others, so only the owner (or root) can swap the file
    between this check and the read (which follows no symlink)."""
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ReportError(f"{path}: the job's user {user!r} is unknown on this host, "
                          "so its owner cannot be checked") from None
    for p, is_dir in ((path.parent, True), (path, False)):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return  # no report yet
        except OSError as exc:
            raise ReportError(f"{p}: cannot be checked ({exc.strerror})") from None
        if st.st_uid != uid:
            raise ReportError(f"{p}: owned by uid {st.st_uid}, not by the job's user {user} (uid {uid})")
        if is_dir and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ReportError(f"{p}: group or others may write it (mode {stat.filemode(st.st_mode)}); "
                              "allowed: only the job's user (a umask of 022 or 077 when the job starts)")


def read_job_reports(jobs: Iterable[JobView], read: Callable | None = None,
                     path: Callable | None = None) -> tuple[dict, list[str]]:
    """{job id: report} of the running jobs' reports of one kind (default: progress), and a note per unusable one.

    `jobs` are `JobView`s; those not running or without a working directory are skipped; a report that
    is not the job owner's (`check_owner`) is one of the notes, never read. `read` and `path` name the
    kind (`read_progress`, `progress_path` or the counters' pair, `runtime.counters`).
    """
    read, path = read or read_progress, path or progress_path
    found, notes = {}, []
    for job in jobs:
        if job.state is not JobState.RUNNING or not job.work_dir:
            continue
        where = Path(path(job.work_dir, job.job_id))
        try:
            check_owner(where, job.user)
            value = read(where)
        except ReportError as exc:
            notes.append(f"job {job.job_id}: report ignored: {exc}")
            continue
        if value is not None:
            found[job.job_id] = value
    return found, notes


def write_progress(path: str | os.PathLike[str], progress: Progress) -> None:
    write_report(path, progress.to_dict())


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
        self._started: float | None = None

    def report(self, done: float, total: float, final: bool = False, grad_noise_scale: float | None = None,
               steps: int | None = None, samples: int | None = None) -> bool:
        """Write a report if `min_interval_s` has passed since the last one (always when `final`); True if written.

        `grad_noise_scale`: goodput mode's φ; `steps`, `samples`: what the work done cost (module docstring);
        each written when not None."""
        if self.path is None:
            return False
        now = self.clock()
        if not final and now - self._last < self.min_interval_s:
            return False
        try:
            if self._started is None:
                self._started = now
            phi = (None if grad_noise_scale is None or math.isnan(grad_noise_scale)
                   else min(float(grad_noise_scale), MAX_NUMBER))  # inf (|G|² not above 0): the largest number
            write_progress(self.path, Progress(float(done), float(total), now, self.shape, self.restarts, self._started,
                                               phi, steps, samples))
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
