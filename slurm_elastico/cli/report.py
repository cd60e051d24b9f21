"""`elastico report`: sacct plus the journal, per user and per kind."""

from __future__ import annotations

import click

from slurm_elastico.cli import settings


@click.command("report")
@click.option("--start", default="now-7days", show_default=True, help="sacct --starttime")
@click.option("--end", default="now", show_default=True, help="sacct --endtime")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.option("--jobs/--no-jobs", default=True, help="list each job under the groups (table)")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="also write the JCT CDF to this PNG")
@click.pass_context
def report(ctx, start, end, fmt, jobs, plot) -> None:
    """JCT, waiting time, GPU-hours, MPS share-hours and reshapes, per kind and per user."""
    from slurm_elastico.cli.view import gateway_from
    from slurm_elastico.report import collect, group_rows, plots, render
    from slurm_elastico.store import Store

    cfg = settings(ctx)
    with Store(cfg.store_path) as store:
        rows = collect(gateway_from(cfg), store, start, end, cfg.gpu.shares_per_gpu)
    groups = group_rows(rows)
    if fmt == "json":
        click.echo(render.to_json(groups, rows))
    elif fmt == "csv":
        click.echo(render.to_csv(rows), nl=False)
    else:
        click.echo(render.table(groups, rows if jobs else None))
    if plot:
        click.echo(f"wrote {plots.jct_cdf(rows, plot)}", err=True)
