"""Traces for the simulator: one documented CSV format, loaders for public traces, a synthetic mix.

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

Loaders turn public traces into this: Pollux workloads (`pollux`), Philly
(`philly`), Alibaba GPU sharing (`alibaba`; `alibaba_slice` takes a window
of it and sizes a cluster to its GPU demand), and a synthetic mixed
training/inference generator (`synthetic`) whose inference jobs are sized
from the Azure LLM request trace (`azure_requests`). Every loader takes a
seed where it draws anything, so a trace is reproducible.

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
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.truth import DATA, GPU_MEM_MIB, GroundTruth, _read_csv

COLUMNS = ("job_id", "submit_s", "kind", "app", "gpus", "work", "global_batch", "share", "context_tokens",
           "generated_tokens")
INFER_APP = "llm"
DEFAULT_JITTER_S = 60.0
"""Arrival jitter of a fixed trace's replicas (`elastico sim --jitter-s`): small beside Pollux's minutes between
arrivals and hours of work, large beside an epoch, so replicas order their planning differently."""
SEEDED = ("synthetic", "philly", "alibaba")
"""Trace kinds that draw from the seed; the others (pollux, pollux1, a CSV) give the same jobs at the same times."""


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


def is_fixed(name: str) -> bool:
    """Whether the trace spec `name` (as `load` takes it) gives the same jobs at the same times for every seed."""
    return name.partition(":")[0] not in SEEDED


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
    rows = _read_csv(path)
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
# Public traces


def default_micro(truth: GroundTruth, app: str, global_batch: int) -> int:
    """The micro-batch a user would submit: the global batch halved until the largest measured batch holds it."""
    lo, hi = truth.batch_range(app)
    m = global_batch
    while m > hi and m % 2 == 0:
        m //= 2
    return m


POLLUX_WORKLOADS = 8
"""Bundled Pollux workloads: workload-1.csv .. workload-8.csv."""
POLLUX_COLUMNS = ("time", "application", "num_replicas", "batch_size")


def pollux(path: str | Path | int = 1, truth: GroundTruth | None = None, single_gpu: bool = False) -> list[TraceJob]:
    """A Pollux workload (`name,time,application,num_replicas,batch_size`); an int picks a bundled one (1..8).

    Work = the measured iterations to the app's end at the job's global batch
    (`pollux_iterations.csv`). `single_gpu` runs every job on one GPU (same
    steps, same global batch, hence longer), so all of them can be shaped.
    """
    truth = truth or GroundTruth()
    if isinstance(path, int) and not 1 <= path <= POLLUX_WORKLOADS:
        raise ConfigError("trace", [f"pollux:{path}: no such bundled workload; allowed: pollux:N with N in "
                                    f"1..{POLLUX_WORKLOADS}, or pollux:PATH"])
    p = DATA / "pollux_workloads" / f"workload-{path}.csv" if isinstance(path, int) else Path(path)
    rows = _read_csv(p)
    missing = [c for c in POLLUX_COLUMNS if rows and c not in rows[0]]
    if missing:
        raise ConfigError(str(p), [f"missing column(s) {', '.join(missing)}; allowed: a Pollux workload with "
                                   f"columns {','.join(POLLUX_COLUMNS)}"])
    jobs, problems = [], []
    for i, r in enumerate(rows):
        try:
            app, batch = (r["application"] or "").strip(), int(r["batch_size"])
            gpus = 1 if single_gpu else max(1, int(r["num_replicas"]))
            submit = float(r["time"])
        except (ValueError, TypeError) as exc:  # TypeError: a short row's missing cell is None
            problems.append(f"row {i + 2}: {exc if isinstance(exc, ValueError) else 'fewer cells than the header'}; "
                            "allowed: integers for batch_size and num_replicas, seconds for time")
            continue
        if app not in truth.apps:
            problems.append(f"row {i + 2}: application {app!r} has no measured profile; allowed: "
                            f"{', '.join(truth.apps)}")
            continue
        jobs.append(TraceJob(i + 1, submit, "train", app, gpus, float(truth.iterations_to_end(app, batch)), batch))
    if problems:
        raise ConfigError(str(p), problems)
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    validate(jobs, truth, str(p))
    return jobs


def _train_batch(truth: GroundTruth, app: str, rng: np.random.Generator) -> int:
    """A global batch the app was measured at, no larger than 4 of its largest per-GPU batches."""
    lo, hi = truth.batch_range(app)
    batches = sorted(b for b in truth.iterations.get(app, {}) if b <= 4 * hi) or [hi]
    return int(batches[int(rng.integers(0, len(batches)))])


PHILLY_COLUMNS = ("submit_s", "duration_s", "num_gpus")


def philly(path: str | Path | None = None, truth: GroundTruth | None = None, seed: int = 0, start_s: float = 0.0,
           hours: float = 24.0, max_duration_s: float | None = 7 * 86400.0) -> list[TraceJob]:
    """Philly jobs submitted in [start_s, start_s + hours): arrival, GPUs and duration from the trace.

    Philly has no model names: each job gets a profiled app and a global batch
    at random (seeded), and its work is its duration times its speed alone at
    its submitted shape, so a job alone on plain Slurm takes its measured time.
    """
    truth = truth or GroundTruth()
    rng = np.random.default_rng(seed)
    end = start_s + hours * 3600.0
    jobs = []
    where = str(path or "philly")
    rows = _read_csv(Path(path) if path else DATA / "philly.csv.gz")
    missing = [c for c in PHILLY_COLUMNS if rows and c not in rows[0]]
    if missing:
        raise ConfigError(where, [f"missing column(s) {', '.join(missing)}; allowed: a Philly trace with columns "
                                  f"{','.join(PHILLY_COLUMNS)}"])
    for i, r in enumerate(rows, start=2):
        try:
            t, dur, gpus = float(r["submit_s"]), float(r["duration_s"]), max(1, int(r["num_gpus"]))
        except (ValueError, TypeError) as exc:  # TypeError: a short row's missing cell is None
            raise ConfigError(where, [f"row {i}: {exc if isinstance(exc, ValueError) else 'fewer cells than the header'}"
                                      "; allowed: seconds for submit_s and duration_s, an integer for num_gpus"]) from None
        if t < start_s:
            continue
        if t >= end:
            break
        if dur <= 0:
            continue
        if max_duration_s:
            dur = min(dur, max_duration_s)
        app = truth.apps[int(rng.integers(0, len(truth.apps)))]
        batch = _train_batch(truth, app, rng)
        speed = (truth.train_speed(app, batch, default_micro(truth, app, batch), 100) if gpus == 1
                 else truth.rigid_speed(app, batch, gpus))
        jobs.append(TraceJob(len(jobs) + 1, t - start_s, "train", app, gpus, dur * speed, batch))
    validate(jobs, truth, "philly")
    return jobs


def azure_requests(path: str | Path | None = None, service: str | None = None) -> np.ndarray:
    """[t_s, context, generated] rows of the Azure LLM trace (both services unless one is named)."""
    rows = _read_csv(Path(path) if path else DATA / "azure_llm.csv.gz")
    out = [(float(r["t_s"]), float(r["context_tokens"]), float(r["generated_tokens"])) for r in rows
           if service is None or r["service"] == service]
    if not out:
        raise ConfigError(str(path or "azure_llm"), [f"no requests for service {service!r}; allowed: conv, code"])
    return np.array(out)


ALIBABA_COLUMNS = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time")


@dataclass(frozen=True)
class AlibabaSlice:
    """The jobs of a window of Alibaba's GPU-sharing trace, with what sizing a cluster for them needs."""

    jobs: list[TraceJob]
    gpu_seconds: float
    """What the slice's pods held in the trace during its arrival span: Σ GPUs (`gpu_milli` / 1000 of one for a
    shared GPU) × the part of the pod's run (scheduled to deleted, capped) within the first to last submission."""
    start_s: float
    """When the slice's first job was submitted, in the trace's seconds (its jobs' `submit_s` count from here)."""
    span_s: float
    """First to last submission of the slice."""
    skipped: dict[str, int]
    """Pods of the window left out, by reason (no GPU request, never scheduled, no run time)."""

    def load_on(self, gpus: int) -> float:
        """The slice's demand on `gpus` GPUs: the mean GPUs its pods held while they arrived, over `gpus`."""
        return self.gpu_seconds / (gpus * max(self.span_s, 1.0))

    def gpus_for(self, load: float, gpus_per_node: int) -> int:
        """The fewest whole nodes of GPUs on which `load_on` is at most `load`, and at least the largest job's GPUs.

        The demand counts a pod's run only while the slice's jobs arrive, so a
        few pods of days (the trace has pods of weeks) do not size the
        cluster for time after the slice; at `load` 1 the cluster holds on
        average what the pods held in the trace, with their GPU shares.
        """
        if not (load > 0 and math.isfinite(load)):
            raise ConfigError("alibaba", [f"load {load!r} must be a finite number > 0"])
        if gpus_per_node < 1:
            raise ConfigError("alibaba", [f"gpus_per_node {gpus_per_node} must be >= 1"])
        need = max(self.load_on(1) / load, max(j.gpus for j in self.jobs), 1)
        return math.ceil(need / gpus_per_node) * gpus_per_node


