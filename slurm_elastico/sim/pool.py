"""Independent simulation runs on worker processes: the same results as one after another, sooner.

`Runs(truth, workers)` takes `engine.run` calls (`submit`) and hands back
futures. With one worker each run happens at once in this process, in
submission order (an error is raised by `submit`); with more, a process pool runs them side by side. A run
depends only on its inputs (the engine is deterministic and seeds its own
draws), so a run's result is the same either way, whichever worker takes it
and whatever ran before it there. The ground truth goes to each worker once,
when it starts (its caches then warm up over the runs it takes, as in one
process); traces, settings and the slowdown model go with each run.

Worker processes are started by a fork server where the platform has one
(Linux), else spawned: never forked from this process, which may hold
threads by then (the pool's own among them; Python 3.12+ warns that a fork
then may deadlock the child). Each worker imports the simulator once.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.sim import engine
from slurm_elastico.sim.results import RunResult
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.trace import TraceJob
from slurm_elastico.sim.truth import GroundTruth

_TRUTH: GroundTruth | None = None
"""The ground truth of this worker process (set once by `_start`)."""


def _start(truth: GroundTruth) -> None:
    global _TRUTH
    _TRUTH = truth


def _run(trace: Sequence[TraceJob], policy: str, settings: Settings, sim: SimSettings,
         model: SlowdownModel | None, seed: int) -> RunResult:
    return engine.run(trace, policy, settings, sim, model, _TRUTH, seed)


def default_workers() -> int:
    """The CPUs this process may use (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


class Runs:
    """Simulation runs on `workers` processes (1: in this process, each at once when submitted)."""

    def __init__(self, truth: GroundTruth, workers: int = 1):
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"workers must be an integer of at least 1, not {workers!r}")
        self.truth = truth
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        if workers > 1:
            method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
            self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                                             initializer=_start, initargs=(truth,))

    @property
    def here(self) -> bool:
        """Whether runs happen in this process (one worker)."""
        return self._pool is None

    def submit(self, trace: Sequence[TraceJob], policy: str, settings: Settings, sim: SimSettings,
               model: SlowdownModel | None, seed: int, on_progress: Callable[[float], None] | None = None
               ) -> Future:
        """A future of `engine.run(trace, policy, settings, sim, model, self.truth, seed, on_progress)`;
        `on_progress` only when runs happen here (a worker's progress stays in the worker)."""
        if self._pool is not None:
            return self._pool.submit(_run, list(trace), policy, settings, sim, model, seed)
        done: Future = Future()  # run now; an error is raised at once
        done.set_result(engine.run(trace, policy, settings, sim, model, self.truth, seed, on_progress))
        return done

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Runs:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
