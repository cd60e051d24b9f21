"""The results page's plots: one matplotlib PNG per benchmark, drawn from its captured figures only.

matplotlib is the `plot` extra; it is imported here alone, so rendering and
checking the page's text needs none. A NaN or missing figure is left out of a
plot (the page's table shows it as "n/a").
"""

from __future__ import annotations

import math
from pathlib import Path


def _num(x) -> float:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else math.nan


def _sim(ax, f: dict) -> None:
    c = f["comparison"][0]
    names = sorted(c["policies"], key=lambda n: n != "elastico")  # elastico first, then as given
    means = [_num(c["policies"][n].get("mean_jct_h")) for n in names]
    errs = [0.0 if math.isnan(e) else e for e in (_num(c["policies"][n].get("ci95")) for n in names)]
    colors = ["tab:green" if n == "elastico" else "tab:gray" for n in names]
    # A JCT is positive: the interval's lower arm stops at 0.
    ax.bar(names, means, yerr=[[min(e, m) if m == m else 0.0 for e, m in zip(errs, means)], errs], color=colors,
           capsize=3)
    ax.set_ylabel("mean JCT, hours (± 95 %)")
    ax.set_title(f"Mixed trace: {c.get('label', '')}".split(" (")[0], fontsize=9)
    ax.tick_params(axis="x", rotation=45)


def _planner(ax, f: dict) -> None:
    for key, label in (("latency", "elastico"), ("latency_gangs", "30 % data-parallel families")):
        rows = f.get(key, [])
        ax.plot([r["jobs"] for r in rows], [1000 * _num(r.get("cpu_median_s")) for r in rows], "o-", label=label)
    rows = f.get("latency", [])
    ax.plot([r["jobs"] for r in rows], [1000 * _num(r.get("target_s")) for r in rows], "k--", label="target")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("jobs")
    ax.set_ylabel("epoch CPU ms (median)")
    ax.legend(fontsize=8)


def _interference(ax, f: dict) -> None:
    kinds = list(f.get("heldout", {}))
    methods = [m for m in f["heldout"][kinds[0]]["metrics"] if not m.startswith("target ")] if kinds else []
    width = 0.8 / max(len(kinds), 1)
    for i, kind in enumerate(kinds):
        vals = [100 * _num(f["heldout"][kind]["metrics"].get(m, {}).get("mape_norm")) for m in methods]
        ax.bar([j + i * width for j in range(len(methods))], vals, width, label=kind)
    ax.set_xticks([j + width * (len(kinds) - 1) / 2 for j in range(len(methods))], methods, rotation=45, ha="right")
    ax.set_ylabel("held-out MAPE of normalized throughput, %")
    ax.legend(fontsize=8)


def _online(ax, f: dict) -> None:
    for i, (fam, r) in enumerate(f.get("families", {}).items()):
        color = f"C{i % 10}"
        ax.plot(r["observed"], [100 * _num(x) for x in r["mape_online"]], "o-", color=color, label=f"{fam} online")
        ax.plot(r["observed"], [100 * _num(x) for x in r["mape_frozen"]], ":", color=color, label=f"{fam} frozen")
    ax.set_xlabel("pairs observed")
    ax.set_ylabel("MAPE on pairs not yet observed, %")
    ax.legend(fontsize=7)


def _checkpoint(ax, f: dict) -> None:
    rows = f.get("rows", [])
    for key, label in (("save_mib_s", "save"), ("load_mib_s", "verified load")):
        ax.plot([r["mib"] for r in rows], [_num(r.get(key)) for r in rows], "o-", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("state MiB")
    ax.set_ylabel("MiB/s (median)")
    ax.legend(fontsize=8)


DRAW = {"sim": _sim, "planner": _planner, "interference": _interference, "online": _online,
        "checkpoint": _checkpoint}


def draw(name: str, figures: dict, path: Path) -> None:
    """Draw benchmark `name`'s plot from its figures into the PNG `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    try:
        DRAW[name](ax, figures)
        fig.tight_layout()
        # No timestamp in the file, so an unchanged plot is an unchanged file.
        fig.savefig(path, metadata={"Software": None})
    finally:
        plt.close(fig)
