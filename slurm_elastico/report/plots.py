"""PNG plots of a report (matplotlib, headless): JCT CDF per kind and waiting time per kind."""

from __future__ import annotations

from pathlib import Path

from slurm_elastico.report.metrics import JobRow


def jct_cdf(jobs: list[JobRow], path: str | Path) -> Path:
    """The cumulative distribution of JCT, one line per job kind; returns the file written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for kind in sorted({j.kind for j in jobs}):
        xs = sorted(j.jct_s for j in jobs if j.kind == kind and j.jct_s is not None)
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"{kind} ({len(xs)})")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
