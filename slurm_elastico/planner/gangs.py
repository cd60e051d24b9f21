"""Gangs Slurm can be asked for: P whole GPUs on each of K nodes (`Gres=gpu:P NumNodes=K-K NodeList=...`).

The helper changes a job's GPU count with `slurm.commands.set_gpu_count`,
which asks for the same number of GPUs on every node (Slurm's `Gres=` is per
node), so a gang of 6 is 6 on one node or 3 + 3 on two, never 4 + 2. Every
policy that pins a gang to nodes (elastico's packing, Tiresias, Pollux) places
it through `even_split`, and the simulator starts such a request exactly so.

Fewest nodes first (K = 1 when one node holds it: consolidation); a larger K
only when no smaller one fits. Elastico's packing goes no further than the
fewest nodes the gang can span at all (`fewest_nodes`): that is where its
shapes' throughputs were measured, and the same GPUs spread wider may run
slower than fewer GPUs on one node (2 GPUs as 1 + 1 across nodes ran a
YOLOv3 job at 0.71 of one GPU alone in the simulator's measured data).

`split` is what the Tiresias and Pollux baselines place through: `even_split`,
or `uneven_split` where the snapshot says the cluster places gangs freely
(`Snapshot.even_gangs` false: only the simulator's cluster that calibrates
those baselines against the peer's published figures, whose simulator places
a gang's GPUs freely, e.g. 3 + 1).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence


def fewest_nodes(n: int, node_size: int) -> int:
    """The fewest nodes of `node_size` GPUs a gang of n can be asked on: the smallest K dividing n with
    n / K <= node_size (n itself, one GPU per node, at worst)."""
    if n < 1 or node_size < 1:
        raise ValueError(f"a gang of {n} GPU(s) on nodes of {node_size}: both must be at least 1")
    return next(k for k in range(1, n + 1) if n % k == 0 and n // k <= node_size)


def even_split(n: int, nodes: Sequence[Hashable], room: Callable[[Hashable, int], bool],
               rank: Callable[[Hashable], tuple], most_nodes: int | None = None) -> dict[Hashable, int] | None:
    """{node: P} for a gang of n GPUs: P = n / K on each of K nodes, K as small as fits, or None.

    `nodes` in their own order (the result keeps it); `room(node, p)`: whether the node can take p of the
    gang's GPUs now (idle GPUs, and its share of the host); `rank(node)`: which of the nodes that can go
    first (e.g. best fit: fewest idle GPUs); `most_nodes`: K at most this (None: any).
    """
    if n < 1:
        raise ValueError(f"a gang holds at least one GPU, not {n}")
    for k in range(1, min(n, most_nodes or n) + 1):
        if n % k:
            continue
        p = n // k
        ok = [nd for nd in nodes if room(nd, p)]
        if len(ok) >= k:
            chosen = set(sorted(ok, key=rank)[:k])
            return {nd: p for nd in nodes if nd in chosen}
    return None


def uneven_split(n: int, nodes: Sequence[Hashable], count: Callable[[Hashable, int], int],
                 rank: Callable[[Hashable], tuple]) -> dict[Hashable, int] | None:
    """{node: GPUs} for a gang of n placed freely, or None: one node when one holds it (the first by `rank`),
    else the nodes by `rank`, each taking what it can (`count(node, k)`: how many of k it can take now)."""
    if n < 1:
        raise ValueError(f"a gang holds at least one GPU, not {n}")
    ranked = sorted(nodes, key=rank)
    one = next((nd for nd in ranked if count(nd, n) >= n), None)
    if one is not None:
        return {one: n}
    take: dict[Hashable, int] = {}
    left = n
    for nd in ranked:
        k = count(nd, left)
        if k > 0:
            take[nd] = k
            left -= k
        if not left:
            return {nd: take[nd] for nd in nodes if nd in take}
    return None


def split(n: int, nodes: Sequence[Hashable], count: Callable[[Hashable, int], int],
          rank: Callable[[Hashable], tuple], even: bool = True) -> dict[Hashable, int] | None:
    """A gang's GPUs per node: `even_split` (what Slurm can be asked for), or with `even` false `uneven_split`
    (the peer's rule, calibration only: `Snapshot.even_gangs`)."""
    if not even:
        return uneven_split(n, nodes, count, rank)
    return even_split(n, nodes, lambda nd, p: count(nd, p) >= p, rank)
