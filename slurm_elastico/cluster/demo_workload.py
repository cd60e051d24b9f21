"""The demo's job list, as the local cluster runs it and as the simulator replays it (pure: no Slurm, no clock).

One list of `DemoJob`s gives, for each job:
- the trace row the simulator replays (`trace`);
- the shape family elastico-submit gets (`family_spec`): the knobs, shares
  and GPU counts of the simulator's own family for that trace row
  (`sim.families.family_of`: training micro-batches by halving from the
  largest measured one, fp32, and data-parallel shapes of 2 whole GPUs at
  the same global batch where the app was measured on several GPUs and each
  rank keeps at least the smallest measured batch (at most `Plan.max_gpus`,
  2, GPUs per shape; such a family offers one GPU only whole, as
  elastico-submit starts it on whole GPUs and Slurm 22.05 cannot move a job
  from `gpu` to `mps`: the simulator's `whole_gpu_gangs`); inference `gpu_memory_utilization` ×
  `max_num_seqs` × KV dtype), each shape `declared` with the truth's solo speed and GPU memory, i.e. what
  `elastico profile` would record on the emulated GPU, so the live planner
  sees the numbers the simulated one sees (profiling noise 0);
- the emulated job its program paces to (`emulated`, see `cluster.pacing`).

`predict` runs the simulator in process on the same list and cluster: the
`static` policy with no placement window (plain sbatch: Slurm starts each job
at once on a whole GPU, at its default one-GPU shape) and `elastico` with the
helper's interval as epoch, elastico-submit's placement window and the
interference model the helper plans with (`settings`: the untrained contention
model, as no model file is configured). The jobs' true co-location speeds are
the ground truth's (`Plan.colocation`) in both.

The default list (`APPS`, `job_list`): 6 training jobs and 3 inference
jobs, one every 6 s, on 8 GPUs (2 nodes × 4: one half of the local
cluster, `cluster.halves`). Four of the training jobs have GPU counts 1
and 2 (`Plan.max_gpus`): imagenet at global batch 160 (1.3 steps/s on one
GPU, 1.8x that on two; 300 steps), yolov3 at 16 (1.7 steps/s on one GPU,
1.6x on two; 60 steps) and bert at 12 (1.1 steps/s on one GPU, 1.6x on
two; 240 steps). The fastest shape of each at one GPU keeps the whole
global batch in one micro-batch, and at two splits it across the ranks, so
every GPU-count change to a job's fastest shape is also a micro-batch
reshape. The jobs are long (imagenet and bert about 230 s on one GPU) so
that a job's start-up and exit, which the simulator models only as
`start_cost_s`, are a few percent of its time. The two ncf jobs at 32 (a
recommendation model, one micro-batch) cannot be split and take MPS
shares, as inference does. An ncf job is sub-second on its emulated GPU
(about 130 steps/s, 60 steps), so live its time is mostly its start-up.
Plain Slurm runs each job on one whole GPU and leaves GPUs idle while its
long jobs run alone; the helper starts jobs on two GPUs, or on one and
grows them into freed GPUs (GPU count, with a new micro-batch per rank):
which of the two depends on the seconds at which GPUs free, so a run shows
GPU-count reshapes or none, and the gain either way (`sim.truth`: sharing a
GPU is at best neutral for jobs that fill it).

The one pairing the helper's contention model admits on this list is an
inference job beside the small ncf job (Gavel measured LM next to
Recommendation at 0.73 + 0.70 of solo speed): when every GPU is taken the
helper may start an inference job on the half GPU next to it and widen it
once a GPU frees (a share reshape). The best engine arguments do not depend
on the share on this ground truth (the KV cache fits beside ncf either
way), so that widening keeps them: the list gives no engine reshape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_elastico.cluster.pacing import Emulated, Knobs, rate, seconds_for
from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError
from slurm_elastico.model import ActionKind
from slurm_elastico.shapes.spec import shape_name
from slurm_elastico.sim import families as sim_families
from slurm_elastico.sim.trace import INFER_APP, TraceJob, default_micro
from slurm_elastico.sim.truth import GroundTruth

GPU_MEM_MIB = 16384
INFER_CONTEXT, INFER_GENERATED = 1024.0, 512.0
"""Mean tokens per request of the emulated inference jobs: about a third of a second per request on a whole GPU."""


@dataclass(frozen=True)
class DemoJob:
    index: int
    kind: str
    app: str
    submit_s: float
    work: int
    """Optimizer steps (train) or requests (infer)."""
    global_batch: int = 0

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.app}-{self.index}"


@dataclass(frozen=True)
class Plan:
    """The demo's cluster and timings, shared by both live runs and the simulator."""

    gpus: int = 8
    """GPUs of one half of the local cluster: each run (plain, elastico) has its own half (`cluster.halves`)."""
    gpus_per_node: int = 4
    shares: tuple[int, ...] = (50, 100)
    interval_s: float = 3.0
    placement_window_s: int = 60
    """elastico-submit's `--begin` delay: after it Slurm starts a waiting job itself, at its default shape. 20 s
    beyond the longest wait the simulator predicts for the default list, as live the GPUs free seconds later."""
    max_gpus: int = 2
    """The most GPUs of a training job's data-parallel shapes (the simulator's `max_gpus_per_job`); 0: none. Two:
    a shape of four ranks starts four PyTorch processes at once, which on a loaded machine of few cores takes far
    longer than the start cost the simulator is given, and delays every job after it."""
    restart_cost_s: float = 10.0
    """What a reshape really costs on the local cluster (checkpoint, requeue, Slurm's start, Python and torch
    start-up): the simulator's `restart_cost_s` and the planner's `reshape_cost_s`."""
    colocation: str = "gavel"
    start_cost_s: float = 2.0
    """Seconds of start-up and exit per job on the local cluster, for the prediction before the live runs (the
    simulator's `start_cost_s`); after them the demo replays with the value measured on the plain half."""


