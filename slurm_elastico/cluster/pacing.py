"""Emulated GPUs for the local cluster: each step of a real (tiny) job takes the time the simulator's truth gives.

The local cluster's GPUs are fake (device nodes), so a tiny model runs as
fast on a 25 % share as on a whole GPU, next to others or alone. A paced job
runs its real code and, after each optimizer step (training) or each answered
batch of requests (inference), sleeps until the step has taken what the
simulator's ground truth (`sim.truth.GroundTruth`) gives a job of the
emulated app at the job's CURRENT shape, MPS share and co-runners, computed
as the simulator computes it (`sim.speeds.JobSpeeds._solo`, `sim.engine.Engine._rerate`):

- training: `train_speed(app, global_batch, micro, share)` optimizer steps/s,
  and the whole-GPU speed `train_speed(..., 100)`; a data-parallel shape of
  n ranks on n whole GPUs: `gang_speed(app, global_batch, placement, micro)`,
  the placement (GPUs on each node) being the job's own allocation, alone on
  its GPUs (nobody shares a whole GPU), as `JobSpeeds._gang_solo` rates it;
- inference: `infer_speed(context, generated, gmu, max_num_seqs, kv, share)`
  requests/s (the decode model of `sim.truth`);
- next to co-runners on its GPU: `colocated(share speed, whole speed, me,
  others, mode)`, each job standing for its Gavel job (`identity`).

So a job behaves on the local cluster as the same job in the simulator, and
the simulator's prediction for a job list can be checked against Slurm.

Where the numbers come from at run time (`SlurmPacer`):
- the job's own allocation, from Slurm: `squeue --json` through the gateway
  (`JobView.gpu_alloc`: node, GPU index and MPS shares; 0 shares = a whole
  GPU, as plain `--gres=gpu:1` holds it; a gang's GPUs counted per node);
- the co-runners: the other jobs squeue shows on the same GPU of the same
  node; what each of them is (kind, Gavel identity at its current shape) from
  the small record every paced job publishes in a directory they share
  (`publish`); a job without a record counts as an unknown co-runner (the
  truth's 0.5 for pairs it has no measurement of).
- refreshed every `refresh_s` seconds (default 5), so a 1 s step does not
  cost a Slurm call; when Slurm does not answer, the last rate is kept;
- on a local cluster of several fake GPU types (`cluster.gpu_types`), the
  rate times the speed of the type of the job's node (`type_speeds`, from
  the cluster's saved settings beside its slurm.conf).

A job of several ranks is paced by rank 0 alone: the other ranks wait for it
in the step's collectives, so every rank keeps its pace without reading Slurm.

Real compute counts: the sleep is what is left of the step's time after the
real work; a step whose real work already took longer is not padded (and is
slower than the simulator: keep the real model tiny). Time runs 1:1 with the
simulator's seconds (the profiles were measured on T4s, so steps of the slow
apps take about a second).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_elastico.cluster.gpu_types import node_types, parse_gpu_types
from slurm_elastico.errors import ConfigError, ElasticoError
from slurm_elastico.runtime.split import accumulation_for, split_problem
from slurm_elastico.sim.truth import GPU_MEM_MIB, GroundTruth

UNKNOWN = ("unknown", 0)
"""The identity of a co-runner that published no record: the truth has no pair for it (factor 0.5)."""
MODES = ("gavel", "gavel-residual", "none")
SOURCE = "pacing"


@dataclass(frozen=True)
class Emulated:
    """What a paced job stands for in the simulator: a trace job's kind, app and sizes (see `sim.trace`)."""

    kind: str
    app: str
    global_batch: int = 0
    context_tokens: float = 0.0
    generated_tokens: float = 0.0
    gpu_mem_mib: float = GPU_MEM_MIB
    colocation: str = "gavel"
    restart_cost_s: float = 0.0
    """Seconds without progress at the start of every run after the first (the simulator's `restart_cost_s`)."""

    def __post_init__(self) -> None:
        problems = []
        if self.kind not in ("train", "infer"):
            problems.append(f"kind {self.kind!r}; allowed: train, infer")
        if self.kind == "train" and self.global_batch < 1:
            problems.append(f"global_batch {self.global_batch!r}: a training job needs one >= 1")
        if self.kind == "infer" and not (self.context_tokens > 0 and self.generated_tokens > 0):
            problems.append("an inference job needs context_tokens and generated_tokens > 0")
        if not (self.restart_cost_s >= 0 and math.isfinite(self.restart_cost_s)):
            problems.append(f"restart_cost_s {self.restart_cost_s!r} must be a finite number >= 0")
        if self.colocation not in MODES:
            problems.append(f"colocation {self.colocation!r}; allowed: {', '.join(MODES)}")
        if problems:
            raise ConfigError(SOURCE, problems)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Emulated":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(SOURCE, [f"not JSON: {exc}"]) from None
        if not isinstance(data, dict):
            raise ConfigError(SOURCE, [f"expected a JSON object, got {type(data).__name__}"])
        allowed = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ConfigError(SOURCE, [f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"])
        return cls(**data)


@dataclass(frozen=True)
class Knobs:
    """The shape knobs the truth reads: micro-batch (training); vLLM arguments (inference)."""

    micro_batch: int = 0
    ranks: int = 1
    """Data-parallel ranks (training): more than 1 runs on that many whole GPUs."""
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 0
    kv_cache_dtype: str = "auto"


def identity(truth: GroundTruth, job: Emulated, knobs: Knobs) -> tuple[str, int]:
    """The Gavel job standing for `job` at `knobs`, as the simulator maps it (micro-batch or max_num_seqs)."""
    batch = knobs.micro_batch if job.kind == "train" else knobs.max_num_seqs
    return truth.identity(job.kind, job.app, batch)


def solo_speeds(truth: GroundTruth, job: Emulated, knobs: Knobs, share: int) -> tuple[float, float]:
    """(speed at `share` percent, speed on a whole GPU), running alone: steps/s or requests/s."""
    if not 1 <= share <= 100:
        raise ConfigError(SOURCE, [f"share {share!r}: a percent of one GPU in 1..100"])
    if job.kind == "train":
        if knobs.micro_batch < 1 or job.global_batch % knobs.micro_batch:
            raise ConfigError(SOURCE, [f"micro_batch {knobs.micro_batch!r} must divide global batch "
                                       f"{job.global_batch}"])
        return (truth.train_speed(job.app, job.global_batch, knobs.micro_batch, share),
                truth.train_speed(job.app, job.global_batch, knobs.micro_batch, 100))
    args = (job.context_tokens, job.generated_tokens, knobs.gpu_memory_utilization, knobs.max_num_seqs,
            knobs.kv_cache_dtype)
    return (truth.infer_speed(*args, share, job.gpu_mem_mib), truth.infer_speed(*args, 100, job.gpu_mem_mib))


def rate(truth: GroundTruth, job: Emulated, knobs: Knobs, share: int,
         others: Sequence[tuple[str, int]] = (), nodes: Sequence[int] = ()) -> float:
    """Steps/s (training) or requests/s (inference) of `job` at `knobs` and `share` percent next to `others`
    (their Gavel identities), exactly as the simulator rates it; 0 when the shape cannot run (no KV room).

    A training shape of several ranks runs on whole GPUs, `nodes` of them on each node (its allocation; until
    Slurm has said, all on one node), alone: `gang_speed`, and `share` and `others` do not count.
    """
    if job.kind == "train" and knobs.ranks > 1:
        problem = "micro_batch must be >= 1" if knobs.micro_batch < 1 else split_problem(
            job.global_batch, knobs.micro_batch, accumulation_for(job.global_batch, knobs.micro_batch, knobs.ranks),
            knobs.ranks)
        if problem:
            raise ConfigError(SOURCE, [f"micro_batch {knobs.micro_batch!r} on {knobs.ranks} ranks does not split "
                                       f"global batch {job.global_batch}: {problem}"])
        placement = tuple(nodes) if sum(nodes) == knobs.ranks else (knobs.ranks,)
        return truth.gang_speed(job.app, job.global_batch, placement, knobs.micro_batch)
    at_share, whole = solo_speeds(truth, job, knobs, share)
    return truth.colocated(at_share, whole, identity(truth, job, knobs), list(others), job.colocation)


def seconds_for(units: float, speed: float) -> float:
    """Seconds `units` steps or requests take at `speed` per second; inf when the job cannot run (speed 0)."""
    if units < 0:
        raise ConfigError(SOURCE, [f"units {units!r} must be >= 0"])
    return units / speed if speed > 0 else math.inf


@dataclass(frozen=True)
class Placement:
    """Where the job runs now, as Slurm shows it: its share (percent) and who else is on its GPU."""

    share: int
    others: tuple[int, ...]
    """Job ids of the co-runners on its GPU."""
    started: float | None = None
    """When Slurm started this run of the job (epoch seconds, squeue's StartTime), if it says."""
    nodes: tuple[int, ...] = (1,)
    """GPUs the job holds on each of its nodes."""
    node: str = ""
    """The node of its first GPU (whose fake GPU type sets its speed, `type_speeds`)."""


def placement_of(job_id: int, jobs: Sequence, shares_per_gpu: int = 100) -> Placement | None:
    """The job's `Placement` from squeue's running jobs (`JobView`s), None when it is not running there.

    Its first GPU gives the share and the co-runners (a job of one GPU; a gang holds whole GPUs, alone). A
    whole GPU (0 shares: `--gres=gpu:N`) is 100 %; MPS shares in Slurm's counts become a percent of
    `shares_per_gpu`. `nodes`: its GPUs counted per node, in Slurm's order.
    """
    mine = next((j for j in jobs if j.job_id == job_id and j.gpu_alloc), None)
    if mine is None:
        return None
    node, gpu, shares = mine.gpu_alloc[0]
    share = 100 if shares == 0 else max(1, min(100, round(100 * shares / shares_per_gpu)))
    others = tuple(sorted(j.job_id for j in jobs if j.job_id != job_id
                          and any(n == node and g == gpu for n, g, _ in j.gpu_alloc)))
    per_node: dict[str, int] = {}
    for n, _, _ in mine.gpu_alloc:
        per_node[n] = per_node.get(n, 0) + 1
    return Placement(share, others, float(mine.start_time) if mine.start_time else None, tuple(per_node.values()),
                     node)


def origin(started: float | None, program_start: float, stopped: float | None, restart_cost_s: float) -> float:
    """When the emulated GPU starts this run's work (epoch seconds).

    The emulated job begins when Slurm started the run (`started`), not when the program's imports are done:
    start-up overlaps the emulated compute, as the simulator has no start-up time. A run after a checkpoint
    (`stopped`: when the previous run of the job stopped; an in-place relaunch keeps Slurm's start time) begins
    at the later of the two, plus `restart_cost_s` without progress, as the simulator charges a restart. Without
    Slurm's word, the program's own start.
    """
    begin = max(t for t in (started, stopped, None if started else program_start) if t is not None)
    return begin + (restart_cost_s if stopped is not None else 0.0)


def record_stop(directory: Path, job_id: int, when: float) -> None:
    """Say when this run of the job stopped (checkpointed), for its next run's `origin`."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{job_id}.stopped.tmp"
    tmp.write_text(repr(when))
    os.replace(tmp, directory / f"{job_id}.stopped")


def read_stop(directory: Path, job_id: int) -> float | None:
    try:
        return float((directory / f"{job_id}.stopped").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None


def publish(directory: Path, job_id: int, ident: tuple[str, int]) -> None:
    """Write this job's Gavel identity where its co-runners read it (atomically: rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{job_id}.json.tmp"
    tmp.write_text(json.dumps({"job_id": job_id, "identity": list(ident)}))
    os.replace(tmp, directory / f"{job_id}.json")


def read_identity(directory: Path, job_id: int) -> tuple[str, int]:
    """The identity job `job_id` published, or `UNKNOWN` when it published none (or an unreadable one)."""
    try:
        data = json.loads((directory / f"{job_id}.json").read_text())
        model, batch = data["identity"]
        return str(model), int(batch)
    except FileNotFoundError:
        return UNKNOWN
    except (OSError, ValueError, KeyError, TypeError):
        return UNKNOWN


class Pacer:
    """Pads each step to the time its current rate gives; `placement()` says where the job runs now.

    `placement` is called at most every `refresh_s` seconds; `None` (Slurm did not answer, or the job is not
    listed yet) keeps the last answer (a whole GPU alone before the first one). `clock`/`sleep` are passed in
    so tests run without waiting.
    """

    def __init__(self, truth: GroundTruth, job: Emulated, knobs: Knobs, placement: Callable[[], Placement | None],
                 identities: Callable[[int], tuple[str, int]], refresh_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 speed_of: Callable[[str], float] = lambda node: 1.0):
        self.truth, self.job, self.knobs = truth, job, knobs
        self.speed_of = speed_of
        """The fake GPU speed of a node (`type_speeds`): the truth's rate is multiplied by it."""
        self.placement_fn, self.identities = placement, identities
        self.refresh_s, self.clock, self.sleep = refresh_s, clock, sleep
        self.current = Placement(100, (), nodes=(knobs.ranks,))
        self.speed = rate(truth, job, knobs, 100, nodes=self.current.nodes)
        self.checked = -math.inf
        self.mark = clock()
        self.slept = 0.0
        self.job_id: int | None = None
        """The Slurm job paced (`from_environment`), None in tests."""
        self.late = 0.0
        """The most seconds the real run was behind the emulated GPU after a step (0: it never was)."""

    def start(self, at: float | None = None) -> None:
        """The emulated work starts at `at` (a `clock` value; default now): steps are due from there."""
        self.mark = self.clock() if at is None else at

    def refresh(self) -> float:
        now = self.clock()
        if now - self.checked >= self.refresh_s:
            self.checked = now
            got = self.placement_fn()
            if got is not None:
                self.current = got
                others = [self.identities(o) for o in got.others] if self.knobs.ranks == 1 else []
                self.speed = rate(self.truth, self.job, self.knobs, got.share, others, got.nodes) * self.speed_of(got.node)
        return self.speed

    def pad(self, units: float = 1.0) -> float:
        """Sleep until `units` more steps (or requests) are due on the emulated GPU; returns the seconds slept.

        Steps are due back to back from `start`: a step whose real work (or the program's start-up) ran late is
        not padded, and the next ones catch up, so the run ends when the emulated GPU would have finished it
        unless the real work itself is slower (then `late` says by how much, at most).
        """
        speed = self.refresh()
        due = seconds_for(units, speed)
        if not math.isfinite(due):
            raise ConfigError(SOURCE, [f"{self.job.kind} job of app {self.job.app!r} cannot run at {self.knobs} "
                                       f"on {self.current.share} % of a GPU (the truth gives it speed 0)"])
        self.mark += due
        left = self.mark - self.clock()
        if left > 0:
            self.sleep(left)
            self.slept += left
        else:
            self.late = max(self.late, -left)
        return max(left, 0.0)


def finish(pacer: Pacer, pace_dir: Path, checkpointed: bool) -> dict:
    """End of a paced run: a checkpointed run says when it stopped (its next run pays the restart cost); returns
    the pacing figures for the program's summary line: seconds padded, the most seconds the run was behind the
    emulated GPU after a step (`late_s`, start-up included), and how many seconds after the emulated GPU would
    have ended it the run ended (`ended_late_s`: 0 when the steps caught up; more when the machine could not keep
    pace, so the run took longer than the simulator's truth gives it)."""
    if checkpointed and pacer.job_id is not None:
        record_stop(pace_dir, pacer.job_id, time.time())
    return {"padded_s": round(pacer.slept, 3), "late_s": round(pacer.late, 3),
            "ended_late_s": round(max(0.0, pacer.clock() - pacer.mark), 3)}


class SlurmPlacement:
    """`Placement` of one job read from Slurm (`squeue --json` through the gateway); None when Slurm fails."""

    def __init__(self, job_id: int, gateway, shares_per_gpu: int = 100):
        self.job_id, self.gateway, self.shares_per_gpu = job_id, gateway, shares_per_gpu
        self.errors = 0

    def __call__(self) -> Placement | None:
        from slurm_elastico.errors import ParseError, SlurmError

        try:
            jobs = self.gateway.jobs()
        except (SlurmError, ParseError):
            self.errors += 1
            return None
        return placement_of(self.job_id, jobs, self.shares_per_gpu)


def from_environment(job: Emulated, knobs: Knobs, pace_dir: Path, program_start: float, env=None,
                     refresh_s: float = 5.0) -> Pacer:
    """The started pacer of the job Slurm runs this program in (SLURM_JOB_ID), publishing its identity in
    `pace_dir`; its clock is the wall clock (`time.time`, as Slurm's start times), its work begins at `origin`.
    `program_start`: `time.time()` when the program began (before its imports)."""
    from slurm_elastico.slurm.gateway import SlurmGateway
    from slurm_elastico.slurm.runner import SubprocessRunner

    env = os.environ if env is None else env
    raw = env.get("SLURM_JOB_ID", "")
    if not raw.isdigit():
        raise ConfigError(SOURCE, [f"SLURM_JOB_ID {raw!r}: a paced job runs under Slurm (a job id is needed to "
                                   "read its allocation)"])
    job_id = int(raw)
    truth = GroundTruth()
    publish(pace_dir, job_id, identity(truth, job, knobs))
    gateway = SlurmGateway(SubprocessRunner(timeout=10.0))
    speeds = type_speeds(env.get("SLURM_CONF", ""))
    pacer = Pacer(truth, job, knobs, SlurmPlacement(job_id, gateway), lambda o: read_identity(pace_dir, o),
                  refresh_s=refresh_s, clock=time.time, speed_of=lambda node: speeds.get(node, 1.0))
    pacer.job_id = job_id
    pacer.refresh()
    pacer.start(origin(pacer.current.started, program_start, read_stop(pace_dir, job_id), job.restart_cost_s))
    return pacer


def type_speeds(slurm_conf: str) -> dict[str, float]:
    """{node: its fake GPU type's speed} of the local cluster whose slurm.conf is `slurm_conf` (its saved settings
    lie beside it, `Layout.spec_file`); {} (every node at the truth's speed) for an untyped cluster or another one.
    """
    try:
        saved = json.loads((Path(slurm_conf).parent / "cluster.json").read_text()) if slurm_conf else {}
        types = parse_gpu_types(saved.get("gpu_types", "") if isinstance(saved, dict) else "")
    except (OSError, ValueError, ElasticoError):
        return {}
    return {node: t.speed for node, t in node_types(types).items()}
