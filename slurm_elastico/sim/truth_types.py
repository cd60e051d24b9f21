"""Ground truth of a cluster of several GPU types: one `GroundTruth` per type, and how fast a job runs across them.

`TypedTruth` maps each type to its ground truth (`profiles_sia.sia_truths`
builds them from measured per-type profiles). Everything that does not
depend on the GPU — the statistical efficiency, the iterations to an app's
end, the Gavel co-location factors — is the same on every type and is read
from `reference` (the type with the most apps).

A job's speed on a type is that type's truth at the placement it holds
(`speed_on`). A micro-batch beyond what the type was measured at (a shape
chosen for another type, or by a type-blind planner) runs as the largest it
was measured at, in more accumulation steps: the same samples per step, in
the micro-batches that fit.

A data-parallel gang spanning types (`gang_speed`) runs at the pace of its
slowest rank (synchronous all-reduce: every rank waits for the last): the
lowest of the speeds each of its types would give the whole placement. Sia
never runs one job across types (its scheduler picks one type a job; its
port of type-blind Pollux drops the GPUs of the job's minority types and
leaves them idle); under Slurm an untyped `--gpus=N` may span types, so the
simulator must rate it, and the slowest rank is the physics of the case.

`slowest_type` is the reference of the type-blind ablation
(`SimSettings.type_blind`): the type where the app's one-GPU peak rate
(its largest measured batch over that batch's step time, Sia's "atomic
throughput") is lowest, so a type-blind planner never expects more than any
GPU gives.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim import profiles_sia
from slurm_elastico.sim.truth import GroundTruth

TypedPlacement = tuple[tuple[str, int], ...]
"""(GPU type, GPUs held there) per node of a job, most GPUs first."""


class TypedTruth:
    """Ground truth per GPU type (`by_type`), the type-independent parts from `reference`, and Sia's restart costs
    when `sia_model` (`profiles_sia.restart_s`)."""

    def __init__(self, by_type: Mapping[str, GroundTruth], sia_model: bool = False, source: str = ""):
        if not by_type:
            raise ConfigError(source or "profiles", ["no GPU type; allowed: at least one type with profiles"])
        self.by_type = dict(by_type)
        self.sia_model = sia_model
        self.source = source
        name = min(self.by_type, key=lambda t: (-len(self.by_type[t].apps), t))
        self.reference = self.by_type[name]
        """The truth of the type with the most apps: statistical efficiency, iterations, co-location."""

    @classmethod
    def from_sia(cls, directory: str, gpu_types: Iterable[str], sia_model: bool = True) -> TypedTruth:
        """Per-type truths from a Sia-layout directory (`profiles_sia.sia_truths`)."""
        return cls(profiles_sia.sia_truths(directory, tuple(gpu_types), sia_model), sia_model, str(directory))

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(self.by_type)

    def __getitem__(self, gpu_type: str) -> GroundTruth:
        try:
            return self.by_type[gpu_type]
        except KeyError:
            raise ConfigError(self.source or "profiles", [f"no ground truth for GPU type {gpu_type!r}; profiled "
                                                          f"types: {', '.join(self.by_type)}"]) from None

    def restart_s(self, app: str) -> float | None:
        """Seconds a start of `app` makes no progress under Sia's model; None: the settings' costs apply."""
        return profiles_sia.restart_s(app) if self.sia_model else None

    def missing(self, app: str, gpu_types: Iterable[str]) -> list[str]:
        """The types of `gpu_types` without a measured profile of `app`."""
        return [t for t in gpu_types if app not in self[t].apps]

    def micro_on(self, gpu_type: str, app: str, micro: int | None) -> int | None:
        """`micro` capped at the largest per-GPU batch measured on `gpu_type` (None stays None)."""
        if micro is None:
            return None
        return min(int(micro), self[gpu_type].batch_range(app)[1])

    def gang_speed(self, app: str, global_batch: int, placement: TypedPlacement, micro: int | None = None) -> float:
        """Optimizer steps/s of a data-parallel job on `placement`: on one type that type's `gang_speed`; across
        types the slowest rank's pace (the lowest such speed of its types)."""
        counts = tuple(n for _, n in placement)
        return min(self[t].gang_speed(app, global_batch, counts, self.micro_on(t, app, micro))
                   for t in dict.fromkeys(t for t, _ in placement))

    def rigid_speed(self, app: str, global_batch: int, placement: TypedPlacement) -> float:
        """A job as submitted (`--gpus=N`, no family): one GPU by the single-GPU rule of its type, else `gang_speed`."""
        if sum(n for _, n in placement) > 1:
            return self.gang_speed(app, global_batch, placement)
        return self[placement[0][0]].rigid_speed(app, global_batch, 1)

    def train_speed(self, gpu_type: str, app: str, global_batch: int, micro: int, share: int) -> float:
        """Steps/s of a one-GPU shape at an MPS share on a GPU of `gpu_type`, alone."""
        return self[gpu_type].train_speed(app, global_batch, self.micro_on(gpu_type, app, micro), share)

    def peak_rate(self, gpu_type: str, app: str) -> float:
        """Samples/s of one GPU of `gpu_type` at the app's largest measured batch (Sia's atomic throughput)."""
        p = self[gpu_type].profile(app)
        return float(p.bsz[-1] / p.step[-1])

    def slowest_type(self, app: str, gpu_types: Iterable[str]) -> str:
        """The type of `gpu_types` with the lowest `peak_rate` for `app` (first written on a tie)."""
        return min(gpu_types, key=lambda t: self.peak_rate(t, app) if app in self[t].apps else math.inf)
