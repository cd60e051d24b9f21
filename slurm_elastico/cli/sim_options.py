"""The options of `elastico sim run|compare`: the trace recipe, the cluster, the output.

Parsing only; `sim.experiment.setup` takes the recipe and cluster options as keyword arguments.
"""

from __future__ import annotations

import click

from slurm_elastico.cli import Finite
from slurm_elastico.sim.trace import DEFAULT_JITTER_S

TRACE_HELP = ("synthetic (a training/inference mix), pollux:N (bundled workload N=1..8), pollux1:N (the same on one "
              "GPU each), philly[:PATH], alibaba:PATH (openb_pod_list_default.csv), sia:PATH (a Sia workload, e.g. "
              "workload-1.csv), or a CSV in the trace format")


def options(f):
    """The trace, cluster and output options both commands take."""
    opts = [
        click.option("--trace", "trace_name", default="synthetic", show_default=True, help=TRACE_HELP),
        click.option("--jobs", type=click.IntRange(1, 100000), default=400, show_default=True, help="synthetic: jobs"),
        click.option("--load", type=Finite(0.01, 1000), default=2.0, show_default=True,
                     help="synthetic: offered load (GPU-seconds asked / GPU-seconds there while jobs arrive)"),
        click.option("--infer-fraction", type=Finite(0, 1), default=0.3, show_default=True,
                     help="synthetic: share of inference jobs"),
        click.option("--hours", type=Finite(0.01, 24 * 366 * 10), default=24.0, show_default=True,
                     help="philly: hours of submissions to replay"),
        click.option("--gpus", type=click.IntRange(1, 65536), default=None, help="GPUs (default: sim.gpus)"),
        click.option("--epoch-s", type=Finite(1, 86400), default=None, help="seconds between epochs"),
        click.option("--window-s", type=Finite(min=-1), default=None,
                     help="placement window before Slurm starts a job as submitted; -1 = until planned (static and static-mps: "
                          "none, Slurm starts their jobs at once)"),
        click.option("--colocation", type=click.Choice(["gavel", "gavel-residual", "none"]), default=None,
                     help="ground truth of co-location slowdown"),
        click.option("--jitter-s", type=Finite(0, 86400), default=DEFAULT_JITTER_S, show_default=True,
                     help="pollux or CSV traces: each seed moves every arrival by its own seeded uniform offset "
                          "within ± this many seconds (0 = the trace's exact times)"),
        click.option("--cluster", default=None,
                     help="GPU types: sia (Sia's 64 GPUs: aws:6x4,dgx-ext:2x8,rtx:3x8) or TYPE:NODESxGPUS,... "
                          "(types: aws, rtx, dgx-ext, dgx, azure, quad); needs --profiles (default: sim.cluster; "
                          "none = one type, --gpus)"),
        click.option("--profiles", type=click.Path(exists=True, file_okay=False), default=None,
                     help="directory of per-type profiles in Sia's layout (<app>/placements-<type>.csv, ...)"),
        click.option("--type-blind/--type-aware", "type_blind", default=None,
                     help="families name no GPU type, at the app's slowest type's speed (the ablation)"),
        click.option("--sim-config", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="YAML with a `sim:` section (see slurm_elastico.sim.settings)"),
        click.option("--out", type=click.Path(file_okay=False), default=None,
                     help="write runs.csv, jobs.csv, summary.json and PNG plots here"),
        click.option("--json", "as_json", is_flag=True, help="print the summary as JSON"),
        click.option("--progress/--no-progress", default=None, help="progress bar on stderr (default: on a TTY)"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f
