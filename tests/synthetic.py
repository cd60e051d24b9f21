"""Synthetic clusters and job mixes: fixtures for the unit tests and benchmarks/planner.py (not installed).

Import it as `tests.synthetic`: pytest puts the repository root on sys.path
(`pythonpath` in pyproject.toml), and the benchmarks put it there themselves.

Deterministic from a `numpy.random.Generator`. Families come from a few
templates shared by many jobs, as on a real cluster where users submit many
jobs from the same spec file (the epoch caches per distinct family object).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pwd

import numpy as np

from slurm_elastico.model import (Family, GpuUse, GpuView, GresRequest, JobState, JobView, NodeView, Resources,
                                  Shape, Snapshot)

USER = pwd.getpwuid(os.getuid()).pw_name
"""The jobs' user: this process's, so the reports a test writes pass the helper's owner check."""

GPU_MEM_MIB = 81920


def cluster(n_gpus: int, gpus_per_node: int = 8, cpus_per_gpu: int = 8, mem_per_gpu_mib: int = 65536,
            shares: int = 100) -> tuple[NodeView, ...]:
    """Idle nodes of `gpus_per_node` GPUs each (the last node takes the remainder)."""
    nodes = []
    left, k = n_gpus, 0
    while left > 0:
        g = min(gpus_per_node, left)
        name = f"n{k:04d}"
        nodes.append(NodeView(name=name, state="idle", partitions=("gpu",), cpus=g * cpus_per_gpu, cpus_alloc=0,
                              memory_mib=g * mem_per_gpu_mib, memory_alloc_mib=0,
                              gpus=tuple(GpuView(name, i, shares) for i in range(g)), gpu_memory_mib=GPU_MEM_MIB))
        left -= g
        k += 1
    return tuple(nodes)


def random_family(rng: np.random.Generator, n_shapes: int = 8, kind: str | None = None) -> Family:
    """A Pareto-like family: faster shapes take more share and usually more memory."""
    kind = kind or ("train" if rng.random() < 0.6 else "infer")
    shares = np.array([25, 50, 75, 100])
    base = float(rng.uniform(0.5, 5.0))
    alpha = float(rng.uniform(0.5, 1.0))
    shapes = []
    for i in range(n_shapes):
        share = int(shares[i % len(shares)])
        variant = i // len(shares)
        eff = float(rng.uniform(0.6, 1.0)) if variant else 1.0
        mem = int(rng.uniform(4000, 30000) * (1.0 + 0.5 * variant) * (0.6 + 0.4 * share / 100))
        tput = base * (share / 100.0) ** alpha * eff
        shapes.append(Shape(name=f"s{i}-mps{share}", resources=Resources(share, mem, int(rng.integers(1, 5)),
                                                                         int(rng.integers(2, 16)) * 1024),
                            throughput=tput))
    floor = float(base * rng.uniform(0.0, 0.3)) if rng.random() < 0.8 else 0.0
    return Family(kind=kind, shapes=tuple(shapes), total_work=float(rng.uniform(500, 20000)),
                  throughput_floor=floor, name=f"model{int(rng.integers(0, 6))}", default=shapes[-1].name)


def with_gangs(rng: np.random.Generator, fam: Family, counts: tuple[int, ...] = (2, 4, 8)) -> Family:
    """`fam` plus data-parallel shapes of n whole GPUs (its whole-GPU shape's knobs, a speedup drawn per
    family between 0.7 and 0.95 of linear), submitted on one of them."""
    whole = max(fam.shapes, key=lambda s: (s.resources.mps, s.throughput))
    eff = float(rng.uniform(0.7, 0.95))
    r = whole.resources
    gangs = tuple(Shape(f"gpus{n}", Resources(0, r.gpu_mem_mib, r.cpus * n, r.host_mem_mib * n, gpus=n),
                        whole.throughput * n * eff ** math.log2(n)) for n in counts)
    default = gangs[int(rng.integers(0, len(gangs)))].name
    return Family(kind="train", shapes=fam.shapes + gangs, total_work=fam.total_work,
                  throughput_floor=fam.throughput_floor, name=fam.name, default=default)


