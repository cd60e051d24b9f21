"""`elastico demo`: the main job end to end on a local real Slurm cluster.

Brings the local cluster up (accounting on), submits a few MPS jobs, and prints
the cluster as elastico sees it. Later stages (elastico-submit, the helper,
the report) join as they land.
"""

from __future__ import annotations

import os
import subprocess
import time

import click

from slurm_elastico.cli.view import render
from slurm_elastico.cluster import LocalCluster
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.runner import SubprocessRunner

DEMO_JOB = "#!/bin/bash\necho \"$SLURMD_NODENAME GPU $SLURM_JOB_GPUS at $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE%\"\nsleep 20\n"


@click.command("demo")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="local cluster state (default: $ELASTICO_CLUSTER_DIR, then ~/.local/state/slurm-elastico/cluster)")
@click.option("--keep/--down", default=True, help="leave the cluster running afterwards (default) or stop it")
def demo(state_dir: str | None, keep: bool) -> None:
    """Run the main job on a local Slurm cluster with fake GPUs and print what elastico sees."""
    cluster = LocalCluster.from_state_dir(state_dir, accounting=True)
    click.echo(f"== bringing up the local Slurm cluster in {cluster.state_dir}")
    result = cluster.up()
    click.echo(f"   {result.version}; {'already running' if result.already_running else f'started in {result.seconds:.1f} s'}")
    env = cluster.env()
    gateway = SlurmGateway(SubprocessRunner(env=env))
    work = cluster.state_dir / "demo"
    work.mkdir(exist_ok=True)
    script = work / "mps-job.sh"
    script.write_text(DEMO_JOB)
    click.echo("== submitting MPS jobs (shares 50, 30, 40, 25, 60, 100)")
    ids = []
    for share in (50, 30, 40, 25, 60, 100):
        out = subprocess.run(["sbatch", "--parsable", f"--gres=mps:{share}", f"--job-name=demo-mps{share}",
                              f"--output={work}/%j.out", str(script)],
                             env={**os.environ, **env}, capture_output=True, text=True, timeout=30, check=True)
        ids.append(int(out.stdout.strip().split(";")[0]))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(j.state.value == "PENDING" for j in gateway.jobs() if j.job_id in ids):
        time.sleep(0.5)
    click.echo("== the cluster as elastico sees it (one squeue call and one node listing)")
    click.echo(render(gateway.snapshot()))
    if not keep:
        cluster.down()
        click.echo("== cluster stopped")
    else:
        click.echo(f"== the cluster keeps running; stop it with: elastico cluster down --state-dir {cluster.state_dir}")
