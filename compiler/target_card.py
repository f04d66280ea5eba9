"""The card a prediction is priced on, for a GPU named by the hardware table: its own calibrations where
the database holds any, else its spec sheet scaled by what the calibrated GPUs reach of theirs.

Pure: the calibrations are read from the database by the report (`report.ledger.ledger.read_calibrations`) and
handed here as typed objects.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.hardware import HARDWARE, hardware_key
from compiler.stepcost import Card


@dataclass(frozen=True)
class Calibration:
    """One run's measured ceilings: peak bandwidth (a streaming copy) and dense bf16 matmul FLOP/s."""

    gpu: str  # the GPU's name as the run recorded it (nvidia-smi's)
    bandwidth_Bps: float
    flops_per_s: float
    run_id: str = ""

    @property
    def key(self) -> str | None:
        """The hardware table's key for the GPU (None: a card the table does not hold)."""
        return hardware_key(self.gpu)


@dataclass(frozen=True)
class PricedCard:
    """The card a GPU's predictions are priced on and how it was found. `how`: "calibrated" (the median of
    its runs' calibrations) or "spec-scaled" (its spec sheet times the calibrated GPUs' measured-to-spec
    ratios); `note` says so in a sentence."""

    card: Card
    how: str
    note: str


def spec_ratios(calibrations: Sequence[Calibration]) -> dict[str, tuple[float, float]]:
    """Per calibrated GPU of the table (spec-sheet entries only): (median measured / spec bandwidth,
    median measured / spec FLOP/s)."""
    by_gpu: dict[str, list[Calibration]] = defaultdict(list)
    for c in calibrations:
        if c.key is not None and HARDWARE[c.key].source == "spec":
            by_gpu[c.key].append(c)
    return {gpu: (statistics.median(c.bandwidth_Bps for c in runs) / HARDWARE[gpu].bandwidth_Bps,
                  statistics.median(c.flops_per_s for c in runs) / HARDWARE[gpu].flops_bf16)
            for gpu, runs in sorted(by_gpu.items())}


def target_card(gpu: str, calibrations: Sequence[Calibration]) -> PricedCard:
    """The card to price `gpu` (a table key, alias or nvidia-smi name) on: the median of its calibrated
    runs' ceilings; without any, its spec sheet scaled by the median over calibrated GPUs (one vote each)
    of their measured-to-spec ratios. ValueError where neither exists (a card the table does not hold, or
    no calibrated GPU to scale by)."""
    key = hardware_key(gpu)
    own = [c for c in calibrations if c.key is not None and c.key == key]
    if key is None:  # a card the table does not hold: its own calibrations, by name ("NVIDIA " or not)
        own = [c for c in calibrations if _label(c.gpu) == _label(gpu)]
    if own:
        card = Card(statistics.median(c.bandwidth_Bps for c in own), statistics.median(c.flops_per_s for c in own))
        return PricedCard(card, "calibrated", f"priced on {key or _label(gpu)}'s calibration (median of {len(own)} run(s): "
                          f"{card.bandwidth_Bps / 1e12:.2f} TB/s, {card.flops_per_s / 1e12:.0f} TFLOP/s)")
    if key is None:
        raise ValueError(f"{gpu!r} is not in the hardware table and no run calibrated it")
    ratios = spec_ratios(calibrations)
    if not ratios:
        raise ValueError(f"no calibration of {key} and no calibrated GPU to scale its spec sheet by")
    bw = statistics.median(r[0] for r in ratios.values())
    flops = statistics.median(r[1] for r in ratios.values())
    spec = HARDWARE[key]
    card = Card(spec.bandwidth_Bps * bw, spec.flops_bf16 * flops)
    return PricedCard(card, "spec-scaled",
                      f"no calibration of {key}: its spec sheet scaled by the measured-to-spec ratios of "
                      f"{', '.join(ratios)} (bandwidth {bw:.2f}, FLOP/s {flops:.2f}): "
                      f"{card.bandwidth_Bps / 1e12:.2f} TB/s, {card.flops_per_s / 1e12:.0f} TFLOP/s")


def _label(name: str) -> str:
    return name.strip().removeprefix("NVIDIA ").strip()