def with_types(rng: np.random.Generator, fam: Family, types: tuple[str, ...]) -> Family:
    """`fam` on each of `types` (a copy of every shape named `<name>@<type>`, with `gpu_type` set): the first type
    at the family's speeds, each later one faster by a factor drawn per family (1–2.5× over the one before), as
    newer GPU generations speed jobs up by different amounts."""
    shapes, factor = [], 1.0
    for k, t in enumerate(types):
        if k:
            factor *= float(rng.uniform(1.0, 2.5))
        shapes += [dataclasses.replace(s, name=f"{s.name}@{t}", throughput=s.throughput * factor, gpu_type=t)
                   for s in fam.shapes]
    default = f"{fam.default}@{types[0]}" if fam.default else None
    return dataclasses.replace(fam, shapes=tuple(shapes), default=default)


def instance(rng: np.random.Generator, n_jobs: int, n_gpus: int, n_shapes: int = 8, templates: int = 64,
             running_frac: float = 0.0, gpus_per_node: int = 8, now: float = 1_000_000.0, gang_frac: float = 0.0,
             types: tuple[str, ...] = ()) -> tuple[Snapshot, dict[int, Family]]:
    """A snapshot with `n_jobs` pending family jobs (a fraction of them already running) on `n_gpus` GPUs;
    `gang_frac` of the family templates also have data-parallel shapes (`with_gangs`) and are submitted on
    several GPUs (their running jobs run on a share, as the others do). With `types`, node k's GPUs are of type
    `types[k % len(types)]` and every family has its shapes on each type (`with_types`)."""
    fams = [random_family(rng, n_shapes) for _ in range(max(1, templates))]
    if gang_frac > 0:  # (no draw otherwise: the instances without gangs stay what they were)
        fams = [with_gangs(rng, f) if rng.random() < gang_frac else f for f in fams]
    if types:
        fams = [with_types(rng, f, types) for f in fams]
    nodes = list(cluster(n_gpus, gpus_per_node))
    if types:
        nodes = [dataclasses.replace(n, gpu_type=types[k % len(types)]) for k, n in enumerate(nodes)]
    jobs, families = [], {}
    # Running jobs take a share on a GPU with room; the node views are rebuilt with their use.
    uses: dict[tuple[int, int], list[GpuUse]] = {}
    free = {(ni, gi): 100 for ni, n in enumerate(nodes) for gi in range(len(n.gpus))}
    slots = list(free)
    cpus_used: dict[int, int] = {}
    gmem_used: dict[tuple[int, int], int] = {}
    mem_used: dict[int, int] = {}
    for k in range(n_jobs):
        jid = 1000 + k
        fam = fams[int(rng.integers(0, len(fams)))]
        families[jid] = fam
        submit = int(now - rng.uniform(0, 7200))
        if rng.random() < running_frac and slots:
            shares = [sh for sh in fam.shapes if not sh.resources.gpus]
            if types:  # the slot first: the shape must be of its node's type
                key = slots[int(rng.integers(0, len(slots)))]
                shares = [sh for sh in shares if sh.gpu_type == nodes[key[0]].gpu_type]
                shape = shares[int(rng.integers(0, len(shares)))]
            else:
                shape = shares[int(rng.integers(0, len(shares)))]
                key = slots[int(rng.integers(0, len(slots)))]
            node = nodes[key[0]]
            room = (free[key] >= shape.resources.mps
                    and gmem_used.get(key, 0) + shape.resources.gpu_mem_mib <= node.gpu_memory_mib
                    and cpus_used.get(key[0], 0) + shape.resources.cpus <= node.cpus
                    and mem_used.get(key[0], 0) + shape.resources.host_mem_mib <= node.memory_mib)
            if room:  # a running job that could really run: within its node's CPUs and memory and its GPU's memory too
                free[key] -= shape.resources.mps
                cpus_used[key[0]] = cpus_used.get(key[0], 0) + shape.resources.cpus
                gmem_used[key] = gmem_used.get(key, 0) + shape.resources.gpu_mem_mib
                mem_used[key[0]] = mem_used.get(key[0], 0) + shape.resources.host_mem_mib
                uses.setdefault(key, []).append(GpuUse(jid, shape.resources.mps))
                jobs.append(JobView(jid, f"j{jid}", USER, "gpu", JobState.RUNNING, gres=GresRequest("mps", shape.resources.mps),
                                    nodes=(node.name,), gpu_indices=(key[1],), cpus=shape.resources.cpus,
                                    memory_mib=shape.resources.host_mem_mib, submit_time=submit, requeue=True,
                                    start_time=int(now - rng.uniform(0, 600)), admin_comment=f"elastico:shape={shape.name}"))
                continue
        jobs.append(JobView(jid, f"j{jid}", USER, "gpu", JobState.PENDING, gres=GresRequest("mps", 100),
                            submit_time=submit, priority=int(rng.integers(0, 3))))
    cpus_on: dict[str, int] = {}
    mem_on: dict[str, int] = {}
    for j in jobs:
        if j.state is JobState.RUNNING:
            cpus_on[j.nodes[0]] = cpus_on.get(j.nodes[0], 0) + j.cpus
            mem_on[j.nodes[0]] = mem_on.get(j.nodes[0], 0) + j.memory_mib
    for ni, n in enumerate(nodes):
        gpus = tuple(GpuView(n.name, gv.index, 100, tuple(uses.get((ni, gv.index), ()))) for gv in n.gpus)
        cpus, mem = cpus_on.get(n.name, 0), mem_on.get(n.name, 0)
        nodes[ni] = NodeView(n.name, "mixed" if cpus else "idle", n.partitions, n.cpus, cpus, n.memory_mib, mem, gpus,
                             n.gpu_memory_mib, n.gpu_type)
    snap = Snapshot(taken_at=now, slurm_version="24.11.5", nodes=tuple(nodes), jobs=tuple(jobs))
    return snap, families


