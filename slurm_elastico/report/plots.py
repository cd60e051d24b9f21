"""PNG plots of a report (matplotlib, headless): the JCT distribution per job kind, and of several runs side by side.

Legends sit outside the axes (right of them), so they never cover a curve.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_elastico.report.metrics import JobRow


def cdf_figure(series: Mapping[str, Sequence[float]], title: str = ""):
    """A matplotlib figure: one step line per series (its CDF), labelled with its job count; legend outside the
    axes, right of them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    styles = ("-", "--", "-.", ":")
    for i, (label, values) in enumerate(series.items()):
        xs = sorted(values)
        if xs:
            ax.step(xs, [(k + 1) / len(xs) for k in range(len(xs))], where="post", linestyle=styles[i % len(styles)],
                    linewidth=1.8, label=f"{label} ({len(xs)} jobs)")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    fig.tight_layout()
    return fig


def _cdf_plot(series: Mapping[str, Sequence[float]], path: str | Path, title: str = "") -> Path:
    import matplotlib.pyplot as plt

    fig = cdf_figure(series, title)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out


def jct_cdf(jobs: list[JobRow], path: str | Path) -> Path:
    """The cumulative distribution of JCT, one line per job kind; returns the file written."""
    series = {kind: [j.jct_s for j in jobs if j.kind == kind and j.jct_s is not None]
              for kind in sorted({j.kind for j in jobs})}
    return _cdf_plot(series, path)


def jct_cdf_compare(series: Mapping[str, Sequence[float]], path: str | Path, title: str = "") -> Path:
    """The JCT distributions of several runs of one job list (e.g. measured and simulated), one line each."""
    return _cdf_plot(series, path, title)
