"""Where the helper finds each job's shape family: inside the job's own batch script, or files in a directory.

Trust: a family comes from the job itself, never from a file a user could
write for someone else's job. elastico-submit embeds the family in the batch
script it hands sbatch (`jobwrap.script`); Slurm keeps that script with the
job and lets only root, SlurmUser and the job's owner read it. `ScriptFamilies`
reads it once per job (`scontrol write batch_script`), keeps what it found in
the helper's private store keyed by job id AND submit time (a reused job id is
a new job), and offers families only for jobs whose script carries
elastico-submit's payload: a plain sbatch job is never acted on, whatever rows
anyone wrote. Rows of jobs that left the queue are forgotten (the journal keeps
the history). `DirectoryFamilies` is the administrator's own assertion
(`elastico sched --families DIR`), for jobs not submitted through elastico-submit.

GPU types: each epoch's `admit` reads the cluster's types from the snapshot's
nodes (`NodeView.gpu_type`, `gpu_memory_mib`; `shapes.typed.types_of_nodes`).
With two or more, families are enumerated per type (`<shape>@<type>`), a
job's typed GPU request (`--gres=gpu:a100:2`, carried in its payload) limits
its family to those types, and what the job measured on a type (its solo
speed per typed shape, the store's `solo_rate_by_type`) replaces the estimate
there and rescales it on the others (`shapes.type_speed`). With one type or
none, everything is as it always was.

Reading budget: a script read is a `scontrol` process (a few milliseconds each), so the first epoch over a deep
queue (a new installation, a restart after downtime) would take as long as the queue is deep. `admit` reads
new jobs' scripts in `read_order` (running jobs first, the helper may reshape them; then pending jobs as Slurm
would start them) and starts no read once `read_budget_s` (settings' `helper.script_read_budget_s`) has passed:
the jobs left are counted in `deferred`, left as submitted (no family yet, so never acted on), and read by the
next epochs, which pick them up in the same order.
"""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import yaml

from slurm_elastico.errors import ConfigError, SlurmError, SlurmUnavailable, UnknownJobError
from slurm_elastico.inputs import load_yaml
from slurm_elastico.jobwrap.script import payload_from_script
from slurm_elastico.model import Family, JobState, JobView, Snapshot
from slurm_elastico.shapes import load_directory, parse_family
from slurm_elastico.shapes.typed import Measured, family_memory, same_type, types_of_nodes
from slurm_elastico.store import Store


class FamilySource(Protocol):
    def families(self, job_ids: set[int]) -> tuple[dict[int, Family], list[str]]:
        """Families of these jobs, and one warning per family that could not be used."""
        ...


@runtime_checkable
class Admission(Protocol):
    """A family source that learns each epoch's jobs first. It may also carry `deferred` (int): the queued jobs
    whose family its last `admit` left for later epochs (`ScriptFamilies`' reading budget)."""

    def admit(self, snapshot: Snapshot, dry_run: bool) -> list[str]:
        """Learn the families of the snapshot's jobs not seen before, forget those of jobs gone; notes."""
        ...


class ScriptReader(Protocol):
    def batch_script(self, job_id: int) -> str: ...


READ_WORKERS = 4
"""Batch scripts read at once. Each read is a scontrol process, mostly waiting on slurmctld (about 3 ms); a first
epoch over 2,000 queued jobs reads 2,000 of them, one after another about 6 s (hence the reading budget)."""


