"""`elastico status` (the cluster as the planner sees it) and `elastico config` (the settings in force)."""

from __future__ import annotations

import dataclasses
import json

import click

from slurm_elastico.cli import settings
from slurm_elastico.model import Snapshot


def gateway_from(cfg):
    """The live gateway for these settings (SLURM_CONF and timeouts from `slurm:`)."""
    from slurm_elastico.slurm.gateway import SlurmGateway
    from slurm_elastico.slurm.runner import SubprocessRunner

    env = {"SLURM_CONF": cfg.slurm.conf} if cfg.slurm.conf else {}
    return SlurmGateway(
        SubprocessRunner(env=env, timeout=cfg.slurm.timeout_s),
        shares_per_gpu=cfg.gpu.shares_per_gpu,
        gpu_memory_mib=cfg.gpu.memory_mib,
    )


def snapshot_dict(snap: Snapshot) -> dict:
    """A JSON-ready view of a snapshot, with the derived per-GPU figures a script wants."""
    data = dataclasses.asdict(snap)
    for node_d, node in zip(data["nodes"], snap.nodes):
        for gpu_d, gpu in zip(node_d["gpus"], node.gpus):
            gpu_d["shares_used"] = gpu.shares_used
            gpu_d["held_whole"] = gpu.held_whole
    for job_d in data["jobs"]:
        job_d["state"] = job_d["state"].value if hasattr(job_d["state"], "value") else job_d["state"]
    return data


def render(snap: Snapshot) -> str:
    """The text table: one line per GPU, then one line per active job."""
    lines = [f"Slurm {snap.slurm_version}: {len(snap.nodes)} nodes, {len(snap.gpus)} GPUs, "
             f"{len(snap.running)} running, {len(snap.pending)} pending"]
    lines.append(f"{'NODE':<10}{'STATE':<12}{'GPU':>4}  {'SHARES':>9}  JOBS")
    for node in snap.nodes:
        for gpu in node.gpus:
            users = ", ".join(f"{u.job_id}({'whole' if u.whole else u.shares})" for u in gpu.users) or "-"
            lines.append(f"{node.name:<10}{node.state:<12}{gpu.index:>4}  {gpu.shares_used:>4}/{gpu.shares_total:<4}  {users}")
    if snap.jobs:
        lines.append("")
        lines.append(f"{'JOBID':>7}  {'STATE':<10}{'GRES':<10}{'WHERE':<14}{'USER':<10}NAME")
        for j in snap.jobs:
            where = f"{j.node}:{','.join(map(str, j.gpu_indices))}" if j.node else (j.reason or "-")
            state = j.state.value + ("*" if j.held else "")
            name = j.name.replace("\n", "\\n")
            lines.append(f"{j.job_id:>7}  {state:<10}{str(j.gres or '-'):<10}{where:<14}{j.user:<10}{name}")
    return "\n".join(lines)


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="print the snapshot as JSON")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show nodes, GPUs with their MPS shares, and active jobs, from one squeue call and one node listing."""
    snap = gateway_from(settings(ctx)).snapshot()
    click.echo(json.dumps(snapshot_dict(snap), indent=2) if as_json else render(snap))


@click.command("config")
@click.option("--keys", is_flag=True, help="list every valid key instead of the values")
@click.pass_context
def config_cmd(ctx: click.Context, keys: bool) -> None:
    """Print the settings in force (defaults filled in) as YAML, or the valid keys."""
    import yaml

    from slurm_elastico import config

    if keys:
        click.echo("\n".join(config.valid_keys()))
        return
    click.echo(yaml.safe_dump(dataclasses.asdict(settings(ctx)), sort_keys=False).rstrip())