def alibaba_slice(path: str | Path, truth: GroundTruth | None = None, seed: int = 0, start_h: float = 0.0,
                  hours: float | None = None, infer_below_milli: int = 1000,
                  max_duration_s: float | None = 7 * 86400.0) -> AlibabaSlice:
    """Pods of Alibaba's GPU-sharing trace (`openb_pod_list_default.csv`) created in [start_h, start_h + hours)
    hours from the trace's start (`hours` None: to its end) that asked for a GPU and ran.

    A pod asking for part of a GPU (`gpu_milli` < `infer_below_milli`)
    becomes an inference job asking for that MPS share; whole-GPU pods become
    training jobs (`num_gpu` > 1: rigid). The trace says nothing of models:
    those are drawn (seeded). Duration = deletion − scheduled time (capped at
    `max_duration_s`: a pod still running at the trace's end was cut there);
    work = duration × speed alone at the requested shape. A pod never
    scheduled (phase Pending, no `scheduled_time`) never ran and is left out,
    as is one with no run time; `skipped` counts them. Submissions are from
    the slice's first pod; `job_id` is the pod's row in the file (1 = the
    first pod), so an error about a job names a row one can find. Pods
    created before the window and still running in it are not in the slice.
    """
    truth = truth or GroundTruth()
    where = str(path)
    problems = []
    if not (start_h >= 0 and math.isfinite(start_h)):
        problems.append(f"start_h {start_h!r} must be a finite number of hours >= 0")
    if hours is not None and not (hours > 0 and math.isfinite(hours)):
        problems.append(f"hours {hours!r} must be a finite number > 0 (or None: to the trace's end)")
    if max_duration_s is not None and not max_duration_s > 0:
        problems.append(f"max_duration_s {max_duration_s!r} must be > 0 (or None: no cap)")
    if not 1 <= infer_below_milli <= 1000:
        problems.append(f"infer_below_milli {infer_below_milli!r} must be in 1..1000")
    if problems:
        raise ConfigError("alibaba", problems)
    rows = _read_csv(Path(path))
    missing = [c for c in ALIBABA_COLUMNS if rows and c not in rows[0]]
    if missing:
        raise ConfigError(where, [f"missing column(s) {', '.join(missing)}; expected {', '.join(ALIBABA_COLUMNS)} "
                                  "(openb_pod_list_*.csv of Alibaba's cluster-trace-gpu-v2023)"])
    lo, hi = start_h * 3600.0, math.inf if hours is None else (start_h + hours) * 3600.0
    rng = np.random.default_rng(seed)
    req = azure_requests()
    jobs, runs, skipped = [], [], {"no GPU request": 0, "never scheduled": 0, "no run time": 0}
    for row, r in enumerate(rows, start=1):
        bad = [f"{c} {r[c]!r}" for c, kind in _ALIBABA_NUMBERS.items() if not _parses(r[c], kind)]
        if bad:
            problems.append(f"pod row {row} ({r['name']}): {', '.join(bad)} is not a number (integers for "
                            "num_gpu and gpu_milli; seconds for the times, empty where the trace has none)")
            continue
        n, milli, submit = int(r["num_gpu"] or 0), int(r["gpu_milli"] or 0), float(r["creation_time"] or "nan")
        stop = float(r["deletion_time"] or "nan")
        sched = float(r["scheduled_time"]) if r["scheduled_time"] else None
        if not lo <= submit < hi:  # a pod with no creation time (NaN) is in no window
            continue
        if n < 1 or milli < 1:
            skipped["no GPU request"] += 1
            continue
        if sched is None:
            skipped["never scheduled"] += 1
            continue
        dur = stop - sched
        if not dur > 0:  # also a missing deletion time (NaN)
            skipped["no run time"] += 1
            continue
        if max_duration_s:
            dur = min(dur, max_duration_s)
        if n == 1 and milli < infer_below_milli:
            share = max(1, min(100, int(round(milli / 10))))
            ctx, gen = _llm_tokens(req, rng)
            speed = truth.infer_speed(ctx, gen, 0.9, 256, "auto", share, GPU_MEM_MIB)
            if speed <= 0:
                problems.append(f"pod row {row} ({r['name']}): no vLLM engine fits share {share} of a GPU")
                continue
            jobs.append(TraceJob(row, submit, "infer", INFER_APP, 1, dur * speed, 0, share, ctx, gen))
            runs.append((sched, sched + dur, share / 100.0))
        else:
            app = truth.apps[int(rng.integers(0, len(truth.apps)))]
            batch = _train_batch(truth, app, rng)
            speed = (truth.train_speed(app, batch, default_micro(truth, app, batch), 100) if n == 1
                     else truth.rigid_speed(app, batch, n))
            jobs.append(TraceJob(row, submit, "train", app, n, dur * speed, batch))
            runs.append((sched, sched + dur, float(n)))
    if problems:
        raise ConfigError(where, problems)
    if not jobs:
        window = f"[{start_h:g} h, {'end' if hours is None else f'{start_h + hours:g} h'})"
        raise ConfigError(where, [f"no pod created in {window} asked for a GPU and ran "
                                  f"({', '.join(f'{k}: {v}' for k, v in skipped.items())}); the file has "
                                  f"{len(rows)} pod(s)"])
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    t0, t1 = jobs[0].submit_s, jobs[-1].submit_s
    held = sum(g * max(0.0, min(b, t1) - max(a, t0)) for a, b, g in runs)
    jobs = [replace(j, submit_s=j.submit_s - t0) for j in jobs]
    validate(jobs, truth, where)
    return AlibabaSlice(jobs, held, t0, t1 - t0, skipped)


