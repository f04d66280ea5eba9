"""GPU-side measurements where there may be no GPU: NVML telemetry and calibration.

On this CPU machine NVML is really absent; a GPU whose driver refuses some fields is
faked (a real one cannot be made to refuse on demand).
"""

from __future__ import annotations

import itertools
import stat
import sys
import time
import types
from pathlib import Path

import pytest

from runner.measure import nvml
from runner.measure.calibrate import Calibration, calibrate
from runner.measure.nvml import NvmlSampler, gpu_info
from tests.conftest import VLLM_VENV


def _nvml_works() -> bool:
    return gpu_info(0) is not None


@pytest.mark.skipif(_nvml_works(), reason="this machine has a working NVML and GPU")
def test_no_nvidia_driver_is_recorded_not_raised() -> None:
    assert gpu_info(0) is None
    with NvmlSampler(gpu_index=0, interval_s=0.01) as sampler:
        time.sleep(0.05)
    assert sampler.available is False
    assert sampler.samples == []
    assert len(sampler.warnings) == 1 and "NVML" in sampler.warnings[0]
    assert sampler.energy_delta_j() is None
    assert sampler.summary()["n_samples"] == 0


@pytest.mark.skipif(not _nvml_works(), reason="no NVIDIA driver or GPU here")
def test_real_gpu_is_sampled() -> None:
    info = gpu_info(0)
    assert info is not None and info["name"] and info["driver_version"]
    with NvmlSampler(gpu_index=0, interval_s=0.05) as sampler:
        time.sleep(0.5)
    assert sampler.available
    assert len(sampler.samples) >= 5
    assert all(s.memory_used_bytes is not None for s in sampler.samples)


class _FakeNVMLError(Exception):
    pass


def _fake_pynvml(*, device_count: int = 1, energy_supported: bool = True) -> types.ModuleType:
    """A pynvml whose one GPU reports fixed values and a growing energy counter."""
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 0, 2, 0  # type: ignore[attr-defined]
    m.NVMLError = _FakeNVMLError  # type: ignore[attr-defined]
    state = {"energy_mj": 1_000_000, "inits": 0}

    def get_handle(i: int) -> str:
        if i >= device_count:
            raise _FakeNVMLError("Invalid Argument")
        return f"gpu{i}"

    def energy(h: str) -> int:
        if not energy_supported:
            raise _FakeNVMLError("Not Supported")
        state["energy_mj"] += 500  # 0.5 J per sample
        return state["energy_mj"]

    def init() -> None:
        state["inits"] += 1

    def shutdown() -> None:
        state["inits"] -= 1

    m.nvmlInit = init  # type: ignore[attr-defined]
    m.nvmlShutdown = shutdown  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = get_handle  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: "580.65.06"  # type: ignore[attr-defined]
    m.nvmlSystemGetCudaDriverVersion = lambda: 13000  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = lambda h: "GPU-fake"  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=150_000_000_000, used=1_000_000_000)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxClockInfo = lambda h, c: 1980 if c == 0 else 3201  # type: ignore[attr-defined]
    m.nvmlDeviceGetClockInfo = lambda h, c: 1755 if c == 0 else 3201  # type: ignore[attr-defined]
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerUsage = lambda h: 350_500  # type: ignore[attr-defined]
    m.nvmlDeviceGetTotalEnergyConsumption = energy  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = lambda h, s: 41  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)  # type: ignore[attr-defined]
    m.state = state  # type: ignore[attr-defined]
    return m


def test_sampler_converts_units_and_counts_energy(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with NvmlSampler(gpu_index=0, interval_s=0.02) as sampler:
        time.sleep(0.2)
    rows = sampler.samples
    assert sampler.available and sampler.warnings == []
    assert len(rows) >= 4
    r = rows[0]
    assert (r.sm_clock_hz, r.mem_clock_hz) == (1755e6, 3201e6)
    assert r.power_w == pytest.approx(350.5)
    assert r.temperature_c == 41 and r.memory_used_bytes == 1_000_000_000
    assert (r.gpu_util_frac, r.mem_util_frac) == (0.87, 0.40)
    assert sampler.energy_delta_j() == pytest.approx(0.5 * (len(rows) - 1))
    assert all(b.t_s > a.t_s for a, b in itertools.pairwise(rows))
    assert sampler.summary()["power_w_mean"] == pytest.approx(350.5)
    assert fake.state["inits"] == 0  # NVML shut down again


def test_unsupported_field_is_one_warning_and_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(energy_supported=False))
    with NvmlSampler(interval_s=0.02) as sampler:
        time.sleep(0.1)
    assert sampler.available
    assert all(s.energy_j is None and s.power_w is not None for s in sampler.samples)
    assert len(sampler.warnings) == 1 and "energy" in sampler.warnings[0]
    assert sampler.energy_delta_j() is None


def test_missing_gpu_index_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(device_count=1))
    with NvmlSampler(gpu_index=3) as sampler:
        pass
    assert not sampler.available
    assert "GPU 3 not found" in sampler.warnings[0]
    assert nvml.gpu_info(3) is None


def test_gpu_info_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    info = gpu_info(0)
    assert info is not None
    assert info["name"] == "NVIDIA H200" and info["driver_version"] == "580.65.06"
    assert info["memory_total_bytes"] == 150_000_000_000
    assert info["sm_clock_max_hz"] == 1980e6 and info["power_limit_w"] == 700.0


# --- calibration ------------------------------------------------------------------------


@pytest.mark.skipif(not (VLLM_VENV / "bin" / "python").exists(), reason="no .venv-vllm")
def test_calibrate_on_a_cpu_machine_says_why_not() -> None:
    cal = calibrate([str(VLLM_VENV / "bin" / "python")], timeout_s=120)
    assert isinstance(cal, Calibration)
    if cal.calibrated:  # a CUDA machine: real numbers
        assert cal.bandwidth_Bps and cal.bandwidth_Bps > 1e11 and cal.flops_bf16 and cal.flops_bf16 > 1e12
        return
    assert cal.bandwidth_Bps is None and cal.flops_bf16 is None
    assert cal.reason and "CUDA not available" in cal.reason and "+cpu" in cal.reason


def test_calibrate_without_torch_or_python(tmp_path: Path) -> None:
    no_torch = calibrate([sys.executable], timeout_s=60)  # studyc's own env has no torch
    assert not no_torch.calibrated and no_torch.reason and "torch" in no_torch.reason
    missing = calibrate([str(tmp_path / "no-python")], timeout_s=10)
    assert not missing.calibrated and missing.reason and "not found" in missing.reason


def test_calibrate_probe_that_dies_or_hangs(tmp_path: Path) -> None:
    dies = tmp_path / "dies"
    dies.write_text("#!/bin/sh\necho 'Segmentation fault' >&2\nexit 139\n")
    hangs = tmp_path / "hangs"
    hangs.write_text("#!/bin/sh\nsleep 30 &\nwait\n")  # a child holds the pipes too
    for p in (dies, hangs):
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    died = calibrate([str(dies)], timeout_s=10)
    assert not died.calibrated and "code 139" in (died.reason or "") and "Segmentation" in (died.reason or "")
    hung = calibrate([str(hangs)], timeout_s=0.5)
    assert not hung.calibrated and "ran past" in (hung.reason or "")
