"""`elastico demo`: the main job end to end (see `slurm_elastico.cluster.demo`)."""

from __future__ import annotations

import click


@click.command("demo")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="local cluster state (default: $ELASTICO_CLUSTER_DIR, then ~/.local/state/slurm-elastico/cluster)")
@click.option("--train-jobs", type=click.IntRange(0, 64), default=6, show_default=True)
@click.option("--infer-jobs", type=click.IntRange(0, 64), default=3, show_default=True)
@click.option("--gap", "gap_s", type=click.FloatRange(0, 600), default=6.0, show_default=True,
              help="seconds between two jobs' arrivals")
@click.option("--steps", type=click.IntRange(1, 100000), default=None,
              help="optimizer steps of every training job [default: each app's own, printed as the demo starts]")
@click.option("--requests", type=click.IntRange(1, 100000), default=120, show_default=True,
              help="requests of each inference job")
@click.option("--timeout", "timeout_s", type=click.FloatRange(10, 86400), default=420.0, show_default=True,
              help="seconds the two runs (side by side, at once) may take")
@click.option("--shadow-pass", is_flag=True, default=False,
              help="then run the list again on the elastico half with the helper in shadow mode: it must change "
                   "nothing in Slurm and propose the acting helper's kinds of action (docs/admin/shadow.md)")
@click.option("--keep/--down", default=True, help="leave the cluster running afterwards (default) or stop it")
def demo(state_dir: str | None, train_jobs: int, infer_jobs: int, gap_s: float, steps: int | None, requests: int,
         timeout_s: float, shadow_pass: bool, keep: bool) -> None:
    """One mixed training and inference job list on a local Slurm cluster with emulated GPUs, run at once on two
    halves of it, with plain sbatch and with elastico-submit and the helper, beside the simulator's prediction."""
    from slurm_elastico.cluster import demo as main_job

    if train_jobs + infer_jobs == 0:
        raise click.BadParameter("the job list needs at least one job", param_hint="--train-jobs/--infer-jobs")
    load = main_job.Workload(train_jobs=train_jobs, infer_jobs=infer_jobs, gap_s=gap_s, steps=steps,
                             requests=requests, timeout_s=timeout_s, shadow_pass=shadow_pass)
    main_job.run(state_dir, load, say=click.echo, keep=keep)
