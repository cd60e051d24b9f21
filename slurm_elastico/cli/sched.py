"""`elastico sched`: the backfill helper, once (cron, systemd timer, PrologSlurmctld) or in a loop."""

from __future__ import annotations

import contextlib
import json
import os
import time

import click

from slurm_elastico.cli import settings


@click.command("sched")
@click.option("--once", is_flag=True, help="run one epoch and exit (the default without --interval)")
@click.option("--interval", type=click.FloatRange(min=1.0), default=None, help="run an epoch every S seconds")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="with --interval: stop after N epochs")
@click.option("--dry-run", is_flag=True, help="print the plan and the exact scontrol commands; change nothing")
@click.option("--families", "families_dir", type=click.Path(file_okay=False), default=None,
              help="read families from DIR/<job id>.yaml (the administrator's) instead of the jobs' batch scripts")
@click.option("--json", "as_json", is_flag=True, help="print each epoch as one JSON line")
@click.pass_context
def sched(ctx, once, interval, epochs, dry_run, families_dir, as_json) -> None:
    """Plan one epoch over the live cluster and act on it (journaled, so a crash leaves no job held).

    Without --interval it runs one epoch (for cron, a systemd timer or PrologSlurmctld). A helper holds its
    cluster's lock (by slurm.conf's ClusterName, in /run/slurm-elastico) and its state directory's for its
    whole life: a second --interval helper is refused, naming the first one's pid; a --once that finds
    them taken skips its epoch. While Slurm does not answer, nothing is planned: --once exits 75,
    --interval waits longer each time and says so.
    """
    from slurm_elastico.helper.lock import HelperBusy, helper_lock
    from slurm_elastico.helper.private import require_private
    from slurm_elastico.planner import policies
    from slurm_elastico.slurm.conf import read_cluster_name

    if once and interval is not None:
        raise click.UsageError("--once and --interval exclude each other")
    cfg = settings(ctx)
    policies.get(cfg.planner.policy)  # an unknown policy stops here, not at every epoch
    with contextlib.ExitStack() as lifetime:  # what the helper holds for its whole life
        if not dry_run:  # a dry run changes nothing: it may look while the helper runs
            lifetime.callback(os.umask, os.umask(0o077))  # its state is private (helper.private)
            require_private(cfg.state_dir)
            try:
                lifetime.enter_context(helper_lock(read_cluster_name(cfg.slurm.conf), cfg.state_dir))
            except HelperBusy as exc:
                if interval is not None:
                    raise
                click.echo(f"note: {exc}; this epoch is skipped", err=True)
                return
        _serve(cfg, interval, epochs, dry_run, families_dir, as_json)


def _serve(cfg, interval, epochs, dry_run, families_dir, as_json) -> None:
    """The helper's life once it holds its locks: one epoch, or epochs every `interval` seconds."""
    from slurm_elastico.cli.view import gateway_from
    from slurm_elastico.errors import ConfigError, SlurmUnavailable
    from slurm_elastico.helper.epoch import main_loop, outage_line, render, run_once
    from slurm_elastico.helper.families import DirectoryFamilies, ScriptFamilies
    from slurm_elastico.helper.journal import Journal
    from slurm_elastico.helper.observer import ProgressObserver
    from slurm_elastico.interference import load_model
    from slurm_elastico.interference.errors import MeasurementError
    from slurm_elastico.interference.measurements import read_csv
    from slurm_elastico.store import Store

    gateway = gateway_from(cfg)
    store = Store(cfg.store_path)
    families = (DirectoryFamilies(families_dir, cfg.gpu.memory_mib) if families_dir
                else ScriptFamilies(store, gateway, cfg.gpu.memory_mib))
    model = load_model(cfg.interference.model)
    journal = None if dry_run else Journal(store)
    reference = []
    if cfg.interference.reference:
        if not cfg.interference.model:
            click.echo("note: interference.reference is set but interference.model is empty: observed slowdowns "
                       "are recorded, no model is refined", err=True)
        try:
            reference = read_csv(cfg.interference.reference)
        except MeasurementError as exc:
            raise ConfigError("interference.reference", [f"{exc} (the measurement CSV the model was trained on)"]) from None
    observer = ProgressObserver(store, cfg.gpu.type, model, cfg.interference.model, reference)

    def step():
        result = run_once(gateway, cfg, families, model, journal, time.time(), dry_run=dry_run, observer=observer)
        click.echo(json.dumps(result.to_dict()) if as_json else render(result))
        return result

    if interval is None:
        try:
            result = step()
        except SlurmUnavailable as exc:
            click.echo(f"elastico sched: {outage_line(exc)}; try again later", err=True)
            raise SystemExit(exc.exit_code) from None
        if result.outage:
            raise SystemExit(SlurmUnavailable.exit_code)
        return
    failures = main_loop(step, interval, epochs)
    if failures:
        raise SystemExit(1)
