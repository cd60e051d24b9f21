"""Pollux on a cluster of several GPU types, as Sia's evaluation ran it: blind to the types, then repaired.

Sia's artifact runs Pollux heterogeneity-unaware (`cluster_unaware.py`,
`pollux_unaware.py`): one throughput model per job, fitted from the steps it
ran wherever it ran, and a cluster seen as GPUs of no type; an allocation that
lands on nodes of several types keeps the GPUs of the type that holds most
of them (on a tie the faster type) and drops the others, which stay idle
until the next round (`fix_allocations_by_dropping`).

`TypeBlindPollux` does the same around `planner.pollux.PolluxPolicy`, by
composition: on a family of typed shapes it shows Pollux the job's shapes of
one type with their type removed — the type the job runs on, else the one it
last ran on (`elastico:pollux-on.type=` in its AdminComment), else its default
shape's (what it was submitted for): the speeds its own steps would have
taught Pollux's model. Pollux then plans as on a one-type cluster. Each
start or move is mapped back: the nodes chosen are kept where they are of
the majority type (GPUs per node as Slurm's even gang asks: the count over
the nodes), the job's count shrinks to what those hold (its best shape of
that count there, or the largest smaller count its family offers), and every
shape named is the same shape on that type (same knobs and GPU count; else
that type's fastest at the count and batch). A family of one type, or none,
goes to Pollux untouched.

Differences from the artifact: Sia's 8-GPU nodes are seen by its Pollux as
two virtual nodes of 4 (its vnode map); here Pollux sees the real nodes.
Pure: a `Snapshot` and families in, a `Plan` out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Action, ActionKind, Family, Plan, Shape, Snapshot
from slurm_elastico.planner.narrowers import whole_gpu_any_batch
from slurm_elastico.planner.per_type import gpus_of, running_on, speed_table, state_of, with_state
from slurm_elastico.planner.pollux import PolluxPolicy
from slurm_elastico.shapes.current import ADMIN_PREFIX

STATE = "elastico:pollux-on."
"""AdminComment part `elastico:pollux-on.type=<type it last ran on>` (Pollux's own `pollux:` parts are its to
rewrite; under `elastico:`, the helper counts it as a policy's own part)."""
MOVES = (ActionKind.SET_GPUS, ActionKind.SET_SHARE, ActionKind.SET_NODES, ActionKind.RESHAPE_RUNNING,
         ActionKind.RESUME)


def types_in(fam: Family) -> tuple[str, ...]:
    """The GPU types a family's shapes name, in order of appearance ("" not counted)."""
    return tuple(dict.fromkeys(s.gpu_type for s in fam.shapes if s.gpu_type))


def blind(fam: Family, gpu_type: str) -> Family:
    """The family's shapes of `gpu_type` with their type removed (the default: its twin on that type)."""
    shapes = tuple(dataclasses.replace(s, gpu_type="") for s in fam.shapes if s.gpu_type == gpu_type)
    d = twin(fam, fam.default_shape, gpu_type)
    return dataclasses.replace(fam, shapes=shapes, default=d.name if d is not None else None)


def twin(fam: Family, shape: Shape, gpu_type: str) -> Shape | None:
    """The family's shape on `gpu_type` matching `shape`: same knobs and GPU count, else the fastest there at the same
    count and global batch, else the fastest at the same count; None when the type has no shape of that count."""
    same = [s for s in fam.shapes if s.gpu_type == gpu_type and gpus_of(s) == gpus_of(shape)]
    exact = [s for s in same if s.knobs == shape.knobs and s.resources.gpus == shape.resources.gpus]
    if exact:
        return exact[0]
    batch = [s for s in same if s.knob("global_batch") == shape.knob("global_batch")]
    return max(batch or same, key=lambda s: s.throughput, default=None)


@dataclass(frozen=True)
class TypeBlindPollux(PolluxPolicy):
    """`PolluxPolicy` run blind to GPU types and repaired as Sia's evaluation ran it (module docstring); on families
    of one type (or none) exactly `PolluxPolicy`."""

    def plan(self, snapshot: Snapshot, families: Mapping[int, Family], settings: Settings,
             model: SlowdownModel | None, now: float, progress: Mapping[int, float] | None = None) -> Plan:
        typed = {jid: f for jid, f in families.items() if len(types_in(f)) > 1}
        if not typed:
            return PolluxPolicy.plan(self, snapshot, families, settings, model, now, progress)
        views = dict(families)
        seen: dict[int, str] = {}
        for v in snapshot.jobs:
            fam = typed.get(v.job_id)
            if fam is None:
                continue
            on, _ = running_on(v, snapshot)
            last = state_of(v.admin_comment, STATE).get("type")
            t = next((x for x in (on, last, fam.default_shape.gpu_type) if x in types_in(fam)), types_in(fam)[0])
            views[v.job_id], seen[v.job_id] = blind(fam, t), t
        plan = PolluxPolicy.plan(self, snapshot, views, settings, model, now, progress)
        return self._repair(plan, snapshot, typed, seen, settings.gpu.shares_per_gpu)

    def _repair(self, plan: Plan, snapshot: Snapshot, typed: Mapping[int, Family], seen: Mapping[int, str],
                spg: int) -> Plan:
        """Pollux's plan with each typed job's nodes, count and shapes on one type (module docstring)."""
        node_type = {n.name: n.gpu_type for n in snapshot.nodes}
        by_job: dict[int, list[Action]] = {}
        for a in plan.actions:
            by_job.setdefault(a.job_id, []).append(a)
        out: list[Action] = []
        placements = {p.job_id: p for p in plan.placements}
        dropped = 0
        for jid, acts in by_job.items():
            fam = typed.get(jid)
            if fam is None:
                out += acts
                continue
            move = next((a for a in acts if a.kind in (ActionKind.SET_GPUS, ActionKind.RESHAPE_RUNNING)
                         or (a.kind in (ActionKind.SET_NODES, ActionKind.RESUME) and a.nodes)), None)
            t = seen[jid]
            n = nodes = None
            if move is not None:
                nodes = move.nodes
                n = move.gpus if move.gpus else 1
                t, nodes, n = self._majority(fam, nodes, n, node_type)
                dropped += (move.gpus or 1) - n
            fixed = self._shape_on(fam, acts, t, n)
            if fixed is None:  # the type has no shape of that count: the job is left as it is this epoch
                placements.pop(jid, None)
                continue
            for a in acts:
                change: dict[str, object] = {"shape": fixed.name if a.shape is not None else None}
                if a.kind in MOVES and nodes is not None and a.nodes:
                    change["nodes"] = nodes
                if a.kind in (ActionKind.SET_GPUS, ActionKind.SET_SHARE, ActionKind.RESHAPE_RUNNING):
                    change["gpu_type"] = t
                if a.kind in (ActionKind.SET_GPUS, ActionKind.RESHAPE_RUNNING):
                    gang = fixed.resources.gpus > 0
                    change["gpus"], change["share"] = (n, None) if gang else (None, spg)
                    if a.kind is ActionKind.SET_GPUS and not gang:  # one GPU left: a full share of it, pinned
                        out.append(Action(ActionKind.SET_SHARE, jid, a.reason, share=spg, shape=fixed.name,
                                          gpu_type=t))
                        out.append(Action(ActionKind.SET_NODES, jid, a.reason, nodes=nodes or (), shape=fixed.name))
                        continue
                if a.kind is ActionKind.SET_ADMIN_COMMENT and a.text is not None:
                    change["text"] = with_state(_rest(a.text), fixed.name, STATE, {"type": t})
                out.append(dataclasses.replace(a, **change))
            p = placements.get(jid)
            if p is not None and fixed is not None:
                placements[jid] = dataclasses.replace(p, shape=fixed.name, throughput=fixed.throughput,
                                                      node=nodes[0] if nodes else p.node)
        notes = plan.notes + ((f"type-blind: {dropped} GPU(s) of a minority type dropped from mixed placements",)
                              if dropped else ())
        return dataclasses.replace(plan, actions=tuple(out), notes=notes,
                                   placements=tuple(sorted(placements.values(), key=lambda p: p.job_id)))

    @staticmethod
    def _majority(fam: Family, nodes: tuple[str, ...], n: int, node_type: Mapping[str, str]
                  ) -> tuple[str, tuple[str, ...], int]:
        """(type, nodes, GPUs) a placement keeps: its nodes of the type holding most of its GPUs (a tie: the type
        where the job's one-GPU shape is fastest), the same GPUs per node as before."""
        per = max(1, n // max(1, len(nodes)))
        count: dict[str, int] = {}
        for k in nodes:
            count[node_type.get(k, "")] = count.get(node_type.get(k, ""), 0) + 1
        table = speed_table(fam, tuple(count))
        t = max(count, key=lambda x: (count[x], table[(x, 1)].throughput if (x, 1) in table else 0.0))
        kept = tuple(k for k in nodes if node_type.get(k, "") == t)
        return t, kept, n if len(kept) == len(nodes) else per * len(kept)

    @staticmethod
    def _shape_on(fam: Family, acts: list[Action], t: str, n: int | None) -> Shape | None:
        """The shape on type `t` standing for the one Pollux named (at n GPUs when the count changed)."""
        name = next((a.shape for a in acts if a.shape), None)
        base = next((s for s in fam.shapes if s.name == name), None)
        if base is None:
            return None
        if n is None or gpus_of(base) == n:
            return twin(fam, base, t)
        table = speed_table(whole_gpu_any_batch(fam), (t,))
        m = max((c for (x, c) in table if x == t and c <= n), default=None)
        return table[(t, m)] if m is not None else None


def _rest(text: str) -> str:
    """A comment without its shape part (`with_state` writes the new one first)."""
    return ",".join(p for p in text.split(",") if not p.strip().startswith(ADMIN_PREFIX))
