"""Narrowers: how a policy cuts a job's family down to the shapes it may use.

A narrower is a pure `Family -> Family`. The elastico policies and the
baselines pick theirs from here, so the registry (`planner.policies`) and the
baselines (`planner.baselines`, `planner.pollux`) import this module and never
each other in a circle.

- `all_shapes`: the whole family (elastico).
- `default_shape`: only the shape the job would run as unplanned.
- `whole_gpu`: the submitted knobs and GPU count on whole GPUs (plain Slurm).
- `half_gpu`: *static MPS sharing*: every job at its submitted knobs on half a
  GPU, blind to interference (what a site configures by hand with `mps:50`).
- `whole_gpu_any_batch`: the *Pollux-style* goodput baseline: whole GPUs
  only, any knobs the family offers — including other global batches when the
  family declares them with a learning-rate rule (their throughput is then
  goodput, in steps of the submitted batch per second).

On a cluster of several GPU types the narrowers that fix a job's shape
(`default_shape`, `whole_gpu`, `half_gpu`) keep it *type-blind* where the
family spans types: the shape loses its `gpu_type`, so it runs wherever Slurm
finds room, as a request that names no type does. A family of one type (the
user asked for it, `--gres=gpu:TYPE:N`) keeps it.
"""

from __future__ import annotations

import dataclasses

from slurm_elastico.model import Family, Shape

HALF = 50


def all_shapes(fam: Family) -> Family:
    return fam


def blind(fam: Family, d: Shape) -> Shape:
    """`d` without its GPU type when `fam` spans several types (see the module docstring)."""
    return dataclasses.replace(d, gpu_type="") if len({s.gpu_type for s in fam.shapes}) > 1 else d


def default_shape(fam: Family) -> Family:
    """Only the shape the job would run as unplanned (its share and knobs fixed; type-blind)."""
    d = blind(fam, fam.default_shape)
    return dataclasses.replace(fam, shapes=(d,), default=d.name)


def whole_gpu(fam: Family) -> Family:
    """The default shape on whole GPUs: the job's knobs and GPU count as submitted, no sharing (plain Slurm;
    type-blind)."""
    d = blind(fam, fam.default_shape)
    if d.resources.gpus:  # submitted on several GPUs: already whole ones
        return dataclasses.replace(fam, shapes=(d,), default=d.name, throughput_floor=0.0)
    top = max(s.resources.mps for s in fam.shapes)
    if d.resources.mps != top:
        same = [s for s in fam.shapes if s.resources.mps == top and s.knobs == d.knobs]
        d = blind(fam, same[0]) if same else dataclasses.replace(d, resources=dataclasses.replace(d.resources, mps=100))
    d = dataclasses.replace(d, resources=dataclasses.replace(d.resources, mps=100))
    return dataclasses.replace(fam, shapes=(d,), default=d.name, throughput_floor=0.0)


def _same_knobs(fam: Family, d: Shape, share: int) -> Shape:
    """The family's shape with `d`'s knobs at `share`; if pruned away, `d` at that share with throughput in proportion."""
    for s in fam.shapes:
        if s.resources.mps == share and s.knobs == d.knobs:
            return s
    res = dataclasses.replace(d.resources, mps=share)
    return dataclasses.replace(d, resources=res, throughput=d.throughput * share / max(d.resources.mps, 1))


def half_gpu(fam: Family) -> Family:
    """The submitted knobs on half a GPU (a multi-GPU job as submitted); no floor (static sharing checks nothing)."""
    if fam.default_shape.resources.gpus:
        return whole_gpu(fam)
    d = blind(fam, _same_knobs(fam, fam.default_shape, HALF))
    return dataclasses.replace(fam, shapes=(d,), default=d.name, throughput_floor=0.0)


def whole_gpu_any_batch(fam: Family) -> Family:
    """Every shape the family offers on whole GPUs (its largest share of one, or several), the default kept."""
    top = max(s.resources.mps for s in fam.shapes)
    keep = tuple(s for s in fam.shapes if s.resources.gpus or s.resources.mps == top)
    d = fam.default_shape
    default = d.name if d in keep else max(keep, key=lambda s: s.throughput).name
    return dataclasses.replace(fam, shapes=keep, default=default, throughput_floor=0.0)
