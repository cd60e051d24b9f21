"""`elastico whatif`: the cluster's own history replayed under plain Slurm and under elastico, side by side.

Exit codes: 0 the comparison was printed; 1 no GPU job in the window, or none
finished there; 2 a bad option, settings or families file; 3 sacct or the
cluster listing failed (no accounting storage, slurmdbd or slurmctld down), or
sacct printed only records that could not be read (each named).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from slurm_elastico.cli import settings


@click.command("whatif")
@click.option("--since", default="now-7days", show_default=True, help="sacct --starttime (its date syntax)")
@click.option("--until", default="now", show_default=True, help="sacct --endtime")
@click.option("--partition", default="", help="only this partition's jobs, on its nodes (default: the whole "
              "cluster, each job on its own partitions' nodes)")
@click.option("--assume", type=click.Choice(["none", "gpu-count", "families"]), default="gpu-count",
              show_default=True, help="what a plain job is: rigid (none), data-parallel at its global batch "
              "(gpu-count), or as FILE says (families FILE: job-name patterns to {kind, app, global_batch})")
@click.argument("families_file", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--epoch-s", type=click.FloatRange(1, 3600), default=60.0, show_default=True,
              help="seconds between the simulated helper's epochs (its --interval)")
@click.option("--max-gpus", type=click.IntRange(0, 4096), default=8, show_default=True,
              help="the most GPUs a data-parallel job may be given (0: none)")
@click.option("--json", "as_json", is_flag=True, help="end with one JSON object")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="also draw the JCT distributions (measured, static and elastico simulated) into this PNG")
@click.pass_context
def whatif(ctx, since, until, partition, assume, families_file, epoch_s, max_gpus, as_json, plot) -> None:
    """Every GPU job sacct knows between --since and --until, replayed on the cluster's own nodes: first under the
    simulator's plain Slurm (`static`), whose starts are checked against the ones Slurm really made (start-time
    error, mean-wait ratio), then under elastico; prints mean / median / p99 JCT and wait and GPU-hours idle side by
    side, each with its range over what had to be assumed, and the predicted gain (plain / elastico mean JCT)."""
    from slurm_elastico import jsonout
    from slurm_elastico.cli.trace import _families, nothing_kept, read_accounting
    from slurm_elastico.slurm.gateway import gateway_from
    from slurm_elastico.errors import ConfigError
    from slurm_elastico.history import replay as replay_mod
    from slurm_elastico.history import whatif as wi
    from slurm_elastico.history import whatif_table
    from slurm_elastico.history.past import SKIPS, past_jobs
    from slurm_elastico.history.shape import from_snapshot
    from slurm_elastico.inputs import load_yaml
    from slurm_elastico.interference import load_model

    if (assume == "families") != bool(families_file):
        raise ConfigError("--assume", ["families needs its FILE (elastico whatif --assume families FILE)" if
                                       assume == "families" else f"a FILE ({families_file}) is read only with "
                                       "--assume families"])
    families = wi.read_families(load_yaml(Path(families_file).read_text(encoding="utf-8"), families_file),
                                families_file) if families_file else None
    cfg = settings(ctx)
    gateway = gateway_from(cfg)
    records, bad = read_accounting(gateway, since, until, None)
    store = Path(cfg.store_path)
    jobs, summary = past_jobs(records, partition, _families(store) if store.is_file() else {}, bad)
    if not summary.kept:
        nothing_kept(summary, since, until, partition)
    if not any(j.run_s is not None for j in jobs):
        click.echo(f"error: none of the {summary.kept} GPU job(s) between {since} and {until} has finished: nothing "
                   "to replay; widen --until", err=True)
        sys.exit(1)
    snap = gateway.snapshot()
    shape = from_snapshot(snap, partition, cfg.gpu.shares_per_gpu)
    rep = replay_mod.replay(jobs, shape, until=int(snap.taken_at)).stats()
    model = load_model(cfg.interference.model)
    result = wi.what_if(jobs, shape, cfg, assume, families, epoch_s, max_gpus, model)
    s = result.summary()
    # The gain under each assumption, the asked one's from its run: the spread says how much the answer rests on it.
    by_assumption = {name: s["ratio"] if name == assume else
                     wi.what_if(jobs, shape, cfg, name, families, epoch_s, max_gpus, model).summary()["ratio"]
                     for name in ("none", "gpu-count", *(("families",) if families else ()))}
    measured = wi.measured(jobs, shape)
    skipped = {**{r: summary.skipped.get(r, 0) for r in SKIPS}, **{r: result.skipped.get(r, 0)
                                                                  for r in (wi.SKIP_UNFINISHED, wi.SKIP_TOO_BIG)}}
    ratio = s["ratio"]
    if plot:
        whatif_table.plot(plot, jobs, result)
    label = {"none": "plain jobs rigid", "gpu-count": "plain jobs data-parallel at their global batch",
             "families": f"plain jobs as {families_file} says"}[assume]
    head = (f"{summary.seen} job(s) in accounting between {since} and {until}"
            + (f", partition {partition}" if partition else "") + f"; {summary.kept} GPU job(s) kept; cluster "
            f"{shape.describe()} (Slurm {shape.slurm_version})")
    for line in whatif_table.lines(head, label, rep, result, measured, by_assumption, skipped):
        click.echo(line)  # the table, then (--json) the JSON object last
    if as_json:
        click.echo(jsonout.dumps({
            "since": since, "until": until, "partition": partition, "cluster": shape.describe(),
            "slurm_version": shape.slurm_version, "assume": assume, "replay": rep, "measured": measured,
            "static": s["static"], "elastico": s["elastico"], "predicted_ratio": ratio["value"],
            "predicted_ratio_range": [ratio["lo"], ratio["hi"]],
            "runs": {label: {"ratio": v["ratio"]} for label, v in result.runs.items()},
            "by_assumption": by_assumption, "gpu_speedups": result.gpu_speedups, "notes": dict(result.notes),
            "unfinished": result.unfinished, "skipped": skipped, "import": summary.to_dict()}))

