"""Does a family's GPU layout fit a partition's nodes? The check elastico-submit runs before it submits.

A family's n-GPU shape runs on K nodes with n/K GPUs each (`spec.layout`: the
fewest nodes with at most `gpus_per_node` on each). The partition must have a
node with `gpus_per_node` GPUs when the family sets it, and, for every GPU
count, K nodes holding n/K GPUs each; otherwise the job could never run that
shape, and a family whose default cannot run would sit pending for ever.
Pure: the caller reads the nodes (`SlurmGateway.snapshot().nodes`).
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_elastico.model import NodeView, Shape
from slurm_elastico.shapes.current import ranks_of
from slurm_elastico.shapes.spec import FamilySpec, layout


def partition_fit_problems(spec: FamilySpec, nodes: Sequence[NodeView], partition: str) -> list[str]:
    """What of the family cannot run on `partition`'s usable nodes (empty: it all can), each naming what is allowed."""
    counts = sorted((len(n.gpus) for n in nodes if partition in n.partitions and n.usable), reverse=True)
    most = counts[0] if counts else 0
    if most == 0:
        return [f"gpus: partition {partition!r} has no usable node with a GPU; allowed: a partition whose nodes "
                f"have GPUs (sinfo -p {partition} -o '%N %G')"]
    problems = []
    if spec.gpus_per_node > most:
        problems.append(f"gpus_per_node: {spec.gpus_per_node} but the nodes of partition {partition!r} have at most "
                        f"{most} GPUs each; allowed: gpus_per_node <= {most}")
    per_node = min(spec.per_node_limit, most)
    for n in spec.gpus:
        fit = layout(n, per_node, min(spec.max_nodes or len(counts), len(counts)))
        if fit is None or sum(1 for c in counts if c >= fit[1]) < fit[0]:
            problems.append(f"gpus: {n} GPUs cannot be spread evenly over the {len(counts)} usable node(s) of "
                            f"partition {partition!r} (GPUs per node: {', '.join(map(str, counts))}) with at most "
                            f"{per_node} on each; allowed: a GPU count that K of its nodes hold evenly")
    return problems


def start_request(spec: FamilySpec, default: Shape) -> tuple[int, int] | None:
    """(nodes, GPUs per node) elastico-submit asks for a family that lists GPU counts; None: an MPS share as before.

    Such a family starts on whole GPUs even when its default is a 1-GPU shape (`gpu:1`): Slurm 22.05 refuses
    to switch a job from `mps` to `gpu` later, so a job started on a share could never grow.
    """
    if max(spec.gpus) == 1:
        return None
    return layout(ranks_of(default), spec.per_node_limit, spec.max_nodes)
