"""A simulation experiment as `elastico sim` sets it up: settings, trace recipe, ground truth and model; the load sweep.

`setup` reads the `sim:` section of a YAML file, applies the command line's
overrides and returns a trace factory per seed (`trace.load`); `load_sweep`
runs `compare.compare` at several offered loads and `write_sweep` saves the
result (sweep.json, load_sweep.png); `ProgressBar` shows the runs' progress.
The command: `slurm_elastico.cli.sim`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path


def setup(cfg, trace_name, jobs, load, infer_fraction, hours, gpus, epoch_s, window_s, colocation, sim_config):
    """`cfg`, the simulator's settings, the ground truth, a trace factory `make(seed)` and `cfg`'s slowdown model."""
    import yaml

    from slurm_elastico.interference import load_model
    from slurm_elastico.sim import settings as sim_settings
    from slurm_elastico.sim import trace as traces
    from slurm_elastico.sim.truth import GroundTruth

    data = {}
    if sim_config:
        with open(sim_config) as fh:
            data = (yaml.safe_load(fh) or {}).get("sim", {})
    sim = sim_settings.from_mapping(data, sim_config or "sim")
    changes = {k: v for k, v in (("gpus", gpus), ("epoch_s", epoch_s), ("placement_window_s", window_s),
                                 ("colocation", colocation)) if v is not None}
    sim = sim_settings.replace(sim, **changes)
    truth = GroundTruth()

    def make(seed: int):
        return traces.load(trace_name, truth, seed, n_jobs=jobs, gpus=sim.gpus, load=load,
                           infer_fraction=infer_fraction, hours=hours, gpu_memory_mib=sim.gpu_memory_mib)

    return cfg, sim, truth, make, load_model(cfg.interference.model)


def load_sweep(setup_for: Callable[[float], tuple], loads: Iterable[float], names: Sequence[str], seeds: int,
               progress, each: Callable[[float, dict], None] | None = None) -> tuple[dict, dict]:
    """Every policy of `names` over seeds 0..seeds-1 at each load: mean JCT per policy and load, each load's report.

    `setup_for(load)` gives `(settings, sim settings, truth, make, model)`;
    `each(load, aggregated)` is called after each load.
    """
    from slurm_elastico.sim import compare as cmp

    sweep: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    report = {}
    for ld in loads:
        cfg, sim_s, truth, make, model = setup_for(ld)
        res = cmp.compare(make, names, range(seeds), cfg, sim_s, model, truth, progress)
        agg = res.aggregated()
        for n in names:
            sweep[n].append((ld, *agg[n]["mean_jct_h"]))
        report[str(ld)] = res.to_json()
        if each is not None:
            each(ld, agg)
    return sweep, report


def write_sweep(sweep: dict, report: dict, out: str) -> None:
    """sweep.json and load_sweep.png in `out`."""
    from slurm_elastico.sim import plots

    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "sweep.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    plots.load_sweep(sweep, Path(out) / "load_sweep.png")


class ProgressBar:
    """`compare.compare`'s progress callback as a one-line bar on stderr: policy, seed, percent of jobs done, time."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.t0 = time.monotonic()

    def __call__(self, policy: str, seed: int, frac: float) -> None:
        if not self.enabled:
            return
        n = int(30 * frac)
        sys.stderr.write(f"\r{policy:>16} seed {seed} [{'#' * n}{'.' * (30 - n)}] {100 * frac:5.1f}% "
                         f"{time.monotonic() - self.t0:6.0f}s")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
