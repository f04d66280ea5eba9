"""Roofline physics of a measured decode point: where the model math places it (arithmetic intensity,
attained FLOP/s) and how close it comes to a card's ceiling. Pure.

This is model math, not presentation: it belongs beside ModelShape in compiler/modelmath.py and is
kept here, behind these two functions, until it moves there; the site only calls them.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.hardware import Hardware
from compiler.modelmath import ModelShape


@dataclass(frozen=True)
class Placement:
    intensity: float  # decode FLOPs / bytes read per step
    flops_per_s: float  # FLOPs per token x measured output tokens/s
    fraction: float  # of the card's ceiling at this intensity


def ceiling(hw: Hardware, intensity: float) -> float:
    """min(peak bf16 FLOP/s, bandwidth x intensity)."""
    return min(hw.flops_bf16, hw.bandwidth_Bps * intensity)


def decode_placement(shape: ModelShape, dtype: str, kv_dtype: str, hw: Hardware, batch: float, context: float,
                     tokens_per_s: float) -> Placement:
    """One decode step at `batch` sequences in flight and `context` tokens each: intensity = FLOPs /
    bytes read (weights + KV), attained = FLOPs per token x measured output tokens/s."""
    flops = shape.decode_flops(batch, context)
    intensity = flops / shape.decode_step_bytes(batch, context, dtype, kv_dtype)
    attained = flops / batch * tokens_per_s
    return Placement(intensity, attained, attained / ceiling(hw, intensity))
