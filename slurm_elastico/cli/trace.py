"""`elastico trace from-sacct`: the cluster's own GPU jobs, from its accounting, as a history trace file.

Exit codes: 0 the trace was written; 1 no GPU job in the window (nothing
written; the summary says what was seen); 2 a bad option or settings (an
--out that cannot be written included); 3 sacct failed (it says why: no
accounting storage, slurmdbd down, a date it cannot read), or printed only
records that could not be read (each listed).
"""

from __future__ import annotations

import sys

import click

from slurm_elastico.cli import settings


@click.group("trace")
def trace() -> None:
    """Traces from the cluster's own history."""


@trace.command("from-sacct")
@click.option("--since", default="now-7days", show_default=True, help="sacct --starttime (its date syntax)")
@click.option("--until", default="now", show_default=True, help="sacct --endtime")
@click.option("--partition", default="", help="only jobs submitted to this partition")
@click.option("--out", required=True, type=click.Path(dir_okay=False, writable=True),
              help="the trace file to write (CSV; replaced whole, never left half-written)")
@click.option("--json", "as_json", is_flag=True, help="print the summary as one JSON object")
@click.option("--progress/--no-progress", default=None,
              help="a progress line on stderr while accounting is read (default: when stderr is a terminal)")
@click.pass_context
def from_sacct(ctx, since, until, partition, out, as_json, progress) -> None:
    """Every GPU job sacct knows between --since and --until, one row a job (runs of a requeued job merged),
    and a summary of what was kept and what was skipped, by reason. A job that came through elastico-submit is
    marked with its family, from the helper's store when there is one. Accounting is read a time window at a
    time (about 2,000 job runs each), so a long period's answer never has to fit in one sacct call."""
    from pathlib import Path

    from slurm_elastico import jsonout
    from slurm_elastico.slurm.gateway import gateway_from
    from slurm_elastico.history import trace_file
    from slurm_elastico.history.past import SKIPS, past_jobs

    cfg = settings(ctx)
    records, bad = read_accounting(gateway_from(cfg), since, until, progress)
    store = Path(cfg.store_path)
    jobs, summary = past_jobs(records, partition, _families(store) if store.is_file() else {}, bad)
    if summary.kept:
        try:
            trace_file.write(jobs, out)
        except OSError as exc:
            raise click.UsageError(f"--out {out}: {exc.strerror or exc}; allowed: a file in an existing directory "
                                   "this user may write") from None
    if as_json:
        click.echo(jsonout.dumps({"out": out if summary.kept else None, "since": since, "until": until,
                                  "partition": partition, **summary.to_dict()}))
    else:
        click.echo(f"{summary.seen} job(s) in accounting between {since} and {until}"
                   + (f", partition {partition}" if partition else "") + ":")
        click.echo(f"  kept {summary.kept}: {summary.finished} finished ({summary.failed} not COMPLETED), "
                   f"{summary.running} running, {summary.pending} pending; {summary.requeued} requeued, "
                   f"{summary.array_tasks} array task(s), {summary.with_family} through elastico-submit")
        for reason in SKIPS:
            click.echo(f"  skipped, {reason}: {summary.skipped.get(reason, 0)}")
        for line in summary.bad:
            click.echo(f"  unreadable: {line}")
        click.echo(f"wrote {out}" if summary.kept else "nothing written")
    if not summary.kept:
        nothing_kept(summary, since, until, partition)


def read_accounting(gateway, since: str, until: str, progress: bool | None):
    """The gateway's sacct records between `since` and `until`, a window at a time (`history.windows`), with a
    progress line on stderr when `progress` (None: when stderr is a terminal); never on stdout."""
    from slurm_elastico.history import windows

    tty = sys.stderr.isatty()
    show = tty if progress is None else progress

    def say(fraction: float, runs: int) -> None:
        bar = "#" * int(fraction * 30)
        line = f"reading accounting [{bar:<30}] {fraction:4.0%} {runs} job run(s)"
        click.echo(f"\r{line}" if tty else line, err=True, nl=not tty or fraction >= 1)

    return windows.read(lambda a, b, states: gateway.sacct_each(start=a, end=b, states=states), since, until,
                        progress=say if show else None)


def nothing_kept(summary, since: str, until: str, partition: str) -> None:
    """Say why no GPU job was kept and exit: 3 when every record was unreadable (each named), else 1."""
    if summary.bad:
        click.echo(f"error: no GPU job read between {since} and {until}: {len(summary.bad)} record(s) unreadable "
                   f"({'; '.join(summary.bad[:3])}{' ...' if len(summary.bad) > 3 else ''}; a sacct whose JSON "
                   "this version does not know?)", err=True)
        sys.exit(3)
    click.echo(f"error: no GPU job in accounting between {since} and {until}"
               + (f" in partition {partition}" if partition else "") + "; widen --since/--until", err=True)
    sys.exit(1)


def _families(path):
    """job id -> `past.Family` from the helper's store at `path`."""
    from slurm_elastico.history.past import stored_families
    from slurm_elastico.store import Store

    with Store(path) as store:
        return stored_families(store)
