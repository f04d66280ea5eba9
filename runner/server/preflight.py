"""Checks before any measuring: the study's hardware is this host's (the engine command is checked by
`runner.server.engine_check.check_engine`).

Called by `studyc run` after compiling and before calibration, the client self-test or the first
run record, so a machine that cannot run a study costs neither time nor a stray row in the database.
"""

from __future__ import annotations

from collections.abc import Sequence

from base.errors import StudycError
from compiler.hardware import HardwareError, get_hardware


def hardware_mismatch(study_hardware: str, gpu_name: str | None) -> str | None:
    """Why a study naming `study_hardware` should not be scored on a host with this GPU, or None."""
    wanted = get_hardware(study_hardware).name
    if gpu_name is None:
        if wanted == "cpu":
            return None
        return (
            f"the study names hardware {study_hardware!r}, but this host has no GPU (NVML sees none): its "
            f"predictions would be scored against the {wanted} spec sheet"
        )
    try:
        found = get_hardware(gpu_name).name
    except HardwareError:
        return f"this host's GPU {gpu_name!r} is not in the hardware table; the study names {study_hardware!r}"
    if found != wanted:
        return f"the study names hardware {study_hardware!r}, but this host's GPU is {gpu_name!r} ({found})"
    return None


def check_hardware(
    study_hardware: Sequence[tuple[str, str]], gpu_name: str | None, allow_mismatch: bool = False
) -> list[str]:
    """Every study's hardware against this host's GPU. `study_hardware`: (study id, hardware name) pairs.

    A mismatch is refused (StudycError naming every study and the fix) unless `allow_mismatch`, when
    it comes back as a warning for the caller to show.
    """
    found = [f"{study_id}: {why}" for study_id, hardware in study_hardware
             if (why := hardware_mismatch(hardware, gpu_name)) is not None]
    if found and not allow_mismatch:
        raise StudycError(
            "\n".join(found)
            + "\nrun on matching hardware, set `study.hardware` to this host's, or pass --allow-hardware-mismatch"
        )
    return found
