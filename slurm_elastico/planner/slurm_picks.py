"""Which GPU of a node Slurm gives a job, asked of the packing's ledger (`SlurmPicks`, a part of `GpuState`).

Slurm, not the planner, picks the GPU within the node the helper pins
(`planner.gpu_choice`: the lowest-index GPU with the shares free, and for a
gang the lowest GPUs not held whole, or on Slurm 24.11 the lowest with no
user: `lowest_unused`, from the snapshot's version), so a share is placed
only on the GPU Slurm would give it on that node (`slurm_gives`) and a gang only on GPUs
Slurm would take; the interference and gain checks are then about the
co-runners the job will really have. What Slurm sees free is the planner's
free shares plus the head-of-queue reservation (`block`), which Slurm does
not know. GPUs of a node must be given in Slurm's index order.

The rule itself is pure and lives in `planner.gpu_choice`; this applies it to
what `planner.packing.GpuState` holds (its occupants, free and blocked shares,
and `known`: where Slurm already runs a job).
"""

from __future__ import annotations

from slurm_elastico.planner.gpu_choice import mps_gpu, whole_gpus
from slurm_elastico.planner.seats import Row, Seat


class SlurmPicks:
    """`GpuState`'s questions about Slurm's choice of GPU; reads the ledger `GpuState` keeps (no state of its own)."""

    def asks_one_whole(self, seat: Seat, row: Row, g: int) -> bool:
        """Whether `seat` at `row` on GPU g is asked of Slurm as `gpu:1` (a job asking whole GPUs, all of one GPU)."""
        return seat.whole and row.share >= self.total_share[g]

    def slurm_gives(self, g: int, share: int, whole: bool = False) -> bool:
        """Whether Slurm gives a job pinned to GPU g's node that very GPU (`given`): an `mps:share` job read off
        the most shares free or reserved below g on its node (`OpenGpus.lower_most`, which `given`'s rule
        implies: the lowest GPU with the shares), a `gpu:1` job (`whole`) by `given` itself."""
        if whole:
            return self.given(self.gpu_node[g], share, True) == g
        return self.lower_most[g] < share <= self.free_share[g] + self.blocked[g]

    def given(self, node: int, share: int, whole: bool = False) -> int:
        """The GPU Slurm gives an `mps:share` job pinned to `node` (`gpu_choice.mps_gpu`), or -1; with `whole`, a
        `gpu:1` job's (`gpu_choice.whole_gpus`: its lowest GPU not held whole, or on 24.11 with no user, only
        when that one is idle)."""
        gpus = self.node_gpus[node]
        if whole:
            idle, held, unused = self._idle_whole(node, 0.0)
            taken = whole_gpus(idle, 1, held, unused)
            return gpus[taken[0]] if taken else -1
        k = mps_gpu([self.free_share[i] + self.blocked[i] for i in gpus], share)
        return gpus[k] if k >= 0 else -1

    def gives_gang(self, row: Row, gpus: tuple[int, ...]) -> bool:
        """Whether these GPUs are the ones Slurm gives `row`'s gang on their nodes now (on each node the ones
        `gpu_choice.whole_gpus` takes, all idle, with the node's CPUs and memory for its part)."""
        for node, p in self._per_node(gpus).items():
            idle, held, unused = self._idle_whole(node, row.mem)
            taken = tuple(self.node_gpus[node][k] for k in whole_gpus(idle, p, held, unused))
            if (taken != tuple(g for g in gpus if self.gpu_node[g] == node)
                    or self.node_cpu[node] < row.cpus * p / len(gpus) - 1e-9
                    or self.node_mem[node] < row.hmem * p / len(gpus) - 1e-9):
                return False
        return True

    def whole_gpus_for(self, count: int, nodes: frozenset[int] | None = None,
                       types: set[int] | None = None) -> tuple[int, ...]:
        """The GPUs Slurm's rule for `gpu:count` picks (its `count` lowest not held whole: `gpu_choice.whole_gpus`
        without `lowest_unused`) on the node where they are least used (most free shares, then fewest occupants;
        the last node among equals), idle or not; () when no node has `count` GPUs not held whole. Only on
        `nodes` whose GPUs are of one of `types` (each None: any)."""
        best: tuple[int, ...] = ()
        best_key: tuple[int, int, int] | None = None
        for node, gpus in self.node_gpus.items():
            if nodes is not None and node not in nodes or types is not None and self.gpu_type[gpus[0]] not in types:
                continue
            held = self._idle_whole(node, 0.0)[1]
            taken = tuple(gpus[k] for k in whole_gpus([True] * len(gpus), count, held))
            if not taken:
                continue
            key = (sum(self.free_share[g] for g in taken), -sum(len(self.occ[g]) for g in taken), node)
            if best_key is None or key > best_key:
                best, best_key = taken, key
        return best

    def _idle_whole(self, node: int, mem: float) -> tuple[list[bool], list[bool], list[bool] | None]:
        """Per GPU of `node`: idle (no occupant, every share free, `mem` free), held whole as Slurm sees it (by a
        gang, by a job asked as `gpu:1` (`asks_one_whole`), or nothing free and no occupant: a foreign `gpu:N`
        job), and, where Slurm gives `gpu:P` the lowest GPUs with no user (`lowest_unused`), with no user as
        Slurm sees it (the head-of-queue reservation is not Slurm's); else None.

        Slurm starts the jobs of a plan in its own priority order, which may put a gang before a share the plan
        placed first. A GPU only shares this plan starts use (not `attach`ed: Slurm does not run them yet) is
        therefore without a user for Slurm and not idle, so a gang whose lowest GPUs include it is not asked for
        on that node, whichever Slurm starts first. A planned job holding whole GPUs counts as their user: two
        whole-GPU jobs started in either order each get idle GPUs of their own."""
        gpus = self.node_gpus[node]
        idle = [not self.occ[g] and self.free_share[g] == self.total_share[g] > 0 and self.free_mem[g] >= mem
                for g in gpus]
        whole = [any(s.gang or self.asks_one_whole(s, s.row, g) for s in self.occ[g]) for g in gpus]
        held = [w or (not self.occ[g] and not self.free_share[g] + self.blocked[g]) for g, w in zip(gpus, whole)]
        unused = ([self.total_share[g] > 0 and not w and not any((id(s), g) in self.known for s in self.occ[g])
                   and (bool(self.occ[g]) or self.free_share[g] + self.blocked[g] == self.total_share[g])
                   for g, w in zip(gpus, whole)] if self.lowest_unused else None)
        return idle, held, unused