class ScriptFamilies:
    """Families embedded by elastico-submit in the jobs' batch scripts, read once per job through Slurm."""

    def __init__(self, store: Store, gateway: ScriptReader, gpu_memory_mib: int, clock=time.time, anchor: str = "",
                 figures: Mapping[str, Mapping[str, object]] | None = None, read_budget_s: float = 0.0,
                 monotonic: Callable[[], float] = time.monotonic, workers: int = READ_WORKERS):
        self.store, self.gateway, self.gpu_memory_mib, self.clock = store, gateway, gpu_memory_mib, clock
        self.anchor, self.figures = anchor, dict(figures or {})
        """The GPU type the families' untyped figures describe (settings' `gpu.type`; else the first type), and the
        declared figures of types the public table lacks (`shapes.typed.figures_by_type`)."""
        self.read_budget_s, self.monotonic, self.workers = read_budget_s, monotonic, workers
        """Seconds after which an `admit` starts no more script reads (0: no limit), its clock, reads at once."""
        self.deferred = 0
        """New jobs whose script the last `admit` did not read (its budget was spent): read by later epochs."""
        self.types: dict[str, int] = {}
        """The cluster's GPU types -> memory MiB as the last snapshot showed them ({}: one type)."""
        self.memory = gpu_memory_mib
        """What an untyped family is sized for (`shapes.typed.family_memory`: a one-type cluster's type's)."""
        self._dry: dict[tuple[int, int], tuple[int, str, str]] = {}  # what a dry run found (it writes nothing)
        self._built: dict[str, Family] = {}
        """Family texts the last `admit` found valid, with the `Family` built (same types and memory as this epoch's
        `families`, which reuses them; renewed by every `admit`)."""

    def admit(self, snapshot: Snapshot, dry_run: bool) -> list[str]:
        """Read the batch script of active jobs not seen before, in `read_order` until the reading budget is spent
        (the rest: `deferred`, read next epoch); forget rows of jobs no longer queued.

        `SlurmUnavailable` propagates (the epoch is an outage); a job that vanished meanwhile is skipped and
        tried again next epoch; any other refusal to show its script leaves the job unmanaged, with a note.
        """
        self.types = types_of_nodes(snapshot.nodes, self.gpu_memory_mib)
        self.memory = family_memory(snapshot.nodes, self.gpu_memory_mib)
        known = {(r["job_id"], r["submit_time"]) for r in self.store.query("SELECT job_id, submit_time FROM job_admission")}
        active = {_key(j): j for j in snapshot.jobs}
        notes: list[str] = []
        found: list[tuple] = []
        load, self._built, shared = yaml_memo(), {}, {}
        todo = read_order(job for key, job in active.items() if key not in known and key not in self._dry)
        scripts = read_scripts(self.gateway, [job.job_id for job in todo], self.workers, self.read_budget_s,
                               self.monotonic)
        self.deferred = len(todo) - len(scripts)
        for job in todo:
            key = _key(job)
            if job.job_id not in scripts:
                continue  # not read yet: no row, so the next epoch reads it
            try:
                managed, spec, source, note = self._examine(job, scripts[job.job_id], load, self._built, shared)
            except UnknownJobError:
                continue  # it left between the snapshot and this read
            if note:
                notes.append(note)
            found.append((*key, job.user, managed, spec, source, note, self.clock()))
        if dry_run:
            self._dry.update({(r[0], r[1]): (r[3], r[4], r[5]) for r in found})
            return notes
        with self.store.transaction() as conn:
            conn.executemany("INSERT OR REPLACE INTO job_admission (job_id, submit_time, user, managed, spec, source,"
                             " note, seen_at) VALUES (?,?,?,?,?,?,?,?)", found)
            # The history `elastico report` reads (kind per job); never read to decide anything.
            conn.executemany("INSERT OR REPLACE INTO job_family (job_id, spec, source, submitted_at) VALUES (?,?,?,?)",
                             [(r[0], r[4], r[5], r[1]) for r in found if r[3]])
            self._forget(conn, active)
        return notes

    def _examine(self, job: JobView, script: str | SlurmError, load=load_yaml,
                 valid: dict[str, Family] | None = None, shared: dict | None = None) -> tuple[int, str, str, str]:
        """(managed, spec, source, note) of one job from its batch script as `read_scripts` read it (the text or
        Slurm's refusal). `load`: `load_yaml` or a `yaml_memo`; `valid`: family texts this epoch found valid, with
        their `Family` (a text is built once; one that fails is built again for each job, so its note names that
        job; `families` reuses them this epoch); `shared`: `family_of`'s (texts that differ only in their work
        share their shapes)."""
        if isinstance(script, (SlurmUnavailable, UnknownJobError)):
            raise script
        if isinstance(script, SlurmError):
            return 0, "", "", f"job {job.job_id}: left alone, its batch script could not be read: {script}"
        text = script
        try:
            payload = payload_from_script(text)
        except ConfigError:
            return 0, "", "", ""  # not elastico-submit's: not ours, nothing to say
        source = f"job {job.job_id} ({payload.family_source})"
        try:
            text = limited(payload.family_spec, source, payload.type_limit)
            if valid is None or text not in valid:
                family = parse_family(load(text, source), source, self.memory, gpu_types=self.types,
                                      anchor=self.anchor or None, figures=self.figures, shared=shared)
                if valid is not None:
                    valid[text] = family
        except (ConfigError, RecursionError, ValueError) as exc:
            return 0, "", "", f"job {job.job_id}: family ignored, the job is left as submitted: {_short(exc)}"
        return 1, text, payload.family_source, ""

    @staticmethod
    def _forget(conn, active: dict[tuple[int, int], JobView]) -> None:
        """Drop the rows of jobs no longer queued, unless an open co-location pair still needs the family."""
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS admitted_now (job_id INTEGER, submit_time INTEGER)")
        conn.execute("DELETE FROM admitted_now")
        conn.executemany("INSERT INTO admitted_now VALUES (?, ?)", list(active))
        conn.execute("DELETE FROM job_admission WHERE NOT EXISTS (SELECT 1 FROM admitted_now a WHERE "
                     "a.job_id = job_admission.job_id AND a.submit_time = job_admission.submit_time) "
                     "AND job_id NOT IN (SELECT job_id FROM pair_rate) AND job_id NOT IN (SELECT partner FROM pair_rate)")

    def families(self, job_ids: set[int]) -> tuple[dict[int, Family], list[str]]:
        """Families of the managed jobs among `job_ids` (the newest submission of an id)."""
        if not job_ids:
            return {}, []
        marks = ",".join("?" * len(job_ids))
        rows = [(r["job_id"], r["spec"], r["source"]) for r in self.store.query(
            f"SELECT job_id, spec, source FROM job_admission WHERE managed = 1 AND job_id IN ({marks}) "
            "ORDER BY submit_time", sorted(job_ids))]
        rows += [(k[0], spec, source) for k, (managed, spec, source) in sorted(self._dry.items(), key=lambda x: x[0][1])
                 if managed and k[0] in job_ids]
        measured = measured_by_type(self.store, {j for j, _, _ in rows}) if self.types else {}
        return _parse_all(((j, spec, f"job {j} ({source})") for j, spec, source in rows), self.memory,
                          self.types, measured, self.anchor, self.figures, self._built)


