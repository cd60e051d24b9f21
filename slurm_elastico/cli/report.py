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
@click.option("--shadow", is_flag=True, help="what the helper in shadow mode would have done in the period: actions, "
              "predicted JCT gain, jobs it would have touched (from its shadow journal; table or json)")
@click.pass_context
def report(ctx, start, end, fmt, jobs, plot, shadow) -> None:
    """JCT, waiting time, GPU-hours, MPS share-hours and reshapes, per kind and per user.

    With --shadow: the shadow helper's journal over the period instead (docs/admin/shadow.md)."""
    if shadow:
        _shadow(ctx, start, end, fmt, plot)
        return
    from slurm_elastico.slurm.gateway import gateway_from
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


def _shadow(ctx, start: str, end: str, fmt: str, plot) -> None:
    import time

    from slurm_elastico import jsonout
    from slurm_elastico.helper.shadow import parse_when, render_report, shadow_report
    from slurm_elastico.store import Store

    if fmt == "csv" or plot:
        raise click.UsageError("--shadow prints a table or JSON (--format table|json), without --plot")
    now = time.time()
    try:
        since, until = parse_when(start, now, "--start"), parse_when(end, now, "--end")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if since > until:
        raise click.BadParameter(f"--start {start!r} is after --end {end!r}")
    cfg = settings(ctx)
    with Store(cfg.store_path) as store:
        summary = shadow_report(store, since, until)
    click.echo(jsonout.dumps(summary) if fmt == "json" else render_report(summary))
