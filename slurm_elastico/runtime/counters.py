"""A job's GPU counters: NVML sampled by elastico-run while the program runs, read by the helper.

`elastico-run` starts a `CounterRecorder` for each launch of the program when
the job has a GPU (CUDA_VISIBLE_DEVICES set). Every `every_s` seconds it
replaces (write, fsync, rename) `counters_path(<working directory>, <job id>)`,
beside the progress report, with the means of the samples since the previous
write (memory: the peak):

    {"version": 1, "sm_util": 0.62, "membw_util": 0.31, "mem_used_mib": 5120.0, "power_w": 210.5,
     "since": 1764489590.0, "updated": 1764489600.0}

The helper keeps them with the job's solo speed when the job ran alone over
that time (`slurm_elastico.helper.observe`), so the interference model sees the
job's measured counters instead of a guess from its kind and share.

Which GPU: the first entry of CUDA_VISIBLE_DEVICES, a UUID as is, an index as
NVML's index. Without device cgroups Slurm gives physical indices, which NVML
numbers the same way (both by PCI bus when CUDA_DEVICE_ORDER=PCI_BUS_ID);
with ConstrainDevices NVML should see only the job's GPUs, from 0, as CUDA does.
Without nvidia-ml-py, a driver or a GPU the sampler says so once and nothing
is written; nothing here ever fails the job. Not yet run on a GPU: tested
against a fake NVML only (the index rule under cgroups is the part to check
on real hardware).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path

from slurm_elastico.interference.nvml import NvmlSampler, Sample, summarize
from slurm_elastico.model import Counters
from slurm_elastico.runtime.progress import MAX_NUMBER, VERSION, number, progress_path, read_report, write_report

log = logging.getLogger(__name__)

FIELDS = ("sm_util", "membw_util", "mem_used_mib", "power_w")


def counters_path(work_dir: str | os.PathLike[str], job_id: int | str) -> Path:
    """Where elastico-run writes the job's counters: beside its progress report."""
    return progress_path(work_dir, job_id).with_name("counters.json")


def gpu_of(env: Mapping[str, str]) -> int | str | None:
    """The GPU to watch (NVML index or UUID) from the job's environment; None when the job has no GPU."""
    visible = (env.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    if not visible or visible == "-1" or visible.lower() == "nodevfiles":
        return None
    return int(visible) if visible.isdigit() else visible  # an index, or GPU-<uuid> / MIG-<uuid>


def write_counters(path: str | os.PathLike[str], counters: Counters, since: float, updated: float) -> None:
    values = {f: getattr(counters, f) for f in FIELDS}
    write_report(path, {"version": VERSION, "since": since, "updated": updated,
                        **{f: (None if math.isnan(v) else v) for f, v in values.items()}})


def read_counters(path: str | os.PathLike[str]) -> tuple[Counters, float, float] | None:
    """(counters, since, updated) at `path`, None when there are none; `ReportError` when unusable."""
    d = read_report(path, "counters")
    if d is None:
        return None
    source = str(path)
    values = {f: number(d, f, source, required=False, high=1.0 if f.endswith("_util") else MAX_NUMBER)
              for f in FIELDS}
    return Counters(**values), number(d, "since", source), number(d, "updated", source)


class CounterRecorder:
    """Samples the job's GPU while the program runs and writes the counters report every `every_s` seconds."""

    def __init__(self, path: str | os.PathLike[str], gpu: int | str, every_s: float = 10.0, interval_s: float = 1.0,
                 clock=time.time):
        self.path, self.every_s, self.clock = Path(path), every_s, clock
        self.sampler = NvmlSampler(gpu, interval_s, on_sample=self._on_sample)
        self._batch: list[Sample] = []
        self._since = clock()

    def start(self, pid: int) -> CounterRecorder:
        self._since = self.clock()
        self.sampler.watch(pid)
        self.sampler.start()
        return self

    def stop(self) -> None:
        self.sampler.stop()
        if not self.sampler.sampling:  # joined: nobody else writes now (a hung NVML call keeps it alive)
            self._flush()

    def _on_sample(self, sample: Sample) -> None:
        self._batch.append(sample)
        if self.clock() - self._since >= self.every_s:
            self._flush()

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        self.sampler.samples.clear()  # the report keeps what matters; a job may run for days
        if not batch:
            return
        now = self.clock()
        try:
            write_counters(self.path, Counters(**summarize(batch)), self._since, now)
        except OSError as exc:
            log.warning("GPU counters are not written: %s: %s", self.path, exc)
        self._since = now
