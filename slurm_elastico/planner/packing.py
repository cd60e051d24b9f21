"""The GPUs as the packing sees them: free shares, memory, node CPUs and memory, who sits where.

Mutable, but only inside one epoch: the epoch builds it from the snapshot,
places jobs one at a time, and reads the result. A placement is accepted only
when, on that GPU, the shares still sum to at most the GPU's, the memory fits,
the node has the CPUs and memory, nobody's co-located speed (its own or a
neighbour's) falls under the floor or under its job's throughput floor, and a
shared GPU gains over one job alone (the gain rule, `planner.admission`).

The questions are parts of `GpuState` by concept: which GPU Slurm gives a
job on a node (`planner.slurm_picks`), and whether a job may go on a GPU,
the floors and the gain rule (`planner.admission`); what a job holds is
`planner.seats`.

Finding a GPU is best fit on free shares (the fullest GPU that still fits),
through buckets keyed by free shares, so it costs little even at thousands of
GPUs; at most `max_tries` GPUs are examined per shape, which bounds the
epoch's time when most GPUs fail on memory, CPUs or interference. GPUs the
gain rule's cheap bound rules out, and questions `fits` already answered no
to on an unchanged GPU (jobs of one family ask the same), are passed over
without counting: under the gain rule most shared GPUs are no place for most
jobs, and the tries would otherwise run out before a GPU that fits. A GPU
Slurm would never give a share on its node (a lower one there has at least
its shares free) is not visited at all (`planner.shadows`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort

from slurm_elastico.planner.admission import Admission
from slurm_elastico.planner.gang_search import GangSearch
from slurm_elastico.planner.seats import Row, Seat
from slurm_elastico.planner.shadows import GPU_MASK, OpenGpus
from slurm_elastico.planner.slowdown import PairCache
from slurm_elastico.planner.slurm_picks import SlurmPicks


class GpuState(SlurmPicks, Admission, OpenGpus, GangSearch):
    """The GPUs of one epoch: the ledger (below), Slurm's choice of GPU (`SlurmPicks`), admission
    (`Admission`), the GPUs a share search visits (`OpenGpus`), the search for a share's place (`find`) and for a
    gang's (`GangSearch`)."""

    def __init__(self, gpu_node: list[int], free_share: list[int], free_mem: list[float],
                 node_cpu: list[float], node_mem: list[float], cache: PairCache, floor: float,
                 max_tries: int = 64, total_share: list[int] | None = None, lowest_unused: bool = False,
                 gpu_type: list[int] | None = None):
        self.gpu_node = gpu_node
        # Each GPU's type (`Board.types` index; -1 untyped): a row of type t goes only on GPUs of type t (`on_type`).
        self.gpu_type = list(gpu_type) if gpu_type is not None else [-1] * len(gpu_node)
        self.free_share = free_share
        self.total_share = list(total_share if total_share is not None else free_share)
        self.node_gpus: dict[int, list[int]] = {}
        for g, n in enumerate(gpu_node):
            self.node_gpus.setdefault(n, []).append(g)
        self.blocked = [0] * len(free_share)  # shares `block` took: free as far as Slurm knows
        self.known: set[tuple[int, int]] = set()  # (id(seat), GPU): where Slurm runs a job already (`attach`)
        self.lowest_unused = lowest_unused  # Slurm gives `gpu:P` its lowest GPUs with no user (`gpu_choice`)
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
        # The same buckets per GPU type, so that a typed row's search walks only its type's GPUs.
        self.type_buckets: dict[int, list[dict[int, None]]] = {
            t: [dict() for _ in range(self.top + 1)] for t in set(self.gpu_type) if t >= 0}
        for g, f in enumerate(free_share):
            if self.gpu_type[g] >= 0:
                self.type_buckets[self.gpu_type[g]][f][g] = None
        # The free-share levels whose bucket holds a GPU, ascending (all GPUs, and per type): `find` visits only
        # those (a GPU has up to `top` + 1 levels; a cluster's GPUs sit at a few).
        self.levels: list[int] = sorted(set(free_share))
        self.type_levels: dict[int, list[int]] = {t: [f for f, b in enumerate(bs) if b]
                                                  for t, bs in self.type_buckets.items()}
        self.type_hi = {t: self.top for t in self.type_buckets}  # per type, as `_hi` (`max_free`)
        # `find_gang`'s memory of the gangs it found no room for, at the state `gained` names then: what the epoch
        # places only takes room away, so a gang that found none finds none until something is given back. Each
        # give-back names a new state (never one used before), and `put_back` returns to the one it started from:
        # what a trial learnt in between is not believed of any later state.
        self.gained = 0
        self._states = 0
        self.no_gang: dict[tuple, int] = {}
        # GPUs with every share free, per type: `find_gang`'s cheap bound (a gang of n needs n of them).
        self.all_free: dict[int, int] = {}
        self.node_all_free = [0] * (max(gpu_node, default=-1) + 1)  # and per node: nodes with none are not scanned
        for g, f in enumerate(free_share):
            if f >= self.total_share[g] > 0:
                self.all_free[self.gpu_type[g]] = self.all_free.get(self.gpu_type[g], 0) + 1
                self.node_all_free[gpu_node[g]] += 1
        self.occ: list[list[Seat]] = [[] for _ in free_share]
        self._hi = self.top  # upper bound on the largest free share; see max_free
        # The gain rule's cheap bound (see `fits`): a newcomer whose fraction of solo speed with no slowdown is
        # below need[g] cannot gain on GPU g (-inf: no occupant, nothing to gain against); need_min[level] is a
        # lower bound of need over the GPUs with that free share, so `find` skips a whole bucket on one compare.
        self.need = [-math.inf] * len(free_share)
        self.need_min = [-math.inf] * (self.top + 1)
        # The same bound per GPU type (a typed row's search scans only its type's bucket, so what it learns holds
        # for that type alone).
        self.type_need_min = {t: [-math.inf] * (self.top + 1) for t in self.type_buckets}
        # Refusals `find` already got, per GPU and per bucket, for a question (`find`'s key: jobs of one family
        # ask the same one). A refusal stays one while the GPU is as it was (its `version`; a bucket's version
        # moves with each of its GPUs' and with each GPU that enters it): placing elsewhere only takes node CPUs
        # and memory, which never turns a refusal into a fit, and anything that gives some back (a removal)
        # moves the version of every GPU of its node.
        self.version = [0] * len(free_share)
        self.bucket_version = [0] * (self.top + 1)
        self.refused_at = [-1] * len(free_share)  # the version `refused` was gathered at
        self.refused: list[set[int]] = [set() for _ in free_share]
        self.bucket_refused: list[dict[int, int]] = [{} for _ in range(self.top + 1)]
        self.keys: dict[tuple, int] = {}
        # The ledger's state as a number that every change moves (each `_touch`, and `attach_gang`): a search's
        # answer holds while it stands. `starts.place` remembers the questions (a family's rows, for seats alike)
        # that found no place at it (`unplaced`): jobs of one family ask the same one, and the answer stays no until
        # something changes. A search `max_tries` cut short (`cut_short` counts them) is not such an answer: asked
        # again, it goes on past the GPUs it refused.
        self.changes = 0
        self.cut_short = 0
        self.unplaced: dict[tuple, int] = {}
        self._bounds: dict[int, tuple[int, tuple[list[int], list[float]]]] = {}  # `bounds` per type, at `changes`
        self._init_open()  # each bucket's GPUs that Slurm could give a share (`planner.shadows`)

    # -- bookkeeping -------------------------------------------------------

    def _set_share(self, g: int, value: int) -> None:
        old = self.free_share[g]
        total = self.total_share[g]
        if value > old:
            self._gain()
        t, node = self.gpu_type[g], self.gpu_node[g]
        if (old >= total) != (value >= total) and total > 0:
            d = 1 if value >= total else -1
            self.all_free[t] = self.all_free.get(t, 0) + d
            self.node_all_free[node] += d
        del self.buckets[old][g]  # fewer GPUs never turn a bucket's refusal into a fit: its version stays
        self.free_share[g] = value
        _move_level(self.buckets, self.levels, g, old, value)
        if t >= 0:
            del self.type_buckets[t][old][g]
            _move_level(self.type_buckets[t], self.type_levels[t], g, old, value)
            if value > self.type_hi[t]:
                self.type_hi[t] = value
        self.reshadow(g, old)
        if value > self._hi:
            self._hi = value
        self._lower_need_min(g)
        # Every GPU of the node: a removal gives back node CPUs and memory any of them may now fit, and any
        # change of free shares may change which GPU of the node Slurm gives a share (`slurm_gives`). (`_touch`
        # for each, written out: this runs for every GPU of the node at every placement and removal.)
        gpus, version, bucket_version = self.node_gpus[node], self.version, self.bucket_version
        free = self.free_share
        self.changes += len(gpus)
        for k in gpus:
            version[k] += 1
            bucket_version[free[k]] += 1

    def _touch(self, g: int) -> None:
        """GPU g changed: refusals `find` remembers for it, or for its bucket, no longer hold."""
        self.changes += 1
        self.version[g] += 1
        self.bucket_version[self.free_share[g]] += 1

    def max_free(self) -> int:
        """The largest free share of any GPU (amortised O(1): the bound only walks down over empty buckets)."""
        while self._hi > 0 and not self.buckets[self._hi]:
            self._hi -= 1
        return self._hi

    def max_free_of(self, t: int) -> int:
        """`max_free` over the GPUs of type t (-1: all of them)."""
        if t < 0:
            return self.max_free()
        buckets = self.type_buckets.get(t)
        if buckets is None:
            return -1
        hi = self.type_hi[t]
        while hi > 0 and not buckets[hi]:
            hi -= 1
        self.type_hi[t] = hi
        return hi

    def block(self, g: int, shares: int) -> None:
        """Take `shares` off GPU g for this epoch (a reservation); memory goes in proportion."""
        shares = min(shares, self.free_share[g])
        self.blocked[g] += shares
        if self.free_share[g] > 0:
            self.free_mem[g] -= self.free_mem[g] * shares / self.free_share[g]
        self._set_share(g, self.free_share[g] - shares)

    def attach(self, seat: Seat, g: int, mem: float) -> None:
        """Record a job already on GPU g (its shares are already off `free_share`)."""
        seat.gpu = g
        self.free_mem[g] -= mem
        self.occ[g].append(seat)
        self.known.add((id(seat), g))
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
        self.changes += 1
        for g in gpus:
            self.free_mem[g] -= mem
            self.occ[g].append(seat)
            self.known.add((id(seat), g))

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

    def put_back(self, mark: int) -> None:
        """The caller took a job off and put it back exactly where it was (a trial that found nothing better):
        `find_gang`'s memory of gangs with no room holds again as of `mark` (the `gained` state before)."""
        self.gained = mark

    def _gain(self) -> None:
        self._states += 1
        self.gained = self._states

    def remove(self, seat: Seat) -> None:
        """Take a planned or running job off its GPU(s), giving back what it held."""
        self._gain()
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
        """Recompute every occupant's slowdown on GPU g from the pairs, and the GPU's `need`."""
        occ = self.occ[g]
        if len(occ) < 2 or not self.cache.enabled:
            for s in occ:
                s.slow, s.margin = 1.0, 0.0
        elif len(occ) == 2:  # (the usual shared GPU: the general case below, written out for one pair)
            a, b = occ
            pairs = [(a.row.uid, b.row.uid), (b.row.uid, a.row.uid)]
            s_ab, s_ba = self.cache.get(pairs)
            a.slow, b.slow = 1.0 + (s_ab - 1.0), 1.0 + (s_ba - 1.0)
            if self.cache.per_pair:
                m_ab, m_ba = self.cache.margins(pairs)
                a.margin, b.margin = max(m_ab, m_ba), max(m_ba, m_ab)
        else:
            pairs = [(a.row.uid, b.row.uid) for a in occ for b in occ if a is not b]
            got = iter(self.cache.get(pairs))
            for a in occ:
                a.slow = 1.0 + sum(next(got) - 1.0 for b in occ if b is not a)
            if self.cache.per_pair:
                m = dict(zip(pairs, self.cache.margins(pairs)))
                for a in occ:
                    a.margin = max(max(m[(a.row.uid, b.row.uid)], m[(b.row.uid, a.row.uid)])
                                   for b in occ if b is not a)
        if not occ or not self.cache.enabled:
            need = -math.inf
        else:
            # The gain without the newcomer's slowdowns bounds the real one from above, and the GPU's margin is at
            # least its occupants' own (or the one of all pairs); the slack leaves ties to the full check.
            least = max(self.cache.gain_margin, max(o.margin for o in occ)) if self.per_pair else self.cache.gain_margin
            need = (1.0 + least) * (1.0 - 1e-12) - sum(self.fraction(o, o.row, g, o.slow) for o in occ)
        self.need[g] = need
        self._lower_need_min(g)
        self._touch(g)

    def _lower_need_min(self, g: int) -> None:
        """GPU g's bucket bound (`need_min`, and its type's) is at most its `need` now."""
        level, need = self.free_share[g], self.need[g]
        if need < self.need_min[level]:  # (`min` written out, as it keeps its first argument on NaN)
            self.need_min[level] = need
        if self.gpu_type[g] >= 0:
            mins = self.type_need_min[self.gpu_type[g]]
            if need < mins[level]:
                mins[level] = need

    # -- searches ----------------------------------------------------------

    def on_type(self, row: Row, g: int) -> bool:
        """Whether GPU g is of the type `row` runs on (a row of no type runs on any)."""
        return row.gtype < 0 or self.gpu_type[g] == row.gtype

    def bounds(self, t: int) -> tuple[list[int], list[float]]:
        """GPU type t's free-share levels that hold a GPU (-1: all GPUs'), ascending, and for each the least of the
        gain rule's bucket bounds (`need_min`) at that level and above. `find` for a row of type t finds nothing when
        no level reaches its share, or when the newcomer alone (`alone`) is below the least bound from its share up:
        it scans only those buckets. A search that finds nothing only raises bounds, so the answer holds until
        something is placed or removed. (A type no GPU has: no level.) Kept while the ledger's `changes` stands (jobs
        of one family ask again and again): a search in between only raises the bounds, so the kept ones hold."""
        kept = self._bounds.get(t)
        if kept is not None and kept[0] == self.changes:
            return kept[1]
        if t >= 0 and t not in self.type_levels:
            return [], []
        levels = self.type_levels[t] if t >= 0 else self.levels
        need_min = self.type_need_min[t] if t >= 0 else self.need_min
        least, low = [0.0] * len(levels), math.inf
        for i in range(len(levels) - 1, -1, -1):
            v = need_min[levels[i]]
            if low == low and not v >= low:  # (a NaN bound stays NaN from there down: never a reason to skip)
                low = v
            least[i] = low
        out = (list(levels), least)
        self._bounds[t] = (self.changes, out)
        return out

    def find(self, seat: Seat, row: Row) -> tuple[int, float]:
        """(GPU, slowdown) of the best-fit GPU for `row`, or (-1, 0.0).

        GPUs the gain rule's bound rules out (`need`) are passed over without counting as tries, a whole bucket
        at once where its `need_min` does: with the gain rule most shared GPUs are no place for most jobs, and
        `max_tries` would otherwise run out on them before the search reached a GPU the job could take. A bucket
        scanned to its end gets its exact `need_min` back. Only GPUs of the seat's partitions' nodes (`Seat.nodes`)
        are tried.
        """
        t = row.gtype
        top = self.max_free() if t < 0 else self.max_free_of(t)
        if row.share > top:
            return -1, 0.0
        x = self.alone(seat, row)
        levels = self.type_levels[t] if t >= 0 else self.levels
        need_min = self.type_need_min[t] if t >= 0 else self.need_min  # a bound over what it scans
        # the buckets with a GPU, at or above the share, that the gain rule's bound does not rule out (a bucket's
        # bound moves only when that bucket is scanned, so it is read before any scan): most searches end here
        scan = [level for level in levels[bisect_left(levels, row.share):bisect_right(levels, top)]
                if not x < need_min[level]]
        if not scan:
            return -1, 0.0
        need, version = self.need, self.version
        refused, refused_at = self.refused, self.refused_at
        nodes, gpu_node = seat.nodes, self.gpu_node  # the nodes of its partitions (None: any)
        key = self.keys.setdefault((row, seat.floor, seat.best_solo, nodes), len(self.keys))  # what `fits` reads
        gives, whole = self.slurm_gives, self.asks_one_whole
        opened = self.type_open[t] if t >= 0 else self.open  # the buckets' GPUs Slurm could give a share
        tries = 0
        for level in scan:
            at = self.bucket_version[level]
            if self.bucket_refused[level].get(key) == at:
                continue  # every GPU here said no to this question, and none has changed since
            low = math.inf
            for entry in opened[level]:
                g = entry & GPU_MASK
                ng = need[g]
                if ng < low:
                    low = ng
                if x < ng:
                    continue
                if nodes is not None and gpu_node[g] not in nodes:
                    continue  # not a node of its partitions: not a try
                if refused_at[g] != version[g]:
                    refused_at[g], refused[g] = version[g], set()
                elif key in refused[g]:
                    continue  # asked before, nothing changed since: counted then
                if not gives(g, row.share, whole(seat, row, g)):
                    continue  # Slurm would give this node's share elsewhere: not a try
                slow = self.fits(seat, row, g)
                if slow:
                    return g, slow
                refused[g].add(key)
                tries += 1
                if tries >= self.max_tries:
                    self.cut_short += 1
                    return -1, 0.0
            need_min[level] = low
            self.bucket_refused[level][key] = at
        return -1, 0.0


def _move_level(buckets: list[dict[int, None]], levels: list[int], g: int, old: int, value: int) -> None:
    """GPU g (already out of bucket `old`) into bucket `value`; `levels` (the non-empty buckets, ascending) kept."""
    if not buckets[old]:
        levels.pop(bisect_left(levels, old))
    if not buckets[value]:
        insort(levels, value)
    buckets[value][g] = None
