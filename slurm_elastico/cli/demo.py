"""`elastico demo`: the main job end to end (see `slurm_elastico.cluster.demo`)."""

from __future__ import annotations

import click


@click.command("demo")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="local cluster state (default: $ELASTICO_CLUSTER_DIR, then ~/.local/state/slurm-elastico/cluster)")
@click.option("--train-jobs", type=click.IntRange(0, 64), default=14, show_default=True)
@click.option("--infer-jobs", type=click.IntRange(0, 64), default=6, show_default=True)
@click.option("--keep/--down", default=True, help="leave the cluster running afterwards (default) or stop it")
def demo(state_dir: str | None, train_jobs: int, infer_jobs: int, keep: bool) -> None:
    """A local Slurm cluster with fake GPUs, a mixed training and inference workload submitted with
    elastico-submit, the helper scheduling it, and the report."""
    from slurm_elastico.cluster import demo as main_job

    main_job.run(state_dir, main_job.Workload(train_jobs=train_jobs, infer_jobs=infer_jobs), say=click.echo, keep=keep)
