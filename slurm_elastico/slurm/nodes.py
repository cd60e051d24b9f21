"""Nodes from `sinfo --json` (22.05 per node, 24.11 groups) and `scontrol show node --json` (24.11) as `NodeRecord`s.

Pure functions of the text a command printed; `commands.nodes_json` picks the
command for a Slurm version, and `snapshot.build_nodes` adds the jobs' GPU use.

Traps handled here (see tests/unit/test_parse.py for the recorded output):

- Node `gres_used` is wrong for MPS on 22.05 ("mps:(null):1(IDX:0)"), so it
  is kept only as text; GPU use is rebuilt from the running jobs
  (`snapshot.build_nodes`) and `tres_used` (right on both) is kept too.
- 24.11 `sinfo --json` groups nodes (one record for "n2,n3,n4", with summed
  CPU counts); per-node allocation of a group of several busy nodes is only
  an even split, marked `approximate`. `scontrol show node --json` (24.11)
  gives exact per-node records and parses with the same function.
- A node's state is its base state and flags, lower case and joined by '+'
  ("idle+drain"): 22.05 prints `state` and `state_flags`, 24.11 one list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from slurm_elastico.errors import ParseError
from slurm_elastico.slurm.gres import gres_counts, gres_types, parse_gres_list, parse_tres
from slurm_elastico.slurm.hostlist import expand_hostlist
from slurm_elastico.slurm.schema import Fields, load

__all__ = ["NodeRecord", "parse_sinfo"]


@dataclass(frozen=True)
class NodeRecord:
    """One node's base facts as sinfo printed them, before the jobs' GPU use is added.

    `gpus`/`mps_total` come from the configured `gres` ("gpu:4,mps:400").
    `tres_used` is the node's TRES in use (right for MPS on 22.05, unlike
    `gres_used`). `approximate` marks allocation figures split evenly over a
    24.11 sinfo group of several nodes. `slurmd_start_time` is when the
    node's slurmd last registered (Unix seconds; None where the listing lacks
    it, as 24.11 sinfo groups do). `gpu_types` are its GPUs per type from the same `gres`
    ("gpu:a100:2,gpu:v100:2" -> (("a100", 2), ("v100", 2)); "" for an untyped entry).
    """

    name: str
    state: str
    partitions: tuple[str, ...]
    cpus: int
    alloc_cpus: int
    real_memory: int
    alloc_memory: int
    gres: str = ""
    gpus: int = 0
    mps_total: int = 0
    tres_used: dict[str, int] = field(default_factory=dict, hash=False)
    gres_used: str = ""
    partition_states: tuple[tuple[str, str], ...] = ()
    approximate: bool = False
    slurmd_start_time: int | None = None
    gpu_types: tuple[tuple[str, int], ...] = ()

    @property
    def gpu_type(self) -> str:
        """The type of the node's GPUs: its first gres entry's ("" when untyped or without GPUs). A node that
        mixes types is taken by its first, as `NodeView.gpu_type` says."""
        return self.gpu_types[0][0] if self.gpu_types else ""


def _node_state(words: Iterable[str]) -> str:
    """["IDLE", "DRAIN"] -> "idle+drain" (lower case, like sinfo; '+' like scontrol)."""
    out: list[str] = []
    for w in words:
        w = w.strip().lower()
        if w and w not in out:
            out.append(w)
    return "+".join(out) or "unknown"


def _node(f: Fields) -> NodeRecord:
    """A per-node record: 22.05 `sinfo --json` or 24.11 `scontrol show node --json`."""
    gres = f.text("gres")
    gpus, mps = f.parsed("gres", gres_counts)
    return NodeRecord(
        name=f.text("name", required=True),
        state=_node_state(f.strs("state") + f.strs("state_flags")),
        partitions=f.strs("partitions"),
        cpus=f.integer("cpus", required=True),  # type: ignore[arg-type]
        alloc_cpus=f.integer("alloc_cpus", 0) or 0,
        real_memory=f.integer("real_memory", 0) or 0,
        alloc_memory=f.integer("alloc_memory", 0) or 0,
        gres=gres,
        gpus=gpus,
        mps_total=mps,
        gpu_types=f.parsed("gres", gres_types),
        tres_used=f.parsed("tres_used", parse_tres),
        gres_used=f.text("gres_used"),
        slurmd_start_time=f.time("slurmd_start_time"),
    )


def _group(f: Fields) -> list[NodeRecord]:
    """The nodes of one 24.11 `sinfo --json` group, which sums CPU counts over its nodes."""
    names: list[str] = []
    listed = f.sub("nodes", required=True)
    listed.raw("nodes", required=True)
    for entry in listed.strs("nodes"):
        try:
            names.extend(expand_hostlist(entry))
        except ParseError as exc:
            raise listed.error("nodes", f"= {entry!r}: {exc}") from None
    if not names:
        return []
    count = len(names)
    cpus, memory, gres_f = f.sub("cpus"), f.sub("memory"), f.sub("gres")
    part = f.sub("partition")
    part_name = part.text("name")
    part_state = _node_state(part.sub("partition").strs("state")).upper() if part_name else ""
    cmin, cmax = cpus.integer("minimum", 0), cpus.integer("maximum", 0)
    per_node_cpus = cmax if cmin == cmax else (cpus.integer("total", 0) or 0) // count
    alloc_cpus = cpus.integer("allocated", 0) or 0
    mmin, mmax = memory.integer("minimum", 0), memory.integer("maximum", 0)
    alloc_mem = memory.integer("allocated", 0) or 0
    approximate = cmin != cmax or mmin != mmax or (count > 1 and (alloc_cpus > 0 or alloc_mem > 0))
    gres, used = gres_f.text("total"), gres_f.text("used")
    gpus, mps = gres_f.parsed("total", gres_counts)
    types = gres_f.parsed("total", gres_types)
    tres_used: dict[str, int] = {}
    if count == 1:
        # 24.11's gres used is right (22.05's is not, and has no groups).
        tres_used = {"cpu": alloc_cpus, "mem": alloc_mem}
        for item in gres_f.parsed("used", parse_gres_list):
            if item.name in ("gpu", "mps"):
                key = f"gres/{item.name}"
                tres_used[key] = tres_used.get(key, 0) + item.count
        tres_used = {k: v for k, v in tres_used.items() if v}
    return [
        NodeRecord(
            name=name,
            state=_node_state(f.sub("node").strs("state")),
            partitions=(part_name,) if part_name else (),
            cpus=per_node_cpus or 0,
            alloc_cpus=alloc_cpus // count,
            real_memory=mmax or 0,
            alloc_memory=alloc_mem // count,
            gres=gres,
            gpus=gpus,
            mps_total=mps,
            gpu_types=types,
            tres_used=tres_used,
            gres_used=used if count == 1 else "",
            partition_states=((part_name, part_state),) if part_name else (),
            approximate=approximate,
        )
        for name in names
    ]


def _merge(a: NodeRecord, b: NodeRecord) -> NodeRecord:
    """One node listed in two partitions' groups: same node, union of partitions."""
    parts = a.partitions + tuple(p for p in b.partitions if p not in a.partitions)
    states = a.partition_states + tuple(s for s in b.partition_states if s not in a.partition_states)
    return replace(a, partitions=parts, partition_states=states)


def parse_sinfo(text: str, source: str = "sinfo --json") -> tuple[NodeRecord, ...]:
    """Node records from `sinfo --json` (22.05 `nodes`, 24.11 `sinfo` groups) or 24.11 `scontrol show node --json`."""
    doc = load(text, source)
    top = Fields(doc.data, "", doc)
    records: list[NodeRecord] = []
    if "sinfo" in doc.data:
        for i, group in enumerate(top.items("sinfo")):
            records.extend(_group(Fields(group, f"sinfo[{i}]", doc)))
    elif "nodes" in doc.data:
        records = [_node(Fields(n, f"nodes[{i}]", doc)) for i, n in enumerate(top.items("nodes"))]
    else:
        raise top.error("sinfo", "and .nodes are both missing: no node records")
    merged: dict[str, NodeRecord] = {}
    for r in records:
        merged[r.name] = _merge(merged[r.name], r) if r.name in merged else r
    return tuple(merged.values())
