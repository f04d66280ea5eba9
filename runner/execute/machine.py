"""The machine metrics of a launch (`compiler.metrics.MACHINE_METRICS`): each of its servers' GPU calibrated
once (`runner.measure.calibrate`, the run's own probe and arguments, on that server's first device), just
before the launch's servers start and while no server of the study measures, in a study whose hypotheses
name one (`Plan.calibrate_launches`). The values go on the server's row; a calibration that fails (no GPU,
a probe that dies) leaves them NULL with its reason in `calibration_error`, and the launch goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from runner.measure.calibrate import Calibration, calibrate
from runner.store.records import ServerRecord

Calibrator = Callable[..., Calibration]  # runner.measure.calibrate.calibrate's signature (tests pass a fake)
PHASE = "calibration"  # the run's phase table counts these seconds with the run's own calibration


def calibrate_device(python_argv: Sequence[str], gpu_index: int, calibrator: Calibrator = calibrate) -> Calibration:
    """One calibration of GPU `gpu_index`; never raises (a calibrator that does reads as failed)."""
    try:
        return calibrator(list(python_argv), gpu_index=gpu_index)
    except Exception as exc:  # a broken probe is a measurement that failed, not a run that stops
        return Calibration(calibrated=False, bandwidth_Bps=None, flops_bf16=None, device=None,
                           reason=f"calibration raised {type(exc).__name__}: {exc}")


def with_calibration(record: ServerRecord, cal: Calibration) -> ServerRecord:
    """The server's row with its launch's calibration: both values, or NULLs and why."""
    if cal.calibrated and cal.flops_bf16 and cal.bandwidth_Bps and cal.flops_bf16 > 0 and cal.bandwidth_Bps > 0:
        return replace(record, machine_flops=float(cal.flops_bf16), machine_bandwidth=float(cal.bandwidth_Bps),
                       calibration_error=None)
    why = cal.reason or "calibration returned no positive FLOP/s and bandwidth"
    return replace(record, machine_flops=None, machine_bandwidth=None, calibration_error=f"not calibrated: {why}")


def calibrate_servers(records: Sequence[ServerRecord], devices: Sequence[int | None], python_argv: Sequence[str],
                      calibrator: Calibrator = calibrate) -> tuple[list[ServerRecord], float]:
    """Each server's row with its own GPU's calibration (one per distinct device, in order), and the
    seconds spent. `devices`: each server's first GPU index, None where it has none (a CPU host): its
    calibration is the probe's on GPU 0, as the run's own, which fails without a GPU."""
    t0 = time.monotonic()
    done: dict[int, Calibration] = {}
    out = []
    for record, device in zip(records, devices, strict=True):
        index = 0 if device is None else device
        if index not in done:
            done[index] = calibrate_device(python_argv, index, calibrator)
        out.append(with_calibration(record, done[index]))
    return out, time.monotonic() - t0


def calibration_note(records: Sequence[ServerRecord]) -> str:
    """What the progress line says of a launch's calibration."""
    parts = []
    for r in records:
        if r.machine_flops is not None and r.machine_bandwidth is not None:
            parts.append(f"{r.machine_bandwidth / 1e12:.3f} TB/s, {r.machine_flops / 1e12:.0f} TFLOP/s")
        else:
            parts.append(r.calibration_error or "not calibrated")
    return "calibrated: " + "; ".join(dict.fromkeys(parts))
