"""`elastico iac`: interference measurements, training and honest evaluation of the slowdown predictor.

Parses and prints; the work is in `slurm_elastico.interference` (measurements, evaluation, scoring, transfer).
The commands that gather measurements (`import-gavel`, `measure`) are in `iac_data`.
"""

from __future__ import annotations

import click

from slurm_elastico import jsonout
from slurm_elastico.cli.iac_data import import_gavel_cmd, measure
from slurm_elastico.interference import measurements


@click.group()
def iac() -> None:
    """Interference-aware co-location: measure pairs, train and evaluate the slowdown predictor."""


iac.add_command(import_gavel_cmd)
iac.add_command(measure)


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
@click.option("--seed", default=0, show_default=True, type=int,
              help="random seed (with --adapt-fraction: the first draw's)")
@click.option("--adapt-fraction", "fraction", type=float,
              help="with --model: adapt the model on this share of DATA's pairs of each GPU type, drawn at random, "
                   "and score it on the rest, beside the unadapted model and the mean slowdown of the same pairs; "
                   "in (0, 1)")
@click.option("--seeds", type=click.IntRange(1, 1000),
              help="with --adapt-fraction: repeat over this many draws (seeds SEED, SEED+1, ...) and report each "
                   "figure's mean and 95 % interval [default: 1]")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def evaluate(data: str, model_path: str | None, kind: str | None, predictor: str | None, floor: float, folds: int,
             seed: int, fraction: float | None, seeds: int | None, as_json: bool) -> None:
    """Scores a saved model on DATA (--model), or cross-validates a fresh one on DATA (--split).

    Both report MAPE on normalized throughput and on slowdown, false
    admissions and good pairs admitted, beside the trivial predictors
    (training mean, the test data's median, no slowdown) and the untrained
    contention model; --split pools them over its held-out parts (model
    selection on each training part only). With --split --predictor mlp:
    the MLP's report (MAPE, median APE, R² on normalized throughput), 1-3
    minutes on 2 cores.

    With --model and --adapt-fraction F: few-shot adaptation to a new GPU
    type or site, judged as it is used. F of DATA's pairs of each GPU type
    are its first measured pairs: the model's offset and scale of log
    slowdown, per-family and per-job corrections and admission margins are
    fitted on them (penalties chosen by cross-validation inside them), and
    the rest are scored, beside the unadapted model and the trivial
    predictor that sees the same pairs (their mean slowdown per GPU type).
    A type with too few pairs for F is skipped and named. --seeds N
    repeats over N draws. JSON: mape, trivial_mape, unadapted_mape,
    false_admit, good_admitted (means over draws, normalized throughput),
    intervals per method and figure under methods, each draw under draws.
    """
    if (model_path is None) == (kind is None):
        raise click.UsageError("give exactly one of --model FILE (score a saved model on --data) "
                               "and --split KIND (cross-validate on --data)")
    if model_path is not None and predictor is not None:
        raise click.UsageError("--predictor goes with --split; a saved model (--model) is scored as it is")
    if fraction is not None and model_path is None:
        raise click.UsageError("--adapt-fraction goes with --model FILE: it adapts a saved model (not with --split)")
    if seeds is not None and fraction is None:
        raise click.UsageError("--seeds goes with --adapt-fraction: it repeats the adaptation's random draw")
    if model_path is not None:
        from slurm_elastico.interference import load_model
        from slurm_elastico.interference.scoring import format_score, score

        if not model_path.strip():
            raise click.UsageError("--model is empty; give the file `elastico iac train` wrote")
        if fraction is not None:
            from slurm_elastico.interference.adapt_score import format_adaptation, score_adaptation

            adapted = score_adaptation(load_model(model_path), measurements.load(data), fraction, seed=seed,
                                       seeds=seeds or 1, floor=floor)
            click.echo(jsonout.dumps(adapted.to_dict(), indent=2) if as_json else format_adaptation(adapted))
            return
        result = score(load_model(model_path), measurements.load(data), floor=floor)
        click.echo(jsonout.dumps(result.to_dict(), indent=2) if as_json else format_score(result))
        return
    if predictor in (None, "prior-corrected"):
        from slurm_elastico.interference.scoring import format_score
        from slurm_elastico.interference.transfer.fit import cross_validate

        result = cross_validate(measurements.load(data), kind, k=folds, seed=seed, floor=floor)
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
