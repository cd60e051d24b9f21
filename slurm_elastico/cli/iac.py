"""`elastico iac`: interference measurements, training and honest evaluation of the slowdown predictor.

Parses and prints; the work is in `slurm_elastico.interference` (measurements, evaluation, gavel, measure).
"""

from __future__ import annotations

import shlex

import click

from slurm_elastico import jsonout
from slurm_elastico.interference import measurements
from slurm_elastico.interference.errors import MeasurementError


@click.group()
def iac() -> None:
    """Interference-aware co-location: measure pairs, train and evaluate the slowdown predictor."""


@iac.command()
@click.option("--data", required=True, type=click.Path(dir_okay=False), help="measurement CSV (or a store .db)")
@click.option("--model", "model_path", type=click.Path(dir_okay=False),
              help="a saved model (`iac train`) to score on DATA; without it, --split cross-validates DATA")
@click.option("--split", "kind", type=click.Choice(["kfold", "leave-one-model-out", "leave-one-gpu-out"]),
              help="cross-validate a fresh model on DATA (not with --model)")
@click.option("--predictor", type=click.Choice(["prior-corrected", "mlp"]),
              help="with --split: the predictor to cross-validate [default: prior-corrected]")
@click.option("--floor", default=0.6, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="admission floor on normalized throughput")
@click.option("--folds", default=5, show_default=True, type=click.IntRange(2, 50), help="k for kfold")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def evaluate(data: str, model_path: str | None, kind: str | None, predictor: str | None, floor: float, folds: int,
             seed: int, as_json: bool) -> None:
    """Scores a saved model on DATA (--model), or cross-validates a fresh one on DATA (--split).

    Both report MAPE on normalized throughput and on slowdown, false
    admissions and good pairs admitted, beside the trivial predictors
    (training mean, the test data's median, no slowdown) and the untrained
    contention model; --split pools them over its held-out parts (model
    selection on each training part only). With --split --predictor mlp:
    the MLP's report (MAPE, median APE, R² on normalized throughput), 1-3
    minutes on 2 cores.
    """
    if (model_path is None) == (kind is None):
        raise click.UsageError("give exactly one of --model FILE (score a saved model on --data) "
                               "and --split KIND (cross-validate on --data)")
    if model_path is not None and predictor is not None:
        raise click.UsageError("--predictor goes with --split; a saved model (--model) is scored as it is")
    if model_path is not None:
        from slurm_elastico.interference import load_model
        from slurm_elastico.interference.scoring import format_score, score

        if not model_path.strip():
            raise click.UsageError("--model is empty; give the file `elastico iac train` wrote")
        result = score(load_model(model_path), measurements.load(data), floor=floor)
        click.echo(jsonout.dumps(result.to_dict(), indent=2) if as_json else format_score(result))
        return
    if predictor in (None, "prior-corrected"):
        from slurm_elastico.interference.evaluation import split
        from slurm_elastico.interference.scoring import cross_score, format_score
        from slurm_elastico.interference.transfer.fit import fit_transfer

        observations = measurements.load(data)
        result = cross_score(observations, split(observations, kind, k=folds, seed=seed),
                             lambda part: fit_transfer(part, seed=seed), floor=floor)
        click.echo(jsonout.dumps({"split": kind, **result.to_dict()}, indent=2) if as_json
                   else f"split: {kind}\n" + format_score(result))
        return
    from slurm_elastico.interference.evaluation import evaluate as run, format_report

    report = run(measurements.load(data), kind, floor=floor, k=folds, seed=seed)
    click.echo(jsonout.dumps(report.to_dict(), indent=2) if as_json else format_report(report))


@iac.command("train")
@click.option("--data", required=True, type=click.Path(dir_okay=False), help="measurement CSV (or a store .db)")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="model file to write")
@click.option("--predictor", default="prior-corrected", show_default=True, type=click.Choice(["prior-corrected", "mlp"]),
              help="prior-corrected: the contention model with a learned correction that fades outside the "
                   "training data (JSON, no torch); mlp: the PyTorch MLP")
@click.option("--select", "select_by", type=click.Choice(["kfold", "leave-one-model-out"]),
              help="mlp only: folds used to choose hyper-parameters and the admission margin "
                   "[default: leave-one-model-out]")
@click.option("--floor", type=click.FloatRange(0, 1, min_open=True),
              help="mlp only: the floor its margin is calibrated at [default: 0.6]")
@click.option("--seed", default=0, show_default=True, type=int)
def train_cmd(data: str, out: str, predictor: str, select_by: str | None, floor: float | None, seed: int) -> None:
    """Chooses hyper-parameters on held-out folds of DATA, trains on all of it and saves the model.

    prior-corrected (the default; docs/interference-data.md): the file holds
    its held-out error on k-fold, leave-one-model-out and (two or more GPU
    types) leave-one-GPU-out folds, and its admission margins derive from it.
    mlp: leave-one-model-out selection (the default) prefers models that hold
    up on workloads not seen in training; the file records the GPU types and
    families trained on, and pairs outside them get cautious margins.
    """
    if predictor == "prior-corrected" and (select_by is not None or floor is not None):
        raise click.UsageError("--select and --floor apply to --predictor mlp only: the prior-corrected predictor "
                               "selects on leave-one-model-out folds and its margins hold at any floor")
    observations = measurements.load(data)
    if predictor == "prior-corrected":
        from slurm_elastico.interference.transfer.fit import fit_transfer, format_transfer

        model = fit_transfer(observations, seed=seed)
        model.save(out)
        click.echo(format_transfer(model, out))
        return
    from slurm_elastico.interference.evaluation import fit_model, format_fit

    model, scores = fit_model(observations, select_by or "leave-one-model-out", 0.6 if floor is None else floor, seed)
    model.save(out)
    click.echo(format_fit(model, scores, out))


@iac.command("import-gavel")
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
    found = sorted({o.gpu_type for o in result.observations})
    missing = [g for g in gpu_types if g not in found]
    if missing:
        raise MeasurementError(f"--gpu-type {', '.join(missing)}: not in the data; it has {', '.join(found)}")
    kept = [o for o in result.observations if not gpu_types or o.gpu_type in gpu_types]
    if out:
        measurements.write_csv(out, kept)
    if store_path:
        measurements.save(kept, None, store_path)
    fits = sum(o.fits for o in kept)
    click.echo(f"{len(kept)} pairs on {', '.join(sorted({o.gpu_type for o in kept}))}: {fits} ran together, "
               f"{len(kept) - fits} did not fit (kept, fits=0); the input's {result.multi_gpu_skipped} multi-GPU rows "
               f"(not measured) and {result.duplicates} mirrored rows were skipped")


@iac.command()
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
    from slurm_elastico.interference.measure import measure_pair

    if not out and not store_path:
        raise MeasurementError("measure needs --out FILE.csv, --store FILE.db, or both")
    pa = SoloProfile(kind=a_kind, batch=a_batch or math.nan, precision=a_precision, model_family=a_family)
    pb = SoloProfile(kind=b_kind, batch=b_batch or math.nan, precision=b_precision, model_family=b_family)
    obs = measure_pair(shlex.split(cmd_a), shlex.split(cmd_b), pa, pb, gpu_type, gpu_index, timeout)
    click.echo(f"a: solo {obs.a.throughput:.4g}/s, normalized {obs.norm_a:.3f}; "
               f"b: solo {obs.b.throughput:.4g}/s, normalized {obs.norm_b:.3f}")
    for line in measurements.save([obs], out, store_path):
        click.echo(line)
