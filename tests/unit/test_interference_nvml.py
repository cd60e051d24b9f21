import logging
import math
import sys
import types

import pytest

from slurm_elastico.interference import nvml
from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.errors import MeasurementError, NoGpuError
from slurm_elastico.interference.measure import measure_pair, parse_throughput


def _fake_pynvml(fail_after: int | None = None):
    calls = {"n": 0}

    class NVMLError(Exception):
        pass

    def util(h):
        calls["n"] += 1
        if fail_after is not None and calls["n"] > fail_after:
            raise NVMLError("GPU is lost")
        return types.SimpleNamespace(gpu=80, memory=40)

    mod = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: object(), nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlDeviceGetUtilizationRates=util,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=3 * 2**30),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=42, usedGpuMemory=2**30)],
        nvmlDeviceGetMPSComputeRunningProcesses=lambda h: [],
        nvmlDeviceGetProcessUtilization=lambda h, ts: [types.SimpleNamespace(pid=42, smUtil=30, memUtil=20, timeStamp=5)],
        nvmlDeviceGetPowerUsage=lambda h: 250_000,
    )
    return mod


def _no_nvml(monkeypatch):
    def boom():
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=boom, nvmlShutdown=lambda: None))
    monkeypatch.setattr(nvml, "_warned", set())


def test_without_gpu_records_nothing_and_says_so_once(monkeypatch, caplog):
    _no_nvml(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=nvml.__name__):
        for _ in range(3):
            with nvml.NvmlSampler(interval_s=0.01) as s:
                pass
            assert s.samples == [] and math.isnan(s.summary()["sm_util"])
    assert sum("records nothing" in r.message for r in caplog.records) == 1
    assert nvml.gpu_available()[0] is False


def test_samples_process_counters_with_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    s = nvml.NvmlSampler(interval_s=0.01, pids=(42,)).start()
    s.stop()
    assert s.samples, "the thread took at least one sample"
    summary = s.summary()
    assert summary["sm_util"] == pytest.approx(0.30) and summary["membw_util"] == pytest.approx(0.20)
    assert summary["mem_used_mib"] == pytest.approx(1024) and summary["power_w"] == pytest.approx(250)
    assert nvml.gpu_available() == (True, "Fake GPU")


def test_nvml_error_while_sampling_stops_quietly(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail_after=2))
    monkeypatch.setattr(nvml, "_warned", set())
    with caplog.at_level(logging.WARNING, logger=nvml.__name__):
        with nvml.NvmlSampler(interval_s=0.001) as s:
            for _ in range(200):
                if s._thread is not None and not s._thread.is_alive():
                    break
                __import__("time").sleep(0.005)
    assert len(s.samples) == 2
    assert any("GPU is lost" in r.message for r in caplog.records)


def test_a_per_process_counter_the_driver_lacks_is_said_once_and_the_whole_gpu_figures_kept(monkeypatch, caplog):
    fake = _fake_pynvml()

    def unsupported(h, ts):
        raise RuntimeError("Not Supported")

    fake.nvmlDeviceGetProcessUtilization = unsupported
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml, "_warned", set())
    with caplog.at_level(logging.WARNING, logger=nvml.__name__):
        s = nvml.NvmlSampler(interval_s=0.01, pids=(42,))
        s.start()
        first, second = s.sample(), s.sample()
        s.stop()
    assert (first.sm_util, first.membw_util) == (0.8, 0.4) == (second.sm_util, second.membw_util)
    said = [r.message for r in caplog.records if "per-process utilisation" in r.message]
    assert len(said) == 1 and "Not Supported" in said[0]


def test_measure_refuses_without_gpu(monkeypatch):
    _no_nvml(monkeypatch)
    p = SoloProfile(kind="train")
    with pytest.raises(NoGpuError, match="needs an NVIDIA GPU"):
        measure_pair(["true"], ["true"], p, p, "h100")


def test_parse_throughput():
    assert parse_throughput("step 1\nELASTICO_THROUGHPUT=3.5\nELASTICO_THROUGHPUT=4e2\n", "a") == 400.0
    with pytest.raises(MeasurementError, match="printed no line"):
        parse_throughput("done\n", "workload a")
    with pytest.raises(MeasurementError, match="positive"):
        parse_throughput("ELASTICO_THROUGHPUT=0\n", "workload a")