APPS = (("ncf", 32, 60), ("imagenet", 160, 300), ("yolov3", 16, 60), ("bert", 12, 240))
"""The training apps of the list, taken in turn: (app, global batch, optimizer steps) (see the module docstring)."""


def job_list(train: int = 6, infer: int = 3, gap_s: float = 6.0, steps: int | None = None, requests: int = 120,
             apps: Sequence[tuple[str, int, int]] = APPS) -> list[DemoJob]:
    """`train` + `infer` jobs arriving every `gap_s` seconds, inference spread evenly among the training jobs,
    the training apps taken in turn; each training job runs its app's steps, or `steps` when given."""
    if train < 0 or infer < 0 or train + infer == 0:
        raise ConfigError("demo", [f"train {train}, infer {infer}: at least one job, none negative"])
    if gap_s < 0 or (steps is not None and steps < 1) or requests < 1:
        raise ConfigError("demo", [f"gap_s {gap_s} (>= 0), steps {steps} (>= 1, or none: each app's own), "
                                   f"requests {requests} (>= 1)"])
    n = train + infer
    out: list[DemoJob] = []
    t = 0
    for i in range(n):
        is_infer = (i * infer) // n != ((i + 1) * infer) // n
        if is_infer:
            out.append(DemoJob(i, "infer", INFER_APP, i * gap_s, requests))
        else:
            app, batch, own = apps[t % len(apps)]
            t += 1
            out.append(DemoJob(i, "train", app, i * gap_s, own if steps is None else steps, batch))
    return out


def trace(jobs: Sequence[DemoJob]) -> list[TraceJob]:
    """The simulator's trace of the list: one-GPU jobs submitted at a whole GPU's share (100) (a training job's
    GPU counts are its family's, `Plan.max_gpus`)."""
    return [TraceJob(j.index + 1, j.submit_s, j.kind, j.app, 1, float(j.work), j.global_batch, 100,
                     INFER_CONTEXT if j.kind == "infer" else 0.0, INFER_GENERATED if j.kind == "infer" else 0.0)
            for j in jobs]


def emulated(job: DemoJob, plan: Plan) -> Emulated:
    if job.kind == "train":
        return Emulated("train", job.app, job.global_batch, gpu_mem_mib=GPU_MEM_MIB, colocation=plan.colocation,
                        restart_cost_s=plan.restart_cost_s)
    return Emulated("infer", job.app, context_tokens=INFER_CONTEXT, generated_tokens=INFER_GENERATED,
                    gpu_mem_mib=GPU_MEM_MIB, colocation=plan.colocation, restart_cost_s=plan.restart_cost_s)


