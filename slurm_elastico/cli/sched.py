"""`elastico sched`: the backfill helper, once (cron, systemd timer, PrologSlurmctld) or in a loop."""

from __future__ import annotations

import contextlib
import time

import click

from slurm_elastico import jsonout
from slurm_elastico.cli import settings


@click.command("sched")
@click.option("--once", is_flag=True, help="run one epoch and exit (the default without --interval)")
@click.option("--interval", type=click.FloatRange(min=1.0), default=None, help="run an epoch every S seconds")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="with --interval: stop after N epochs")
@click.option("--dry-run", is_flag=True, help="print the plan and the exact scontrol commands; change nothing")
@click.option("--shadow/--act", "shadow", default=None,
              help="shadow: full epochs, journaled with their predicted gain (elastico report --shadow), nothing "
                   "changed in Slurm; act: change jobs. Overrides helper.mode (default: act)")
@click.option("--families", "families_dir", type=click.Path(file_okay=False), default=None,
              help="read families from DIR/<job id>.yaml (the administrator's) instead of the jobs' batch scripts")
@click.option("--json", "as_json", is_flag=True, help="print each epoch as one JSON line")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: every line printed (epochs, outage, back-off and error lines) is one JSON object")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="serve Prometheus metrics on http://ADDRESS:PORT/metrics while the helper runs")
@click.option("--metrics-address", default="127.0.0.1", show_default=True,
              help="the address --metrics-port listens on (0.0.0.0: every interface)")
@click.option("--metrics-file", type=click.Path(dir_okay=False), default=None,
              help="after every epoch, replace FILE with the metrics (node_exporter's textfile collector)")
@click.pass_context
def sched(ctx, once, interval, epochs, dry_run, shadow, families_dir, as_json, log_format, metrics_port,
          metrics_address, metrics_file) -> None:
    """Plan one epoch over the live cluster and act on it (journaled, so a crash leaves no job held).

    Without --interval it runs one epoch (for cron, a systemd timer or PrologSlurmctld). A helper holds its
    cluster's lock (by slurm.conf's ClusterName, in /run/slurm-elastico) and its state directory's for its
    whole life: a second --interval helper is refused, naming the first one's pid; a --once that finds
    them taken skips its epoch. While Slurm does not answer, nothing is planned: --once exits 75,
    --interval waits longer each time and says so. It acts only on jobs elastico-submit made (the family
    is read from the job's batch script) and keeps its state private (docs/admin/running.md).

    With --shadow (or helper.mode: shadow) it runs the same epochs and changes nothing in Slurm: its Slurm
    commands are limited to reads, each action it would take is journaled with its predicted JCT gain, and
    every epoch's JSON says slurm_changes: 0 (docs/admin/shadow.md).
    """
    from slurm_elastico.helper.lock import HelperBusy
    from slurm_elastico.helper.metrics import Metrics, serve
    from slurm_elastico.helper.service import held
    from slurm_elastico.planner import policies

    if once and interval is not None:
        raise click.UsageError("--once and --interval exclude each other")
    cfg = settings(ctx)
    if dry_run and shadow:
        raise click.UsageError("--dry-run and --shadow exclude each other (a dry run journals nothing)")
    shadow = False if dry_run else (cfg.helper.mode == "shadow" if shadow is None else shadow)
    out = Output(as_json, log_format)
    metrics = Metrics(mode="shadow" if shadow else "")
    policies.get(cfg.planner.policy)  # an unknown policy stops here, not at every epoch
    with contextlib.ExitStack() as lifetime:  # what the helper holds for its whole life
        if not dry_run:  # a dry run changes nothing: it may look while the helper runs
            try:
                lifetime.enter_context(held(cfg))
            except HelperBusy as exc:
                if interval is not None:
                    raise
                out.log("info", f"note: {exc}; this epoch is skipped")
                return
        if metrics_port is not None:
            try:
                server = serve(metrics, metrics_port, metrics_address)
            except OSError as exc:
                raise click.BadParameter(f"cannot listen on {metrics_address}:{metrics_port}: {exc.strerror}",
                                         param_hint="--metrics-port") from None
            lifetime.callback(server.server_close)
            lifetime.callback(server.shutdown)
        _serve(cfg, interval, epochs, dry_run, shadow, families_dir, out, metrics, metrics_file)


class Output:
    """What the helper prints: epochs on stdout, log lines on stderr; as text or one JSON object per line."""

    def __init__(self, as_json: bool, log_format: str):
        self.as_json, self.log_format = as_json, log_format

    def log(self, level: str, line: str) -> None:
        if self.log_format == "json":
            click.echo(jsonout.dumps({"ts": time.time(), "level": level, "event": "log", "message": line}), err=True)
        else:
            click.echo(line if line.startswith("note:") else f"elastico sched: {line}", err=True)

    def epoch(self, result) -> None:
        from slurm_elastico.helper.epoch import render

        if self.log_format == "json":
            # a shadow action is fine unless the acting helper would be refused (its error says so)
            level = "warning" if result.outage or any(o.status not in ("done", "shadow") or o.error
                                                      for o in result.outcomes) else "info"
            click.echo(jsonout.dumps({"ts": time.time(), "level": level, "event": "epoch", **result.to_dict()}))
        else:
            click.echo(jsonout.dumps(result.to_dict()) if self.as_json else render(result))


def _serve(cfg, interval, epochs, dry_run, shadow, families_dir, out: Output, metrics, metrics_file) -> None:
    """The helper's life once it holds its locks: one epoch, or epochs every `interval` seconds."""
    from slurm_elastico.errors import SlurmUnavailable
    from slurm_elastico.helper.epoch import main_loop, outage_line
    from slurm_elastico.helper.service import open_helper

    service = open_helper(cfg, shadow=shadow, dry_run=dry_run, families_dir=families_dir, metrics=metrics,
                          metrics_file=metrics_file, log=out.log)
    if shadow:
        out.log("info", "note: shadow mode: full epochs, journaled; nothing is changed in Slurm")

    def step():
        result = service.step()
        out.epoch(result)
        return result

    if interval is None:
        try:
            result = step()
        except SlurmUnavailable as exc:
            out.log("warning", f"{outage_line(exc)}; try again later")
            raise SystemExit(exc.exit_code) from None
        if result.outage:
            raise SystemExit(SlurmUnavailable.exit_code)
        return
    if main_loop(step, interval, epochs, log=out.log):  # the number of failed epochs
        raise SystemExit(1)

