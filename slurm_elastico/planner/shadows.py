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

A search (`GpuState.find`) passes over such a GPU without a try, so it can
skip it unseen: each free-share bucket keeps, beside all its GPUs, the list of
its GPUs that are not shadowed (`open`, and per GPU type `type_open`), in the
order the GPUs entered the bucket, which is the order the bucket's own dict
keeps, so that the search visits the same GPUs in the same order, less the
ones it could never take. On a large cluster with many idle GPUs per node the
search otherwise walks every one of them, at each of thousands of searches an
epoch.

A GPU's shadow changes only when a GPU of its node changes its free or
reserved shares (`GpuState._set_share`, which calls `reshadow`), and such a
change already moves the version of every bucket the node's GPUs are in, so
no remembered refusal outlives it; a GPU that comes out of shadow lowers its
bucket's gain bound (`_lower_need_min`) as one that enters the bucket would.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from slurm_elastico.planner.seats import Row, Seat

GPU_BITS = 32
"""An open list's entry is stamp << GPU_BITS | GPU: ints sort by stamp, and compare faster than pairs."""
GPU_MASK = (1 << GPU_BITS) - 1


class OpenGpus:
    """`GpuState`'s lists of unshadowed GPUs per free-share bucket (module docstring)."""

    def _init_open(self) -> None:
        n = len(self.free_share)
        self.stamp = list(range(n))  # when each GPU entered its bucket (the bucket dicts' order)
        self._stamps = n
        self.shadowed = [True] * n  # until `_shade` opens them
        self.lower_most = [-1] * n  # the most shares free or reserved on a lower GPU of the node (-1: none)
        self.node_rank = [0] * n  # the GPU's place among its node's
        self.even_node = [False] * (max(self.node_gpus, default=-1) + 1)  # its GPUs have equal share totals
        for node, gpus in self.node_gpus.items():
            self.even_node[node] = len({self.total_share[g] for g in gpus}) == 1
        self.open: list[list[int]] = [[] for _ in range(self.top + 1)]  # entries (`GPU_BITS`), ascending
        self.type_open = {t: [[] for _ in range(self.top + 1)] for t in self.type_buckets}
        for gpus in self.node_gpus.values():
            for i, g in enumerate(gpus):
                self.node_rank[g] = i
            self._shade(gpus, 0, -1, fresh=True)

    def _shade(self, gpus: list[int], start: int, most: int, fresh: bool = False) -> None:
        """`lower_most` and `shadowed` of the node's GPUs from its `start`-th on, `most` the most shares free or
        reserved below it; a GPU whose shadow changes leaves its open list or enters it. Unless `fresh` (nothing
        set yet), it stops at the first GPU whose `lower_most` stays: from there on nothing it reads has changed."""
        free, blocked, lower_most, shadowed = self.free_share, self.blocked, self.lower_most, self.shadowed
        even = self.even_node[self.gpu_node[gpus[0]]]
        for k in gpus[start:]:
            if lower_most[k] == most and not fresh:
                return
            lower_most[k] = most
            s = even and most >= free[k]
            if s != shadowed[k]:
                shadowed[k] = s
                if s:
                    self._close(k, free[k])
                else:
                    self._open(k)
                    self._lower_need_min(k)  # as a GPU entering the bucket would
            if free[k] + blocked[k] > most:
                most = free[k] + blocked[k]

    def _open(self, g: int) -> None:
        entry, level = self.stamp[g] << GPU_BITS | g, self.free_share[g]
        insort(self.open[level], entry)
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
        """GPU g went from `old` free shares to a bucket's end (a new stamp); the shadows of its node's GPUs from it
        on anew (the ones below it do not depend on it). (`_close`, `_open` and `_shade` for g written out: this
        runs at every placement and removal.)"""
        t, value = self.gpu_type[g], self.free_share[g]
        lists = (self.open, self.type_open[t]) if t >= 0 else (self.open,)
        if not self.shadowed[g]:
            entry = self.stamp[g] << GPU_BITS | g
            for per_level in lists:
                row = per_level[old]
                del row[bisect_left(row, entry)]
        self.stamp[g] = self._stamps
        self._stamps += 1
        most = self.lower_most[g]
        node = self.gpu_node[g]
        self.shadowed[g] = shadowed = self.even_node[node] and most >= value
        if not shadowed:
            entry = self.stamp[g] << GPU_BITS | g  # the newest stamp: the list's end
            for per_level in lists:
                per_level[value].append(entry)
        gpus, above = self.node_gpus[node], self.node_rank[g] + 1
        if above < len(gpus):
            most = max(most, value + self.blocked[g])
            if self.lower_most[gpus[above]] != most:  # else nothing above g changes (`_shade`)
                self._shade(gpus, above, most)

    def gives_share(self, seat: Seat, row: Row, g: int) -> bool:
        """`SlurmPicks.slurm_gives` for `seat` at `row` on GPU g, which has the row's shares free: for an `mps:N`
        job read off `lower_most` (Slurm gives GPU g exactly when `lower_most[g]` < N), for a `gpu:1` job asked
        of the ledger."""
        if self.asks_one_whole(seat, row, g):
            return self.slurm_gives(g, row.share, True)
        return self.lower_most[g] < row.share
