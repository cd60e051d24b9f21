"""`elastico status` (the cluster as the planner sees it) and `elastico config` (the settings in force)."""

from __future__ import annotations

import dataclasses

import click

from slurm_elastico import jsonout
from slurm_elastico.cli import settings
from slurm_elastico.model import Snapshot
from slurm_elastico.runtime.progress import Progress, read_job_reports
from slurm_elastico.slurm.gateway import gateway_from


def progress_of(snap: Snapshot) -> dict[int, Progress]:
    """The progress reports of the running jobs that have one (an unreadable one counts as none)."""
    return read_job_reports(snap.jobs)[0]


def snapshot_dict(snap: Snapshot, progress: dict[int, Progress] | None = None) -> dict:
    """A JSON-ready view of a snapshot, with the derived per-GPU figures a script wants and each job's progress."""
    progress = progress or {}
    data = dataclasses.asdict(snap)
    for node_d, node in zip(data["nodes"], snap.nodes):
        for gpu_d, gpu in zip(node_d["gpus"], node.gpus):
            gpu_d["shares_used"] = gpu.shares_used
            gpu_d["held_whole"] = gpu.held_whole
    for job_d in data["jobs"]:
        job_d["state"] = job_d["state"].value if hasattr(job_d["state"], "value") else job_d["state"]
        report = progress.get(job_d["job_id"])
        job_d["progress"] = None if report is None else dataclasses.asdict(report)
    return data


def render(snap: Snapshot, progress: dict[int, Progress] | None = None) -> str:
    """The text table: one line per GPU, then one line per active job (DONE: its progress report, if any)."""
    progress = progress or {}
    lines = [f"Slurm {snap.slurm_version}: {len(snap.nodes)} nodes, {len(snap.gpus)} GPUs, "
             f"{len(snap.running)} running, {len(snap.pending)} pending"]
    lines.append(f"{'NODE':<10}{'STATE':<12}{'GPU':>4}  {'SHARES':>9}  JOBS")
    for node in snap.nodes:
        for gpu in node.gpus:
            users = ", ".join(f"{u.job_id}({'whole' if u.whole else u.shares})" for u in gpu.users) or "-"
            lines.append(f"{node.name:<10}{node.state:<12}{gpu.index:>4}  {gpu.shares_used:>4}/{gpu.shares_total:<4}  {users}")
    if snap.jobs:
        lines.append("")
        lines.append(f"{'JOBID':>7}  {'STATE':<10}{'GRES':<10}{'WHERE':<14}{'DONE':>6}  {'USER':<10}NAME")
        for j in snap.jobs:
            where = f"{j.node}:{','.join(map(str, j.gpu_indices))}" if j.node else (j.reason or "-")
            state = j.state.value + ("*" if j.held else "")
            name = j.name.replace("\n", "\\n")
            report = progress.get(j.job_id)
            done = f"{report.done / report.total:.0%}" if report is not None and report.total > 0 else "-"
            lines.append(f"{j.job_id:>7}  {state:<10}{str(j.gres or '-'):<10}{where:<14}{done:>6}  {j.user:<10}{name}")
    return "\n".join(lines)


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="print the snapshot as JSON")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show nodes, GPUs with their MPS shares, and active jobs, from one squeue call and one node listing.

    DONE is the share of its work a running job has reported done: jobs under elastico-run that report their
    progress (docs/users/runtime.md in the project's documentation).
    """
    snap = gateway_from(settings(ctx)).snapshot()
    progress = progress_of(snap)
    click.echo(jsonout.dumps(snapshot_dict(snap, progress), indent=2) if as_json else render(snap, progress))


@click.command("config")
@click.option("--keys", is_flag=True, help="list every valid key instead of the values")
@click.pass_context
def config_cmd(ctx: click.Context, keys: bool) -> None:
    """Print the settings in force (defaults filled in) as YAML, or the valid keys.

    Checks them as the helper would at its start: planner.policy must name a registered policy.
    """
    import yaml

    from slurm_elastico import config
    from slurm_elastico.planner import policies

    if keys:
        click.echo("\n".join(config.valid_keys()))
        return
    cfg = settings(ctx)
    policies.get(cfg.planner.policy)  # the registry is the planner's; the settings file cannot list it
    click.echo(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False).rstrip())
