"""`elastico cluster up|down|status|env`: the local Slurm cluster for development and tests."""

from __future__ import annotations

import shlex

import click

from slurm_elastico import jsonout
from slurm_elastico.cluster import LocalCluster
from slurm_elastico.cluster.gpu_types import KNOWN, types_text, yaml_types
from slurm_elastico.cluster.programs import typed

_state_dir = click.option(
    "--state-dir", type=click.Path(file_okay=False), default=None,
    help="where configs, logs, pids and sockets live (default: $ELASTICO_CLUSTER_DIR, "
         "then ~/.local/state/slurm-elastico/cluster)")


@click.group("cluster")
def cluster() -> None:
    """A real Slurm cluster on this machine with fake GPUs (needs root; installs Debian packages if missing)."""


@cluster.command()
@_state_dir
@click.option("--nodes", type=click.IntRange(1, 64), default=None, help="slurmd nodes n1..nN (default 4)")
@click.option("--gpus", type=click.IntRange(1, 16), default=None, help="fake GPUs per node (default 4)")
@click.option("--shares-per-gpu", type=click.IntRange(1, 100), default=None, help="MPS shares per GPU (default 100)")
@click.option("--accounting/--no-accounting", default=None,
              help="MariaDB + slurmdbd, so sacct shows GRES and comments (default off)")
@click.option("--port-base", type=click.IntRange(1024, 60000), default=None,
              help="slurmctld port; slurmdbd +2, MariaDB +3, slurmd +184.. (default 16817)")
@click.option("--kill-wait", type=click.IntRange(0, 3600), default=None,
              help="seconds between SIGTERM and SIGKILL of a cancelled job (default 30)")
@click.option("--gpu-types", default=None, metavar="NAME:NODES[:MIB[:SPEED]],...",
              help="nodes of several fake GPU types, e.g. t4:2,a100:2 (n1-n2 t4, n3-n4 a100); known names "
                   f"({', '.join(KNOWN)}) need only a node count; \"\" = one untyped type (the default)")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
def up(state_dir, nodes, gpus, shares_per_gpu, accounting, port_base, kill_wait, gpu_types, as_json) -> None:
    """Start the cluster, or what is missing of it; wait until every node is idle.

    Settings not given are those of the last `up` in the same state dir. With --gpu-types each type's nodes
    have `Gres=gpu:TYPE:N`, its memory (for gpu.types in elastico.yaml, printed) and its speed for paced jobs.
    """
    local = LocalCluster.from_state_dir(state_dir, nodes=nodes, gpus_per_node=gpus, shares_per_gpu=shares_per_gpu,
                                        accounting=accounting, port_base=port_base, kill_wait=kill_wait,
                                        gpu_types=gpu_types)
    result = local.up()
    types = yaml_types(local.gpu_types)
    if as_json:
        click.echo(jsonout.dumps({"state_dir": str(local.state_dir), "slurm_conf": str(local.slurm_conf),
                               "started": list(result.started), "installed": list(result.installed),
                               "already_running": result.already_running, "seconds": round(result.seconds, 3),
                               "version": result.version, "gpu_types": types}))
        return
    if types:
        click.echo(f"GPU types: {types_text(local.gpu_types)} (name:nodes:memory MiB:speed); elastico.yaml needs "
                   f"gpu: {{types: {jsonout.dumps(types)}}}")
    if result.installed:
        click.echo(f"installed: {' '.join(result.installed)}")
    if result.already_running:
        click.echo(f"cluster in {local.state_dir} is already running ({result.version})")
    else:
        click.echo(f"started {', '.join(result.started)} in {result.seconds:.1f} s ({result.version})")
    click.echo(f"use it with: eval \"$({typed('elastico')} cluster env --state-dir {shlex.quote(str(local.state_dir))})\"")


@cluster.command()
@_state_dir
def down(state_dir) -> None:
    """Cancel every job, then stop the daemons this cluster started (by their pid files)."""
    result = LocalCluster.from_state_dir(state_dir).down()
    if result.jobs_problem:
        click.echo(f"warning: no job was cancelled: {result.jobs_problem}", err=True)
    if result.stopped:
        click.echo(f"cancelled {result.cancelled_jobs} job(s); stopped {', '.join(result.stopped)} "
                   f"in {result.seconds:.1f} s")
    else:
        click.echo("nothing was running")


@cluster.command()
@_state_dir
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
def status(state_dir, as_json) -> None:
    """Show each daemon and node; exit code 0 when the whole cluster runs, 1 otherwise."""
    state = LocalCluster.from_state_dir(state_dir).status()
    if as_json:
        click.echo(jsonout.dumps(state.to_dict(), indent=2))
    else:
        click.echo(f"cluster {state.state_dir}: {'running' if state.running else 'not running'}")
        click.echo(f"SLURM_CONF={state.slurm_conf}")
        for daemon in state.daemons:
            pid = f"pid {daemon.pid}" if daemon.running else "stopped"
            click.echo(f"  {daemon.name:<12} {pid:<12} {daemon.log}")
        for node, node_state in state.nodes.items():
            click.echo(f"  node {node:<7} {node_state}")
    click.get_current_context().exit(0 if state.running else 1)


@cluster.command()
@_state_dir
def env(state_dir) -> None:
    """Print `export` lines for Slurm commands to use this cluster: eval "$(elastico cluster env)"."""
    for name, value in LocalCluster.from_state_dir(state_dir).env().items():
        click.echo(f"export {name}={shlex.quote(value)}")
