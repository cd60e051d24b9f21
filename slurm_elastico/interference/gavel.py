"""Importer for Gavel's co-location measurements, of any GPU type, into the measurement format.

Two inputs, the same content: Gavel's own throughputs JSON
(`scheduler/simulation_throughputs.json`: `{gpu type: {job: {"null": solo
steps/s, other job: [steps/s of job, steps/s of other job]}}}`, a job written
`('<model> (batch size <n>)', <scale factor>)` or `('<model>', <scale>)`),
or that JSON flattened to two CSV files (`PAIR_COLUMNS`, `ISOLATED_COLUMNS`;
docs/interference-data.md describes them). Throughput is steps per second.

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

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.measurements import Colocation, read_measurement_text, read_rows

PAIR_COLUMNS = ("gpu_type", "model1", "bs1", "scale1", "model2", "bs2", "scale2", "colo_tput1", "colo_tput2")
"""Columns the flattened pairs CSV must have (Gavel's flattening also has iso_tput1/2 and norm_tput1/2: ignored,
the solo throughput comes from the isolated file and the normalized one is computed from the two)."""
ISOLATED_COLUMNS = ("gpu_type", "model", "batch_size", "scale_factor", "iso_tput_steps_per_s")
SOURCE = "gavel"


@dataclass
class GavelImport:
    """The observations plus what was left out and why, so counts stay honest."""

    observations: list[Colocation] = field(default_factory=list)
    did_not_fit: int = 0  # unordered single-GPU pairs with colo 0,0 (also in observations, fits = 0)
    multi_gpu_skipped: int = 0  # ordered rows with scale > 1: no co-location measured
    duplicates: int = 0  # ordered rows whose mirror was already imported

    def on(self, gpu_types: Sequence[str]) -> list[Colocation]:
        """The observations on `gpu_types` (all of them when it is empty); a type the data does not have is an
        error naming the types it has (`elastico iac import-gavel --gpu-type`)."""
        found = sorted({o.gpu_type for o in self.observations})
        missing = [g for g in gpu_types if g not in found]
        if missing:
            raise MeasurementError(f"--gpu-type {', '.join(missing)}: not in the data; it has {', '.join(found)}")
        return [o for o in self.observations if not gpu_types or o.gpu_type in gpu_types]

    def summary(self, kept: Sequence[Colocation]) -> str:
        """What `elastico iac import-gavel` says of the `kept` observations and of the rows it skipped."""
        fits = sum(o.fits for o in kept)
        return (f"{len(kept)} pairs on {', '.join(sorted({o.gpu_type for o in kept}))}: {fits} ran together, "
                f"{len(kept) - fits} did not fit (kept, fits=0); the input's {self.multi_gpu_skipped} multi-GPU rows "
                f"(not measured) and {self.duplicates} mirrored rows were skipped")


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


@dataclass(frozen=True)
class _Pair:
    """One ordered measured pair as Gavel lists it: (model, batch, scale) of each job and their co-located steps/s."""

    gpu: str
    jobs: tuple[tuple[str, str, str], tuple[str, str, str]]
    colo: tuple[float, float]
    where: str


def _build(pairs: list[_Pair], iso: dict[tuple[str, str, str], float], iso_source: str) -> GavelImport:
    result = GavelImport()
    seen: set[tuple] = set()
    for pair in pairs:
        where = pair.where
        if any(scale != "1" for _, _, scale in pair.jobs):
            result.multi_gpu_skipped += 1
            continue
        jobs = [(model, bs) for model, bs, _ in pair.jobs]
        key = (pair.gpu, *sorted(jobs))
        if key in seen:
            result.duplicates += 1
            continue
        seen.add(key)
        profiles, solo = [], []
        for model, bs in jobs:
            tput = iso.get((pair.gpu, model, bs))
            if tput is None:
                raise MeasurementError(f"{where}: job {model} batch {bs or '(none)'} on {pair.gpu} has no solo "
                                       f"throughput in {iso_source}")
            if tput <= 0:
                raise MeasurementError(f"{where}: job {model} batch {bs or '(none)'} on {pair.gpu} has solo "
                                       f"throughput {tput:g} in {iso_source}; it must be > 0")
            batch = float(bs) if bs else math.nan
            profiles.append(SoloProfile(kind="train", throughput=tput, batch=batch, precision="", model_family=model))
            solo.append(tput)
        if pair.colo == (0.0, 0.0):
            result.did_not_fit += 1
            result.observations.append(Colocation(pair.gpu, profiles[0], profiles[1], fits=False, source=SOURCE))
            continue
        norms = (pair.colo[0] / solo[0], pair.colo[1] / solo[1])
        if not all(0 < x <= 2 for x in norms):
            raise MeasurementError(f"{where}: normalized throughputs {norms[0]:.3g}, {norms[1]:.3g} (co-located / solo) "
                                   "must be in (0, 2] when the pair ran")
        result.observations.append(Colocation(pair.gpu, profiles[0], profiles[1], norms[0], norms[1], True, SOURCE))
    return result


def import_gavel(pairs_csv: str | Path, isolated_csv: str | Path) -> GavelImport:
    """Reads the flattened `throughputs_pairs.csv` and `throughputs_isolated.csv` into observations.

    Normalized throughput is computed as co-located / solo steps/s (the CSV's own norm columns are not trusted).
    """
    pairs_csv, isolated_csv = Path(pairs_csv), Path(isolated_csv)
    iso: dict[tuple[str, str, str], float] = {}
    for i, row in read_rows(isolated_csv, ISOLATED_COLUMNS):
        if row["scale_factor"].strip() == "1":
            where = f"{isolated_csv} row {i}"
            iso[(row["gpu_type"].strip(), row["model"].strip(), row["batch_size"].strip())] = _num(
                row, "iso_tput_steps_per_s", where)
    pairs = []
    for i, row in read_rows(pairs_csv, PAIR_COLUMNS):
        where = f"{pairs_csv} row {i}"
        jobs = tuple((row[f"model{n}"].strip(), _batch_text(row[f"bs{n}"], where, f"bs{n}"), row[f"scale{n}"].strip())
                     for n in (1, 2))
        pairs.append(_Pair(row["gpu_type"].strip(), jobs,
                           (_num(row, "colo_tput1", where), _num(row, "colo_tput2", where)), where))
    return _build(pairs, iso, str(isolated_csv))


def _batch_text(text: str, where: str, column: str) -> str:
    """A batch size as Gavel writes it: empty (the model has none) or a positive whole number."""
    text = (text or "").strip()
    if text and not (text.isdigit() and int(text) > 0):
        raise MeasurementError(f"{where}, column {column}: {text!r} is not a batch size (a whole number > 0, or empty)")
    return text


_JOB = re.compile(r"^\(\s*'(?P<model>[^']+?)(?: \(batch size (?P<bs>\d+)\))?'\s*,\s*(?P<scale>\d+)\s*\)$")


def _job(text: str, where: str) -> tuple[str, str, str]:
    match = _JOB.match(text)
    if match is None:
        raise MeasurementError(f"{where}: job {text!r} is not written as Gavel writes one: "
                               "\"('<model> (batch size <n>)', <scale>)\" or \"('<model>', <scale>)\"")
    return match["model"], match["bs"] or "", match["scale"]


def import_gavel_json(path: str | Path) -> GavelImport:
    """Reads Gavel's throughputs JSON (every GPU type in it) into observations."""
    path = Path(path)
    text = read_measurement_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MeasurementError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise MeasurementError(f"{path}: nested too deep; allowed: Gavel's throughputs JSON") from None
    if not isinstance(data, dict) or not data:
        raise MeasurementError(f"{path}: expected an object of GPU types, each an object of jobs")
    iso: dict[tuple[str, str, str], float] = {}
    pairs = []
    for gpu, jobs in data.items():
        if not isinstance(jobs, dict):
            raise MeasurementError(f"{path}, GPU type {gpu!r}: expected an object of jobs")
        for job_text, entry in jobs.items():
            where = f"{path}, {gpu} {job_text}"
            model, bs, scale = _job(job_text, where)
            if not isinstance(entry, dict) or not isinstance(entry.get("null"), (int, float)):
                raise MeasurementError(f"{where}: expected an object with \"null\": solo steps/s")
            if scale == "1":
                iso[(gpu, model, bs)] = float(entry["null"])
            for other_text, colo in entry.items():
                if other_text == "null":
                    continue
                if not (isinstance(colo, list) and len(colo) == 2 and all(isinstance(x, (int, float)) and x >= 0
                                                                          for x in colo)):
                    raise MeasurementError(f"{where}, partner {other_text}: expected [steps/s of the job, "
                                           f"steps/s of the partner], each >= 0; got {colo!r}")
                pairs.append(_Pair(gpu, ((model, bs, scale), _job(other_text, f"{where}, partner")),
                                   (float(colo[0]), float(colo[1])), f"{where}, partner {other_text}"))
    return _build(pairs, iso, str(path))
