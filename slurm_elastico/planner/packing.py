"""The GPUs as the packing sees them: free shares, memory, node CPUs and memory, who sits where.

Mutable, but only inside one epoch: the epoch builds it from the snapshot,
places jobs one at a time, and reads the result. A placement is accepted only
when, on that GPU, the shares still sum to at most the GPU's, the memory fits,
the node has the CPUs and memory, and nobody's co-located speed (its own or a
neighbour's) falls under the floor or under its job's throughput floor.

The floors are checked as `interference.base.admissible` does: predicted
speed >= floor × (1 + margin), with the model's admission margin (one for all
pairs, or per pair from the cache). With several co-runners a job's margin is
the largest of its pairs' (a pair's: the larger of its two directions). The
margin guards against the model's error, so it applies to the job's own
throughput floor as well; the slowdown itself (and so Γ and the rates) stays
the prediction.

Finding a GPU is best fit on free shares (the fullest GPU that still fits),
through buckets keyed by free shares, so it costs little even at thousands of
GPUs; at most `max_tries` GPUs are examined per shape, which bounds the
epoch's time when most GPUs fail on memory, CPUs or interference.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_elastico.planner.slowdown import PairCache


@dataclass(frozen=True)
class Row:
    """One shape as packing needs it."""

    slot: int  # index of the shape in its family table
    uid: int  # profile id for the interference cache
    tput: float  # solo throughput
    share: int  # MPS shares of one GPU (0 for a data-parallel row)
    mem: float  # GPU memory per GPU
    cpus: float  # for the whole job
    hmem: float  # for the whole job
    gpus: int = 0  # whole GPUs of a data-parallel row (a gang); 0 for a share of one GPU


@dataclass
class Seat:
    """One job's hold on one GPU (a planned job, a running one, or a foreign one)."""

    job_id: int
    floor: float
    row: Row | None = None
    gpu: int = -1
    slow: float = 1.0
    margin: float = 0.0  # admission margin next to its current co-runners (per-pair margins only)
    gang: tuple[int, ...] = ()  # every GPU of a data-parallel row (`gpu` is the first); () for a share


