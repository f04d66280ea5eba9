"""Which machine a server ran on: a stable machine id, the host name, and the GPUs' UUIDs and serials
from NVML. Stored with each server start (`ServerRecord`), so `--resume` can keep a block on one host
and the report can tell a block whose arms ran on two.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.measure.nvml import gpu_info

MACHINE_ID_ENV = "STUDYC_MACHINE_ID"  # overrides the file: a test "moves host", a container names its host
MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))


@dataclass(frozen=True)
class HostIdentity:
    machine_id: str
    hostname: str
    gpu_uuid: str | None = None  # the server's GPUs, "," between (None on a CPU host, or NVML without them)
    gpu_serial: str | None = None


def first_gpu_uuid() -> str | None:
    """The UUID of GPU 0 from NVML; None on a host without one."""
    info = gpu_info(0)
    return str(info["uuid"]) if info and info.get("uuid") else None


def machine_id(files: Sequence[Path] = MACHINE_ID_FILES,
               gpu_uuid: Callable[[], str | None] = first_gpu_uuid) -> str:
    """`STUDYC_MACHINE_ID`, else the first readable machine-id file, else "gpu:<GPU 0's UUID>" on a GPU host
    (a lent GPU machine has no machine-id file, and every one is named "vm": its GPU tells them apart), else
    "host:<host name>" (a name is not stable across machines that share one, but it is all there is)."""
    given = os.environ.get(MACHINE_ID_ENV, "").strip()
    if given:
        return given
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text:
            return text
    uuid = gpu_uuid()
    return f"gpu:{uuid}" if uuid else f"host:{socket.gethostname()}"


def host_identity(devices: Sequence[str] = (), gpu_host: bool = False) -> HostIdentity:
    """This host, and on a GPU host the UUIDs and serials of `devices` (GPU indices)."""
    uuids: list[str] = []
    serials: list[str] = []
    for device in devices if gpu_host else ():
        info = gpu_info(int(device)) if device.isdigit() else None
        if info is None:
            continue
        if info.get("uuid"):
            uuids.append(str(info["uuid"]))
        if info.get("serial"):
            serials.append(str(info["serial"]))
    return HostIdentity(machine_id(), socket.gethostname(), ",".join(uuids) or None, ",".join(serials) or None)
