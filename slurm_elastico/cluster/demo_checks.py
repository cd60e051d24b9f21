"""The demo's checks of the work: every job did exactly its work, and the machine kept pace with the emulated GPUs.

Both read what the paced programs (wrappers/demo) print: a JSON summary line at the end of each run of a job.
A failed check raises `DemoError`, naming the job, what went wrong and where its output is; a run that fell behind
its emulated GPUs is flagged with a warning (its JCTs are then the machine's, not the schedule's).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from slurm_elastico.cluster import demo_workload as workload
from slurm_elastico.errors import ElasticoError


class DemoError(ElasticoError):
    """The demo's workload did not finish as it must (names the job and what went wrong)."""


PACE_TOLERANCE = 0.05
"""A run whose jobs ended, on average, more than this fraction of its mean JCT after their emulated GPUs would
have finished them is flagged: the machine did not keep pace, and its JCTs are longer than the truth's."""


def summaries(path: Path) -> list[dict]:
    """The JSON summary line each run of a paced job printed when it ended, in order (none: no output file)."""
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.startswith("{")] if path.exists() else []


def ended_late(path: Path) -> float:
    """Seconds after its emulated GPU the job ended: the sum over its runs' summary lines (`pacing.finish`), as a
    relaunched run's emulated start is the previous run's stop plus the restart cost, so each run's delay carries
    over to the job's end. A summary without the figure is an error: every paced run prints it."""
    runs = summaries(path)
    missing = [i for i, run in enumerate(runs) if "ended_late_s" not in run]
    if missing:
        raise DemoError(f"{path}: run(s) {missing} printed no ended_late_s in their summary "
                        "(see cluster.pacing.finish)")
    return sum(float(run["ended_late_s"]) for run in runs)


def pace_lines(lag: dict[str, list[float]], figures: dict[str, dict]) -> list[str]:
    """How far each live run fell behind its emulated GPUs, and a warning for a run that did not keep pace."""
    out = ["emulated GPUs: how long after their emulated GPUs would have finished them the jobs ended (start-up "
           "included): " + "; ".join(f"{mode} mean {np.mean(v):.1f} s, max {max(v):.1f} s" for mode, v in lag.items())]
    for mode, v in lag.items():
        share = float(np.mean(v)) / figures[mode]["mean_jct_s"]
        if share > PACE_TOLERANCE:
            out.append(f"warning: the {mode} run did not keep pace with its emulated GPUs (its jobs ended "
                       f"{100 * share:.0f} % of its mean JCT late on average; more than {100 * PACE_TOLERANCE:.0f} % "
                       "is the machine, not the schedule): the real code, or its start-up, ran slower than the GPUs "
                       "it emulates, so its JCTs are longer than the simulator's truth gives and the comparison "
                       "with the simulator does not check the simulator. Run the demo again on a less loaded machine.")
    return out


def check_output(path: Path, job_id: int, job: workload.DemoJob) -> None:
    """The last JSON line of the job's final run says the work is complete."""
    runs = summaries(path)
    if not runs:
        raise DemoError(f"job {job_id} ({job.name}) printed no summary; see {path}")
    last = runs[-1]
    if job.kind == "train" and not (last.get("status") == "done" and last.get("step") == job.work):
        raise DemoError(f"training job {job_id} ({job.name}) ended at step {last.get('step')} of {job.work} "
                        f"({last.get('status')}); see {path}")
    if job.kind == "infer" and not (last.get("status") == "done" and last.get("done") == last.get("total") == job.work):
        raise DemoError(f"inference job {job_id} ({job.name}) answered {last.get('done')}/{last.get('total')} of "
                        f"{job.work}; see {path}")
