"""Where the model math places a measured decode point on a card's roofline (compiler.modelmath)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.hardware import get_hardware
from compiler.modelconfig import load_model
from compiler.modelmath import decode_placement, roofline_flops_per_s

ROOT = Path(__file__).resolve().parents[2]


def test_roofline_is_bandwidth_bound_below_the_ridge_and_flat_above() -> None:
    hw = get_hardware("h200")
    below, above = hw.ridge / 2, hw.ridge * 2
    assert roofline_flops_per_s(hw, below) == pytest.approx(hw.bandwidth_Bps * below)
    assert roofline_flops_per_s(hw, above) == hw.flops_bf16
    assert roofline_flops_per_s(hw, hw.ridge) == pytest.approx(hw.flops_bf16)


def test_decode_placement_is_flops_over_bytes_and_attained_over_roofline() -> None:
    shape, hw = load_model(ROOT / "models/tiny-qwen3"), get_hardware("h200")
    placed = decode_placement(shape, "bfloat16", "auto", hw, batch=4, context=200, tokens_per_s=1000.0)
    flops = shape.decode_flops(4, 200)
    assert placed.intensity == pytest.approx(flops / shape.decode_step_bytes(4, 200, "bfloat16", "auto"))
    assert placed.flops_per_s == pytest.approx(flops / 4 * 1000.0)
    assert placed.fraction == pytest.approx(placed.flops_per_s / roofline_flops_per_s(hw, placed.intensity))
    faster = decode_placement(shape, "bfloat16", "auto", hw, batch=4, context=200, tokens_per_s=2000.0)
    assert faster.fraction == pytest.approx(2 * placed.fraction)