def default_knobs(truth: GroundTruth, job: DemoJob) -> dict:
    """The knobs a job runs with when nobody shapes it (plain sbatch): the simulator's default shape's."""
    if job.kind == "train":
        return {"micro_batch": default_micro(truth, job.app, job.global_batch)}
    return {"gpu_memory_utilization": sim_families.GMUS[-1], "max_num_seqs": sim_families.SEQS[-1],
            "kv_cache_dtype": "auto"}


def solo_seconds(truth: GroundTruth, job: DemoJob, plan: Plan) -> float:
    """Seconds `job`'s work takes at its default shape alone on a whole GPU (how plain sbatch runs it), as its
    emulated GPU paces it (`pacing.rate`)."""
    knobs = default_knobs(truth, job)
    at = Knobs(**knobs) if job.kind == "infer" else Knobs(micro_batch=knobs["micro_batch"])
    return seconds_for(job.work, rate(truth, emulated(job, plan), at, 100))


def family_spec(truth: GroundTruth, job: DemoJob, plan: Plan) -> dict:
    """The YAML mapping elastico-submit reads for `job` (see the module docstring); every shape declared."""
    ranks = gang_ranks(truth, job, plan)
    shares = [100] if ranks else sorted(set(plan.shares) | {100})
    declared: dict[str, dict] = {}
    common = {"name": job.app, "mps_shares": shares, "cpus": 1, "host_mem_mib": 512}
    if job.kind == "train":
        micros = sim_families.micro_batches(truth, job.app, job.global_batch)
        for m in micros:
            knobs = {"micro_batch": m, "precision": "fp32", "checkpointing": False}
            for s in shares:
                declared[shape_name("train", knobs, s)] = {
                    "throughput": truth.train_speed(job.app, job.global_batch, m, s),
                    "gpu_mem_mib": int(truth.train_mem_mib(job.app, m))}
        for r in ranks:
            for m in sim_families.micro_batches(truth, job.app, job.global_batch, r):
                knobs = {"micro_batch": m, "precision": "fp32", "checkpointing": False}
                declared[shape_name("train", knobs, 0, r)] = {
                    "throughput": truth.gang_speed(job.app, job.global_batch,
                                                   sim_families.packed(r, plan.gpus_per_node), m),
                    "gpu_mem_mib": int(truth.train_mem_mib(job.app, m))}
        default = shape_name("train", {**default_knobs(truth, job), "precision": "fp32", "checkpointing": False}, 100)
        gpus = {"gpus": [1, *ranks], "gpus_per_node": plan.gpus_per_node} if ranks else {}
        return {"kind": "train", **common, **gpus, "global_batch": job.global_batch, "micro_batches": micros,
                "precisions": ["fp32"], "checkpointing": [False], "steps": job.work, "default": default,
                "declared": declared}
    for gmu in sim_families.GMUS:
        for n in sim_families.SEQS:
            for kv in sim_families.KV:
                knobs = {"gpu_memory_utilization": gmu, "max_num_seqs": n, "kv_cache_dtype": kv}
                for s in shares:
                    speed = truth.infer_speed(INFER_CONTEXT, INFER_GENERATED, gmu, n, kv, s, GPU_MEM_MIB)
                    if speed <= 0:
                        raise ConfigError("demo", [f"inference shape {shape_name('infer', knobs, s)} fits no "
                                                   "sequence; the demo's request sizes must fit every shape"])
                    declared[shape_name("infer", knobs, s)] = {"throughput": speed, "gpu_mem_mib": int(gmu * GPU_MEM_MIB)}
    default = shape_name("infer", {**default_knobs(truth, job)}, 100)
    return {"kind": "infer", **common, "requests": job.work, "gpu_memory_utilization": list(sim_families.GMUS),
            "max_num_seqs": list(sim_families.SEQS), "kv_cache_dtype": list(sim_families.KV), "default": default,
            "declared": declared}


