"""The GPUs as the packing sees them: free shares, memory, node CPUs and memory, who sits where.

Mutable, but only inside one epoch: the epoch builds it from the snapshot,
places jobs one at a time, and reads the result. A placement is accepted only
when, on that GPU, the shares still sum to at most the GPU's, the memory fits,
the node has the CPUs and memory, nobody's co-located speed (its own or a
neighbour's) falls under the floor or under its job's throughput floor, and a
shared GPU gains over one job alone (the gain rule below).

The floors are checked as `interference.base.admissible` does: predicted
speed >= floor × (1 + margin), with the model's admission margin (one for all
pairs, or per pair from the cache). With several co-runners a job's margin is
the largest of its pairs' (a pair's: the larger of its two directions). The
margin guards against the model's error, so it applies to the job's own
throughput floor as well; the slowdown itself (and so Γ and the rates) stays
the prediction.

Besides the floors, a GPU is shared only when the GPU as a whole gains
(DESIGN, IAC): with f_i = job i's predicted co-located throughput ÷ its
throughput alone at its family's best single-GPU shape (`fraction`), a
placement next to others is admitted only if Σ_i f_i >= 1 + m over everyone
on the GPU, m the largest of the gain margin (`PairCache.gain_margin`: the
model's, never below `interference.base.MIN_GAIN`) and the admission margins
of the GPU's pairs (the one margin of all pairs when margins are not per
pair); a pair that only breaks even is
waste plus risk, and a model unsure of a GPU type (wide margins) shares only
clear wins. Co-runners leave at different times and what stays behind is never
re-checked, so with three or more on a GPU each pair of the newcomer and an
occupant must also gain on its own (f's of the pair alone, that pair's
margin); by induction every pair the packing puts on a GPU gains, whatever
leaves — the pair rule `planner.exact` applies, which keeps it an upper bound.
The reference of f is `Seat.best_solo`, which the epoch sets. A job alone on its
GPU is always admitted (nothing is shared). A foreign occupant (not managed:
`Row.tput` inf) counts as f = its share of the GPU ÷ its predicted slowdown:
a neutral guess, as if its speed were linear in its share.

Slurm, not the planner, picks the GPU within the node the helper pins
(`planner.gpu_choice`: the lowest-index GPU with the shares free, and for a
gang the lowest GPUs not held whole, or on Slurm 24.11 the lowest with no
user: `lowest_unused`, from the snapshot's version), so a share is placed
only on the GPU Slurm would give it on that node (`slurm_gives`) and a gang only on GPUs
Slurm would take; the interference and gain checks are then about the
co-runners the job will really have. What Slurm sees free is the planner's
free shares plus the head-of-queue reservation (`block`), which Slurm does
not know. GPUs of a node must be given in Slurm's index order.

Finding a GPU is best fit on free shares (the fullest GPU that still fits),
through buckets keyed by free shares, so it costs little even at thousands of
GPUs; at most `max_tries` GPUs are examined per shape, which bounds the
epoch's time when most GPUs fail on memory, CPUs or interference. GPUs the
gain rule's cheap bound rules out, and questions `fits` already answered no
to on an unchanged GPU (jobs of one family ask the same), are passed over
without counting: under the gain rule most shared GPUs are no place for most
jobs, and the tries would otherwise run out before a GPU that fits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from slurm_elastico.planner.gangs import even_split, fewest_nodes
from slurm_elastico.planner.gpu_choice import mps_gpu, whole_gpus
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
    # Throughput alone at its family's best single-GPU shape (`best_solo`): the reference of its fraction of solo
    # speed in the gain rule. 0 = unknown: its row's own solo throughput is the reference (f = 1 / slowdown),
    # which the floors already imply whenever floor >= 0.5, i.e. the rule as it was before the gain check.
    best_solo: float = 0.0
    whole: bool = False  # asks whole GPUs (`gpu:N`): Slurm gives it `gpu_choice.whole_gpus`, not an MPS share's GPU


def best_solo(rows: Iterable[Row]) -> float:
    """`Seat.best_solo` of a job whose family has these rows: the fastest that holds at most one GPU (0: none)."""
    return max((r.tput for r in rows if r.gpus <= 1), default=0.0)


class GpuState:
    def __init__(self, gpu_node: list[int], free_share: list[int], free_mem: list[float],
                 node_cpu: list[float], node_mem: list[float], cache: PairCache, floor: float,
                 max_tries: int = 64, total_share: list[int] | None = None, lowest_unused: bool = False):
        self.gpu_node = gpu_node
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
        self.occ: list[list[Seat]] = [[] for _ in free_share]
        self._hi = self.top  # upper bound on the largest free share; see max_free
        # The gain rule's cheap bound (see `fits`): a newcomer whose fraction of solo speed with no slowdown is
        # below need[g] cannot gain on GPU g (-inf: no occupant, nothing to gain against); need_min[level] is a
        # lower bound of need over the GPUs with that free share, so `find` skips a whole bucket on one compare.
        self.need = [-math.inf] * len(free_share)
        self.need_min = [-math.inf] * (self.top + 1)
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

    # -- bookkeeping -------------------------------------------------------

    def _set_share(self, g: int, value: int) -> None:
        old = self.free_share[g]
        del self.buckets[old][g]  # fewer GPUs never turn a bucket's refusal into a fit: its version stays
        self.free_share[g] = value
        self.buckets[value][g] = None
        self._hi = max(self._hi, value)
        self.need_min[value] = min(self.need_min[value], self.need[g])
        # Every GPU of the node: a removal gives back node CPUs and memory any of them may now fit, and any
        # change of free shares may change which GPU of the node Slurm gives a share (`slurm_gives`).
        for k in self.node_gpus[self.gpu_node[g]]:
            self._touch(k)

    def _touch(self, g: int) -> None:
        """GPU g changed: refusals `find` remembers for it, or for its bucket, no longer hold."""
        self.version[g] += 1
        self.bucket_version[self.free_share[g]] += 1

    def max_free(self) -> int:
        """The largest free share of any GPU (amortised O(1): the bound only walks down over empty buckets)."""
        while self._hi > 0 and not self.buckets[self._hi]:
            self._hi -= 1
        return self._hi

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
        """Recompute every occupant's slowdown on GPU g from the pairs, and the GPU's `need`."""
        occ = self.occ[g]
        if len(occ) < 2 or not self.cache.enabled:
            for s in occ:
                s.slow, s.margin = 1.0, 0.0
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
        self.need_min[self.free_share[g]] = min(self.need_min[self.free_share[g]], need)
        self._touch(g)

    # -- questions ---------------------------------------------------------

    def asks_one_whole(self, seat: Seat, row: Row, g: int) -> bool:
        """Whether `seat` at `row` on GPU g is asked of Slurm as `gpu:1` (a job asking whole GPUs, all of one GPU)."""
        return seat.whole and row.share >= self.total_share[g]

    def slurm_gives(self, g: int, share: int, whole: bool = False) -> bool:
        """Whether Slurm gives a job pinned to GPU g's node that very GPU (`given`)."""
        return self.given(self.gpu_node[g], share, whole) == g

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

    def whole_gpus_for(self, count: int) -> tuple[int, ...]:
        """The GPUs Slurm's rule for `gpu:count` picks (its `count` lowest not held whole: `gpu_choice.whole_gpus`
        without `lowest_unused`) on the node where they are least used (most free shares, then fewest occupants;
        the last node among equals), idle or not; () when no node has `count` GPUs not held whole."""
        best: tuple[int, ...] = ()
        best_key: tuple[int, int, int] | None = None
        for node, gpus in self.node_gpus.items():
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

    def fits(self, seat: Seat, row: Row, g: int, *, stays: bool = False) -> float:
        """Slowdown `seat` would see at `row` on GPU g, or 0.0 when it may not go there.

        `stays`: the job keeps its place on g (a running job reshaped in place, no requeue), so Slurm's
        choice of GPU does not come into it; otherwise g must be the GPU Slurm gives the share (`slurm_gives`).
        """
        if self.free_share[g] < row.share or self.free_mem[g] < row.mem:
            return 0.0
        if not stays and not self.slurm_gives(g, row.share, self.asks_one_whole(seat, row, g)):
            return 0.0
        n = self.gpu_node[g]
        if self.node_cpu[n] < row.cpus or self.node_mem[n] < row.hmem:
            return 0.0
        occ = self.occ[g]
        if not occ or not self.cache.enabled:
            return 1.0
        if self.alone(seat, row) < self.need[g]:  # cannot gain here whatever the slowdowns: no lookup
            return 0.0
        k = len(occ)
        pairs = [(row.uid, o.row.uid) for o in occ] + [(o.row.uid, row.uid) for o in occ]
        got = self.cache.get(pairs)
        slow = 1.0 + sum(s - 1.0 for s in got[:k])
        if self.per_pair:
            return self._fits_per_pair(seat, row, occ, pairs, got, slow, g)
        bar, scale = self.bar, self.scale
        if slow * bar > 1.0 or row.tput < seat.floor * slow * scale:
            return 0.0
        for o, s in zip(occ, got[k:]):
            # Every occupant, even next to a harmless newcomer: one that was alone was never checked with
            # the margin, and co-located it must hold its floors at slowdown × (1 + margin).
            after = o.slow + s - 1.0
            if after * bar > 1.0 or o.row.tput < o.floor * after * scale:
                return 0.0
        m = self.cache.gain_margin
        return slow if self._gains(seat, row, g, occ, got, slow, [m] * k, m) else 0.0

    def _fits_per_pair(self, seat: Seat, row: Row, occ: list[Seat], pairs: list[tuple[int, int]],
                       got: list[float], slow: float, g: int) -> float:
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
        # The GPU's margin: the largest of its pairs' after the placement (an occupant's `margin` is its pairs'),
        # never below the model's margin for the gain rule (admission margins may be below 0).
        least = self.cache.gain_margin
        gpu_m = max(least, max(pair_m), max(o.margin for o in occ))
        gain_m = [max(least, m) for m in pair_m]
        return slow if self._gains(seat, row, g, occ, got, slow, gain_m, gpu_m) else 0.0

    @staticmethod
    def alone(seat: Seat, row: Row) -> float:
        """`seat`'s fraction of solo speed at `row` with no slowdown (a managed job; see `fraction`)."""
        ref = max(seat.best_solo, row.tput)
        return row.tput / ref if ref > 0 else 0.0

    def fraction(self, seat: Seat, row: Row, g: int, slow: float) -> float:
        """f: `seat`'s predicted speed at `row` on GPU g at slowdown `slow` ÷ its speed alone at its best shape.

        The reference is `seat.best_solo`, never below the row's own solo throughput (so 0, unknown, gives
        1 / slow). A foreign occupant (tput inf): its share of the GPU ÷ its slowdown, a neutral guess.
        """
        if row.tput == math.inf:
            return row.share / max(1, self.total_share[g]) / slow
        ref = max(seat.best_solo, row.tput)
        return row.tput / ref / slow if ref > 0 else 0.0

    def _gains(self, seat: Seat, row: Row, g: int, occ: list[Seat], got: list[float], slow: float,
               pair_m: list[float], gpu_m: float) -> bool:
        """The gain rule (module docstring): Σ f >= 1 + the GPU's margin, and with two occupants or more already,
        f(newcomer) + f(occupant) >= 1 + that pair's margin for each pair of the two alone.

        `got` as in `fits` (newcomer→each occupant, then each occupant→newcomer); `slow` the newcomer's summed
        slowdown; `pair_m` each pair's margin, in occupant order.
        """
        k = len(occ)
        total = self.fraction(seat, row, g, slow)
        for o, s_in, s_out, m in zip(occ, got[:k], got[k:], pair_m):
            total += self.fraction(o, o.row, g, o.slow + s_out - 1.0)
            if k > 1 and self.fraction(seat, row, g, s_in) + self.fraction(o, o.row, g, s_out) < 1.0 + m:
                return False
        return total >= 1.0 + gpu_m

    def find_gang(self, row: Row) -> tuple[int, ...]:
        """Idle GPUs for a data-parallel row as Slurm can be asked for them, or () when they are not there.

        P GPUs on each of K nodes (`planner.gangs.even_split`: Slurm's `Gres=gpu:P NumNodes=K-K`), on each the
        ones Slurm takes for `gpu:P` (`gpu_choice.whole_gpus`: its P lowest not held whole, or on 24.11 its P
        lowest with no user; all idle), K the
        fewest nodes the gang can span (`gangs.fewest_nodes`; its throughput was measured there): one node
        when the gang fits a node (the one with the fewest idle GPUs that can: best fit). Idle: no occupant and every share free. Each node must have the CPUs and host memory for
        its part (the row's, in proportion to its GPUs there).
        """
        n = row.gpus
        if n <= 0 or self.max_free() <= 0:
            return ()
        idle: dict[int, list[bool]] = {}
        whole: dict[int, list[bool]] = {}
        unused: dict[int, list[bool] | None] = {}
        for node in self.node_gpus:
            ok, held, free = self._idle_whole(node, row.mem)
            if any(ok):
                idle[node], whole[node], unused[node] = ok, held, free
        if sum(sum(v) for v in idle.values()) < n:
            return ()

        def room(node: int, p: int) -> bool:
            return (bool(whole_gpus(idle[node], p, whole[node], unused[node]))
                    and self.node_cpu[node] >= row.cpus * p / n - 1e-9 and self.node_mem[node] >= row.hmem * p / n - 1e-9)

        size = max(len(gpus) for gpus in self.node_gpus.values())
        split = even_split(n, sorted(idle), room, lambda node: (sum(idle[node]), node), fewest_nodes(n, size))
        return tuple(self.node_gpus[node][k] for node, p in (split or {}).items()
                     for k in whole_gpus(idle[node], p, whole[node], unused[node]))

    def find(self, seat: Seat, row: Row) -> tuple[int, float]:
        """(GPU, slowdown) of the best-fit GPU for `row`, or (-1, 0.0).

        GPUs the gain rule's bound rules out (`need`) are passed over without counting as tries, a whole bucket
        at once where its `need_min` does: with the gain rule most shared GPUs are no place for most jobs, and
        `max_tries` would otherwise run out on them before the search reached a GPU the job could take. A bucket
        scanned to its end gets its exact `need_min` back.
        """
        if row.share > self.max_free():
            return -1, 0.0
        x = self.alone(seat, row)
        need, need_min, version = self.need, self.need_min, self.version
        refused, refused_at = self.refused, self.refused_at
        key = self.keys.setdefault((row, seat.floor, seat.best_solo), len(self.keys))  # all `fits` reads of `seat`
        gpu_node, given = self.gpu_node, {}  # node -> the GPU Slurm gives this share there, once per call
        tries = 0
        for level in range(row.share, self._hi + 1):
            if x < need_min[level]:
                continue
            at = self.bucket_version[level]
            if self.bucket_refused[level].get(key) == at:
                continue  # every GPU here said no to this question, and none has changed since
            low = math.inf
            for g in self.buckets[level]:
                ng = need[g]
                if ng < low:
                    low = ng
                if x < ng:
                    continue
                if refused_at[g] != version[g]:
                    refused_at[g], refused[g] = version[g], set()
                elif key in refused[g]:
                    continue  # asked before, nothing changed since: counted then
                n = gpu_node[g]
                if n not in given:  # nothing changes during the search: the node's answer holds for all its GPUs
                    given[n] = self.given(n, row.share, self.asks_one_whole(seat, row, g))
                if given[n] != g:
                    continue  # Slurm would give this node's share elsewhere: not a try
                slow = self.fits(seat, row, g)
                if slow:
                    return g, slow
                refused[g].add(key)
                tries += 1
                if tries >= self.max_tries:
                    return -1, 0.0
            need_min[level] = low
            self.bucket_refused[level][key] = at
        return -1, 0.0
