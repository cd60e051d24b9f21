"""How much of the cluster's GPU time the live helper may spend probing pairs its model is unsure of.

With `interference.adapt_online` the helper learns a GPU type from the pairs it measures there
(`interference.adapt_online.OnlineAdapted`). A pair never measured is only tried when the model is allowed to be
optimistic about it (`OnlineAdapted.probing`); `interference.probe_budget` caps what that optimism may cost: the
GPU-seconds spent on probes (each pair's first measurement: the time its two jobs shared one GPU until the
observer measured them; a pair judged against a family's figure, one of its jobs never measured alone at its
shape, the same: the time until its first judgement, `helper.observer`) stay below that share of the
GPU-seconds the type's GPUs have been up under the helper.
The planner's gain rule still chooses which pairs to try (the unmeasured ones that might gain most), and a probe
that loses is undone after one measurement (`interference.probe`, `helper.revert`).

The ledger counts time between epochs, each gap at most `MAX_GAP_S`: while no helper ran, nothing could be
probed, so a long outage buys no probes. A probe is counted when it is measured, so the probes one epoch starts
may overshoot the budget by their own time; the next epochs then probe nothing until the cluster's time catches
up. The simulated new cluster (`sim.new_cluster.PairObserver`) budgets its probes the same way, over all the
time since its first arrival (its epochs never stop: no gap to cap).

Pure: numbers in, numbers out; `helper.observer` keeps the ledger in the store.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MAX_GAP_S = 600.0
"""The most one gap between epochs adds to the cluster's time (a helper that was not running probed nothing)."""


@dataclass(frozen=True)
class Ledger:
    gpu_s: float = 0.0
    """GPU-seconds the type's GPUs have been up between epochs (each gap at most `MAX_GAP_S`)."""
    probe_gpu_s: float = 0.0
    """GPU-seconds spent on probes (first measurements of a pair)."""
    last: float | None = None
    """When the last epoch counted (None: none yet)."""

    def tick(self, now: float, gpus: int) -> Ledger:
        """The ledger after an epoch at `now` on `gpus` GPUs of the type; a clock that stepped back adds nothing."""
        if self.last is None or now <= self.last:
            return replace(self, last=now if self.last is None else max(self.last, now))
        return replace(self, gpu_s=self.gpu_s + max(0, gpus) * min(now - self.last, MAX_GAP_S), last=now)

    def spend(self, seconds: float) -> Ledger:
        """The ledger after probes that shared one GPU for `seconds` in all."""
        return replace(self, probe_gpu_s=self.probe_gpu_s + max(0.0, seconds))

    def allows(self, budget: float) -> bool:
        """Whether a new probe may start: the probes so far below `budget` × the cluster's time."""
        return budget > 0 and self.probe_gpu_s < budget * self.gpu_s