def gang_ranks(truth: GroundTruth, job: DemoJob, plan: Plan) -> list[int]:
    """The data-parallel sizes (2 or more) of a training job's family: the simulator's (`sim.families.gang_ranks`)."""
    if job.kind != "train" or not plan.max_gpus:
        return []
    return sim_families.gang_ranks(trace([job])[0], truth, plan.max_gpus)


def settings(plan: Plan, base: Settings | None = None) -> Settings:
    """The planner settings both the helper and the simulator use."""
    s = base or Settings()
    return dataclasses.replace(
        s, gpu=dataclasses.replace(s.gpu, memory_mib=GPU_MEM_MIB, shares_per_gpu=100),
        planner=dataclasses.replace(s.planner, reshape_cost_s=plan.restart_cost_s))


def predict(jobs: Sequence[DemoJob], plan: Plan, truth: GroundTruth | None = None,
            arrivals: dict[str, Sequence[DemoJob]] | None = None, slurm_version: str = "",
            start_cost_s: float = 0.0) -> dict:
    """{policy: (RunResult, {job id: shape at each start or in-place relaunch})} of the simulator on the list, for
    `static` and `elastico` (see the module docstring). `arrivals` gives a policy the list as it really arrived
    (the same jobs, other submission times: `at_arrivals`). `slurm_version`: the Slurm simulated (the live
    cluster's, so its GPU choice is modelled: `SimSettings.slurm_version`); empty = the simulator's default.
    `start_cost_s`: seconds each job's first start makes no progress (`SimSettings.start_cost_s`): the demo gives
    `Plan.start_cost_s` before its live runs and the cost measured on the plain half after them (a long job's
    start-up overlaps its emulated work live, `pacing.origin`; its exit, a short job's start-up and Slurm's
    completing state do not)."""
    from slurm_elastico.interference import load_model
    from slurm_elastico.sim import engine
    from slurm_elastico.sim import settings as sim_settings

    truth = truth or GroundTruth()
    planned = settings(plan)
    model = load_model(planned.interference.model)  # what `elastico sched` plans with, from the same settings
    out = {}
    for policy, window in (("static", 0), ("elastico", plan.placement_window_s)):
        rows = trace((arrivals or {}).get(policy, jobs))
        sim = sim_settings.from_mapping({
            "gpus": plan.gpus, "gpus_per_node": plan.gpus_per_node, "gpu_memory_mib": GPU_MEM_MIB,
            "shares": ",".join(str(s) for s in sorted(set(plan.shares) | {100})), "epoch_s": plan.interval_s,
            "placement_window_s": window, "restart_cost_s": plan.restart_cost_s, "start_cost_s": start_cost_s,
            "profile_noise": 0.0,
            "max_gpus_per_job": plan.max_gpus, "whole_gpu_gangs": True, "colocation": plan.colocation,
            **({"slurm_version": slurm_version} if slurm_version else {})})
        eng = engine.Engine(rows, policy, planned, sim, model, truth)
        shapes = _record_shapes(eng.cluster)
        out[policy] = (eng.run(), shapes)
    return out


def at_arrivals(jobs: Sequence[DemoJob], submitted: dict[int, float]) -> list[DemoJob]:
    """The list with each job's submission at `submitted[index]` seconds (measured), relative to the first one."""
    missing = sorted(j.index for j in jobs if j.index not in submitted)
    if missing:
        raise ConfigError("demo", [f"no submission time for job(s) {missing}"])
    first = min(submitted[j.index] for j in jobs)
    return [dataclasses.replace(j, submit_s=submitted[j.index] - first) for j in jobs]


def _record_shapes(cluster) -> dict[int, list[str]]:
    """Record the shape each job of the simulated `cluster` takes at every start and in-place relaunch (USR1),
    as the live programs print it when they start: wraps the cluster's `start` and `apply` on this instance."""
    shapes: dict[int, list[str]] = {}
    start, apply = cluster.start, cluster.apply

    def started(job, alloc):
        start(job, alloc)
        shapes.setdefault(job.job_id, []).append(job.shape)

    def applied(action):
        apply(action)
        job = cluster.jobs.get(action.job_id)
        if job is not None and action.kind is ActionKind.SIGNAL and action.signal == "USR1":
            shapes.setdefault(job.job_id, []).append(job.shape)

    cluster.start, cluster.apply = started, applied
    return shapes
