"""`elastico whatif`'s table and plot (pure text; the plot through `report.plots`): the replay's check, then
measured, static and elastico side by side, each figure with its range over the runs the assumption needed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurm_elastico.history import whatif_types
from slurm_elastico.history.past import PastJob

ROWS = (("mean_jct_s", "mean JCT s"), ("median_jct_s", "median JCT s"), ("p99_jct_s", "p99 JCT s"),
        ("mean_wait_s", "mean wait s"), ("median_wait_s", "median wait s"), ("p99_wait_s", "p99 wait s"),
        ("idle_gpu_h", "GPU-hours idle"))


def lines(head: str, assumption: str, rep: Mapping, result, measured: Mapping, by_assumption: Mapping,
          skipped: Mapping[str, int]) -> list[str]:
    """The table: `head` (what was read), the replay's start-time error, the side-by-side figures, the gain
    under each assumption, what was skipped and any job a simulation left unfinished."""
    s = result.summary()
    ratio = s["ratio"]
    out = [head,
           f"replay (static, the simulator's Slurm) against what Slurm did, {rep['compared']} job(s): start-time "
           f"error median {_s(rep['median_start_error_s'])}, p90 {_s(rep['p90_start_error_s'])}; mean wait "
           f"simulated {_s(rep['mean_wait_simulated_s'])} / measured {_s(rep['mean_wait_actual_s'])}"
           f" = {_n(rep['mean_wait_ratio'], 2)} (Slurm's start lag, from the jobs that found room: "
           f"{_s(rep.get('start_lag_s', 0.0))})",
           f"what-if, {assumption}; {len(result.runs)} run(s) of each policy"
           + (f" (one per measured app: {', '.join(result.runs)}): value [range]" if len(result.runs) > 1 else ""),
           f"  {'':16} {'measured':>12} {'static (sim)':>22} {'elastico (sim)':>22}"]
    if result.gpu_speedups:
        out.insert(3, "GPU types, each at the bundled profiles' speed (a T4's) times the public-specification prior "
                   "the helper plans with: " + whatif_types.describe(result.gpu_speedups)
                   + "".join(f"; {n} job(s) {why}" for why, n in result.notes.items() if n))
    for key, name in ROWS:
        out.append(f"  {name:16} {_n(measured[key]):>12} {_iv(s['static'][key]):>22} {_iv(s['elastico'][key]):>22}")
    out.append(f"  predicted gain (static / elastico mean JCT): {_iv(ratio, 2)}"
               + (f"; elastico's mean JCT on this history: {_n(measured['mean_jct_s'] / ratio['value'])} s"
                  if ratio["value"] and measured["mean_jct_s"] else ""))
    out.append("  gain under each assumption: " + ", ".join(f"{k} {_iv(r, 2)}" for k, r in by_assumption.items()))
    out.append("  skipped: " + (", ".join(f"{r} {n}" for r, n in skipped.items() if n) or "none"))
    unfinished = {p: n for p, n in result.unfinished.items() if n}
    if unfinished:
        out.append("  warning: the simulator left job(s) unfinished: "
                   + ", ".join(f"{p} {n}" for p, n in unfinished.items()))
    return out


def plot(path: str, jobs: Sequence[PastJob], result) -> None:
    """The JCT distributions: measured, static (once: it holds each GPU as long as it was held, whatever app a job
    is taken for) and elastico per run."""
    from slurm_elastico.report import plots

    series = {"measured": [j.end - j.submit for j in jobs if j.end is not None and j.start is not None],
              "static (sim)": next(iter(result.runs.values()))["jct"]["static"]}
    for label, v in result.runs.items():
        series[f"elastico (sim{', ' + label if len(result.runs) > 1 else ''})"] = v["jct"]["elastico"]
    plots.jct_cdf_compare(series, path, title="JCT on the cluster's own history: measured and simulated")


def _s(x) -> str:
    return "-" if x is None else f"{x:.1f} s"


def _n(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _iv(v: Mapping, digits: int = 1) -> str:
    """'value' or 'value [lo-hi]' when the range shows at that precision."""
    if v["value"] is None:
        return "-"
    if _n(v["lo"], digits) == _n(v["hi"], digits):
        return _n(v["value"], digits)
    return f"{_n(v['value'], digits)} [{_n(v['lo'], digits)}-{_n(v['hi'], digits)}]"
