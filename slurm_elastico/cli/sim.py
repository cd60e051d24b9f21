"""`elastico sim run|compare`: replay a trace on a simulated cluster with the real planner and its policies.

Parses and prints; the experiment itself is `slurm_elastico.sim.experiment` and `slurm_elastico.sim.compare`.
Every table shows each policy's unfinished jobs beside its means; `sim run`
warns when its run left jobs unfinished, and `sim compare` then prints its
table and fails (exit 5, naming each policy and seed): a comparison with
unfinished jobs is not a result.
"""

from __future__ import annotations

import sys

import click

from slurm_elastico import jsonout
from slurm_elastico.cli import Finite, settings
from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.experiment import ProgressBar, check_sweep, load_sweep, parse_loads, setup, write_sweep
from slurm_elastico.sim.trace import DEFAULT_JITTER_S

TRACE_HELP = ("synthetic (a training/inference mix), pollux:N (bundled workload N=1..8), pollux1:N (the same on one "
              "GPU each), philly[:PATH], alibaba:PATH (openb_pod_list_default.csv), or a CSV in the trace format")


def _options(f):
    opts = [
        click.option("--trace", "trace_name", default="synthetic", show_default=True, help=TRACE_HELP),
        click.option("--jobs", type=click.IntRange(1, 100000), default=400, show_default=True, help="synthetic: jobs"),
        click.option("--load", type=Finite(0.01, 1000), default=2.0, show_default=True,
                     help="synthetic: offered load (GPU-seconds asked / GPU-seconds there while jobs arrive)"),
        click.option("--infer-fraction", type=Finite(0, 1), default=0.3, show_default=True,
                     help="synthetic: share of inference jobs"),
        click.option("--hours", type=Finite(0.01, 24 * 366 * 10), default=24.0, show_default=True,
                     help="philly: hours of submissions to replay"),
        click.option("--gpus", type=click.IntRange(1, 65536), default=None, help="GPUs (default: sim.gpus)"),
        click.option("--epoch-s", type=Finite(1, 86400), default=None, help="seconds between epochs"),
        click.option("--window-s", type=Finite(min=-1), default=None,
                     help="placement window before Slurm starts a job as submitted; -1 = until planned"),
        click.option("--colocation", type=click.Choice(["gavel", "gavel-residual", "none"]), default=None,
                     help="ground truth of co-location slowdown"),
        click.option("--jitter-s", type=Finite(0, 86400), default=DEFAULT_JITTER_S, show_default=True,
                     help="pollux or CSV traces: each seed moves every arrival by its own seeded uniform offset "
                          "within ± this many seconds (0 = the trace's exact times)"),
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


def _loads(ctx, param, text: str | None) -> list[float] | None:
    """--loads as numbers (`experiment.parse_loads`); one that is not a load is a usage error."""
    try:
        return parse_loads(text) if text else None
    except ConfigError as exc:
        raise click.BadParameter("; ".join(exc.problems), param_hint="--loads") from None


@click.group("sim")
def sim() -> None:
    """Trace-driven simulation: the real planner and policies on a simulated Slurm cluster."""


@sim.command("run")
@_options
@click.option("--policy", default=None, help="policy from the registry (default: planner.policy)")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.pass_context
def run_cmd(ctx, policy, seed, out, as_json, progress, **recipe) -> None:
    """Replay one trace under one policy and print its figures (and how many jobs it left unfinished)."""
    from slurm_elastico.planner import policies
    from slurm_elastico.sim import compare as cmp

    cfg = settings(ctx)
    name = policy or cfg.planner.policy
    policies.get(name)  # an unknown name fails before the trace is loaded
    s = setup(cfg, **recipe)
    bar = ProgressBar(sys.stderr.isatty() if progress is None else progress)
    result = cmp.compare(s.make, [name], [seed], s.cfg, s.sim, s.model, s.truth, bar, s.seed_varies)
    bar.done()
    _emit(result, out, as_json)
    for p, sd, c, n in result.incomplete():
        click.echo(f"warning: policy {p} seed {sd} left {c} of {n} jobs unfinished; the means are over finished "
                   "jobs only", err=True)


@sim.command("compare")
@_options
@click.option("--policies", "names", default=None,
              help="comma-separated policies (default: every policy in the registry)")
@click.option("--seeds", type=click.IntRange(1, 1000), default=5, show_default=True, help="seeds 0..N-1")
@click.option("--loads", default=None, callback=_loads,
              help="synthetic: comma-separated loads for a sweep (writes load_sweep.png)")
@click.pass_context
def compare_cmd(ctx, names, seeds, loads, out, as_json, progress, **recipe) -> None:
    """Every policy over several seeds: mean and 95 % interval of each figure, ratio to the lower bound.

    Fails (exit 5) after printing if any run left jobs unfinished.
    """
    from slurm_elastico.planner import policies
    from slurm_elastico.sim import compare as cmp

    names_l = [n.strip() for n in names.split(",")] if names else list(policies.REGISTRY)
    for n in names_l:
        policies.get(n)  # an unknown name fails before the trace is loaded
    bar = ProgressBar(sys.stderr.isatty() if progress is None else progress)
    if loads:
        def each(ld, res):
            if not as_json:
                bar.done()
                click.echo(f"load {ld:g}:\n" + res.table(cmp.SHOWN_FIGURES))

        sweep, report, results = load_sweep(lambda ld: setup(settings(ctx), **{**recipe, "load": ld}),
                                            loads, names_l, seeds, bar, each)
        bar.done()
        if out:
            write_sweep(sweep, report, out)
        if as_json:
            click.echo(jsonout.dumps(report, sort_keys=True))
        check_sweep(loads, results)
        return
    s = setup(settings(ctx), **recipe)
    result = cmp.compare(s.make, names_l, range(seeds), s.cfg, s.sim, s.model, s.truth, bar, s.seed_varies)
    bar.done()
    _emit(result, out, as_json)
    result.check_complete()


def _emit(result, out, as_json) -> None:
    from slurm_elastico.sim import compare as cmp

    if out:
        for p in cmp.write(result, out):
            click.echo(f"wrote {p}", err=True)
    if as_json:
        click.echo(jsonout.dumps(result.to_json(), sort_keys=True))
    else:
        click.echo(result.table(cmp.SHOWN_FIGURES))
