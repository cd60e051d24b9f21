"""`elastico iac import-gavel` and `elastico iac measure`: co-location measurements into a CSV file or the store.

Parses and prints; the work is in `slurm_elastico.interference` (gavel, measure, measurements). The commands
belong to the `elastico iac` group (`iac`), which trains and evaluates the predictor on what they gather.
"""

from __future__ import annotations

import shlex

import click

from slurm_elastico.interference import measurements
from slurm_elastico.interference.errors import MeasurementError


@click.command("import-gavel")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, exists=True),
              help="Gavel's throughputs JSON (e.g. scheduler/simulation_throughputs.json)")
@click.option("--pairs", type=click.Path(dir_okay=False, exists=True), help="flattened pairs CSV (not with --json)")
@click.option("--isolated", type=click.Path(dir_okay=False, exists=True), help="flattened isolated CSV (with --pairs)")
@click.option("--gpu-type", "gpu_types", multiple=True, help="keep only this GPU type (repeatable; default: all)")
@click.option("--out", type=click.Path(dir_okay=False), help="measurement CSV to write (replaced)")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), help="store .db to append to")
def import_gavel_cmd(json_path: str | None, pairs: str | None, isolated: str | None, gpu_types: tuple[str, ...],
                     out: str | None, store_path: str | None) -> None:
    """Converts Gavel's co-location measurements (every GPU type in them) into the measurement format.

    Input: Gavel's own JSON (--json), or that JSON flattened to two CSV files
    (--pairs and --isolated; docs/interference-data.md gives their columns).
    """
    from slurm_elastico.interference.gavel import import_gavel, import_gavel_json

    if not out and not store_path:
        raise MeasurementError("import-gavel needs --out FILE.csv, --store FILE.db, or both")
    if bool(json_path) == bool(pairs or isolated) or (not json_path and not (pairs and isolated)):
        raise click.UsageError("give --json FILE, or both --pairs FILE and --isolated FILE")
    result = import_gavel_json(json_path) if json_path else import_gavel(pairs, isolated)
    kept = result.on(gpu_types)
    if out:
        measurements.write_csv(out, kept)
    if store_path:
        measurements.save(kept, None, store_path)
    click.echo(result.summary(kept))


@click.command()
@click.option("--a", "cmd_a", required=True, help="workload a: a command line printing ELASTICO_THROUGHPUT=<x>")
@click.option("--b", "cmd_b", required=True, help="workload b: the same contract")
@click.option("--gpu-type", required=True, help="e.g. a100-80g, h100 (recorded with the observation)")
@click.option("--gpu-index", default=0, show_default=True, type=click.IntRange(0))
@click.option("--a-kind", default="train", show_default=True, type=click.Choice(["train", "infer"]))
@click.option("--b-kind", default="train", show_default=True, type=click.Choice(["train", "infer"]))
@click.option("--a-family", default="", help="model family of a, e.g. resnet50")
@click.option("--b-family", default="", help="model family of b")
@click.option("--a-batch", type=click.FloatRange(0, min_open=True))
@click.option("--b-batch", type=click.FloatRange(0, min_open=True))
@click.option("--a-precision", default="", type=click.Choice(["", "fp32", "fp16", "bf16"]))
@click.option("--b-precision", default="", type=click.Choice(["", "fp32", "fp16", "bf16"]))
@click.option("--timeout", default=1800.0, show_default=True, type=click.FloatRange(1), help="seconds per run")
@click.option("--out", type=click.Path(dir_okay=False), help="measurement CSV to append to")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), help="store .db to append to")
def measure(cmd_a, cmd_b, gpu_type, gpu_index, a_kind, b_kind, a_family, b_family, a_batch, b_batch,
            a_precision, b_precision, timeout, out, store_path) -> None:
    """Runs A solo, B solo, then both on one GPU, and appends the observation. Needs an NVIDIA GPU.

    Commands are split like a shell would (shlex) but run without one. Not yet
    run on a GPU: written and tested against a fake NVML only.
    """
    import math

    from slurm_elastico.interference.base import SoloProfile
    from slurm_elastico.interference.measure import describe, measure_pair

    if not out and not store_path:
        raise MeasurementError("measure needs --out FILE.csv, --store FILE.db, or both")
    pa = SoloProfile(kind=a_kind, batch=a_batch or math.nan, precision=a_precision, model_family=a_family)
    pb = SoloProfile(kind=b_kind, batch=b_batch or math.nan, precision=b_precision, model_family=b_family)
    obs = measure_pair(shlex.split(cmd_a), shlex.split(cmd_b), pa, pb, gpu_type, gpu_index, timeout)
    click.echo(describe(obs))
    for line in measurements.save([obs], out, store_path):
        click.echo(line)
