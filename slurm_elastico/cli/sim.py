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
from slurm_elastico.cli import settings
from slurm_elastico.cli.sim_options import options as _options
from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.experiment import ProgressBar, check_sweep, load_sweep, parse_loads, setup, write_sweep

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