_ALIBABA_NUMBERS = {"num_gpu": int, "gpu_milli": int, "creation_time": float, "deletion_time": float,
                    "scheduled_time": float}


def _parses(text: str, kind: type) -> bool:
    try:
        kind(text or 0)
    except ValueError:
        return False
    return True


def alibaba(path: str | Path, truth: GroundTruth | None = None, seed: int = 0, start_h: float = 0.0,
            hours: float | None = None, infer_below_milli: int = 1000,
            max_duration_s: float | None = 7 * 86400.0) -> list[TraceJob]:
    """The jobs of `alibaba_slice` (the whole trace by default)."""
    return alibaba_slice(path, truth, seed, start_h, hours, infer_below_milli, max_duration_s).jobs


def _llm_tokens(req: np.ndarray, rng: np.random.Generator, window_s: float = 300.0) -> tuple[float, float]:
    """Mean context and generated tokens of the requests in a random window of the Azure trace."""
    t0 = float(rng.uniform(0, max(1.0, req[-1, 0] - window_s)))
    sel = req[(req[:, 0] >= t0) & (req[:, 0] < t0 + window_s)]
    if len(sel) == 0:
        sel = req
    return float(sel[:, 1].mean()), float(sel[:, 2].mean())


# ---------------------------------------------------------------------------
# Synthetic mix


