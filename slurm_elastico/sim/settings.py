"""The simulator's own settings (the `sim:` section of a YAML file, or CLI options): cluster, epochs, ground truth.

Validated like `slurm_elastico.config`: every bad key or value is collected
into one `ConfigError` naming it and what is allowed. Planner settings
(policy constants, reshape cost the planner *believes*: `planner.reshape_cost_s`,
fairness) stay in `Settings`; the costs here are what the engine really
charges, apart from that belief: `restart_cost_s` (the job's own
checkpoint-and-restore, what `benchmarks/sim.py` sweeps), plus each kind's
measured overhead (`requeue_overhead_s`, `relaunch_overhead_s`), and at a
job's first start `start_cost_s`, plus `wrapper_start_s` for a job that
comes through elastico-submit's wrapper (`Policy.whole_gpu_gangs`: the
elastico policies).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from slurm_elastico import config
from slurm_elastico.config import _opt
from slurm_elastico.errors import ConfigError
from slurm_elastico.sim import gpu_types

COLOCATION = ("gavel", "gavel-residual", "none")


@dataclass(frozen=True)
class SimSettings:
    gpus: int = _opt(64, lo=1, hi=100000, help="GPUs in the simulated cluster")
    gpus_per_node: int = _opt(8, lo=1, hi=64, help="GPUs per node")
    gpu_memory_mib: int = _opt(16384, lo=1024, help="memory of each GPU (the profiles are from 16 GiB T4s)")
    cpus_per_gpu: int = _opt(16, lo=1, help="CPUs per GPU on each node")
    shares: str = _opt("25,50,75,100", help="MPS shares (percent) every job's family offers, comma-separated")
    epoch_s: float = _opt(60.0, lo=1, help="simulated seconds between planner epochs")
    placement_window_s: float = _opt(60.0, lo=-1, help="a job waits this long for the planner before Slurm starts "
                                                      "it as submitted; -1 = until the planner starts it (not for static "
                                                      "and static-mps: Slurm starts their jobs at once, Policy.plain)")
    restart_cost_s: float = _opt(60.0, lo=0, help="true checkpoint-and-restore time of the job's own program at every "
                                                 "start after its first (no progress), whatever the reshape's kind; "
                                                 "the kind's Slurm or wrapper time comes on top")
    requeue_overhead_s: float = _opt(2.7, lo=0, help="true seconds a requeue adds (requeued to running again): "
                                                     "measured live, benchmarks/reshape.py's requeue row")
    relaunch_overhead_s: float = _opt(1.0, lo=0, help="true seconds an in-place relaunch (the wrapper's, on USR1) "
                                                      "adds: measured live, benchmarks/reshape.py's in-place row")
    start_cost_s: float = _opt(0.0, lo=0, help="seconds a job makes no progress after its first start, holding its "
                                               "GPUs (its processes starting; every later start costs "
                                               "restart_cost_s); 0 = none")
    wrapper_start_s: float = _opt(5.0, lo=0, help="seconds more that a job started through elastico-submit's wrapper "
                                                  "(the policies whose jobs come through it) makes no progress at its "
                                                  "first start: measured live, the demo's start-up gap (elastico jobs "
                                                  "3.4-11.3 s over the simulation, plain ones 1.3-2.5 s)")
    profile_noise: float = _opt(0.05, lo=0, hi=1, help="sigma of the lognormal error of each shape's estimated "
                                                       "throughput, its own (sim.belief)")
    estimate_app_sigma: float = _opt(0.3, lo=0, hi=2, help="sigma of the estimate's log error shared by every shape "
                                                          "of every job of one app (sim.belief)")
    estimate_job_sigma: float = _opt(0.1, lo=0, hi=2, help="sigma of the estimate's log error shared by every shape "
                                                          "of one job (sim.belief)")
    estimate_share_sigma: float = _opt(0.15, lo=0, hi=2, help="sigma of the error of an app's share exponent: its "
                                                             "estimate is off by (share/100)^d (sim.belief)")
    estimate_scaling_sigma: float = _opt(0.1, lo=0, hi=2, help="sigma of the error of an app's data-parallel "
                                                              "scaling: its estimate is off by ranks^r (sim.belief)")
    efficiency_noise: float = _opt(0.1, lo=0, hi=2, help="sigma of the lognormal error of the statistical "
                                                        "efficiency a job's measured gradient noise scale gives "
                                                        "(goodput shapes; sim.belief); none on a cluster of GPU "
                                                        "types, where every policy plans with exact profiles")
    colocation: str = _opt("gavel", choices=COLOCATION, help="ground truth of co-location (sim.truth): Gavel's co-run "
                                                             "speed as a ceiling, its residual beyond time-slicing, "
                                                             "or none (sharing costs only the share)")
    max_gpus_per_job: int = _opt(16, lo=0, hi=4096, help="training families also offer data-parallel shapes of up to "
                                 "this many whole GPUs at the same global batch (where the ground truth measured the "
                                 "app on several GPUs); 0 = every job keeps the GPU count it was submitted with")
    whole_gpu_gangs: bool = _opt(False, help="a training family with data-parallel shapes offers one GPU only whole "
                                             "(no MPS share), as elastico-submit starts such a family on whole GPUs: "
                                             "Slurm 22.05 cannot move a job between mps and gpu; for every policy "
                                             "(the elastico policies always: their jobs come through elastico-submit)")
    adaptive_batch: bool = _opt(False, help="training families also offer other global batches with an LR rule "
                                            "(goodput shapes; what the pollux policy adapts)")
    fixed_batch: bool = _opt(False, help="every training family keeps its submitted global batch, even under a "
                                         "policy that adapts batches (sia, pollux, elastico-goodput): the batch-size "
                                         "ablation, which leaves such a policy only GPU type, count and knobs")
    even_gangs: bool = _opt(True, help="a gang holds the same number of GPUs on each of its nodes (what Slurm's "
                                       "Gres=gpu:P NumNodes=K-K expresses); false: any count per node, the Pollux "
                                       "peer's own rule, only to calibrate the tiresias and pollux baselines against "
                                       "the peer's published figures")
    slurm_version: str = _opt("24.11.5", help="the Slurm version simulated (MAJOR.MINOR.PATCH): which GPUs gpu:P takes "
                                             "(planner.gpu_choice: on 24.11 the P lowest with no user; otherwise, "
                                             "the P lowest not held whole), and the version the planner plans for")
    audit: bool = _opt(False, help="check capacity and bookkeeping after every event (slow; for tests)")
    cluster: str = _opt("", help="GPU types of the cluster (sim.gpu_types): sia (Sia's 64 GPUs: 6x4 aws T4, 2x8 "
                                 "dgx-ext A100, 3x8 rtx RTX 2080 Ti) or TYPE:NODESxGPUS,...; needs profiles; empty = "
                                 "one type, gpus of gpus_per_node")
    profiles: str = _opt("", help="directory of per-type profiles in Sia's layout (sim.profiles_sia), read for a "
                                  "cluster of types")
    type_blind: bool = _opt(False, help="on a cluster of types, families name no type and carry the throughput of "
                                        "the app's slowest type (the type-blind ablation)")
    sia_model: bool = _opt(True, help="with profiles: Sia's simulator calibration (per-app slowdown of the measured "
                                      "step times, per-app checkpoint-restore seconds on every start instead of "
                                      "restart_cost_s and start_cost_s, and nodes whose CPUs and memory never limit "
                                      "a job: its simulator counts GPUs only)")

    def share_levels(self) -> tuple[int, ...]:
        return tuple(sorted({int(x) for x in self.shares.split(",") if x.strip()}))


def from_mapping(data: Any, source: str = "sim") -> SimSettings:
    """`SimSettings` from a mapping (the `sim:` section), with one `ConfigError` for every problem."""
    problems: list[str] = []
    out = config._build(SimSettings, {} if data is None else data, "sim.", problems)
    if not problems:
        try:
            levels = out.share_levels()
            if not levels or any(not 1 <= s <= 100 for s in levels):
                problems.append(f"sim.shares: {out.shares!r} must list shares in 1..100")
        except ValueError:
            problems.append(f"sim.shares: {out.shares!r} is not a comma-separated list of integers")
        if out.cluster:
            try:
                gpu_types.parse_cluster(out.cluster, "sim.cluster")
            except ConfigError as exc:
                problems += [f"sim.cluster: {p}" for p in exc.problems]
            if not out.profiles:
                problems.append("sim.cluster: a cluster of GPU types needs sim.profiles (--profiles DIR: per-type "
                                "profiles in Sia's layout)")
        elif out.profiles:
            problems.append("sim.profiles: per-type profiles need a cluster of GPU types (sim.cluster, --cluster "
                            f"{gpu_types.SPEC_FORM})")
        if out.adaptive_batch and out.fixed_batch:
            problems.append("sim.fixed_batch: true contradicts sim.adaptive_batch: true (every family adaptive); "
                            "set one of them")
        if not re.fullmatch(r"\d+\.\d+(\.[0-9A-Za-z.-]+)?", out.slurm_version):
            problems.append(f"sim.slurm_version: {out.slurm_version!r} is not a Slurm version such as 24.11.5 or "
                            "22.05.8 (MAJOR.MINOR, then the release's own suffix)")
    if problems:
        raise ConfigError(source, problems)
    return out


def replace(s: SimSettings, **changes: Any) -> SimSettings:
    """A copy with `changes`, validated."""
    return from_mapping({**dataclasses.asdict(s), **changes})
