"""Measured training step times: one job's profile on the GPUs of one node, and a gang's on any placement.

Training (measured, Pollux on NVIDIA T4): one optimizer step at global batch
G and micro-batch m runs `G/m` micro-steps of the measured `step_time(m)`
(log-log interpolation between measured per-GPU batches) plus one
`sync_time` (`GroundTruth.train_speed`: the rule of every one-GPU figure;
`TrainProfile` holds one app's measurements on one node).

Several GPUs (`GroundTruth.gang_speed`, and `rigid_speed`, which places r GPUs
the way Slurm fills nodes, full nodes first: 6 → (4, 2), `slurm_placement`):
Pollux measured data-parallel step and sync times per placement (GPUs on
each node, e.g. (4, 2)) and per-GPU batch on 1–4 nodes of 4 T4s, and per
(nodes, GPUs) on 6–16 nodes; `pollux_placements.csv.gz` bundles both, and
`GangTable` holds one app's rows. At a fixed global batch G on r GPUs each
runs `a = ceil(G/r / micro)` micro-steps per optimizer step, which takes
`a·(step − sync) + sync` (Pollux's rule: gradients are all-reduced once). A
measured placement (up to a rotation of its nodes, `ring`: the ring
all-reduce visits them in a cycle) is log-log interpolated in the per-GPU
batch; any other is linearly interpolated, in log time, over (nodes, GPUs,
log per-GPU batch) between the placement rows averaged per such triple and
the 6–16-node rows, nodes capped at 16, and takes the nearest measurement
outside them. Per-GPU batches are clamped to the measured range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator
from scipy.spatial import QhullError


@dataclass(frozen=True)
class TrainProfile:
    """Measured step and sync time per per-GPU batch for one app on `gpus` GPUs of one node."""

    app: str
    gpus: int
    bsz: np.ndarray
    step: np.ndarray
    sync: np.ndarray

    def at(self, m: float) -> tuple[float, float]:
        """(step, sync) seconds at per-GPU batch m, log-log interpolated (clamped to the measured range)."""
        x = math.log(min(max(m, self.bsz[0]), self.bsz[-1]))
        lb = np.log(self.bsz)
        return (float(np.exp(np.interp(x, lb, np.log(self.step)))),
                float(np.exp(np.interp(x, lb, np.log(np.maximum(self.sync, 1e-9))))))


def slurm_placement(gpus: int, gpus_per_node: int = 4) -> tuple[int, ...]:
    """GPUs per node as Slurm gives `gpus` GPUs on empty nodes of `gpus_per_node`: full nodes first (6 → (4, 2))."""
    full, rest = divmod(gpus, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


def ring(placement: tuple[int, ...]) -> tuple[int, ...]:
    """The placement's smallest rotation: how Pollux keys its measured placements ((2, 1) and (1, 2) → (1, 2))."""
    return min(placement[i:] + placement[:i] for i in range(len(placement)))


class GangTable:
    """One app's measured multi-GPU step and sync times (see `GroundTruth.gang_speed`).

    `exact`: per measured placement (smallest rotation), times per per-GPU batch. `points`: (nodes, GPUs,
    log per-GPU batch) of the placement rows averaged per such triple plus the scalability rows; `values`:
    (log step, log sync) there.
    """

    def __init__(self, app: str, rows: list[tuple[str, int, int, float, float, float]]):
        """From (placement digits or "" for a scalability row, nodes, GPUs, per-GPU batch, step, sync) rows."""
        per: dict[tuple[int, ...], list[tuple[float, float, float]]] = {}
        avg: dict[tuple[int, int, float], list[tuple[float, float]]] = {}
        for digits, nodes, ranks, bsz, step, sync in rows:
            if digits:
                per.setdefault(ring(tuple(int(c) for c in digits)), []).append((bsz, step, sync))
            avg.setdefault((nodes, ranks, bsz), []).append((step, sync))
        self.exact: dict[tuple[int, ...], TrainProfile] = {}
        for p, vals in per.items():
            a = np.array(sorted(vals))
            self.exact[p] = TrainProfile(app, sum(p), a[:, 0], a[:, 1], a[:, 2])
        keys = sorted(avg)
        self.points = np.array([(n, r, math.log(b)) for n, r, b in keys])
        self.values = np.log(np.maximum(np.array([np.mean(avg[k], axis=0) for k in keys]), 1e-9))
        self.max_nodes = max(k[0] for k in keys)
        self.bsz_range = (min(k[2] for k in keys), max(k[2] for k in keys))
        self._linear: LinearNDInterpolator | NearestNDInterpolator | None = None
        self._nearest: NearestNDInterpolator | None = None

    def at(self, placement: tuple[int, ...], m: float) -> tuple[float, float]:
        """(step, sync) seconds of one micro-step at per-GPU batch m on `placement` (already `ring`-normalised)."""
        prof = self.exact.get(placement)
        if prof is not None:
            return prof.at(m)
        lo, hi = self.bsz_range
        x = np.array([[min(len(placement), self.max_nodes), sum(placement), math.log(min(max(m, lo), hi))]])
        if self._nearest is None:
            self._nearest = NearestNDInterpolator(self.points, self.values)
            try:
                self._linear = LinearNDInterpolator(self.points, self.values)
            except QhullError:  # too few measurements to span a volume: the nearest one everywhere
                self._linear = self._nearest
        v = self._linear(x)[0]
        if not np.all(np.isfinite(v)):  # outside the measured hull: the nearest measurement
            v = self._nearest(x)[0]
        return float(np.exp(v[0])), float(np.exp(v[1]))
