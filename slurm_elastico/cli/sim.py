"""`elastico sim run|compare`: replay a trace on a simulated cluster with the real planner and its policies."""

from __future__ import annotations

import json
import sys
import time

import click

from slurm_elastico.cli import settings

TRACE_HELP = ("synthetic (a training/inference mix), pollux:N (bundled workload N=1..8), pollux1:N (the same on one "
              "GPU each), philly[:PATH], alibaba:PATH (openb_pod_list_default.csv), or a CSV in the trace format")


def _options(f):
    opts = [
        click.option("--trace", "trace_name", default="synthetic", show_default=True, help=TRACE_HELP),
        click.option("--jobs", type=click.IntRange(min=1), default=400, show_default=True, help="synthetic: jobs"),
        click.option("--load", type=click.FloatRange(min=0.01), default=2.0, show_default=True,
                     help="synthetic: offered load (GPU-seconds asked / GPU-seconds there while jobs arrive)"),
        click.option("--infer-fraction", type=click.FloatRange(0, 1), default=0.3, show_default=True,
                     help="synthetic: share of inference jobs"),
        click.option("--hours", type=click.FloatRange(min=0.01), default=24.0, show_default=True,
                     help="philly: hours of submissions to replay"),
        click.option("--gpus", type=click.IntRange(min=1), default=None, help="GPUs (default: sim.gpus)"),
        click.option("--epoch-s", type=click.FloatRange(min=1), default=None, help="seconds between epochs"),
        click.option("--window-s", type=float, default=None,
                     help="placement window before Slurm starts a job as submitted; -1 = until planned"),
        click.option("--colocation", type=click.Choice(["gavel", "gavel-residual", "none"]), default=None,
                     help="ground truth of co-location slowdown"),
        click.option("--sim-config", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="YAML with a `sim:` section (see slurm_elastico.sim.settings)"),
        click.option("--out", type=click.Path(file_okay=False), default=None,
                     help="write runs.csv, jobs.csv, summary.json and PNG plots here"),
        click.option("--json", "as_json", is_flag=True, help="print the summary as JSON"),
        click.option("--progress/--no-progress", default=None, help="progress bar on stderr (default: on a TTY)"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _setup(ctx, trace_name, jobs, load, infer_fraction, hours, gpus, epoch_s, window_s, colocation, sim_config):
    import yaml

    from slurm_elastico.interference import load_model
    from slurm_elastico.sim import settings as sim_settings
    from slurm_elastico.sim import trace as traces
    from slurm_elastico.sim.truth import GroundTruth

    cfg = settings(ctx)
    data = {}
    if sim_config:
        with open(sim_config) as fh:
            data = (yaml.safe_load(fh) or {}).get("sim", {})
    sim = sim_settings.from_mapping(data, sim_config or "sim")
    changes = {k: v for k, v in (("gpus", gpus), ("epoch_s", epoch_s), ("placement_window_s", window_s),
                                 ("colocation", colocation)) if v is not None}
    sim = sim_settings.replace(sim, **changes)
    truth = GroundTruth()

    def make(seed: int):
        return traces.load(trace_name, truth, seed, n_jobs=jobs, gpus=sim.gpus, load=load,
                           infer_fraction=infer_fraction, hours=hours, gpu_memory_mib=sim.gpu_memory_mib)

    return cfg, sim, truth, make, load_model(cfg.interference.model)


class _Bar:
    """A one-line progress bar on stderr: policy, seed, percent of jobs finished, elapsed time."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.t0 = time.monotonic()

    def __call__(self, policy: str, seed: int, frac: float) -> None:
        if not self.enabled:
            return
        n = int(30 * frac)
        sys.stderr.write(f"\r{policy:>16} seed {seed} [{'#' * n}{'.' * (30 - n)}] {100 * frac:5.1f}% "
                         f"{time.monotonic() - self.t0:6.0f}s")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


@click.group("sim")
def sim() -> None:
    """Trace-driven simulation: the real planner and policies on a simulated Slurm cluster."""


@sim.command("run")
@_options
@click.option("--policy", default=None, help="policy from the registry (default: planner.policy)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.pass_context
def run_cmd(ctx, policy, seed, trace_name, jobs, load, infer_fraction, hours, gpus, epoch_s, window_s, colocation,
            sim_config, out, as_json, progress) -> None:
    """Replay one trace under one policy and print its figures."""
    from slurm_elastico.sim import compare as cmp
    from slurm_elastico.sim import metrics

    cfg, sim_s, truth, make, model = _setup(ctx, trace_name, jobs, load, infer_fraction, hours, gpus, epoch_s,
                                            window_s, colocation, sim_config)
    name = policy or cfg.planner.policy
    bar = _Bar(sys.stderr.isatty() if progress is None else progress)
    result = cmp.compare(make, [name], [seed], cfg, sim_s, model, truth, bar)
    bar.done()
    _emit(result, out, as_json, metrics)


@sim.command("compare")
@_options
@click.option("--policies", "names", default=None,
              help="comma-separated policies (default: every policy in the registry)")
@click.option("--seeds", type=click.IntRange(min=1), default=5, show_default=True, help="seeds 0..N-1")
@click.option("--loads", default=None, help="synthetic: comma-separated loads for a sweep (writes load_sweep.png)")
@click.pass_context
def compare_cmd(ctx, names, seeds, loads, trace_name, jobs, load, infer_fraction, hours, gpus, epoch_s, window_s,
                colocation, sim_config, out, as_json, progress) -> None:
    """Every policy over several seeds: mean and 95 % interval of each figure, ratio to the lower bound."""
    from slurm_elastico.planner import policies
    from slurm_elastico.sim import compare as cmp
    from slurm_elastico.sim import metrics, plots

    names_l = [n.strip() for n in names.split(",")] if names else list(policies.REGISTRY)
    bar = _Bar(sys.stderr.isatty() if progress is None else progress)
    if loads:
        from pathlib import Path

        sweep: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names_l}
        report = {}
        for ld in [float(x) for x in loads.split(",")]:
            cfg, sim_s, truth, make, model = _setup(ctx, trace_name, jobs, ld, infer_fraction, hours, gpus, epoch_s,
                                                    window_s, colocation, sim_config)
            res = cmp.compare(make, names_l, range(seeds), cfg, sim_s, model, truth, bar)
            agg = res.aggregated()
            for n in names_l:
                sweep[n].append((ld, *agg[n]["mean_jct_h"]))
            report[str(ld)] = res.to_json()
            if not as_json:
                bar.done()
                click.echo(f"load {ld:g}:\n" + metrics.table(agg, SHOWN))
        bar.done()
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "sweep.json").write_text(json.dumps(report, indent=2, sort_keys=True))
            plots.load_sweep(sweep, Path(out) / "load_sweep.png")
        if as_json:
            click.echo(json.dumps(report, sort_keys=True))
        return
    cfg, sim_s, truth, make, model = _setup(ctx, trace_name, jobs, load, infer_fraction, hours, gpus, epoch_s,
                                            window_s, colocation, sim_config)
    result = cmp.compare(make, names_l, range(seeds), cfg, sim_s, model, truth, bar)
    bar.done()
    _emit(result, out, as_json, metrics)


SHOWN = ("mean_jct_h", "median_jct_h", "p99_jct_h", "makespan_h", "util_arrivals", "mean_queue_h",
         "reshapes_per_job", "ftf_mean", "ratio_to_lb")


def _emit(result, out, as_json, metrics) -> None:
    from slurm_elastico.sim import compare as cmp

    if out:
        for p in cmp.write(result, out):
            click.echo(f"wrote {p}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_json(), sort_keys=True))
    else:
        click.echo(metrics.table(result.aggregated(), SHOWN))
