"""PNG plots of simulation results with matplotlib (the `plot` extra): JCT CDF, utilisation over time, load sweep."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.results import RunResult


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on a cluster node
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plots", ["matplotlib is not installed; install the 'plot' extra"]) from None
    return plt


def _save(plt, fig, ax, path: str | Path) -> Path:
    """The finish every plot shares: grid, legend, tight layout, PNG written, figure closed."""
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def jct_cdf(runs: Mapping[str, Sequence[RunResult]], path: str | Path) -> Path:
    """CDF of job completion time per policy, every seed's jobs pooled.

    The fraction is of all jobs given, so a policy that left jobs unfinished
    never reaches 1 (and says how many in its label).
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rs in runs.items():
        jct = np.sort([j.jct / 3600 for r in rs for j in r.jobs])
        left = sum(r.unfinished for r in rs)
        if len(jct):
            label = f"{name} ({left} unfinished)" if left else name
            ax.step(jct, np.arange(1, len(jct) + 1) / (len(jct) + left), where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    return _save(plt, fig, ax, path)


def utilization(runs: Mapping[str, Sequence[RunResult]], path: str | Path) -> Path:
    """Allocated share of all GPUs over time per policy (first seed)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rs in runs.items():
        if rs and rs[0].timeline:
            t = np.array(rs[0].timeline)
            ax.plot((t[:, 0] - t[0, 0]) / 3600, t[:, 1], label=name, lw=1)
    ax.set_xlabel("time since first submission (h)")
    ax.set_ylabel("allocated GPU share")
    ax.set_ylim(0, 1.05)
    return _save(plt, fig, ax, path)


def load_sweep(points: Mapping[str, Sequence[tuple[float, ...]]], path: str | Path,
               ylabel: str = "mean JCT (h)") -> Path:
    """A figure against offered load per policy: {policy: [(load, mean, 95 % half-width[, unfinished])]}.

    A point whose runs left jobs unfinished (the optional fourth value > 0)
    is drawn hollow and counted in the label: its mean is over finished jobs.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in points.items():
        p = np.array(sorted(tuple(x) + (0.0,) * (4 - len(x)) for x in pts), dtype=float)
        if len(p):
            left = int(p[:, 3].sum())
            bar = ax.errorbar(p[:, 0], p[:, 1], yerr=np.nan_to_num(p[:, 2]), marker="o", capsize=3,
                              label=f"{name} ({left} unfinished, hollow)" if left else name)
            bad = p[:, 3] > 0
            if bad.any():
                ax.plot(p[bad, 0], p[bad, 1], "o", mfc="white", mec=bar[0].get_color(), ms=8)
    ax.set_xlabel("offered load")
    ax.set_ylabel(ylabel)
    return _save(plt, fig, ax, path)
