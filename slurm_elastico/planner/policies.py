"""Planning policies behind one registry: `elastico`, the `static` baseline, the ablations and the peers' baselines.

A policy is data: how it narrows a family (`planner.narrowers`), whether it prices, whether it
checks interference, whether it reshapes running jobs, and how it orders the
queue. The epoch reads those fields and never a policy's name, so the live
helper and the simulator run exactly the same code for each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Family, Plan, Snapshot
from slurm_elastico.planner.baselines import LasPolicy
from slurm_elastico.planner.epoch import plan_epoch
from slurm_elastico.planner.gpu_choice import start_key
from slurm_elastico.planner.narrowers import all_shapes, default_shape, half_gpu, whole_gpu
from slurm_elastico.planner.gavel import GavelPolicy
from slurm_elastico.planner.pollux_types import TypeBlindPollux
from slurm_elastico.planner.sia import SiaPolicy


def value_order(jobs: Sequence) -> list[int]:
    """Most value per GPU first: weight × best (throughput fraction / dominant resource); ties by job id."""
    if not jobs:
        return []
    key = np.array([j.weight * j.table.density for j in jobs])
    ids = np.array([j.view.job_id for j in jobs])
    return [int(i) for i in np.lexsort((ids, -key))]


def fifo_order(jobs: Sequence) -> list[int]:
    """What Slurm does (`gpu_choice.start_key`): highest priority, then earliest submitted, then lowest id."""
    return sorted(range(len(jobs)), key=lambda i: start_key(jobs[i].view))


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    narrow: Callable[[Family], Family]
    price: bool
    interference: bool
    reshape: bool
    order: Callable[[Sequence], list[int]]
    allot: bool = False
    """GPU counts of data-parallel jobs by weighted shortest remaining time (`planner.allot`), not by the prices."""
    whole_gpu_gangs: bool = False
    """Its jobs are submitted with elastico-submit, which starts a family with GPU counts on whole GPUs (`gpu:N`,
    `shapes.nodes.start_request`), so such a family has no shape on part of a GPU: the simulator builds its
    families so (`SimSettings.whole_gpu_gangs` for every policy)."""
    plain: bool = False
    """Slurm as it is: in the simulator its jobs are plain batch jobs at the shape its narrower gives the family's
    default (static: whole GPUs), started by Slurm's own scheduler and backfill the moment they fit, with no
    placement window, and no family reaches the planner (`sim.engine`)."""
    adapts_batch: bool = False
    """Every training family of the simulator is adaptive: it also offers goodput shapes at other global batches
    (with a learning-rate rule), whose throughput is goodput, in steps of the submitted batch per second
    (`sim.families.goodput_shapes`; `SimSettings.adaptive_batch` for every policy). The planner needs nothing
    else: it prices and allots those shapes as any other, so a job's batch is chosen with its GPU count, type and
    knobs, and a change of batch is a reshape that must pay its restart. Live, a family is adaptive only where its
    file says so (`batch: adaptive`)."""

    def plan(self, snapshot: Snapshot, families: Mapping[int, Family], settings: Settings,
             model: SlowdownModel | None, now: float, progress: Mapping[int, float] | None = None) -> Plan:
        """One epoch under this policy; pure (see `slurm_elastico.planner.epoch`)."""
        return plan_epoch(snapshot, families, settings, model, now, self, progress)


REGISTRY: dict[str, Policy] = {p.name: p for p in (  # type: ignore[misc]  (the peers' policies: Policy's interface)
    Policy("elastico", "shape families, shadow prices, interference-aware packing, reshapes that pay",
           all_shapes, price=True, interference=True, reshape=True, order=value_order, allot=True,
           whole_gpu_gangs=True),
    Policy("elastico-goodput", "elastico with every training family adaptive: goodput shapes at other global "
           "batches (throughput x statistical efficiency relative to the submitted batch), the batch chosen with the "
           "GPU count, type and knobs; a batch change is a reshape that must pay its restart",
           all_shapes, price=True, interference=True, reshape=True, order=value_order, allot=True,
           whole_gpu_gangs=True, adapts_batch=True),
    Policy("static", "each job at its submitted shape on a whole GPU, first come first served with backfill",
           whole_gpu, price=False, interference=False, reshape=False, order=fifo_order, plain=True),
    Policy("no-shapes", "elastico without shape choice: each job only at its default shape",
           default_shape, price=True, interference=True, reshape=False, order=value_order, whole_gpu_gangs=True),
    Policy("no-pricing", "elastico without prices: every job without data-parallel shapes asks for its fastest "
           "shape, no upgrades (GPU counts come from the allotment either way: prices choose only those jobs' "
           "shapes)",
           all_shapes, price=False, interference=True, reshape=True, order=value_order, allot=True,
           whole_gpu_gangs=True),
    Policy("no-interference", "elastico blind to co-location slowdown: no Γ, no floor check",
           all_shapes, price=True, interference=False, reshape=True, order=value_order, allot=True,
           whole_gpu_gangs=True),
    Policy("no-allot", "elastico with GPU counts by the prices alone (no shortest-remaining-time allotment)",
           all_shapes, price=True, interference=True, reshape=True, order=value_order, whole_gpu_gangs=True),
    Policy("static-mps", "static MPS sharing: each job at its submitted knobs on half a GPU, first come first "
           "served, blind to interference", half_gpu, price=False, interference=False, reshape=False,
           order=fifo_order, plain=True),
    LasPolicy("tiresias", "Tiresias (NSDI 2019) as the Pollux artifact runs it: two-queue least "
              "attained service (Q0 until 16 GPU-hours, then Q1), whole GPUs at the submitted count, "
              "lower-queue jobs preempted and resumed later"),
    TypeBlindPollux("pollux", "Pollux (OSDI 2021): GPU counts and batch sizes for goodput (throughput x "
                    "statistical efficiency), allocations maximising the p=-1 power mean of speedups with "
                    "restarts penalised, whole GPUs, preemption; blind to GPU types as Sia's evaluation ran it"),
    SiaPolicy("sia", "Sia (SOSP 2023): GPU type, count and batch size for goodput, an integer programme over "
              "normalised goodput^-0.5 with restarts penalised, throughput models bootstrapped per type"),
    GavelPolicy("gavel", "Gavel + TunedJobs as Sia's evaluation ran it: each job at its submitted GPU count and "
                "batch, time fractions per GPU type maximising total throughput, realised in 360 s rounds"),
    GavelPolicy("gavel-maxmin", "Gavel (OSDI 2020) with its heterogeneity-aware max-min fairness over effective "
                "throughput, jobs at their submitted GPU count and batch, 360 s rounds", objective="maxmin"),
)}


def get(name: str) -> Policy:
    """The policy registered as `name`; a `ConfigError` listing the valid names otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError("planner.policy", [f"{name!r} is not a policy; allowed: {', '.join(REGISTRY)}"]) from None