class GpuState:
    def __init__(self, gpu_node: list[int], free_share: list[int], free_mem: list[float],
                 node_cpu: list[float], node_mem: list[float], cache: PairCache, floor: float,
                 max_tries: int = 64, total_share: list[int] | None = None):
        self.gpu_node = gpu_node
        self.free_share = free_share
        self.total_share = list(total_share if total_share is not None else free_share)
        self.node_gpus: dict[int, list[int]] = {}
        for g, n in enumerate(gpu_node):
            self.node_gpus.setdefault(n, []).append(g)
        self.free_mem = free_mem
        self.node_cpu = node_cpu
        self.node_mem = node_mem
        self.cache = cache
        self.floor = floor
        self.per_pair = cache.per_pair
        self.scale = 1.0 + cache.margin  # when margins are not per pair: the slowdown admission checks is slow × scale
        self.bar = floor * self.scale
        self.max_tries = max_tries
        self.top = max(free_share, default=0)
        self.top = max(self.top, 100, *self.total_share)
        self.buckets: list[dict[int, None]] = [dict() for _ in range(self.top + 1)]
        for g, f in enumerate(free_share):
            self.buckets[f][g] = None
        self.occ: list[list[Seat]] = [[] for _ in free_share]
        self._hi = self.top  # upper bound on the largest free share; see max_free

    # -- bookkeeping -------------------------------------------------------

    def _set_share(self, g: int, value: int) -> None:
        del self.buckets[self.free_share[g]][g]
        self.free_share[g] = value
        self.buckets[value][g] = None
        self._hi = max(self._hi, value)

    def max_free(self) -> int:
        """The largest free share of any GPU (amortised O(1): the bound only walks down over empty buckets)."""
        while self._hi > 0 and not self.buckets[self._hi]:
            self._hi -= 1
        return self._hi

    def block(self, g: int, shares: int) -> None:
        """Take `shares` off GPU g for this epoch (a reservation); memory goes in proportion."""
        shares = min(shares, self.free_share[g])
        if self.free_share[g] > 0:
            self.free_mem[g] -= self.free_mem[g] * shares / self.free_share[g]
        self._set_share(g, self.free_share[g] - shares)

    def attach(self, seat: Seat, g: int, mem: float) -> None:
        """Record a job already on GPU g (its shares are already off `free_share`)."""
        seat.gpu = g
        self.free_mem[g] -= mem
        self.occ[g].append(seat)
        self._refresh(g)

    def place(self, seat: Seat, row: Row, g: int) -> None:
        seat.row, seat.gpu = row, g
        self._set_share(g, self.free_share[g] - row.share)
        self.free_mem[g] -= row.mem
        n = self.gpu_node[g]
        self.node_cpu[n] -= row.cpus
        self.node_mem[n] -= row.hmem
        self.occ[g].append(seat)
        self._refresh(g)

    def attach_gang(self, seat: Seat, gpus: tuple[int, ...], mem: float) -> None:
        """Record a job already holding these whole GPUs (already off `free_share`)."""
        seat.gpu, seat.gang = gpus[0], gpus
        for g in gpus:
            self.free_mem[g] -= mem
            self.occ[g].append(seat)

    def place_gang(self, seat: Seat, row: Row, gpus: tuple[int, ...]) -> None:
        """Put a data-parallel row on these idle GPUs (see `find_gang`)."""
        seat.row, seat.gpu, seat.gang, seat.slow, seat.margin = row, gpus[0], gpus, 1.0, 0.0
        for n, k in self._per_node(gpus).items():
            self.node_cpu[n] -= row.cpus * k / len(gpus)
            self.node_mem[n] -= row.hmem * k / len(gpus)
        for g in gpus:
            self._set_share(g, 0)
            self.free_mem[g] -= row.mem
            self.occ[g].append(seat)

    def _per_node(self, gpus: tuple[int, ...]) -> dict[int, int]:
        out: dict[int, int] = {}
        for g in gpus:
            out[self.gpu_node[g]] = out.get(self.gpu_node[g], 0) + 1
        return out

    def remove(self, seat: Seat) -> None:
        """Take a planned or running job off its GPU(s), giving back what it held."""
        if seat.gang:
            row, gpus = seat.row, seat.gang
            for n, k in self._per_node(gpus).items():
                self.node_cpu[n] += row.cpus * k / len(gpus)
                self.node_mem[n] += row.hmem * k / len(gpus)
            for g in gpus:
                self.occ[g].remove(seat)
                self._set_share(g, self.total_share[g])
                self.free_mem[g] += row.mem
            seat.gpu, seat.gang = -1, ()
            return
        g, row = seat.gpu, seat.row
        self.occ[g].remove(seat)
        self._set_share(g, self.free_share[g] + row.share)
        self.free_mem[g] += row.mem
        n = self.gpu_node[g]
        self.node_cpu[n] += row.cpus
        self.node_mem[n] += row.hmem
        seat.gpu = -1
        self._refresh(g)

    def _refresh(self, g: int) -> None:
        """Recompute every occupant's slowdown on GPU g from the pairs."""
        occ = self.occ[g]
        if len(occ) < 2 or not self.cache.enabled:
            for s in occ:
                s.slow, s.margin = 1.0, 0.0
            return
        pairs = [(a.row.uid, b.row.uid) for a in occ for b in occ if a is not b]
        got = iter(self.cache.get(pairs))
        for a in occ:
            a.slow = 1.0 + sum(next(got) - 1.0 for b in occ if b is not a)
        if self.cache.per_pair:
            m = dict(zip(pairs, self.cache.margins(pairs)))
            for a in occ:
                a.margin = max(max(m[(a.row.uid, b.row.uid)], m[(b.row.uid, a.row.uid)]) for b in occ if b is not a)

    # -- questions ---------------------------------------------------------

    def fits(self, seat: Seat, row: Row, g: int) -> float:
        """Slowdown `seat` would see at `row` on GPU g, or 0.0 when it may not go there."""
        if self.free_share[g] < row.share or self.free_mem[g] < row.mem:
            return 0.0
        n = self.gpu_node[g]
        if self.node_cpu[n] < row.cpus or self.node_mem[n] < row.hmem:
            return 0.0
        occ = self.occ[g]
        if not occ or not self.cache.enabled:
            return 1.0
        k = len(occ)
        pairs = [(row.uid, o.row.uid) for o in occ] + [(o.row.uid, row.uid) for o in occ]
        got = self.cache.get(pairs)
        slow = 1.0 + sum(s - 1.0 for s in got[:k])
        if self.per_pair:
            return self._fits_per_pair(seat, row, occ, pairs, got, slow)
        bar, scale = self.bar, self.scale
        if slow * bar > 1.0 or row.tput < seat.floor * slow * scale:
            return 0.0
        for o, s in zip(occ, got[k:]):
            # Every occupant, even next to a harmless newcomer: one that was alone was never checked with
            # the margin, and co-located it must hold its floors at slowdown × (1 + margin).
            after = o.slow + s - 1.0
            if after * bar > 1.0 or o.row.tput < o.floor * after * scale:
                return 0.0
        return slow

    def _fits_per_pair(self, seat: Seat, row: Row, occ: list[Seat], pairs: list[tuple[int, int]],
                       got: list[float], slow: float) -> float:
        """`fits` with a margin per pair; `pairs` (and `got`) are row→each occupant, then each occupant→row."""
        k = len(occ)
        ms = self.cache.margins(pairs)
        pair_m = [max(x, y) for x, y in zip(ms[:k], ms[k:])]
        checked = slow * (1.0 + max(pair_m))
        if checked * self.floor > 1.0 or row.tput < seat.floor * checked:
            return 0.0
        for o, s, m in zip(occ, got[k:], pair_m):
            # Even a harmless newcomer may raise o's margin (e.g. an unseen family), so check every occupant.
            after = (o.slow + s - 1.0) * (1.0 + max(o.margin, m))
            if after * self.floor > 1.0 or (o.row.tput < o.floor * after):
                return 0.0
        return slow

    def find_gang(self, row: Row) -> tuple[int, ...]:
        """Idle GPUs for a data-parallel row on the fewest nodes, or () when they are not there.

        Idle: no occupant and every share free. One node if any can hold the
        whole gang (the one with the fewest idle GPUs that can: best fit);
        else nodes in order of most idle GPUs. Each node must have the CPUs and
        host memory for its part (the row's, in proportion to its GPUs there).
        """
        n = row.gpus
        if n <= 0 or self.max_free() <= 0:
            return ()
        idle: dict[int, list[int]] = {}
        for node, gpus in self.node_gpus.items():
            ok = [g for g in gpus if not self.occ[g] and self.free_share[g] == self.total_share[g] > 0
                  and self.free_mem[g] >= row.mem]
            k = len(ok)
            while k and (self.node_cpu[node] < row.cpus * k / n - 1e-9 or self.node_mem[node] < row.hmem * k / n - 1e-9):
                k -= 1
            if k:
                idle[node] = ok[:k]
        whole = [(len(v), node) for node, v in idle.items() if len(v) >= n]
        if whole:
            return tuple(idle[min(whole)[1]][:n])
        if sum(len(v) for v in idle.values()) < n:
            return ()
        picked: list[int] = []
        for node in sorted(idle, key=lambda m: (-len(idle[m]), m)):
            picked += idle[node][: n - len(picked)]
            if len(picked) == n:
                break
        return tuple(picked)

    def find(self, seat: Seat, row: Row) -> tuple[int, float]:
        """(GPU, slowdown) of the best-fit GPU for `row`, or (-1, 0.0)."""
        if row.share > self.max_free():
            return -1, 0.0
        tries = 0
        for level in range(row.share, self._hi + 1):
            for g in self.buckets[level]:
                slow = self.fits(seat, row, g)
                if slow:
                    return g, slow
                tries += 1
                if tries >= self.max_tries:
                    return -1, 0.0
        return -1, 0.0
