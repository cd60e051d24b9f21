"""Per-GPU-type ground truth from a directory in Sia's layout (`elastico sim --profiles DIR`): one `GroundTruth` a type.

The layout (Sia's simulator traces, SOSP 2023, which extend Pollux's):
`<app>/placements-<type>.csv` (step and sync time by placement, its digits
the GPUs on each node, and per-GPU batch: `placement,local_bsz,step_time,
sync_time` in any column order), `<app>/scalability-<type>.csv` (by nodes and
GPUs: `num_nodes,num_replicas,local_bsz,step_time,sync_time`) and
`<app>/validation-<batch>.csv` (per epoch: `progress,iteration,metric,
grad_sqr,grad_var`, the statistical efficiency, the same on every type). They
are read into the bundled files' row formats and handed to
`GroundTruth.from_rows`, with the type's usable memory (`gpu_types`): the
placement and scalability rows as `pollux_placements.csv.gz`'s, the one-node
rows as `pollux_profiles.csv`'s, every validation row as
`pollux_validation.csv.gz`'s, and each batch's last iteration as its
iterations to the app's end (`pollux_iterations.csv`; what Pollux and Sia
both run a job to: its app's last profiled epoch, at its own batch).

Sia's simulator calibration (`sia_model`, on by default: its
`simulator_config.SLOWDOWNS` and `applications.rescale_time`): every
measured step and sync time is multiplied by the app's `SIA_SLOWDOWN` (Sia
fitted these so its simulated jobs run as slowly as its real ones did), and
every start of a job, its first included, costs the app's `SIA_RESTART_S` of
checkpoint-and-restore with no progress (instead of `SimSettings.restart_cost_s`).

Traps: pipeline-parallel apps (`PIPELINE_APPS`: Sia's gpt_pmp, measured on
dgx-ext and rtx only) are not data parallel and are left out. A directory is
the user's: it is read, never copied.
"""

from __future__ import annotations

from pathlib import Path

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.datafiles import read_rows
from slurm_elastico.sim.gpu_types import memory_of
from slurm_elastico.sim.truth import GroundTruth

SIA_SLOWDOWN = {"bert": 1.2, "cifar10": 1.8, "deepspeech2": 1.2, "imagenet": 1.2, "ncf": 1.5, "yolov3": 1.2}
"""Sia's per-app calibration of simulated against real step times (its simulator_config SLOWDOWNS)."""
SIA_RESTART_S = {"bert": 120.0, "cifar10": 50.0, "deepspeech2": 25.0, "imagenet": 250.0, "ncf": 15.0,
                 "yolov3": 80.0}
"""Sia's per-app checkpoint-and-restore seconds (its applications.rescale_time); other apps 30 s, as Pollux's."""
DEFAULT_RESTART_S = 30.0
PIPELINE_APPS = frozenset({"gpt_pmp"})
LAYOUT = ("a directory in Sia's layout: <app>/placements-<type>.csv, <app>/scalability-<type>.csv and "
          "<app>/validation-<batch>.csv")
PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
VALIDATION_COLUMNS = ("progress", "iteration", "grad_sqr", "grad_var")


def _columns(path: Path, rows: list[dict[str, str]], wanted: tuple[str, ...]) -> None:
    missing = [c for c in wanted if rows and c not in rows[0]]
    if missing:
        raise ConfigError(str(path), [f"missing column(s) {', '.join(missing)}; allowed: a CSV with columns "
                                      f"{','.join(wanted)} (any order)"])


def _times(path: Path, r: dict[str, str], factor: float) -> tuple[str, str]:
    try:
        return repr(float(r["step_time"]) * factor), repr(float(r["sync_time"]) * factor)
    except (TypeError, ValueError):
        raise ConfigError(str(path), [f"row {r!r}: step_time and sync_time must be numbers"]) from None


def apps_in(root: Path) -> list[str]:
    """The data-parallel apps with validation data under `root` (sorted)."""
    return sorted(d.name for d in root.iterdir() if d.is_dir() and d.name not in PIPELINE_APPS
                  and any(d.glob("validation-*.csv")))


def types_in(root: Path) -> list[str]:
    """Every GPU type some app of `root` has placements for (sorted)."""
    return sorted({f.stem.removeprefix("placements-") for app in apps_in(root)
                   for f in (root / app).glob("placements-*.csv")})


