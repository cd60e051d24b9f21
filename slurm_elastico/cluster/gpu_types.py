"""Fake GPU types of the local cluster: `--gpu-types t4:2,a100:2` (nodes per type), each with its memory and speed.

A local cluster of several types has, per type, a group of nodes whose gres names the type (`Gres=gpu:t4:4`,
`NodeName=n1 Name=gpu Type=t4 File=...` in gres.conf), so Slurm places and moves jobs by type as on a real mixed
cluster. Slurm knows neither a GPU's memory nor its speed: the memory is what elastico.yaml's `gpu.types` must say
(`yaml_types`), and the speed is how fast a paced job steps there (`cluster.pacing`: the simulator's truth at
speed 1, times the type's speed).

The form of one entry is `NAME:NODES[:MEMORY_MIB[:SPEED]]`. A name in `KNOWN` needs only its node count; any
other name needs its memory and speed. Nodes are numbered n1, n2, ... in the order the types are written.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from slurm_elastico.errors import ClusterError

NAME = re.compile(r"^[a-z][a-z0-9_.\-]*$")
"""A fake type's name: lower case (as sites write them; `gpu.types` must then use the same spelling, since Slurm's
type names are case-sensitive), starting with a letter (`gpu:3090` would read as a count)."""

KNOWN: dict[str, tuple[int, float]] = {
    "t4": (15360, 1.0),
    "v100": (16384, 1.9),
    "a100": (40960, 4.8),
    "a100-80": (81920, 4.8),
}
"""Memory (MiB) and speed of the fake types that need no more than a node count.

Memory: the product's memory as `nvidia-smi` reports it (T4 15360 MiB, V100 16 GB, A100 40 GB and 80 GB). Speed:
relative to the simulator's truth, whose training profiles were measured on T4s, by the ratio of peak dense FP16
tensor throughput in NVIDIA's datasheets (T4 65 TFLOPS, V100 125, A100 312): a stand-in for how much faster a
job steps there, not a measurement (a memory-bound job gains less)."""


@dataclass(frozen=True)
class FakeType:
    """One fake GPU type: its name as the gres writes it, how many nodes have it, each GPU's memory and speed."""

    name: str
    nodes: int
    memory_mib: int
    speed: float

    def __str__(self) -> str:
        return f"{self.name}:{self.nodes}:{self.memory_mib}:{self.speed:g}"


ALLOWED = ("allowed: NAME:NODES[:MEMORY_MIB[:SPEED]] entries joined by commas, e.g. t4:2,a100:2 or t4:1,x1:1:8192:2.5; "
           f"known names (node count alone): {', '.join(KNOWN)}; empty = one untyped fake GPU type")


def parse_gpu_types(text: str) -> tuple[FakeType, ...]:
    """The fake types of `--gpu-types` ("" → none: the untyped default); `ClusterError` naming each bad entry."""
    out: list[FakeType] = []
    problems: list[str] = []
    for entry in filter(None, (e.strip() for e in (text or "").split(","))):
        parts = entry.split(":")
        name = parts[0]
        if not NAME.match(name) or not 2 <= len(parts) <= 4:
            problems.append(f"{entry!r} (a name of letters, digits, _ . - starting with a letter, then 1 to 3 "
                            "numbers after colons)")
            continue
        try:
            nodes = int(parts[1])
            memory, speed = KNOWN.get(name, (0, 0.0))
            memory = int(parts[2]) if len(parts) > 2 else memory
            speed = float(parts[3]) if len(parts) > 3 else speed
        except ValueError:
            problems.append(f"{entry!r} (a count, memory or speed that is not a number)")
            continue
        if not 1 <= nodes <= 64 or not 1 <= memory <= 16 * 1024 * 1024 or not (math.isfinite(speed) and speed > 0):
            problems.append(f"{entry!r} (nodes 1..64, memory 1..16777216 MiB and a speed > 0; an unknown name "
                            "needs its memory and speed)")
            continue
        if any(t.name == name for t in out):
            problems.append(f"{entry!r} (type {name} given twice)")
            continue
        out.append(FakeType(name, nodes, memory, speed))
    if problems:
        raise ClusterError(f"--gpu-types {text!r}: bad entries {', '.join(problems)}; {ALLOWED}")
    if sum(t.nodes for t in out) > 64:
        raise ClusterError(f"--gpu-types {text!r}: {sum(t.nodes for t in out)} nodes; allowed: at most 64 in all")
    return tuple(out)


def types_text(types: tuple[FakeType, ...]) -> str:
    """The full form of `types`, which `parse_gpu_types` reads back the same (saved in the state directory)."""
    return ",".join(map(str, types))


def node_types(types: tuple[FakeType, ...]) -> dict[str, FakeType]:
    """{node name: its type}: n1, n2, ... in the order the types are written."""
    out: dict[str, FakeType] = {}
    for t in types:
        for _ in range(t.nodes):
            out[f"n{len(out) + 1}"] = t
    return out


def node_groups(types: tuple[FakeType, ...], nodes: int) -> list[tuple[int, int, str]]:
    """(first, last, type) node numbers of each group of alike nodes: one untyped group when `types` is empty."""
    if not types:
        return [(1, nodes, "")]
    groups, first = [], 1
    for t in types:
        groups.append((first, first + t.nodes - 1, t.name))
        first += t.nodes
    return groups


def yaml_types(types: tuple[FakeType, ...]) -> dict[str, dict[str, int | str]]:
    """The `gpu.types` an elastico.yaml for this cluster needs: each type's memory, and for a name the public GPU
    table does not know (`x1`) `like:` the `KNOWN` fake type nearest its speed, so the helper can estimate it."""
    from slurm_elastico.shapes.gpu_types import canonical

    def like(t: FakeType) -> dict[str, str]:
        if canonical(t.name) is not None:
            return {}
        return {"like": min(KNOWN, key=lambda k: (abs(math.log(KNOWN[k][1] / t.speed)), k))}

    return {t.name: {"memory_mib": t.memory_mib, **like(t)} for t in types}