class DirectoryFamilies:
    """Families as files `<job id>.yaml` in a directory the administrator keeps (before or besides elastico-submit)."""

    def __init__(self, directory: str | Path, gpu_memory_mib: int, anchor: str = "",
                 figures: Mapping[str, Mapping[str, object]] | None = None, store: Store | None = None):
        self.dir, self.gpu_memory_mib, self.anchor, self.figures = Path(directory), gpu_memory_mib, anchor, figures
        self.store = store  # the jobs' speeds measured per GPU type (`measured_by_type`), as ScriptFamilies reads them
        self.types: dict[str, int] = {}
        self.memory = gpu_memory_mib
        if not self.dir.is_dir():
            what = "does not exist" if not self.dir.exists() else "is not a directory"
            raise ConfigError(str(self.dir), [f"the families directory {what}; allowed: a directory of "
                                              "<job id>.yaml files"])

    def admit(self, snapshot: Snapshot, dry_run: bool) -> list[str]:
        """Learn the cluster's GPU types from the snapshot (the files themselves are read on each call)."""
        self.types = types_of_nodes(snapshot.nodes, self.gpu_memory_mib)
        self.memory = family_memory(snapshot.nodes, self.gpu_memory_mib)
        return []

    def families(self, job_ids: set[int]) -> tuple[dict[int, Family], list[str]]:
        measured = measured_by_type(self.store, set(job_ids)) if self.types and self.store is not None else {}
        found, errors = load_directory(self.dir, self.memory, gpu_types=self.types, anchor=self.anchor,
                                       figures=self.figures, measured=measured)
        return ({j: f for j, f in found.items() if j in job_ids},
                [f"family ignored, the job is left as submitted: {e}" for e in errors])


def read_order(jobs: Iterable[JobView]) -> list[JobView]:
    """The order new jobs' scripts are read in: running jobs first (the helper may reshape them at once), then the
    others as Slurm's scheduler would consider them (priority, highest first; then submit time and job id). A held
    job (priority 0) comes last: nothing starts it before it is released."""
    return sorted(jobs, key=lambda j: (j.state is not JobState.RUNNING, -j.priority, j.submit_time or 0, j.job_id))


