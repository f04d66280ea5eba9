"""`studyc calibrate`: the machine measured alone, stored as a run with no points. Its GPU's bandwidth and
FLOP/s (`runner.measure.calibrate`, as `studyc run` measures them) price the step-time model's predictions
for that GPU (`compiler.target_card`), and the host probe (`runner.measure.host_probe`) goes beside them.
"""

from __future__ import annotations

import json
import platform
import socket
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from base import __version__
from base.errors import StudycError
from runner.execute.machine import Calibrator
from runner.measure.calibrate import Calibration, calibrate
from runner.measure.host_probe import HostProbe, host_probe
from runner.measure.nvml import gpu_info
from runner.store.records import RunRecord, new_run_id
from runner.store.store import Store, as_json

STUDY_ID = "calibration"  # the study id of a calibration-only run: no study file, no plan, no points
HOST_PROBE = "host_probe"  # its key in the calibration's details


class CalibrationError(StudycError):
    """The machine could not be calibrated: no GPU, or a probe that failed."""

    exit_code = 2


def calibration_json(cal: Calibration, host: HostProbe | None) -> str:
    """A run's `calibration_json`: the GPU probe's device, reason and details, the host probe among them."""
    details = {**cal.details, **({HOST_PROBE: host.to_json()} if host is not None else {})}
    return as_json({"device": cal.device, "reason": cal.reason, "details": details})


def stored_host_probe(run: RunRecord) -> dict[str, Any] | None:
    """The host probe a run's calibration recorded (None for runs stored before it was)."""
    try:
        doc = json.loads(run.calibration_json or "{}")
    except ValueError:
        return None
    found = (doc.get("details") or {}).get(HOST_PROBE) if isinstance(doc, dict) else None
    return found if isinstance(found, dict) else None


def calibration_run(cal: Calibration, host: HostProbe | None, gpu: dict[str, Any] | None) -> RunRecord:
    """The run record of a calibration on its own: status "calibrated", no plan."""
    now = datetime.now(UTC)
    return RunRecord(
        run_id=new_run_id(now), study_id=STUDY_ID,
        studyc_version=__version__, host=socket.gethostname(), started_at=now, finished_at=now,
        status="calibrated", calibrated=cal.calibrated, bandwidth_Bps=cal.bandwidth_Bps, flops_bf16=cal.flops_bf16,
        calibration_json=calibration_json(cal, host), nvml_available=gpu is not None,
        gpu_name=(gpu or {}).get("name") or cal.device, driver_version=(gpu or {}).get("driver_version"),
        notes=f"{platform.platform()}; calibration only (studyc calibrate): no points",
    )


def save_calibration(db: str | Path, run: RunRecord) -> None:
    with Store(db) as store:
        store.save_run(run)


def measure_machine(gpu_index: int, python_argv: Sequence[str], *, calibrator: Calibrator = calibrate,
                    find_gpu: Callable[[int], dict[str, Any] | None] = gpu_info) -> RunRecord:
    """Calibrate GPU `gpu_index` with the engine's python and probe the host; the run to store.
    CalibrationError (one line) on a host without that GPU, or when the probe fails."""
    gpu = find_gpu(gpu_index)
    if gpu is None:
        raise CalibrationError(f"no CUDA GPU {gpu_index} on this host (NVML finds none): nothing to calibrate; "
                               "run `studyc calibrate` on the GPU host whose card the predictions should use")
    cal = calibrator(list(python_argv), gpu_index=gpu_index)
    if not (cal.calibrated and (cal.bandwidth_Bps or 0) > 0 and (cal.flops_bf16 or 0) > 0):
        reason = " ".join(str(cal.reason or "no positive bandwidth and FLOP/s").split())
        raise CalibrationError(f"GPU {gpu_index} ({gpu.get('name')}) not calibrated: {reason[:400]}")
    return calibration_run(cal, host_probe(), gpu)


def describe(run: RunRecord) -> str:
    """What a calibration measured, in one line."""
    host = stored_host_probe(run)
    return (f"{run.gpu_name}: {(run.bandwidth_Bps or 0) / 1e12:.3f} TB/s, {(run.flops_bf16 or 0) / 1e12:.0f} TFLOP/s"
            + (f"; host probe {host['per_request_s'] * 1e3:.3f} ms per request ({host['workload']})" if host else ""))
