"""Which of a plan's pairings are probes, named in the epoch's notes: pure logic.

A probe is a pairing the adapting model (`interference.adapt_online.OnlineAdapted`) admitted at its optimism
while the probe budget allowed it (`interference.probe_budget`): two jobs the plan puts on one GPU (one of them
acted on this epoch) that do not share it yet, whose pair of profiles was never measured on the cluster's GPU type.
The note says so, so an administrator reading the epoch (or its log) can tell a probe from a pairing the model
predicted to gain; the probe is charged to the ledger when it is measured (`helper.observer`) and undone then if
it lost.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurm_elastico.model import Family, Plan, Snapshot
from slurm_elastico.shapes.solo import solo_profile


def probe_notes(plan: Plan, snapshot: Snapshot, families: Mapping[int, Family], model: object) -> list[str]:
    """One note per pairing of `plan` that is a probe of `model` (one with `probes`; any other: none)."""
    probes = getattr(model, "probes", None)
    if probes is None or not getattr(model, "probing", False):
        return []
    where = {j.job_id: {(node, gpu) for node, gpu, _ in j.gpu_alloc} for j in snapshot.jobs}
    acted = {a.job_id for a in plan.actions}
    on_gpu: dict[tuple[str, int], list] = {}
    for p in plan.placements:
        on_gpu.setdefault((p.node, p.gpu), []).append(p)
    pairs, a, b = [], [], []
    for gpu, placed in on_gpu.items():
        for i, x in enumerate(placed):
            for y in placed[i + 1:]:
                together = gpu in where.get(x.job_id, ()) and gpu in where.get(y.job_id, ())
                if together or not {x.job_id, y.job_id} & acted:
                    continue  # they share it already, or neither is placed this epoch: no new pairing
                fx, fy = families.get(x.job_id), families.get(y.job_id)
                sx = {s.name: s for s in fx.shapes}.get(x.shape) if fx is not None else None
                sy = {s.name: s for s in fy.shapes}.get(y.shape) if fy is not None else None
                if sx is None or sy is None:
                    continue
                pairs.append((gpu, x, y))
                a.append(solo_profile(sx, fx.kind, fx.name))  # type: ignore[union-attr]
                b.append(solo_profile(sy, fy.kind, fy.name))  # type: ignore[union-attr]
    if not pairs:
        return []
    gpu_type = getattr(model, "gpu_type", "") or "this GPU type"
    return [f"probe: jobs {x.job_id} and {y.job_id} on GPU {node}:{index}, a pair never measured on {gpu_type}, "
            f"tried within interference.probe_budget (undone after its first measurement if it does not pay)"
            for ((node, index), x, y), probe in zip(pairs, probes(a, b)) if probe]
