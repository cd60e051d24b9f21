"""NVML sampler: records a GPU's (or a process's) counters at an interval, in a background thread.

Used while profiling a job solo and during its run. It must never break the
job it watches: without nvidia-ml-py, a driver or a GPU it logs once per
process that there is none and records nothing; an NVML error while sampling
stops the sampler with one log line. Counters: SM and memory-bandwidth
utilisation (0..1; per process when NVML reports it, else the whole GPU),
memory used (MiB; the watched processes' own when known), power (W, whole GPU).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)
_warned: set[str] = set()


def _say_once(message: str) -> None:
    """Log `message` as a warning the first time it comes up in this process."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def _warn_once(reason: str) -> None:
    _say_once(f"NVML sampler records nothing: {reason}")


def gpu_available(index: int = 0) -> tuple[bool, str]:
    """(True, name) when NVML sees GPU `index`, else (False, why not)."""
    try:
        import pynvml
    except ImportError:
        return False, "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return False, f"NVML did not start ({exc}); no NVIDIA driver or GPU here"
    try:
        count = pynvml.nvmlDeviceGetCount()
        if index >= count:
            return False, f"GPU index {index} requested, NVML sees {count} GPU(s)"
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
        return True, name.decode() if isinstance(name, bytes) else str(name)
    except Exception as exc:
        return False, f"NVML error: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as exc:
            _say_once(f"NVML shutdown after the GPU check failed ({exc})")


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the sampler started
    sm_util: float
    membw_util: float
    mem_used_mib: float
    power_w: float


def summarize(samples: list[Sample]) -> dict[str, float]:
    """Mean utilisation and power, peak memory, over `samples` (NaN where none): SoloProfile keywords."""
    out = {}
    for name in ("sm_util", "membw_util", "mem_used_mib", "power_w"):
        values = [getattr(s, name) for s in samples if not math.isnan(getattr(s, name))]
        out[name] = (max(values) if name == "mem_used_mib" else sum(values) / len(values)) if values else math.nan
    return out


class NvmlSampler:
    """Samples GPU `gpu_index` (an NVML index, or a GPU-/MIG- UUID) every `interval_s` between `start()` and
    `stop()`, calling `on_sample(sample)` from its thread after each; a context manager."""

    def __init__(self, gpu_index: int | str = 0, interval_s: float = 0.5, pids: tuple[int, ...] = (),
                 on_sample=None):
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self.pids = set(pids)
        self.on_sample = on_sample
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None

    def watch(self, pid: int) -> None:
        """Adds a process whose own memory and utilisation to record (e.g. after it was started)."""
        self.pids.add(pid)

    def start(self) -> NvmlSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            if isinstance(self.gpu_index, str):
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(self.gpu_index)
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.gpu_index)
            self._nvml = pynvml
        except ImportError:
            _warn_once("nvidia-ml-py (pynvml) is not installed")
            return self
        except Exception as exc:
            _warn_once(f"no NVIDIA GPU or driver ({exc})")
            return self
        self._t0 = time.monotonic()
        self._last_ts = 0
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self.sample()
            except Exception as exc:  # never into the job: stop sampling, say why once
                _warn_once(f"NVML error while sampling, sampler stopped ({exc})")
                return
            self.samples.append(sample)
            if self.on_sample is not None:
                try:
                    self.on_sample(sample)
                except Exception as exc:
                    _warn_once(f"the sample's consumer failed, sampler stopped ({exc})")
                    return
            self._stop.wait(self.interval_s)

    def sample(self) -> Sample:
        """One reading now (raises NVML errors; the thread catches them)."""
        nv, h = self._nvml, self._handle
        util = nv.nvmlDeviceGetUtilizationRates(h)
        sm, bw = util.gpu / 100.0, util.memory / 100.0
        mem = nv.nvmlDeviceGetMemoryInfo(h).used / 2**20
        if self.pids:
            procs = list(nv.nvmlDeviceGetComputeRunningProcesses(h))
            try:
                procs += list(nv.nvmlDeviceGetMPSComputeRunningProcesses(h))
            except Exception as exc:  # older drivers: no MPS listing
                _say_once(f"NVML lists no MPS clients on this driver ({exc}): a job's memory counts its "
                          "non-MPS processes only")
            used = [p.usedGpuMemory for p in procs if p.pid in self.pids and p.usedGpuMemory is not None]
            mem = sum(used) / 2**20 if used else math.nan
            try:
                per_proc = [s for s in nv.nvmlDeviceGetProcessUtilization(h, self._last_ts) if s.pid in self.pids]
                if per_proc:
                    self._last_ts = max(s.timeStamp for s in per_proc)
                    sm = sum(s.smUtil for s in per_proc) / 100.0
                    bw = sum(s.memUtil for s in per_proc) / 100.0
            except Exception as exc:  # not supported on this GPU/driver: keep the whole-GPU figures
                _say_once(f"NVML per-process utilisation is not supported here ({exc}): SM and memory bandwidth "
                          "are the whole GPU's")
        power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        return Sample(time.monotonic() - self._t0, sm, bw, mem, power)

    @property
    def sampling(self) -> bool:
        """True while the sampling thread runs (after `stop()`: only if an NVML call hangs)."""
        return self._thread is not None

    def stop(self) -> NvmlSampler:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 4 * self.interval_s))
            if not self._thread.is_alive():
                self._thread = None  # still set: a hung NVML call; the daemon thread dies with the process
        if self._nvml is not None and self._thread is None:
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:
                _say_once(f"NVML shutdown after sampling failed ({exc})")
            self._nvml = None
        return self

    def summary(self) -> dict[str, float]:
        """`summarize` of every sample so far."""
        return summarize(self.samples)

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