@dataclass(frozen=True)
class MixSpec:
    """A synthetic mixed trace: Poisson arrivals sized so the offered load is `load` of the cluster."""

    n_jobs: int = 400
    gpus: int = 64
    load: float = 1.0
    infer_fraction: float = 0.3
    multi_gpu_fraction: float = 0.0
    max_duration_s: float = 12 * 3600.0
    min_duration_s: float = 120.0
    gpu_memory_mib: float = GPU_MEM_MIB


def synthetic(spec: MixSpec, seed: int = 0, truth: GroundTruth | None = None) -> list[TraceJob]:
    """Training and inference jobs whose whole-GPU durations follow Philly's single-GPU jobs.

    Each job's duration alone on a whole GPU at its submitted shape is drawn
    from Philly's single-GPU durations (clipped to [min, max]); training jobs
    get a profiled app and measured global batch, inference jobs the mean
    tokens of a random 5-minute window of the Azure trace. The arrival rate is
    set from the drawn durations so that Σ GPU-seconds / (GPUs × span) = load.
    """
    truth = truth or GroundTruth()
    for name in ("n_jobs", "gpus"):
        if getattr(spec, name) < 1:
            raise ConfigError("synthetic trace", [f"{name} must be >= 1"])
    if spec.load <= 0 or not 0 <= spec.infer_fraction <= 1:
        raise ConfigError("synthetic trace", ["load must be > 0 and infer_fraction in [0, 1]"])
    rng = np.random.default_rng(seed)
    durations = _philly_single_gpu_durations()
    req = azure_requests()
    jobs, gpu_seconds = [], 0.0
    for i in range(spec.n_jobs):
        dur = float(np.clip(durations[int(rng.integers(0, len(durations)))], spec.min_duration_s, spec.max_duration_s))
        if rng.random() < spec.infer_fraction:
            ctx, gen = _llm_tokens(req, rng)
            speed = truth.infer_speed(ctx, gen, 0.9, 256, "auto", 100, spec.gpu_memory_mib)
            jobs.append(TraceJob(i + 1, 0.0, "infer", INFER_APP, 1, max(1.0, round(dur * speed)), 0, 100, ctx, gen))
            gpu_seconds += dur
        else:
            app = truth.apps[int(rng.integers(0, len(truth.apps)))]
            batch = _train_batch(truth, app, rng)
            gpus = int(rng.choice([2, 4, 8])) if rng.random() < spec.multi_gpu_fraction else 1
            speed = (truth.train_speed(app, batch, default_micro(truth, app, batch), 100) if gpus == 1
                     else truth.rigid_speed(app, batch, gpus))
            jobs.append(TraceJob(i + 1, 0.0, "train", app, gpus, max(1.0, round(dur * speed)), batch))
            gpu_seconds += dur * gpus
    span = gpu_seconds / (spec.gpus * spec.load)
    gaps = rng.exponential(1.0, spec.n_jobs)
    times = np.cumsum(gaps)
    times = (times - times[0]) * span / max(times[-1] - times[0], 1e-9)
    out = [replace(j, submit_s=float(round(t, 3))) for j, t in zip(jobs, times)]
    validate(out, truth, "synthetic trace")
    return out


