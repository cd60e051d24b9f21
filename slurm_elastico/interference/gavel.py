"""Importer for Gavel's public co-location measurements (K80, P100) into the measurement format.

The pairs file lists every ordered pair twice (A with B, and B with A, with
the same numbers swapped): the importer keeps one row per unordered pair, so a
pair can never sit on both sides of a train/test split. What the data has per
job: model name (= model family, e.g. "ResNet-50"), batch size (empty for A3C
and CycleGAN), isolated steps/s. It has no NVML counters and no precision, so
those stay missing. All Gavel jobs are training jobs.

Rows with `colo_tput` of 0,0 were not run together. With scale factor 1 they
did not fit on one GPU: imported as `fits = 0` (bad pairs for admission).
With scale factor > 1 (jobs spanning several GPUs) Gavel measured no
co-location at all; they are skipped and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.measurements import Colocation, read_rows

PAIR_COLUMNS = ("gpu_type", "model1", "bs1", "scale1", "model2", "bs2", "scale2",
                "iso_tput1", "iso_tput2", "colo_tput1", "colo_tput2", "norm_tput1", "norm_tput2")
ISOLATED_COLUMNS = ("gpu_type", "model", "batch_size", "scale_factor", "iso_tput_steps_per_s")
SOURCE = "gavel"


@dataclass
class GavelImport:
    """The observations plus what was left out and why, so counts stay honest."""

    observations: list[Colocation] = field(default_factory=list)
    did_not_fit: int = 0  # unordered single-GPU pairs with colo 0,0 (also in observations, fits = 0)
    multi_gpu_skipped: int = 0  # ordered rows with scale > 1: no co-location measured
    duplicates: int = 0  # ordered rows whose mirror was already imported


def _num(row: dict[str, str], column: str, where: str, empty_ok: bool = False) -> float:
    text = (row.get(column) or "").strip()
    if text == "" and empty_ok:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        raise MeasurementError(f"{where}, column {column}: {text!r} is not a number") from None
    if math.isnan(value) or value < 0:
        raise MeasurementError(f"{where}, column {column}: {value:g} must be a number >= 0")
    return value


def import_gavel(pairs_csv: str | Path, isolated_csv: str | Path) -> GavelImport:
    """Reads Gavel's `throughputs_pairs.csv` and `throughputs_isolated.csv` into observations."""
    pairs_csv, isolated_csv = Path(pairs_csv), Path(isolated_csv)
    iso: dict[tuple[str, str, str], float] = {}
    for i, row in read_rows(isolated_csv, ISOLATED_COLUMNS):
        if row["scale_factor"].strip() == "1":
            where = f"{isolated_csv} row {i}"
            iso[(row["gpu_type"].strip(), row["model"].strip(), row["batch_size"].strip())] = _num(
                row, "iso_tput_steps_per_s", where)
    result = GavelImport()
    seen: set[tuple] = set()
    for i, row in read_rows(pairs_csv, PAIR_COLUMNS):
        where = f"{pairs_csv} row {i}"
        if row["scale1"].strip() != "1" or row["scale2"].strip() != "1":
            result.multi_gpu_skipped += 1
            continue
        gpu = row["gpu_type"].strip()
        jobs = [(row["model1"].strip(), row["bs1"].strip()), (row["model2"].strip(), row["bs2"].strip())]
        key = (gpu, *sorted(jobs))
        if key in seen:
            result.duplicates += 1
            continue
        seen.add(key)
        profiles = []
        for n, (model, bs) in enumerate(jobs, start=1):
            tput = iso.get((gpu, model, bs))
            if tput is None:
                raise MeasurementError(f"{where}: job {model} batch {bs or '(none)'} on {gpu} is not in {isolated_csv}")
            batch = _num(row, f"bs{n}", where, empty_ok=True)
            profiles.append(SoloProfile(kind="train", throughput=tput, batch=batch, precision="", model_family=model))
        colo = (_num(row, "colo_tput1", where), _num(row, "colo_tput2", where))
        if colo == (0.0, 0.0):
            result.did_not_fit += 1
            result.observations.append(Colocation(gpu, profiles[0], profiles[1], fits=False, source=SOURCE))
            continue
        norms = (_num(row, "norm_tput1", where), _num(row, "norm_tput2", where))
        if not all(0 < x <= 2 for x in norms):
            raise MeasurementError(f"{where}, columns norm_tput1/norm_tput2: {norms} must be in (0, 2] when the pair ran")
        result.observations.append(Colocation(gpu, profiles[0], profiles[1], norms[0], norms[1], True, SOURCE))
    return result
