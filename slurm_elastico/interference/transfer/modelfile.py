"""The prior-corrected predictor's file: one JSON document, its format and versions, and the checks on reading it.

A file holds everything a prediction needs (prior, encoder, config, the training samples and their weights) and
the calibration (held-out error, admission thresholds per floor), not the held-out pairs. `read` refuses, with
the reason, a file of another format or version, of other features or floors, or whose arrays disagree.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np

from slurm_elastico.interference.admission import FLOORS, from_json, to_json
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.interference.errors import ModelFileError
from slurm_elastico.interference.files import check_header, write_atomically
from slurm_elastico.interference.transfer.calibration import ADMISSION_KINDS
from slurm_elastico.interference.transfer.encoding import NUMERIC, Encoder, Jobs
from slurm_elastico.interference.transfer.kernel import KernelConfig
from slurm_elastico.interference.transfer.training import Fitted

FILE_FORMAT = "slurm-elastico/iac-prior-corrected"
FILE_VERSION = 4  # 3: throughput per unit of the GPU's memory bandwidth; 4: the correction's batch weight and linear part
OLDER_VERSIONS = (3,)  # read as written: a version-3 file is the same model with batch 1 and no linear part


def to_dict(model) -> dict:
    """The JSON document of `model`, a `PriorCorrected` (`model` imports this module, so it is not typed here)."""
    f = model.fitted
    return {"format": FILE_FORMAT, "version": FILE_VERSION, "config": asdict(model.config),
            "prior": {"default_sm": model.prior.default_sm, "default_bw": model.prior.default_bw,
                      "kappa": model.prior.kappa},
            "encoder": {"numeric": list(model.encoder.numeric), "mean": list(model.encoder.mean),
                        "std": list(model.encoder.std), "families": list(model.encoder.families),
                        "ref_log_bw": None if math.isnan(model.encoder.ref_log_bw) else model.encoder.ref_log_bw},
            "training_mean_norm": model.training_mean_norm, "gpu_types": list(model.gpu_types),
            "heldout": model.heldout, "margins": model.margins,
            "admission": {"floors": list(FLOORS), **{k: to_json(v) for k, v in model.admission.items()}},
            "train": {"jobs": _jobs_dict(f.jobs), "self": f.self_idx.tolist(), "partner": f.partner_idx.tolist(),
                      "gpus": f.gpus, "alpha": f.alpha.tolist(), "target": f.target.tolist()}}


def write(model, path: str | Path) -> None:
    """Writes `model` as one JSON file (atomically: write, fsync, rename)."""
    write_atomically(path, json.dumps(to_dict(model)).encode())


def read(path: str | Path) -> tuple:
    """The arguments of `PriorCorrected` from the file at `path` (`ModelFileError` saying what is wrong)."""
    path = Path(path)
    try:
        blob = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such model file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{path}: not a slurm-elastico predictor file ({type(exc).__name__})") from None
    check_header(blob, path, FILE_FORMAT, FILE_VERSION, OLDER_VERSIONS)
    try:
        if blob["version"] == 3 and set(blob["config"]) & {"batch", "linear"}:
            raise ValueError("a version-3 file with version-4 settings (batch, linear)")
        enc = blob["encoder"]
        encoder = Encoder(tuple(enc["numeric"]), tuple(map(float, enc["mean"])), tuple(map(float, enc["std"])),
                          tuple(enc["families"]),
                          math.nan if enc["ref_log_bw"] is None else float(enc["ref_log_bw"]))
        if encoder.numeric != NUMERIC:  # the batch weight and the linear part read NUMERIC's columns
            raise ValueError(f"features {encoder.numeric}, this slurm-elastico's are {NUMERIC}")
        t = blob["train"]
        fitted = Fitted(_jobs_from(t["jobs"]), np.array(t["self"], dtype=np.int64),
                        np.array(t["partner"], dtype=np.int64), list(map(str, t["gpus"])),
                        np.array(t["alpha"], dtype=float), np.array(t["target"], dtype=float))
        if not (len(fitted.alpha) == len(fitted.gpus) == len(fitted.self_idx) == len(fitted.partner_idx)
                == len(fitted.target)):
            raise ValueError("training arrays of different lengths")
        if len(fitted.alpha) and max(fitted.self_idx.max(), fitted.partner_idx.max()) >= len(fitted.jobs.family):
            raise ValueError("a training sample names a job the file does not hold")
        if fitted.jobs.x.shape[1] != len(encoder.numeric):
            raise ValueError("training jobs have another number of features than the encoder")
        prior = ContentionModel(**{k: float(v) for k, v in blob["prior"].items()})
        heldout = {k: {m: float(x) for m, x in v.items()} for k, v in blob["heldout"].items()}
        adm = blob["admission"]
        if [round(float(f), 2) for f in adm["floors"]] != list(FLOORS):
            raise ValueError("admission thresholds on other floors than this slurm-elastico uses")
        admission = {k: from_json(adm[k]) for k in ADMISSION_KINDS}
        return (prior, encoder, KernelConfig(**blob["config"]), fitted, float(blob["training_mean_norm"]),
                heldout, tuple(blob["gpu_types"]), admission)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFileError(f"{path}: incomplete or inconsistent predictor file ({exc!r})") from None


def _jobs_dict(j: Jobs) -> dict:
    return {"x": np.where(np.isnan(j.x), None, j.x).tolist(), "family": j.family.tolist(), "kind": j.kind.tolist(),
            "precision": j.precision.tolist()}


def _jobs_from(d: dict) -> Jobs:
    x = np.array([[math.nan if v is None else float(v) for v in row] for row in d["x"]], dtype=float)
    return Jobs(x.reshape(len(d["family"]), -1), np.array(d["family"], dtype=np.int64),
                np.array(d["kind"], dtype=np.int64), np.array(d["precision"], dtype=np.int64))
