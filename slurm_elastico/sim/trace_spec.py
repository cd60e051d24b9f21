"""A trace by its spec string (`elastico sim --trace`): which source it names, and whether a seed changes it.

`synthetic`, `pollux:N`, `pollux1:N` (the same on one GPU each),
`philly[:PATH]`, `alibaba:PATH`, `sia:PATH` (a workload of Sia's, which is
in Pollux's format: `trace_pollux.pollux` reads it), or a CSV path in the
trace format (`trace.read_csv`).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.trace import TraceJob, read_csv
from slurm_elastico.sim.trace_alibaba import alibaba
from slurm_elastico.sim.trace_philly import philly
from slurm_elastico.sim.trace_pollux import POLLUX_COLUMNS, pollux
from slurm_elastico.sim.trace_synthetic import MixSpec, synthetic
from slurm_elastico.sim.truth import GroundTruth

SEEDED = ("synthetic", "philly", "alibaba")
"""Trace kinds that draw from the seed; the others (pollux, pollux1, a CSV) give the same jobs at the same times."""


def is_fixed(name: str) -> bool:
    """Whether the trace spec `name` (as `load` takes it) gives the same jobs at the same times for every seed."""
    return name.partition(":")[0] not in SEEDED


def load(name: str, truth: GroundTruth, seed: int = 0, **kw) -> list[TraceJob]:
    """A trace by spec string: `synthetic`, `pollux:N`, `pollux1:N` (single GPU), `philly[:PATH]`, `alibaba:PATH`,
    `sia:PATH`, or a CSV path."""
    kind, _, arg = name.partition(":")
    if kind == "synthetic":
        return synthetic(MixSpec(**{k: v for k, v in kw.items() if k in {f.name for f in fields(MixSpec)}}), seed, truth)
    if kind in ("pollux", "pollux1"):
        return pollux(int(arg) if arg.isdigit() else (arg or 1), truth, single_gpu=kind == "pollux1")
    if kind == "philly":
        return philly(arg or None, truth, seed, hours=kw.get("hours", 24.0))
    if kind == "sia":
        if not arg:
            raise ConfigError("trace", ["sia needs a path: sia:PATH/workload-N.csv (Sia's workload format, "
                                        f"{','.join(('name',) + POLLUX_COLUMNS)})"])
        return pollux(arg, truth)
    if kind == "alibaba":
        if not arg:
            raise ConfigError("trace", ["alibaba needs a path: alibaba:PATH/openb_pod_list_default.csv"])
        return alibaba(arg, truth, seed)
    p = Path(name)
    if p.suffix == ".csv" or p.is_file():
        return read_csv(p, truth)
    raise ConfigError("trace", [f"{name!r} is not a trace; allowed: synthetic, pollux:N, pollux1:N, philly[:PATH], "
                                "alibaba:PATH, sia:PATH, or a CSV file in the trace format"])
