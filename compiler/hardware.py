"""Accelerator ceilings for roofline predictions: spec-sheet numbers, replaced by calibration at run time.

The compiler predicts against these; the runner measures the card and calls `Hardware.calibrated`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

_GIB = 1 << 30


class HardwareError(KeyError):
    """An unknown hardware name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would repr-quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Hardware:
    """One accelerator's ceilings, in SI units."""

    name: str
    flops_bf16: float  # dense (no 2:4 sparsity) BF16 tensor FLOP/s
    bandwidth_Bps: float  # memory bandwidth, bytes per second
    memory_bytes: int
    source: str = "spec"  # "spec" (vendor sheet), "nominal" (placeholder) or "calibrated" (measured)

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP per byte) above which work is compute bound."""
        return self.flops_bf16 / self.bandwidth_Bps

    def calibrated(self, bandwidth_Bps: float | None = None, flops_bf16: float | None = None) -> Hardware:
        """The same card with measured ceilings in place of the sheet's."""
        for label, value in (("bandwidth_Bps", bandwidth_Bps), ("flops_bf16", flops_bf16)):
            if value is not None and not value > 0:
                raise ValueError(f"calibrated {label} must be positive, got {value!r}")
        return replace(
            self,
            bandwidth_Bps=self.bandwidth_Bps if bandwidth_Bps is None else float(bandwidth_Bps),
            flops_bf16=self.flops_bf16 if flops_bf16 is None else float(flops_bf16),
            source="calibrated",
        )


# Memory sizes: NVIDIA's "GB" for HBM parts is binary-sized (an H100 80GB shows 81559 MiB in
# nvidia-smi, an H200 143771 MiB), so capacities are stored as GiB.
HARDWARE: dict[str, Hardware] = {
    # NVIDIA H100 Tensor Core GPU datasheet, SXM5: BF16 1,979 TFLOPS with sparsity = 989 dense;
    # HBM3 3.35 TB/s; 80 GB.
    "h100-sxm": Hardware("h100-sxm", 989e12, 3.35e12, 80 * _GIB),
    # NVIDIA H200 datasheet, SXM: same GH100 compute as H100 SXM (989 TFLOPS dense BF16);
    # HBM3e 4.8 TB/s; 141 GB.
    "h200": Hardware("h200", 989e12, 4.8e12, 141 * _GIB),
    # NVIDIA A100 datasheet, 80GB SXM: BF16 312 TFLOPS dense (624 sparse); HBM2e 2,039 GB/s.
    "a100-80gb": Hardware("a100-80gb", 312e12, 2.039e12, 80 * _GIB),
    # NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 sparse); GDDR6 864 GB/s; 48 GB.
    "l40s": Hardware("l40s", 362.05e12, 0.864e12, 48 * _GIB),
    # NVIDIA DGX/HGX B200 datasheets: FP16/BF16 4.5 PFLOPS sparse = 2.25 dense per GPU; HBM3e 8 TB/s.
    # The package carries 192 GB of HBM3e, but DGX B200 lists 1,440 GB for 8 GPUs: 180 GB usable each.
    "b200": Hardware("b200", 2.25e15, 8e12, 180 * _GIB),
    # Nominal, not a spec: a placeholder for the 2-core CI machine running the CPU build of vLLM.
    # Predictions against it mean nothing until the runner calibrates it.
    "cpu": Hardware("cpu", 1e12, 20e9, 16 * _GIB, source="nominal"),
}

# Normalized name -> table key. Names as nvidia-smi prints them are included.
_ALIASES: dict[str, str] = {
    "h100": "h100-sxm",
    "h100-sxm5": "h100-sxm",
    "h100-80gb-hbm3": "h100-sxm",
    "h100-sxm5-80gb": "h100-sxm",
    "h200-sxm": "h200",
    "h200-141gb": "h200",
    "a100": "a100-80gb",
    "a100-sxm4-80gb": "a100-80gb",
    "a100-sxm-80gb": "a100-80gb",
    "b200-sxm": "b200",
}


def _normalize(name: str) -> str:
    key = re.sub(r"[\s_]+", "-", name.strip().lower())
    return key.removeprefix("nvidia-")


def hardware_key(name: str | None) -> str | None:
    """The table key of a card by key, alias or nvidia-smi name ("NVIDIA H100 80GB HBM3" -> h100-sxm);
    None for a card the table does not hold."""
    if not name:
        return None
    key = _normalize(name)
    key = _ALIASES.get(key, key)
    return key if key in HARDWARE else None


def get_hardware(name: str) -> Hardware:
    """Look up a card by table key, alias or nvidia-smi name, ignoring case ("NVIDIA H200" -> h200)."""
    key = _normalize(name)
    key = _ALIASES.get(key, key)
    if key not in HARDWARE:
        known = ", ".join(sorted(HARDWARE))
        aliases = ", ".join(sorted(_ALIASES))
        raise HardwareError(f"unknown hardware {name!r}; known: {known} (aliases: {aliases})")
    return HARDWARE[key]
