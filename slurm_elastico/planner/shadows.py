"""The GPUs a share search visits (`OpenGpus`, a part of `GpuState`): those Slurm could give a share on their node.

Slurm gives an `mps:N` job the lowest GPU of the node with N shares free
(`planner.gpu_choice`). A GPU is *shadowed* when a lower GPU of its node has
at least as many shares free as it has (free as Slurm sees them: the
planner's free shares plus the head-of-queue reservation, `GpuState.block`):
whatever share fits it, Slurm gives that lower GPU instead. A `gpu:1` job
(`SlurmPicks.asks_one_whole`) needs a GPU with every share free; a lower GPU
with every share free or reserved holds no job, so both of Slurm's rules for
whole GPUs take it first, and the shadowed GPU is not given either (on a node
whose GPUs differ in their share totals nothing is shadowed: that argument
needs them equal).

Whether Slurm gives a GPU an `mps:N` job is read off the same number the
shadows come from: the most shares free or reserved below it on its node
(`lower_most`; `SlurmPicks.slurm_gives`). A search (`GpuState.find`) passes
over a shadowed GPU without a try, so it can skip it unseen: each free-share
bucket keeps, beside all its GPUs, the list of its GPUs that are not shadowed
(`open`, and per GPU type `type_open`), in the order the GPUs entered the
bucket, which is the order the bucket's own dict keeps, so that the search
visits the same GPUs in the same order, less the ones it could never take. On
a large cluster with many idle GPUs per node the search otherwise walks every
one of them, at each of thousands of searches an epoch.

A GPU's shadow changes only when a GPU of its node changes its free or
reserved shares (`GpuState._set_share`, which calls `reshadow`), and such a
change already moves the version of every bucket the node's GPUs are in, so
no remembered refusal outlives it; a GPU that comes out of shadow lowers its
bucket's gain bound (`_lower_need_min`) as one that enters the bucket would.
"""

from __future__ import annotations

from bisect import bisect_left, insort

GPU_BITS = 32
"""An open list's entry is stamp << GPU_BITS | GPU: ints sort by stamp, and compare faster than pairs."""
GPU_MASK = (1 << GPU_BITS) - 1


class OpenGpus:
    """`GpuState`'s lists of unshadowed GPUs per free-share bucket (module docstring)."""

    def _init_open(self) -> None:
        n = len(self.free_share)
        self.stamp = list(range(n))  # when each GPU entered its bucket (the bucket dicts' order)
        self._stamps = n
        self.lower_most = [-1] * n  # the most shares free or reserved on a lower GPU of the node (-1: none)
        self.node_rank = [0] * n  # the GPU's place among its node's
        self.even_node = [False] * (max(self.node_gpus, default=-1) + 1)  # its GPUs have equal share totals
        self.open: list[list[int]] = [[] for _ in range(self.top + 1)]  # entries (`GPU_BITS`), ascending
        self.type_open = {t: [[] for _ in range(self.top + 1)] for t in self.type_buckets}
        for node, gpus in self.node_gpus.items():
            self.even_node[node] = len({self.total_share[g] for g in gpus}) == 1
            most = -1
            for i, g in enumerate(gpus):
                self.node_rank[g], self.lower_most[g] = i, most
                most = max(most, self.free_share[g] + self.blocked[g])
        for g in range(n):  # in stamp order
            if not self.shadowed(g):
                self._open(g)

    def shadowed(self, g: int, free: int | None = None) -> bool:
        """Whether GPU g (at `free` shares free; default: its own) is shadowed: a lower GPU of its node has as many
        free or reserved, on a node of equal share totals."""
        return self.even_node[self.gpu_node[g]] and self.lower_most[g] >= (self.free_share[g] if free is None else free)

    def _open(self, g: int) -> None:
        entry, level = self.stamp[g] << GPU_BITS | g, self.free_share[g]
        insort(self.open[level], entry)  # (a GPU's new stamp is the newest: at the list's end)
        if self.gpu_type[g] >= 0:
            insort(self.type_open[self.gpu_type[g]][level], entry)

    def _close(self, g: int, level: int) -> None:
        entry = self.stamp[g] << GPU_BITS | g
        row = self.open[level]
        del row[bisect_left(row, entry)]
        if self.gpu_type[g] >= 0:
            row = self.type_open[self.gpu_type[g]][level]
            del row[bisect_left(row, entry)]

    def reshadow(self, g: int, old: int) -> None:
        """GPU g went from `old` free shares to a bucket's end (a new stamp): g into its new bucket's list unless
        shadowed, and the GPUs above it on its node anew (the ones below do not depend on it), as far as the most
        shares free or reserved below them moves (beyond that nothing they read has changed)."""
        node = self.gpu_node[g]
        even, free, blocked, lower_most = self.even_node[node], self.free_share, self.blocked, self.lower_most
        # (`shadowed`, written out: this runs at every placement and removal, for the GPUs above g on its node)
        if not (even and lower_most[g] >= old):  # (its `lower_most` is as it was: only GPUs below g move it)
            self._close(g, old)
        self.stamp[g] = self._stamps
        self._stamps += 1
        if not (even and lower_most[g] >= free[g]):
            self._open(g)
        most = max(lower_most[g], free[g] + blocked[g])
        for k in self.node_gpus[node][self.node_rank[g] + 1:]:
            if lower_most[k] == most:
                return
            was, lower_most[k] = even and lower_most[k] >= free[k], most
            if was != (even and most >= free[k]):
                if was:
                    self._open(k)
                    self._lower_need_min(k)  # as a GPU entering the bucket would
                else:
                    self._close(k, free[k])
            if free[k] + blocked[k] > most:
                most = free[k] + blocked[k]
