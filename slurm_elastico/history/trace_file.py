"""The history trace file: one past GPU job a row (`past.PastJob`), written whole or not at all.

The format (CSV, header required; times are Unix seconds, an empty cell is
"none": no start for a job still pending, no end for one not ended)::

    job_id,submit,start,end,wait_s,run_s,state,gpus,mps,gpu_type,cpus,mem_mib,nodes,time_limit_s,restarts,user,account,partition,family,kind,name,ran_on,ran_type
    4101,1796007310,1796007312,1796007316,2,4,COMPLETED,1,0,a100,4,16000,1,3600,0,alice,ml,gpu,,,resnet,gpu-a1,a100
    4102_3,1796007320,,,,,PENDING,0,50,,1,4000,1,,0,bob,ml,gpu,tiny-lm,train,lm,,

`wait_s` is first start minus submission, `run_s` last end minus first
start (restarts included). A job of an array is written `ARRAY_TASK`.
`family`/`kind` are set for jobs that came through `elastico-submit`;
`name` is the job's name, `ran_on` the first node of its last run that got
nodes and `ran_type` the GPU type that run was given (where accounting
records typed GPUs); a file written before it had these columns reads them
empty.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

from slurm_elastico.atomic import write_atomic
from slurm_elastico.errors import ConfigError
from slurm_elastico.history.past import PastJob

COLUMNS = ("job_id", "submit", "start", "end", "wait_s", "run_s", "state", "gpus", "mps", "gpu_type", "cpus",
           "mem_mib", "nodes", "time_limit_s", "restarts", "user", "account", "partition", "family", "kind", "name",
           "ran_on", "ran_type")
_STORED = tuple(f.name for f in fields(PastJob))
_INTS = ("submit", "start", "end", "gpus", "mps", "cpus", "mem_mib", "nodes", "time_limit_s", "restarts")
_OPTIONAL = ("start", "end", "time_limit_s")
_LATER = ("name", "ran_on", "ran_type")
"""Columns added since the format began: a file without them reads, with them empty."""


def render(jobs: Iterable[PastJob]) -> str:
    """The file's text."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    for j in jobs:
        cells = {**{k: getattr(j, k) for k in _STORED}, "wait_s": j.wait_s, "run_s": j.run_s}
        w.writerow(["" if cells[c] is None else cells[c] for c in COLUMNS])
    return out.getvalue()


def write(jobs: Iterable[PastJob], path: str | os.PathLike[str]) -> None:
    """Replace `path` with the trace (`atomic.write_atomic`): a file there is the old one or the whole new one."""
    write_atomic(path, lambda f: f.write(render(jobs).encode("utf-8")))


def read(path: str | os.PathLike[str]) -> list[PastJob]:
    """The jobs of a trace file; `ConfigError` naming the row and column of any cell that does not read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [f"cannot be read: {exc}"]) from None
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in _STORED if c not in (reader.fieldnames or ()) and c not in _LATER]
    if missing:
        raise ConfigError(str(path), [f"missing column(s) {', '.join(missing)}; the format is {','.join(COLUMNS)}"])
    jobs, problems = [], []
    for i, row in enumerate(reader, start=2):
        values = {}
        for c in _STORED:
            cell = (row.get(c) or "").strip()
            if c in _INTS:
                if cell == "" and c in _OPTIONAL:
                    values[c] = None
                    continue
                try:
                    values[c] = int(cell)
                except ValueError:
                    problems.append(f"line {i}, {c} = {cell!r}: not an integer" + (" (or empty)" if c in _OPTIONAL
                                                                                     else ""))
                    continue
            else:
                values[c] = cell
        if len(values) == len(_STORED):
            jobs.append(PastJob(**values))
    if problems:
        raise ConfigError(str(path), problems)
    return jobs
