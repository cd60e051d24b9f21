"""The planner (PDS): one pure epoch from a `Snapshot` and job families to a `Plan`.

`run_epoch(snapshot, families, settings, model, now)` plans with the policy
`settings.planner.policy` names; `policies.REGISTRY` holds every policy for
code that wants another (the simulator runs each of them).
"""

from __future__ import annotations

from collections.abc import Mapping

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Family, Plan, Snapshot
from slurm_elastico.planner import policies
from slurm_elastico.shapes.current import ADMIN_PREFIX

__all__ = ["ADMIN_PREFIX", "policies", "run_epoch"]


def run_epoch(snapshot: Snapshot, families: Mapping[int, Family], settings: Settings, model: SlowdownModel | None,
              now: float, progress: Mapping[int, float] | None = None) -> Plan:
    """Plan one epoch with the configured policy.

    `families` maps job id → `Family` (jobs without one are left alone; what
    they hold counts). `model` predicts co-location slowdowns (use
    `ContentionModel()` until a trained predictor exists). `now` is Unix
    seconds, passed in so the planner never reads a clock. `progress`
    optionally maps a running job's id to the work units it has done (else
    estimated from its start time). Raises `ConfigError` for an unknown policy.
    """
    return policies.get(settings.planner.policy).plan(snapshot, families, settings, model, now, progress)
