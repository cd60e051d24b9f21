"""What one simulation run reports: each finished job's times and work, and the run's own figures.

`engine.run` returns a `RunResult`; `metrics` summarises it, `plots` draws it
and `compare` gathers them over policies and seeds. A job the run did not
finish has no `JobResult`: it is counted in `RunResult.unfinished`, never
dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobResult:
    job_id: int
    kind: str
    app: str
    gpus: int
    submit: float
    first_start: float
    end: float
    restarts: int
    """Reshapes: requeues plus in-place relaunches."""
    work: float
    done: float
    best_s: float
    """The job alone on the cluster at its fastest shape: its share of the lower bound on mean JCT."""
    samples: float
    requests: float

    @property
    def jct(self) -> float:
        return self.end - self.submit

    @property
    def queued(self) -> float:
        return self.first_start - self.submit


@dataclass
class RunResult:
    policy: str
    seed: int
    gpus: int
    jobs: list[JobResult]
    timeline: list[tuple[float, float]]
    """(time, allocated share of all GPUs) at each epoch tick."""
    util_makespan: float
    util_arrivals: float
    """Mean allocated share while jobs still arrive (the 'cluster kept busy' figure)."""
    events: int
    epochs: int
    epochs_planned: int
    wall_s: float
    plan_s: float
    counters: dict = field(default_factory=dict)
    unfinished: int = 0
    cpu_s: float = 0.0
    """CPU time of the run's thread (its cost on one core, whatever else shared the machine; `wall_s` counts
    the time it waited for a core too)."""
    useful_per_gpu_s: float = float("nan")
    """Useful work per GPU-second: the running jobs' speeds as fractions of their speed alone on a whole GPU, summed,
    over the GPU-seconds some job held (`engine.Engine`); above 1 only where sharing paid."""
