"""The cluster's past GPU jobs from its accounting (pure): what `elastico trace from-sacct` keeps and what it skips.

One `PastJob` per job that asked for GPUs (`gres/gpu`, typed or not, or MPS
shares `gres/mps`), its runs put back together: `sacct -D` lists each run of
a requeued job apart (`accounting.runs_by_job`), so a job's submission is its
first run's, its start its first start, its end its last run's end, and its
restarts the runs a requeue ended. The request is the first run's (what the
user submitted; a job the helper reshaped asked for other shares later).

Nothing is dropped without a count (`Summary`): each job is kept or skipped
with one reason, and the kept ones are counted by what they are.

Kept:
- finished: its last run ended (COMPLETED, or FAILED, TIMEOUT, NODE_FAIL,
  OUT_OF_MEMORY, PREEMPTED, CANCELLED after it started: these held GPUs);
- still running at the end of the window (no end: `end` is None) and still
  pending (never started, `start` None; or requeued and waiting again): they
  are part of the load;
- counted among them: requeued jobs, array tasks (each task is a job of its
  own, `job_id` "ARRAY_TASK"; the tasks of an array none of which has started
  yet, which sacct prints as one record, each too), jobs that came through `elastico-submit`
  (their family's name and kind from the helper's store).

Skipped, each with its reason (`SKIP_*`):
- no GPU: the job asked for neither GPUs nor MPS shares;
- cancelled before it started: it never held a GPU, and when it left the
  queue is all its record says of it;
- a component of a heterogeneous job: its components start together, which
  the simulator cannot replay;
- another partition than the one asked for;
- a record sacct printed that cannot be read (`accounting.parse_sacct_each`:
  the line names the job and the field).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from slurm_elastico.model import JobState, partition_names
from slurm_elastico.slurm.accounting import SacctRecord, bad_record_job, runs_by_job

SKIP_NO_GPU = "no GPU"
SKIP_CANCELLED = "cancelled before it started"
SKIP_HET = "component of a heterogeneous job"
SKIP_PARTITION = "another partition"
SKIP_BAD = "record unreadable"
SKIPS = (SKIP_NO_GPU, SKIP_CANCELLED, SKIP_HET, SKIP_PARTITION, SKIP_BAD)
"""Every reason a job is skipped, in the order the summary lists them."""


@dataclass(frozen=True)
class Family:
    """What the helper's store says of a job submitted through `elastico-submit`."""

    name: str
    kind: str  # train | infer; "" when its stored family no longer reads
    submitted_at: float | None = None
    """The job's submission time when the helper read it (a requeue resets it; None: not checked)."""

    def of(self, runs: Iterable[SacctRecord]) -> bool:
        """Whether this is the family of the job whose runs these are: a job id Slurm used again (ids wrap; a
        rebuilt cluster starts again from 1) is another job, with other submission times."""
        return self.submitted_at is None or any(r.submit_time == int(self.submitted_at) for r in runs)


def stored_families(store) -> dict[int, Family]:
    """job id -> `Family` from the helper's store (`job_family`: what it read from each managed job's script)."""
    from slurm_elastico.errors import ConfigError
    from slurm_elastico.inputs import load_yaml

    out = {}
    for row in store.query("SELECT job_id, spec, submitted_at FROM job_family"):
        try:
            spec = load_yaml(row["spec"], f"job {row['job_id']}'s stored family")
        except ConfigError:
            spec = None
        if isinstance(spec, dict):
            kind = str(spec.get("kind", ""))
            out[row["job_id"]] = Family(str(spec.get("name", "")), kind if kind in ("train", "infer") else "",
                                        row["submitted_at"])
        else:  # managed, but its family no longer reads
            out[row["job_id"]] = Family("(unreadable)", "", row["submitted_at"])
    return out


@dataclass(frozen=True)
class PastJob:
    """One GPU job of the cluster's past, as the trace file writes it (`history.trace_file`)."""

    job_id: str  # Slurm's: "123", or "120_4" for task 4 of array 120
    submit: int  # Unix seconds of its (first) submission
    start: int | None  # its first start; None: it never started (pending at the end of the window)
    end: int | None  # its last run's end; None: not ended (running or pending at the end of the window)
    state: str  # its last run's state (JobState's name)
    gpus: int  # whole GPUs asked (gres/gpu, every type)
    mps: int  # MPS shares asked (gres/mps, in Slurm's count)
    gpu_type: str  # the GPU type asked ("" when untyped)
    cpus: int
    mem_mib: int
    nodes: int
    time_limit_s: int | None
    restarts: int  # runs a requeue ended
    user: str
    account: str
    partition: str
    family: str = ""  # the family's name when it came through elastico-submit
    kind: str = ""  # its kind then (train | infer); "" for a plain job
    name: str = ""  # the job's name (sbatch --job-name): what `elastico whatif --assume families` matches
    ran_on: str = ""  # the first node of its last run that got nodes ("" if none did): its GPU type's, for the what-if
    ran_type: str = ""  # the GPU type that run was given (its allocated TRES, where typed GPUs are accounted), else ""

    @property
    def wait_s(self) -> int | None:
        return None if self.start is None else self.start - self.submit

    @property
    def run_s(self) -> int | None:
        """First start to last end (restarts included); None while it has not ended."""
        return None if self.start is None or self.end is None else self.end - self.start


