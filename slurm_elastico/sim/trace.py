"""The simulator's trace: its jobs (`TraceJob`), the one documented CSV format, and what a run does to a trace.

The trace format (one job per row, header required; extra columns ignored)::

    job_id,submit_s,kind,app,gpus,work,global_batch,share,context_tokens,generated_tokens
    1,0,train,cifar10,1,4000,256,100,,
    2,30,infer,llm,1,20000,,100,1024,250

- `kind` train | infer; `app` a profiled training app (see `GroundTruth.apps`)
  or any name for inference; `gpus` 1 = a shaped single-GPU job, N > 1 a
  rigid `gpu:N` job on one node that Slurm places and nobody reshapes.
- `work`: optimizer steps at `global_batch` (train) or requests (infer).
- `share`: the MPS share (percent) the job asks for as submitted (its default
  shape's share); 100 = one whole GPU's worth.
- `context_tokens`/`generated_tokens`: mean per request (infer).

Public traces and synthetic mixes are turned into this by one module per
source: `trace_pollux`, `trace_philly`, `trace_alibaba`, `trace_synthetic`
(inference sized from `trace_azure`); `trace_spec.load` picks one by the
`--trace` spec string. Every loader takes a seed where it draws anything, so
a trace is reproducible.

A fixed trace (a Pollux workload or a CSV) draws nothing, so replicas of it
differ only by what `jitter_arrivals` moves: each arrival by its own seeded
uniform offset within ±`jitter_s` (`DEFAULT_JITTER_S`). `check_cluster` is
what a run needs beyond a well-formed trace: at least one job, and none
asking more GPUs than the cluster has (Slurm would hold it pending forever).
"""

from __future__ import annotations

import csv
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.datafiles import read_rows
from slurm_elastico.sim.truth import GroundTruth

COLUMNS = ("job_id", "submit_s", "kind", "app", "gpus", "work", "global_batch", "share", "context_tokens",
           "generated_tokens")
INFER_APP = "llm"
DEFAULT_JITTER_S = 60.0
"""Arrival jitter of a fixed trace's replicas (`elastico sim --jitter-s`): small beside Pollux's minutes between
arrivals and hours of work, large beside an epoch, so replicas order their planning differently."""


@dataclass(frozen=True)
class TraceJob:
    job_id: int
    submit_s: float
    kind: str
    app: str
    gpus: int
    work: float
    global_batch: int = 0
    share: int = 100
    context_tokens: float = 0.0
    generated_tokens: float = 0.0
    partition: str = ""
    """The partitions it was submitted to, as Slurm lists them (`a100,t4`); "" = any (every node). Not a column
    of the CSV format: only a history's replay (`history.whatif`) sets it."""
    gpu_type: str = ""
    """The GPU type it asked for (`gpu:a100:2`: it runs on that type only, under every policy); "" = any. Not a
    column of the CSV format: only a history's replay (`history.whatif`) sets it."""


def validate(jobs: Sequence[TraceJob], truth: GroundTruth, source: str = "trace") -> None:
    """Raise one `ConfigError` naming every bad row (unknown app, bad kind, non-positive work, ...)."""
    problems = []
    seen: set[int] = set()
    for j in jobs:
        where = f"job {j.job_id}"
        if j.job_id in seen:
            problems.append(f"{where}: duplicate job_id")
        seen.add(j.job_id)
        if j.kind not in ("train", "infer"):
            problems.append(f"{where}: kind {j.kind!r}; allowed: train, infer")
        if not (j.work > 0 and math.isfinite(j.work)):
            problems.append(f"{where}: work {j.work!r} must be > 0")
        if j.gpus < 1:
            problems.append(f"{where}: gpus {j.gpus} must be >= 1")
        if not 1 <= j.share <= 100:
            problems.append(f"{where}: share {j.share} must be in 1..100")
        if j.submit_s < 0 or not math.isfinite(j.submit_s):
            problems.append(f"{where}: submit_s {j.submit_s!r} must be >= 0")
        if j.kind == "train":
            if j.app not in truth.apps:
                problems.append(f"{where}: app {j.app!r} has no measured profile; allowed: {', '.join(truth.apps)}")
            if j.global_batch < 1:
                problems.append(f"{where}: training needs global_batch >= 1")
        elif j.kind == "infer" and (j.context_tokens <= 0 or j.generated_tokens <= 0):
            problems.append(f"{where}: inference needs context_tokens and generated_tokens > 0")
    if problems:
        raise ConfigError(source, problems)