def read_scripts(gateway: ScriptReader, job_ids: list[int], workers: int = READ_WORKERS, budget_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> dict[int, str | SlurmError]:
    """job id -> its batch script, or the `SlurmError` Slurm answered for it; up to `workers` reads at once, each
    started in the order of `job_ids` (reads only: what each job's answer means is decided after, one at a time).

    `budget_s` > 0: no read starts once that many seconds (of `clock`) have passed since the call; the jobs not read
    are absent from the answer, and those read are the first of `job_ids` (the first is always read)."""
    deadline = clock() + budget_s if budget_s > 0 else None

    def one(job_id: int) -> str | SlurmError:
        try:
            return gateway.batch_script(job_id)
        except SlurmError as exc:
            return exc

    def spent() -> bool:
        return deadline is not None and clock() >= deadline

    workers = max(1, workers)
    # a read is started only when a worker is free for it, so the budget is checked just before each read starts,
    # in order (one worker: one read after another)
    free = threading.Semaphore(workers)
    futures = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, job_id in enumerate(job_ids):
            free.acquire()
            if i and spent():
                break
            futures[job_id] = pool.submit(one, job_id)
            futures[job_id].add_done_callback(lambda _: free.release())
    return {j: f.result() for j, f in futures.items()}


def yaml_memo() -> Callable[[str, str], Any]:
    """`load_yaml` that parses each distinct text once (jobs submitted with one family file carry the same text;
    a family costs about a millisecond in pure-Python YAML, a sixth of that with libyaml, times 2,000 jobs an
    epoch). It hands out a copy each time (the caller may change what it gets); a text that fails is not kept,
    so each job's error names that job."""
    parsed: dict[str, Any] = {}

    def load(text: str, source: str) -> Any:
        if text not in parsed:
            parsed[text] = load_yaml(text, source)
        return copy.deepcopy(parsed[text])

    return load


def _key(job: JobView) -> tuple[int, int]:
    return job.job_id, int(job.submit_time or 0)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def limited(spec_text: str, source: str, limit: Iterable[str]) -> str:
    """The family text with the job's typed GPU request as its `gpu_types` (the types both allow); unchanged
    without one. Raises `ConfigError` when they share no type."""
    limit = tuple(limit)
    if not limit:
        return spec_text
    data = load_yaml(spec_text, source)
    if not isinstance(data, dict):
        return spec_text  # parse_family says what is wrong with it
    own = data.get("gpu_types") if isinstance(data.get("gpu_types"), list) else None
    both = [t for t in limit if own is None or any(same_type(t, str(w)) for w in own)]
    if not both:
        raise ConfigError(source, [f"gpu_types: the job asked Slurm for GPU type(s) {list(limit)}, its family allows "
                                   f"only {own}; allowed: a request for one of the family's types"])
    return yaml.safe_dump({**data, "gpu_types": both}, sort_keys=False)


def measured_by_type(store: Store, job_ids: set[int]) -> dict[int, Measured]:
    """job -> shape -> {GPU type: solo speed} from the store's typed solo rates (total work / total seconds)."""
    if not job_ids:
        return {}
    marks = ",".join("?" * len(job_ids))
    out: dict[int, dict[str, dict[str, float]]] = {}
    for r in store.query(f"SELECT job_id, shape, gpu_type, work, seconds FROM solo_rate_by_type WHERE job_id IN "
                         f"({marks})", sorted(job_ids)):
        if r["seconds"] > 0 and r["work"] > 0:
            out.setdefault(r["job_id"], {}).setdefault(r["shape"], {})[r["gpu_type"]] = r["work"] / r["seconds"]
    return out  # type: ignore[return-value]


def _parse_all(items: Iterable[tuple[int, str, str]], gpu_memory_mib: int, types: Mapping[str, int] | None = None,
               measured: Mapping[int, Measured] | None = None, anchor: str = "",
               figures: Mapping[str, Mapping[str, object]] | None = None, built: dict[str, Family] | None = None
               ) -> tuple[dict[int, Family], list[str]]:
    """Each job's `Family` (a job id's newest row last wins), and a warning per family that cannot be used.

    A family depends on its text and, for a job that measured speeds on GPU types, on those: jobs with the same
    text and no measurement share one `Family` (frozen, so sharing is safe), built once; texts that differ only in
    their work share their shapes (`family_of`'s `shared`)."""
    families: dict[int, Family] = {}
    warnings: list[str] = []
    load, shared = yaml_memo(), {}
    built = dict(built or {})  # `built`: families of texts already built with these same arguments
    for job_id, text, source in items:
        own = (measured or {}).get(job_id)
        if not own and text in built:
            families[job_id] = built[text]
            continue
        try:
            family = parse_family(load(text, source), source, gpu_memory_mib, gpu_types=types, measured=own,
                                  anchor=anchor or None, figures=figures, shared=shared)
        except (ConfigError, RecursionError, ValueError) as exc:
            warnings.append(f"job {job_id}: family ignored, the job is left as submitted: {_short(exc)}")
            continue
        families[job_id] = family
        if not own:
            built[text] = family
    return families, warnings