@dataclass
class Summary:
    """How many jobs were kept, counted by what they are, and skipped, by reason (`SKIPS`)."""

    kept: int = 0
    finished: int = 0
    failed: int = 0  # of the finished: not COMPLETED
    running: int = 0
    pending: int = 0
    requeued: int = 0
    array_tasks: int = 0
    with_family: int = 0
    skipped: Counter = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)  # one line per unreadable record, naming its job and field

    @property
    def seen(self) -> int:
        return self.kept + sum(self.skipped.values())

    def to_dict(self) -> dict:
        return {"jobs_seen": self.seen, "kept": self.kept, "finished": self.finished, "failed": self.failed,
                "running": self.running, "pending": self.pending, "requeued": self.requeued,
                "array_tasks": self.array_tasks, "with_family": self.with_family,
                "skipped": {reason: self.skipped.get(reason, 0) for reason in SKIPS}, "bad_records": list(self.bad)}


def _gpu_ask(tres: Mapping[str, int]) -> tuple[int, int, str]:
    """(whole GPUs, MPS shares, type) a TRES map asks for; the type is the one typed `gres/gpu:TYPE` entry."""
    typed = {k.split(":", 1)[1]: v for k, v in tres.items() if k.startswith("gres/gpu:") and v > 0}
    gpus = tres.get("gres/gpu", 0) or sum(typed.values())
    return gpus, tres.get("gres/mps", 0), next(iter(typed)) if len(typed) == 1 else ""


def _never_started(runs: tuple[SacctRecord, ...]) -> bool:
    return not any(r.start_time for r in runs) or all(r.elapsed_s == 0 and not r.nodes for r in runs)


def past_jobs(records: Iterable[SacctRecord], partition: str = "", families: Mapping[int, Family] | None = None,
              bad: Iterable[str] = ()) -> tuple[list[PastJob], Summary]:
    """The kept jobs in submission order and the summary; `bad` are the records sacct printed that could not be
    read (each line kept): a job with any unreadable run is skipped whole, counted once (its other runs alone
    would give it the wrong submission, request and restarts); a record without a job id counts alone."""
    families = families or {}
    summary = Summary()
    summary.bad = list(bad)
    bad_jobs = {bad_record_job(line) for line in summary.bad} - {None}
    summary.skipped[SKIP_BAD] = len(bad_jobs) + sum(1 for line in summary.bad if bad_record_job(line) is None)
    kept = []
    for job_id, runs in runs_by_job(records).items():
        if job_id in bad_jobs:
            continue
        first, last = runs[0], runs[-1]
        gpus, mps, gpu_type = _gpu_ask(first.tres_req or first.tres_alloc)
        reason = None
        if gpus <= 0 and mps <= 0:
            reason = SKIP_NO_GPU
        elif first.het_job_id is not None:
            reason = SKIP_HET
        elif partition and partition not in partition_names(first.partition):
            reason = SKIP_PARTITION
        elif last.state is JobState.CANCELLED and _never_started(runs):
            reason = SKIP_CANCELLED
        if reason:
            summary.skipped[reason] += 1
            continue
        starts = [r.start_time for r in runs if r.start_time and (r.elapsed_s or r.nodes)]
        ended = not last.state.active and last.end_time is not None
        start = min(starts) if starts else None
        fam = families.get(job_id)
        fam = fam if fam is not None and fam.of(runs) else None
        tres = first.tres_req or first.tres_alloc
        ran = next((r for r in reversed(runs) if r.nodes), None)  # its last run that got nodes
        job = PastJob(
            job_id=f"{first.array_job_id}_{first.array_task_id}" if first.array_job_id is not None
            and first.array_task_id is not None else str(job_id),
            submit=first.submit_time or 0, start=start, end=last.end_time if ended and start is not None else None,
            state=last.state.value, gpus=gpus, mps=mps, gpu_type=gpu_type, cpus=tres.get("cpu", 0),
            mem_mib=tres.get("mem", 0), nodes=tres.get("node", 0), time_limit_s=first.time_limit_s,
            restarts=sum(r.requeued for r in runs), user=last.user, account=last.account, partition=first.partition,
            family=fam.name if fam else "", kind=fam.kind if fam else "", name=first.name,
            ran_on=ran.nodes[0] if ran else "", ran_type=_gpu_ask(ran.tres_alloc)[2] if ran else "")
        # An array no task of which has started is one record for all its tasks: one pending job per task.
        unsplit = first.array_task_id is None and len(runs) == 1 and first.array_pending
        tasks = [dataclasses.replace(job, job_id=f"{first.array_job_id}_{t}") for t in first.array_pending] \
            if unsplit else [job]
        for job in tasks:
            kept.append(job)
            summary.kept += 1
            if job.end is not None:
                summary.finished += 1
                summary.failed += job.state != JobState.COMPLETED.value
            elif last.state is JobState.PENDING:
                summary.pending += 1  # never started, or requeued and waiting again
            else:
                summary.running += 1
            summary.requeued += job.restarts > 0
            summary.array_tasks += first.array_job_id is not None
            summary.with_family += bool(fam)
    kept.sort(key=lambda j: (j.submit, j.job_id))
    return kept, summary
