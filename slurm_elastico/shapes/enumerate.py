"""From a validated spec to a `Family`: the cross product, the memory fit, the Pareto front.

Numbers per shape come, in this order, from what the spec declares, from a
profile (passed in: this module never opens the store), or from the estimate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import Family, Resources, Shape
from slurm_elastico.shapes import estimate
from slurm_elastico.shapes.spec import PARALLEL_KNOB, Declared, FamilySpec, shape_name


def enumerate_shapes(spec: FamilySpec, gpu_memory_mib: int,
                     profiles: Mapping[str, Declared] | None = None) -> list[Shape]:
    """Every shape of the cross product that fits its GPUs, with its numbers; no pruning yet.

    A 1-GPU shape holds an MPS share (`Resources.mps`, percent); an n-GPU shape
    holds n whole GPUs (`Resources.gpus` n, `mps` 0), with `gpu_mem_mib` per GPU
    and `cpus`, `host_mem_mib` the spec's per-rank figures times n. Training
    shapes on n GPUs carry the knob `ranks` n and an accumulation of
    global / (micro x n); inference shapes carry `replicas` or
    `tensor_parallel_size` n (the spec's `parallel`).

    Dropped: shapes whose GPU memory exceeds the GPU, and inference shapes
    whose KV cache has no room (throughput 0).
    """
    profiles = profiles or {}
    out: list[Shape] = []
    for knobs, share, gpus in spec.shapes_of():
        name = shape_name(spec.kind, knobs, share, gpus, spec.parallel)
        multi = gpus > 1
        if spec.kind == "train":
            tput, mem = estimate.train(spec.model, spec.global_batch, knobs["micro_batch"], knobs["precision"],
                                       knobs["checkpointing"], 100 if multi else share, gpus)
            knobs_full = {**knobs, "accumulation": spec.global_batch // (knobs["micro_batch"] * gpus),
                          "global_batch": spec.global_batch}
            if multi:
                knobs_full["ranks"] = gpus
        else:
            tput, mem = estimate.infer(spec.model, gpu_memory_mib, knobs["gpu_memory_utilization"],
                                       knobs["max_num_seqs"], knobs["kv_cache_dtype"], 100 if multi else share,
                                       gpus, spec.parallel)
            knobs_full = {**knobs, PARALLEL_KNOB[spec.parallel]: gpus} if multi else dict(knobs)
        for source in (profiles.get(name), spec.declared.get(name)):  # later wins
            if source is not None:
                tput = source.throughput if source.throughput is not None else tput
                mem = source.gpu_mem_mib if source.gpu_mem_mib is not None else mem
        if tput <= 0 or mem > gpu_memory_mib:
            continue
        ranks = gpus if multi else 1
        res = Resources(mps=0 if multi else share, gpu_mem_mib=int(math.ceil(mem)), cpus=spec.cpus * ranks,
                        host_mem_mib=spec.host_mem_mib * ranks, gpus=gpus if multi else 0)
        out.append(Shape(name=name, resources=res, throughput=float(tput), knobs=tuple(sorted(knobs_full.items()))))
    return out


def pareto(shapes: Sequence[Shape], keep: str | None = None) -> list[Shape]:
    """The shapes no other shape beats: at least as fast with no more of any resource (one of each tie).

    `keep` names a shape kept even if dominated (the family's default). Order
    of the input is kept, so the result is deterministic.
    """
    out: list[Shape] = []
    prints = [s.resources.footprint() for s in shapes]  # each once, not once per pair
    for i, a in enumerate(shapes):
        ra = prints[i]
        dominated = False
        for j, b in enumerate(shapes):
            if i == j:
                continue
            rb = prints[j]
            no_worse = b.throughput >= a.throughput and all(x <= y for x, y in zip(rb, ra))
            if not no_worse:
                continue
            better = b.throughput > a.throughput or rb != ra
            if better or j < i:  # strictly better, or an identical twin listed earlier
                dominated = True
                break
        if not dominated or a.name == keep:
            out.append(a)
    return out


def build_family(spec: FamilySpec, gpu_memory_mib: int, profiles: Mapping[str, Declared] | None = None) -> Family:
    """The job's `Family`: enumerated, fitted to the GPU, pruned to its Pareto front.

    Raises `ConfigError` when no shape fits the GPU or the default does not.
    """
    shapes = enumerate_shapes(spec, gpu_memory_mib, profiles)
    if not shapes:
        raise ConfigError(spec.source, [f"(all shapes): none fits a GPU of {gpu_memory_mib} MiB; "
                                        "allowed: shapes whose memory estimate or declared gpu_mem_mib is below it"])
    if spec.default is not None and spec.default not in {s.name for s in shapes}:
        raise ConfigError(spec.source, [f"default: shape {spec.default!r} does not fit a GPU of {gpu_memory_mib} MiB"])
    front = pareto(shapes, keep=spec.default)
    return Family(kind=spec.kind, shapes=tuple(front), total_work=spec.work, throughput_floor=spec.throughput_floor,
                  name=spec.name, default=spec.default)