def _validation(root: Path, app: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(validation rows, iteration rows) of one app in the bundled formats."""
    valid, iters = [], []
    files = []
    for f in (root / app).glob("validation-*.csv"):
        try:
            files.append((int(f.stem.removeprefix("validation-")), f))
        except ValueError:
            raise ConfigError(str(f), [f"{f.name}: allowed: validation-<global batch>.csv"]) from None
    for batch, f in sorted(files):
        rows = read_rows(f)
        _columns(f, rows, VALIDATION_COLUMNS)
        if not rows:
            raise ConfigError(str(f), ["no rows; allowed: one row per epoch"])
        for k, r in enumerate(rows):
            valid.append({"app": app, "global_batch": str(batch), "epoch": str(k), "iteration": r["iteration"],
                          "progress": r["progress"], "grad_sqr": r["grad_sqr"], "grad_var": r["grad_var"]})
        iters.append({"app": app, "global_batch": str(batch), "iterations": str(int(float(rows[-1]["iteration"])))})
    return valid, iters


def _placements(root: Path, app: str, gpu_type: str, factor: float) -> tuple[list[dict], list[dict]]:
    """(placement + scalability rows, one-node rows) of one app on one type in the bundled formats."""
    place, one = [], []
    p = root / app / f"placements-{gpu_type}.csv"
    rows = read_rows(p)
    _columns(p, rows, PLACEMENT_COLUMNS)
    for r in rows:
        digits = (r["placement"] or "").strip()
        if not digits.isdigit():
            raise ConfigError(str(p), [f"placement {digits!r}: allowed: digits, the GPUs on each node"])
        step, sync = _times(p, r, factor)
        gpus = sum(int(c) for c in digits)
        place.append({"app": app, "num_nodes": str(len(digits)), "placement": digits, "num_replicas": str(gpus),
                      "local_bsz": r["local_bsz"], "step_time": step, "sync_time": sync})
        if len(digits) == 1:
            one.append({"app": app, "gpus": str(gpus), "local_bsz": r["local_bsz"], "step_time": step,
                        "sync_time": sync})
    s = root / app / f"scalability-{gpu_type}.csv"
    if s.is_file():
        rows = read_rows(s)
        _columns(s, rows, SCALABILITY_COLUMNS)
        for r in rows:
            step, sync = _times(s, r, factor)
            place.append({"app": app, "num_nodes": r["num_nodes"], "placement": "", "num_replicas": r["num_replicas"],
                          "local_bsz": r["local_bsz"], "step_time": step, "sync_time": sync})
    return place, one


def sia_truths(directory: str | Path, gpu_types: list[str] | tuple[str, ...], sia_model: bool = True
               ) -> dict[str, GroundTruth]:
    """One `GroundTruth` per type of `gpu_types` from a Sia-layout `directory` (see the module docstring).

    Raises `ConfigError` naming the directory when it is not one, and a type for which no app was measured
    (with the types that were).
    """
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(str(directory), [f"not a directory; allowed: {LAYOUT}"])
    apps = apps_in(root)
    if not apps:
        raise ConfigError(str(directory), [f"no <app>/validation-<batch>.csv under it; allowed: {LAYOUT}"])
    measured = types_in(root)
    missing = [t for t in gpu_types if t not in measured]
    if missing:
        raise ConfigError(str(directory), [f"no profiles (placements-{t}.csv) for GPU type {t!r}; measured types: "
                                           f"{', '.join(measured) or 'none'}" for t in missing])
    valid, iters = [], []
    for app in apps:
        v, i = _validation(root, app)
        valid += v
        iters += i
    out = {}
    for t in gpu_types:
        place, one = [], []
        for app in apps:
            if not (root / app / f"placements-{t}.csv").is_file():
                continue
            p, o = _placements(root, app, t, SIA_SLOWDOWN.get(app, 1.0) if sia_model else 1.0)
            place += p
            one += o
        out[t] = GroundTruth.from_rows(place, one, valid, iters, memory_mib=memory_of(t, str(directory)))
    return out


def restart_s(app: str) -> float:
    """Sia's checkpoint-and-restore seconds of `app` (`SIA_RESTART_S`, else `DEFAULT_RESTART_S`)."""
    return SIA_RESTART_S.get(app, DEFAULT_RESTART_S)
