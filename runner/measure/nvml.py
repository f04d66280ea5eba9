"""GPU telemetry through NVML: clocks, power, energy, temperature, memory, utilization.

Sampled at ~10 Hz on a thread while a point runs. No driver, no GPU, or a field the GPU
does not report becomes a recorded warning, never an exception.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Self

_MHZ = 1e6


def _load_nvml() -> tuple[ModuleType | None, str | None]:
    """(pynvml, None) with NVML initialised, or (None, why not)."""
    try:
        import pynvml  # type: ignore[import-untyped, unused-ignore]
    except ImportError as exc:
        return None, f"nvidia-ml-py not importable: {exc}"
    try:
        pynvml.nvmlInit()
    except _errors(pynvml) as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"NVML unavailable: {_err(exc)}"
    return pynvml, None


def _errors(nv: ModuleType) -> tuple[type[BaseException], ...]:
    # NVMLError: the driver or GPU refused; AttributeError: an older nvidia-ml-py lacks the call.
    return (nv.NVMLError, AttributeError, OSError)


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def gpu_info(gpu_index: int = 0) -> dict[str, Any] | None:
    """Static facts of one GPU (name, driver, memory, max clocks), or None without NVML."""
    nv, _ = _load_nvml()
    if nv is None:
        return None
    errors = _errors(nv)
    try:
        h = nv.nvmlDeviceGetHandleByIndex(gpu_index)
        info: dict[str, Any] = {
            "index": gpu_index,
            "name": _text(nv.nvmlDeviceGetName(h)),
            "driver_version": _text(nv.nvmlSystemGetDriverVersion()),
            "memory_total_bytes": int(nv.nvmlDeviceGetMemoryInfo(h).total),
        }
        optional = {
            "uuid": lambda: _text(nv.nvmlDeviceGetUUID(h)),
            "serial": lambda: _text(nv.nvmlDeviceGetSerial(h)),  # the board's; NVML_ERROR_NOT_SUPPORTED on some
            "sm_clock_max_hz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM) * _MHZ,
            "mem_clock_max_hz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM) * _MHZ,
            "power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "cuda_driver_version": lambda: nv.nvmlSystemGetCudaDriverVersion(),
        }
        for key, get in optional.items():
            try:
                info[key] = get()
            except errors:  # a field this GPU or driver does not report
                info[key] = None
        return info
    except errors:
        return None
    finally:
        with contextlib.suppress(*errors):
            nv.nvmlShutdown()


@dataclass(frozen=True)
class NvmlSample:
    t_s: float  # time.monotonic()
    sm_clock_hz: float | None
    mem_clock_hz: float | None
    power_w: float | None
    energy_j: float | None  # NVML's total-energy counter (since driver load), in joules
    temperature_c: float | None
    memory_used_bytes: int | None
    gpu_util_frac: float | None  # 0..1, NVML's "percent of time a kernel ran"
    mem_util_frac: float | None


class NvmlSampler:
    """Samples one GPU every `interval_s` on a daemon thread; a context manager.

    `available` is False (and `warnings` says why) where NVML or the GPU is missing; then
    `samples` stays empty. A field that fails is None in every sample, warned about once.
    """

    def __init__(self, gpu_index: int = 0, interval_s: float = 0.1) -> None:
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self.available = False
        self.warnings: list[str] = []
        self._warned: set[str] = set()
        self._samples: list[NvmlSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv: ModuleType | None = None
        self._handle: Any = None

    def start(self) -> None:
        if self._thread is not None:
            return
        nv, why = _load_nvml()
        if nv is None:
            self._warn("init", why or "NVML unavailable")
            return
        try:
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.gpu_index)
        except _errors(nv) as exc:
            self._warn("init", f"GPU {self.gpu_index} not found by NVML: {_err(exc)}")
            with contextlib.suppress(*_errors(nv)):
                nv.nvmlShutdown()
            return
        self._nv = nv
        self.available = True
        self._sample()  # one sample now, so even a very short point has a start value
        self._thread = threading.Thread(target=self._run, name="studyc-nvml", daemon=True)
        self._thread.start()

    def stop(self) -> list[NvmlSample]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5.0)
            self._thread = None
            self._sample()  # and one at the end
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except _errors(self._nv) as exc:
                self._warn("shutdown", f"nvmlShutdown: {_err(exc)}")
            self._nv = None
        return self.samples

    @property
    def samples(self) -> list[NvmlSample]:
        with self._lock:
            return list(self._samples)

    def energy_delta_j(self) -> float | None:
        """Energy used between the first and last sample, from NVML's counter (Volta+)."""
        values = [s.energy_j for s in self.samples if s.energy_j is not None]
        return values[-1] - values[0] if len(values) >= 2 else None

    def summary(self) -> dict[str, float | None]:
        """Means and maxima of the sampled fields, plus the energy delta and duration."""
        rows = self.samples
        out: dict[str, float | None] = {
            "n_samples": float(len(rows)),
            "duration_s": rows[-1].t_s - rows[0].t_s if len(rows) >= 2 else None,
            "energy_j": self.energy_delta_j(),
        }
        for name in ("sm_clock_hz", "mem_clock_hz", "power_w", "temperature_c", "gpu_util_frac"):
            vals = [v for v in (getattr(r, name) for r in rows) if v is not None]
            out[f"{name}_mean"] = sum(vals) / len(vals) if vals else None
            out[f"{name}_max"] = max(vals) if vals else None
        mem = [r.memory_used_bytes for r in rows if r.memory_used_bytes is not None]
        out["memory_used_bytes_max"] = float(max(mem)) if mem else None
        return out

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.warnings.append(message)

    def _field(self, key: str, get: Any) -> Any:
        assert self._nv is not None
        try:
            return get()
        except _errors(self._nv) as exc:
            self._warn(key, f"NVML {key} unavailable on GPU {self.gpu_index}: {_err(exc)}")
            return None

    def _sample(self) -> None:
        nv, h = self._nv, self._handle
        if nv is None:
            return
        t = time.monotonic()
        sm = self._field("sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) * _MHZ)
        mem = self._field("mem_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM) * _MHZ)
        power = self._field("power", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
        energy = self._field("energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0)
        gpu_temp = nv.NVML_TEMPERATURE_GPU
        temp = self._field("temperature", lambda: float(nv.nvmlDeviceGetTemperature(h, gpu_temp)))
        used = self._field("memory", lambda: int(nv.nvmlDeviceGetMemoryInfo(h).used))
        util = self._field("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        row = NvmlSample(
            t_s=t,
            sm_clock_hz=sm,
            mem_clock_hz=mem,
            power_w=power,
            energy_j=energy,
            temperature_c=temp,
            memory_used_bytes=used,
            gpu_util_frac=util.gpu / 100.0 if util is not None else None,
            mem_util_frac=util.memory / 100.0 if util is not None else None,
        )
        with self._lock:
            self._samples.append(row)

    def _run(self) -> None:
        next_t = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            self._sample()
            next_t += self.interval_s
            now = time.monotonic()
            if next_t < now:  # fell behind: skip ahead rather than burst
                next_t = now + self.interval_s

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
