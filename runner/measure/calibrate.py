"""Calibration at the start of a run: the GPU's measured HBM bandwidth and bf16 matmul rate.

"The spec sheet is not the ceiling": predictions use these numbers. The probe runs in
the engine's python (studyc's own env has no torch); no GPU means calibrated=False.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROBE = Path(__file__).with_name("calibrate_probe.py")


@dataclass(frozen=True)
class Calibration:
    calibrated: bool
    bandwidth_Bps: float | None  # bytes read + written per second, device-to-device copy
    flops_bf16: float | None  # dense bf16 matmul, FLOP/s
    device: str | None
    details: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None  # why not calibrated


def calibrate(
    python_cmd: Sequence[str],
    timeout_s: float = 180,
    *,
    gpu_index: int = 0,
    env: Mapping[str, str] | None = None,
    probe_args: Sequence[str] = (),
) -> Calibration:
    """Run the probe with `python_cmd` (e.g. Settings.python_argv). Never raises for a missing GPU."""
    argv = [*python_cmd, str(PROBE), "--device", str(gpu_index), *probe_args]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=None if env is None else dict(env),
            start_new_session=True,  # so a timeout can take the probe's children too
        )
    except FileNotFoundError as exc:
        return _failed(f"engine python not found ({shlex.join(python_cmd)}): {exc}")
    except OSError as exc:
        return _failed(f"cannot run the calibration probe ({shlex.join(argv)}): {exc}")
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except BaseException as exc:  # timeout, or Ctrl-C: never leave a probe holding the GPU
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            return _failed(f"calibration probe ran past {timeout_s:g} s ({shlex.join(argv)})")
        raise
    done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)

    doc = _last_json_line(done.stdout)
    if doc is None:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-10:])
        return _failed(f"calibration probe exited with code {done.returncode} and no result: {tail}")
    if not doc.get("ok"):
        return _failed(str(doc.get("reason") or "probe reported failure"), doc.get("details"))
    return Calibration(
        calibrated=True,
        bandwidth_Bps=float(doc["bandwidth_Bps"]),
        flops_bf16=float(doc["flops_bf16"]),
        device=str(doc.get("device")) if doc.get("device") else None,
        details=dict(doc.get("details") or {}),
        reason=None,
    )


def _failed(reason: str, details: Any = None) -> Calibration:
    return Calibration(
        calibrated=False,
        bandwidth_Bps=None,
        flops_bf16=None,
        device=None,
        details=dict(details) if isinstance(details, dict) else {},
        reason=reason,
    )


def _last_json_line(stdout: str) -> dict[str, Any] | None:
    # torch or CUDA may print warnings first; the probe's answer is the last JSON object line.
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc
    return None
