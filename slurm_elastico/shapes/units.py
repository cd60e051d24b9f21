"""Percent of a GPU ↔ Slurm MPS share counts: the one conversion.

Families and shapes speak percent of one GPU (`Resources.mps`, `mps_shares`
in a spec). Slurm counts MPS shares: a GPU has `gpu.shares_per_gpu` of them
(gres.conf `Count` ÷ GPUs), and `Gres=mps:N`, `GpuView.shares_*`,
`JobView.mps_share` and `Action.share` are all in those counts. Wherever a
percent meets a count, it goes through `shares_of`.

No rounding: a percent that is not a whole number of shares at the site's
`shares_per_gpu` is an error, since rounding would give a shape more or less of
the GPU than its throughput and memory were measured at. At 48 shares per GPU,
25 % is 12 shares, while 10 % (4.8 shares) is refused; the percents allowed are
the multiples of 100 ÷ gcd(100, shares_per_gpu).
"""

from __future__ import annotations

import math

from slurm_elastico.errors import ElasticoError

PERCENT = 100
"""A whole GPU, in the unit families and shapes use."""


class ShareUnitError(ElasticoError, ValueError):
    """A percent of a GPU is not a whole number of MPS shares at the site's shares per GPU."""

    exit_code = 2


def percent_step(shares_per_gpu: int) -> int:
    """The smallest percent that is a whole number of shares: every allowed percent is a multiple of it."""
    _check_per_gpu(shares_per_gpu)
    return PERCENT // math.gcd(PERCENT, shares_per_gpu)


def shares_of(percent: int, shares_per_gpu: int) -> int:
    """MPS shares Slurm counts for `percent` % of one GPU with `shares_per_gpu` shares per GPU (exact or an error)."""
    _check_per_gpu(shares_per_gpu)
    if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= PERCENT:
        raise ShareUnitError(f"an MPS share is a whole percent of one GPU from 1 to {PERCENT}, not {percent!r}")
    shares, rest = divmod(percent * shares_per_gpu, PERCENT)
    if rest:
        step = percent_step(shares_per_gpu)
        raise ShareUnitError(
            f"MPS share {percent} % is {percent * shares_per_gpu / PERCENT:g} of gpu.shares_per_gpu={shares_per_gpu} "
            f"shares, not a whole number; with {shares_per_gpu} shares per GPU a family's shares must be "
            f"multiples of {step} % (or set gpu.shares_per_gpu to match gres.conf with a count that divides them)")
    return shares


def percent_of(shares: int, shares_per_gpu: int) -> float:
    """Percent of one GPU that `shares` of `shares_per_gpu` are (for utilisation models; may be fractional)."""
    _check_per_gpu(shares_per_gpu)
    if isinstance(shares, bool) or not isinstance(shares, int) or not 0 <= shares <= shares_per_gpu:
        raise ShareUnitError(f"MPS shares must be an integer from 0 to gpu.shares_per_gpu={shares_per_gpu}, "
                             f"not {shares!r}")
    return shares * PERCENT / shares_per_gpu


def _check_per_gpu(shares_per_gpu: int) -> None:
    if isinstance(shares_per_gpu, bool) or not isinstance(shares_per_gpu, int) or shares_per_gpu < 1:
        raise ShareUnitError(f"gpu.shares_per_gpu must be a positive integer, not {shares_per_gpu!r}")
