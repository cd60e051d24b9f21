"""Report output: a readable table, CSV and JSON of the same rows."""

from __future__ import annotations

import csv
import dataclasses
import io

from slurm_elastico import jsonout
from slurm_elastico.report.metrics import GroupRow, JobRow


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3f}"
    return str(v)


def table(groups: list[GroupRow], jobs: list[JobRow] | None = None) -> str:
    cols = ("group", "jobs", "finished", "mean_jct_s", "median_jct_s", "mean_wait_s", "gpu_hours",
            "mps_share_hours", "reshapes")
    rows = [[_fmt(getattr(g, c)) for c in cols] for g in groups]
    out = [_columns(cols, rows)]
    if jobs:
        jcols = ("job_id", "user", "kind", "state", "jct_s", "wait_s", "runs", "reshapes", "gpu_hours", "progress",
                 "work", "steps", "samples", "name")
        jrows = [[_fmt(getattr(j, c)).replace("\n", "\\n") for c in jcols] for j in jobs]
        for j, row in zip(jobs, jrows):
            if j.runaway:
                row[jcols.index("state")] += " (runaway)"
        out += ["", _columns(jcols, jrows)]
    runaway = next((g.runaway for g in groups if g.group == "all"), 0)
    if runaway:
        out += ["", f"{runaway} runaway job(s): accounting shows them active but slurmctld no longer knows them "
                    "(their end was never recorded); their last run's GPU-hours are left out. "
                    "`sacctmgr show runawayjobs` lists and fixes them."]
    return "\n".join(out)


def _columns(header, rows) -> str:
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h)) for i, h in enumerate(header)]
    lines = ["  ".join(str(h).upper().ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def to_csv(rows: list[JobRow] | list[GroupRow]) -> str:
    if not rows:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[f.name for f in dataclasses.fields(rows[0])], lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow(dataclasses.asdict(r))
    return buf.getvalue()


def to_json(groups: list[GroupRow], jobs: list[JobRow]) -> str:
    """Groups and jobs as strict JSON (a figure that is not a number is null; times are Unix seconds)."""
    return jsonout.dumps({"groups": [dataclasses.asdict(g) for g in groups],
                          "jobs": [dataclasses.asdict(j) for j in jobs]}, indent=2)