def family(*shapes: tuple[int, float, int], floor: float = 0.0, work: float = 1000.0, kind: str = "train",
           cpus: int = 1, host_mib: int = 1024, default: str | None = None) -> Family:
    """A hand-written family from (share, throughput, GPU MiB) triples; shape names are `mps<share>-<i>`."""
    out = tuple(Shape(f"mps{s}-{i}", Resources(s, m, cpus, host_mib), t) for i, (s, t, m) in enumerate(shapes))
    return Family(kind=kind, shapes=out, total_work=work, throughput_floor=floor, default=default)


def pending(job_id: int, submit: float = 0.0, priority: int = 0, share: int = 100, held: bool = False) -> JobView:
    """A pending job asking for `mps:share`."""
    return JobView(job_id, f"j{job_id}", USER, "gpu", JobState.PENDING, held=held, gres=GresRequest("mps", share),
                   submit_time=int(submit), priority=priority)


def running(job_id: int, node: str, gpu: int, share: int, start: float = 0.0, shape: str = "",
            requeue: bool = True) -> JobView:
    """A job running on GPU `gpu` of `node` with `mps:share` (AdminComment naming `shape` if given)."""
    return JobView(job_id, f"j{job_id}", USER, "gpu", JobState.RUNNING, gres=GresRequest("mps", share), nodes=(node,),
                   gpu_indices=(gpu,), cpus=1, memory_mib=1024, submit_time=int(start), start_time=int(start),
                   requeue=requeue,
                   admin_comment=f"elastico:shape={shape}" if shape else "")


def with_users(nodes: tuple[NodeView, ...], uses: dict[tuple[str, int], tuple[GpuUse, ...]]) -> tuple[NodeView, ...]:
    """The same nodes with GPU users set from {(node, gpu index): uses}."""
    out = []
    for n in nodes:
        gpus = tuple(GpuView(n.name, g.index, g.shares_total, uses.get((n.name, g.index), g.users)) for g in n.gpus)
        out.append(dataclasses.replace(n, gpus=gpus))  # every other field as it was (its GPU type included)
    return tuple(out)


def snapshot(nodes: tuple[NodeView, ...], jobs: list[JobView], now: float = 0.0) -> Snapshot:
    return Snapshot(taken_at=now, slurm_version="24.11.5", nodes=nodes, jobs=tuple(jobs))
