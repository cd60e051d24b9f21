"""A simulation experiment as `elastico sim` sets it up: settings, trace recipe, ground truth and model; the load sweep.

`setup` reads the `sim:` section of a YAML file, applies the command line's
overrides and returns a trace factory per seed (`trace_spec.load`), every trace
checked runnable on the cluster (`check_runnable`: some job, none asking
more GPUs or GPU memory than there are), and says what a seed varies. A
fixed trace (Pollux, a CSV) is loaded once and each seed's replica gets its
own arrival jitter (`trace.jitter_arrivals`, ±`jitter_s`), so seeds vary
something real besides the profiling noise. `load_sweep`
runs `compare.compare` at several offered loads (`parse_loads` reads them
from `--loads`), `check_sweep` refuses a sweep with unfinished jobs, and
`write_sweep` saves the result (sweep.json, load_sweep.png); `ProgressBar`
shows the runs' progress.
The command: `slurm_elastico.cli.sim`.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from slurm_elastico import jsonout
from slurm_elastico.sim.belief import efficiency_sigma


class Setup(NamedTuple):
    cfg: Any
    sim: Any
    truth: Any
    make: Callable[[int], list]
    """The trace of a seed."""
    model: Any
    seed_varies: str
    """What a seed changes, in words (`Comparison.seed_varies`)."""


def seed_varies(trace_name: str, jitter_s: float, sim) -> str:
    """What differs between seeds of `trace_name`: the trace itself, the jobs' drawn apps, or arrival jitter; and
    the errors of the planner's estimates (`sim.belief`, under `sim`'s SimSettings). Says so when nothing does
    (then "± 0" is not replication)."""
    from slurm_elastico.sim import trace_spec

    kind = trace_name.partition(":")[0]
    if kind == "synthetic":
        parts = ["the synthetic trace itself (arrivals, durations, apps and batches, inference sizes)"]
    elif not trace_spec.is_fixed(trace_name):
        parts = ["the app and global batch drawn for each job (arrivals and durations are the trace's)"]
    elif jitter_s > 0:
        parts = [f"the arrival jitter (each arrival moved by a seeded uniform offset within ±{jitter_s:g} s)"]
    else:
        parts = []
    sigmas = ({"shape": sim.profile_noise} if sim.cluster else  # typed: each type's profile (sim.families_typed)
              {"app": sim.estimate_app_sigma, "job": sim.estimate_job_sigma, "shape": sim.profile_noise,
               "share exponent": sim.estimate_share_sigma, "scaling exponent": sim.estimate_scaling_sigma,
               "statistical efficiency": efficiency_sigma(sim)})
    if any(sigmas.values()):
        parts.append("the errors of the planner's estimates (lognormal sigmas: " + ", ".join(
            f"{k} {v:g}" for k, v in sigmas.items() if v) + "; sim.belief)")
    if not parts:
        return "nothing (arrival jitter and estimate errors are off): every seed replays the same run"
    return " and ".join(parts)


def check_runnable(jobs, truth, sim, source: str) -> None:
    """Raise one `ConfigError` unless every job can run on the cluster of `sim`: `trace.check_cluster` (some job,
    none asking more GPUs than there are), then GPU memory: a one-GPU training job whose smallest micro-batch, or
    an inference job whose smallest vLLM shape, does not fit in a GPU would never get a shape."""
    from slurm_elastico.errors import ConfigError
    from slurm_elastico.sim import families
    from slurm_elastico.sim import trace as traces

    traces.check_cluster(jobs, sim.gpus, source)
    mem = float(sim.gpu_memory_mib)
    problems = []
    for j in jobs:
        if j.kind == "train" and j.gpus == 1:
            m = min(families.micro_batches(truth, j.app, j.global_batch))
            need = truth.train_mem_mib(j.app, m)
            if need > mem:
                problems.append(f"job {j.job_id} ({j.app}, global batch {j.global_batch}) needs {need:.0f} MiB of "
                                f"GPU memory at its smallest micro-batch {m}; a GPU has {mem:.0f} MiB "
                                "(sim.gpu_memory_mib)")
        elif j.kind == "infer" and not any(
                truth.infer_speed(j.context_tokens, j.generated_tokens, g, n, kv, 100, mem) > 0
                for g in families.GMUS for n in families.SEQS for kv in families.KV):
            problems.append(f"job {j.job_id} (inference) fits no vLLM shape in a GPU of {mem:.0f} MiB "
                            "(sim.gpu_memory_mib)")
    if problems:
        raise ConfigError(source, problems)


def setup(cfg, trace_name, jobs, load, infer_fraction, hours, gpus, epoch_s, window_s, colocation, sim_config,
          jitter_s=None, cluster=None, profiles=None, type_blind=None) -> Setup:
    """`cfg`, the simulator's settings, the ground truth, a trace factory `make(seed)`, `cfg`'s slowdown model and
    what a seed varies. `jitter_s` (default `trace.DEFAULT_JITTER_S`) jitters a fixed trace's arrivals per seed.

    `cluster`, `profiles` and `type_blind` override the settings' (`--cluster`, `--profiles`, `--type-blind`): a
    cluster of GPU types gets a `truth_types.TypedTruth` read from the profiles (`profiles_sia`) as its truth, its
    total GPUs as `sim.gpus`, and its traces read with the reference type's truth and checked runnable on every
    type (`families_typed.check_typed`)."""
    from slurm_elastico.errors import ConfigError
    from slurm_elastico.inputs import read_yaml
    from slurm_elastico.interference import load_model
    from slurm_elastico.sim import settings as sim_settings
    from slurm_elastico.sim import trace as traces
    from slurm_elastico.sim import trace_spec
    from slurm_elastico.sim import gpu_types
    from slurm_elastico.sim.families_typed import check_typed
    from slurm_elastico.sim.truth import GroundTruth
    from slurm_elastico.sim.truth_types import TypedTruth

    data = {}
    if sim_config:
        whole = read_yaml(sim_config, "settings file") or {}
        if not isinstance(whole, dict):
            raise ConfigError(sim_config, [f"(top level): expected a mapping with a `sim:` section, got "
                                           f"{type(whole).__name__}"])
        data = whole.get("sim", {})
    sim = sim_settings.from_mapping(data, sim_config or "sim")
    changes = {k: v for k, v in (("gpus", gpus), ("epoch_s", epoch_s), ("placement_window_s", window_s),
                                 ("colocation", colocation), ("cluster", cluster), ("profiles", profiles),
                                 ("type_blind", type_blind)) if v is not None}
    sim = sim_settings.replace(sim, **changes)
    groups = gpu_types.parse_cluster(sim.cluster, "sim.cluster") if sim.cluster else ()
    if groups:
        sim = sim_settings.replace(sim, gpus=sum(g.gpus for g in groups))
        truth = TypedTruth.from_sia(sim.profiles, [g.gpu_type for g in groups], sim.sia_model)
        ref = truth.reference
    else:
        truth = ref = GroundTruth()
    jitter = traces.DEFAULT_JITTER_S if jitter_s is None else float(jitter_s)

    def load_seed(seed: int):
        got = trace_spec.load(trace_name, ref, seed, n_jobs=jobs, gpus=sim.gpus, load=load,
                              infer_fraction=infer_fraction, hours=hours, gpu_memory_mib=sim.gpu_memory_mib)
        if groups:
            traces.check_cluster(got, sim.gpus, trace_name)
            check_typed(got, truth, groups, trace_name)
        else:
            check_runnable(got, truth, sim, trace_name)
        return got

    if trace_spec.is_fixed(trace_name):
        base = load_seed(0)  # before any run: a bad trace fails at once

        def make(seed: int):
            return traces.jitter_arrivals(base, seed, jitter)
    else:
        make = load_seed
        jitter = 0.0
    return Setup(cfg, sim, truth, make, load_model(cfg.interference.model),
                 seed_varies(trace_name, jitter, sim))


def load_sweep(setup_for: Callable[[float], Setup], loads: Iterable[float], names: Sequence[str], seeds: int,
               progress, each: Callable[[float, Any], None] | None = None) -> tuple[dict, dict, list]:
    """Every policy of `names` over seeds 0..seeds-1 at each load: mean JCT per policy and load, each load's report,
    and the comparisons (check each with `check_complete`: a load with unfinished jobs is not a result).

    `setup_for(load)` gives a `Setup`; `each(load, comparison)` is called after each load. A sweep point is
    (load, mean, 95 % half-width, unfinished jobs over the seeds).
    """
    from slurm_elastico.sim import compare as cmp

    sweep: dict[str, list[tuple[float, float, float, int]]] = {n: [] for n in names}
    report = {}
    results = []
    for ld in loads:
        s = setup_for(ld)
        res = cmp.compare(s.make, names, range(seeds), s.cfg, s.sim, s.model, s.truth, progress, s.seed_varies)
        agg = res.aggregated()
        left = res.unfinished()
        for n in names:
            sweep[n].append((ld, *agg[n]["mean_jct_h"], sum(c for c, _ in left[n].values())))
        report[str(ld)] = res.to_json()
        results.append(res)
        if each is not None:
            each(ld, res)
    return sweep, report, results


MAX_LOADS = 64
"""The most offered loads one sweep takes (`elastico sim compare --loads`)."""


def parse_loads(text: str) -> list[float]:
    """Offered loads from comma-separated text (`--loads`): each a finite number > 0, at most `MAX_LOADS` of them.

    Raises one `ConfigError` from "--loads" naming the values that are not loads (the first five), or the count.
    """
    from slurm_elastico.errors import ConfigError
    from slurm_elastico.inputs import clip

    bad = []
    loads = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            bad.append(clip(repr(part.strip())))
        loads.append(value)
    if bad:
        raise ConfigError("--loads", [f"{', '.join(bad[:5])} is not a load; allowed: comma-separated numbers > 0 "
                                      "(e.g. 0.5,1,2)"])
    if len(loads) > MAX_LOADS:
        raise ConfigError("--loads", [f"{len(loads)} loads; allowed: at most {MAX_LOADS}"])
    return loads


def check_sweep(loads: Sequence[float], results: Sequence[Any]) -> None:
    """Raise `compare.Incomplete` naming each policy, load and seed whose run left jobs unfinished (`results`: the
    comparisons of `load_sweep`, one per load): a sweep point with unfinished jobs is not a result."""
    from slurm_elastico.sim import compare as cmp

    bad = [(f"{p} at load {ld:g}", sd, c, n) for ld, res in zip(loads, results) for p, sd, c, n in res.incomplete()]
    if bad:
        raise cmp.Incomplete(bad)


def write_sweep(sweep: dict, report: dict, out: str) -> None:
    """sweep.json and load_sweep.png in `out`."""
    from slurm_elastico.sim import plots

    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "sweep.json").write_text(jsonout.dumps(report, indent=2, sort_keys=True))
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
