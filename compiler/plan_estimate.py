"""A plan point's rough wall time, from the model's decode roofline on the study's hardware."""

from __future__ import annotations

import math
from typing import Any


def estimate_point_s(params: dict[str, Any], shape: Any, hardware: Any, kv_dtype: str, *, turns: int = 1,
                     think_s: float = 0.0) -> float:
    """A rough wall time: waves of requests, each output_len decode steps at a roofline pace, plus every
    request's prompt prefilled at `PREFILL_EFFICIENCY` of the spec-sheet bf16 FLOP/s (2 x active params a
    token; no prefix cache assumed, so an upper bound where prompts share a prefix); multi-turn conversations
    (closed loop: concurrency = conversations in flight) add `think_s` between their turns, once per turn
    after the first in each wave of conversations."""
    out_len, in_len = params["output_len"], params["input_len"]
    prefill_token_s = 0.0 if shape is None else prefill_s_per_token(shape, hardware)
    floor = 0.0035 if hardware.name == "cpu" else 0.002
    def step_s(batch: int) -> float:
        if shape is None:
            return floor
        roof = shape.decode_step_s(batch, in_len + out_len // 2, hardware.bandwidth_Bps, kv_dtype=_kv(kv_dtype))
        return max(roof / 0.75, floor)

    total = 0.0
    for count, measured in ((params["warmup"], False), (params["requests"], True)):
        if count == 0:
            continue
        total += count * in_len * prefill_token_s
        if params["concurrency"] is not None:
            batch = min(params["concurrency"], count)
            waves = math.ceil(count / batch)
            total += waves * out_len * step_s(batch)
            if measured and turns > 1:  # warmup requests are single turns
                total += math.ceil(count / turns / params["concurrency"]) * (turns - 1) * think_s
        else:
            total += count / params["rate_rps"] + out_len * step_s(1)
    return round(total + 1.0, 1)


# Prefill's share of the spec-sheet bf16 FLOP/s in the plan estimate: the H200's calibrated dense matmul is
# about 65% of its spec sheet (651 of 989 TFLOP/s), and a serving engine's prefill a part of that.
PREFILL_EFFICIENCY = 0.5


def prefill_s_per_token(shape: Any, hardware: Any) -> float:
    """Seconds to prefill one prompt token: 2 x active params FLOPs at PREFILL_EFFICIENCY of the spec sheet."""
    return 2.0 * shape.active_params / (hardware.flops_bf16 * PREFILL_EFFICIENCY)


def _kv(kv_dtype: str) -> str:
    return "fp8" if kv_dtype.startswith("fp8") else "auto"
