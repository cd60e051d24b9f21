"""Whether a job may go on a GPU: the co-location floors and the gain rule (`Admission`, a part of `GpuState`).

A placement is admitted only when, on that GPU, the shares and memory fit,
Slurm gives the job that GPU (`planner.slurm_picks`), the node has the CPUs
and memory, nobody's co-located speed (its own or a neighbour's) falls under
the floor or under its job's throughput floor, and a shared GPU gains over
one job alone.

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
"""

from __future__ import annotations

import math

from slurm_elastico.planner.seats import Row, Seat


class Admission:
    """`GpuState`'s admission checks; reads the ledger `GpuState` keeps (no state of its own)."""

    def fits(self, seat: Seat, row: Row, g: int, *, stays: bool = False) -> float:
        """Slowdown `seat` would see at `row` on GPU g, or 0.0 when it may not go there.

        `stays`: the job keeps its place on g (a running job reshaped in place, no requeue), so Slurm's
        choice of GPU does not come into it; otherwise g must be the GPU Slurm gives the share (`slurm_gives`).
        """
        if self.free_share[g] < row.share or self.free_mem[g] < row.mem or not self.on_type(row, g):
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
        least = self.cache.gain_margin
        # The gain rule at the least margin any pair may have (below, each is at least that): a placement that does
        # not gain even so is refused without a margin looked up; with a trained model most candidates end here.
        if not self._gains(seat, row, g, occ, got, slow, [least] * k, least):
            return 0.0
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