def check_cluster(jobs: Sequence[TraceJob], gpus: int, source: str = "trace") -> None:
    """Raise one `ConfigError` if the trace has no job or a job asks for more GPUs than the `gpus` there are.

    Either would make a run with nothing to measure: no job gives NaN
    figures, and an oversize job stays pending forever (left unfinished).
    """
    if not jobs:
        raise ConfigError(source, ["the trace has no jobs (an empty or header-only file, or a slice with no "
                                   "submissions); allowed: a trace with at least one job"])
    problems = [f"job {j.job_id} asks for {j.gpus} GPUs; the cluster has {gpus}; allowed: at most {gpus} GPUs a "
                "job, or a larger cluster (--gpus or sim.gpus)" for j in jobs if j.gpus > gpus]
    if problems:
        raise ConfigError(source, problems)


def jitter_arrivals(jobs: Sequence[TraceJob], seed: int, jitter_s: float = DEFAULT_JITTER_S) -> list[TraceJob]:
    """The jobs with each arrival moved by a seeded uniform offset in [-jitter_s, +jitter_s], in submission order.

    What replicates a fixed trace: the offset of a job depends only on
    (seed, job_id), so the result does not depend on the input's order and
    the same seed gives the same trace. Times are clipped at 0 (a trace
    starts there), which keeps every job within the bound; `jitter_s` 0
    returns the trace unchanged.
    """
    if not (jitter_s >= 0 and math.isfinite(jitter_s)):
        raise ConfigError("jitter", [f"jitter_s {jitter_s!r} must be a finite number >= 0"])
    if jitter_s == 0:
        out = list(jobs)
    else:
        out = [replace(j, submit_s=max(0.0, j.submit_s + _offset(seed, j.job_id, jitter_s))) for j in jobs]
    return sorted(out, key=lambda j: (j.submit_s, j.job_id))


def _offset(seed: int, job_id: int, jitter_s: float) -> float:
    # Its own stream per (seed, job), like the families' profiling noise, so no job's draw depends on another's.
    rng = np.random.default_rng(zlib.crc32(f"arrival:{seed}:{job_id}".encode()))
    return float(rng.uniform(-jitter_s, jitter_s))


def read_csv(path: str | Path, truth: GroundTruth | None = None) -> list[TraceJob]:
    """A trace in the documented format, validated, in submission order."""
    path = Path(path)
    rows = read_rows(path)
    if rows and any(c not in rows[0] for c in ("job_id", "submit_s", "kind", "app", "work")):
        raise ConfigError(str(path), [f"missing column(s); the format is {','.join(COLUMNS)}"])
    jobs, problems = [], []
    for i, r in enumerate(rows, start=2):
        try:
            jobs.append(TraceJob(
                int(r["job_id"]), float(r["submit_s"]), (r["kind"] or "").strip(), (r["app"] or "").strip(),
                int(r.get("gpus") or 1), float(r["work"]), int(float(r.get("global_batch") or 0)),
                int(r.get("share") or 100), float(r.get("context_tokens") or 0), float(r.get("generated_tokens") or 0)))
        except (ValueError, TypeError, OverflowError) as exc:  # TypeError: a short row's missing cell is None
            problems.append(f"row {i}: {exc}" if not isinstance(exc, TypeError) else
                            f"row {i}: fewer cells than the header; the format is {','.join(COLUMNS)}")
    if problems:
        raise ConfigError(str(path), problems)
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    validate(jobs, truth or GroundTruth(), str(path))
    return jobs


def write_csv(jobs: Iterable[TraceJob], path: str | Path) -> None:
    with Path(path).open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for j in jobs:
            d = asdict(j)
            w.writerow([d[c] for c in COLUMNS])


def scale_load(jobs: Sequence[TraceJob], factor: float) -> list[TraceJob]:
    """The same jobs arriving `factor` times as fast (submit times divided by it): a load sweep on one trace."""
    if factor <= 0:
        raise ConfigError("load", [f"factor {factor} must be > 0"])
    return [replace(j, submit_s=j.submit_s / factor) for j in jobs]


# ---------------------------------------------------------------------------
# Sizing a training job: the micro-batch a user submits; the global batch of a trace that names none


def default_micro(truth: GroundTruth, app: str, global_batch: int) -> int:
    """The micro-batch a user would submit: the global batch halved until the largest measured batch holds it."""
    lo, hi = truth.batch_range(app)
    m = global_batch
    while m > hi and m % 2 == 0:
        m //= 2
    return m


def train_batch(truth: GroundTruth, app: str, rng: np.random.Generator) -> int:
    """A global batch the app was measured at, no larger than 4 of its largest per-GPU batches."""
    lo, hi = truth.batch_range(app)
    batches = sorted(b for b in truth.iterations.get(app, {}) if b <= 4 * hi) or [hi]
    return int(batches[int(rng.integers(0, len(batches)))])