_PHILLY_CACHE: list[np.ndarray] = []


def _philly_single_gpu_durations() -> np.ndarray:
    if not _PHILLY_CACHE:
        rows = _read_csv(DATA / "philly.csv.gz")
        _PHILLY_CACHE.append(np.array([float(r["duration_s"]) for r in rows
                                       if r["num_gpus"] == "1" and float(r["duration_s"]) > 0]))
    return _PHILLY_CACHE[0]


def load(name: str, truth: GroundTruth, seed: int = 0, **kw) -> list[TraceJob]:
    """A trace by spec string: `synthetic`, `pollux:N`, `pollux1:N` (single GPU), `philly[:PATH]`, `alibaba:PATH`, or a CSV path."""
    kind, _, arg = name.partition(":")
    if kind == "synthetic":
        return synthetic(MixSpec(**{k: v for k, v in kw.items() if k in {f.name for f in fields(MixSpec)}}), seed, truth)
    if kind in ("pollux", "pollux1"):
        return pollux(int(arg) if arg.isdigit() else (arg or 1), truth, single_gpu=kind == "pollux1")
    if kind == "philly":
        return philly(arg or None, truth, seed, hours=kw.get("hours", 24.0))
    if kind == "alibaba":
        if not arg:
            raise ConfigError("trace", ["alibaba needs a path: alibaba:PATH/openb_pod_list_default.csv"])
        return alibaba(arg, truth, seed)
    p = Path(name)
    if p.suffix == ".csv" or p.is_file():
        return read_csv(p, truth)
    raise ConfigError("trace", [f"{name!r} is not a trace; allowed: synthetic, pollux:N, pollux1:N, philly[:PATH], "
                                "alibaba:PATH, or a CSV file in the trace format"])
