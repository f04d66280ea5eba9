"""The names a prediction expression may use, and their values for one model on one card.

The compiler validates expressions against `env_names()` without any numbers; scoring evaluates
them with `build_env`, once with spec-sheet hardware and once with the calibrated card.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compiler.hardware import Hardware
from compiler.modelmath import ModelShape
from compiler.stepcost import Card, Coefficients, EngineShape
from compiler.stepcost import decode_step_s as calibrated_step_s

_VALUES: frozenset[str] = frozenset(
    {
        "model.params",  # total parameters, a tied embedding counted once
        "model.weight_bytes",  # params at the study's weight dtype
        "model.kv_bytes_per_token",  # at the study's KV dtype
        "model.kv_bytes_per_token_fp8",
        "model.active_params",  # read per token at batch 1: no embedding rows, lm_head, k experts
        "hw.bandwidth",  # bytes/s
        "hw.flops",  # dense bf16 FLOP/s
        "hw.ridge",  # FLOP per byte
        "hw.memory",  # bytes
    }
)
# The names that must be called, e.g. `roofline.decode_step_s(batch=1, context=640)`.
_FUNCTIONS: frozenset[str] = frozenset(
    {
        "moe.expected_experts",  # (batch): distinct routed experts per MoE layer; an error on a dense model
        "model.decode_weight_bytes",  # (batch)
        "model.decode_step_bytes",  # (batch, context): weights + KV read
        "model.decode_flops",  # (batch, context)
        "roofline.decode_step_s",  # (batch, context): the slower of memory time and compute time
        "roofline.decode_tokens_per_s",  # (batch, context): batch / decode_step_s
        # The calibrated step-time model (compiler.stepfit), coefficients fitted from stored runs on
        # the run's GPU; an error where none were fitted (never the roofline in their place).
        "model.calibrated.decode_step_s",  # (batch, context)
        "model.calibrated.decode_tokens_per_s",  # (batch, context)
    }
)


@dataclass(frozen=True)
class Calibrated:
    """The step-time model's data for one run: coefficients fitted for its GPU, vLLM version, model
    family and engine options, and the run's calibrated card. `missing` says why there are none."""

    coefficients: Coefficients | None
    card: Card | None
    missing: str = ""


def env_names() -> frozenset[str]:
    """Every name an expression may use, values and functions alike."""
    return _VALUES | _FUNCTIONS


def build_env(
    shape: ModelShape, hw: Hardware, *, dtype: str = "bf16", kv_dtype: str = "auto",
    calibrated: Calibrated | None = None, engine: EngineShape | None = None,
) -> dict[str, float | Callable[..., float]]:
    """Numbers and functions for `Expr.evaluate`. Functions take batch and context as positional
    or keyword arguments; the roofline uses both `hw.bandwidth` and `hw.flops`. `calibrated` carries
    the fitted step-time model (the caller fits it; the compiler reads no database); without it the
    `model.calibrated.*` functions raise, saying why."""

    def calibrated_decode_step_s(batch: float, context: float) -> float:
        if calibrated is None or calibrated.coefficients is None or calibrated.card is None:
            why = calibrated.missing if calibrated is not None and calibrated.missing else (
                "no step-time model coefficients were given for this run's GPU")
            raise ValueError(f"model.calibrated: {why}")
        shape_engine = engine or EngineShape(dtype=dtype, kv_cache_dtype=kv_dtype)
        return calibrated_step_s(shape, shape_engine, calibrated.card, calibrated.coefficients, int(batch), context)

    def calibrated_decode_tokens_per_s(batch: float, context: float) -> float:
        return int(batch) / calibrated_decode_step_s(batch, context)

    def expected_experts(batch: float) -> float:
        experts = shape.expected_experts(batch)
        if experts is None:
            raise ValueError(f"{shape.name} is a dense model: it has no routed experts")
        return experts

    def decode_weight_bytes(batch: float) -> float:
        return shape.decode_weight_bytes(batch, dtype)

    def decode_step_bytes(batch: float, context: float) -> float:
        return shape.decode_step_bytes(batch, context, dtype, kv_dtype)

    def decode_flops(batch: float, context: float) -> float:
        return shape.decode_flops(batch, context)

    def decode_step_s(batch: float, context: float) -> float:
        return shape.decode_step_s(batch, context, hw.bandwidth_Bps, dtype, kv_dtype, hw.flops_bf16)

    def decode_tokens_per_s(batch: float, context: float) -> float:
        return shape.decode_tokens_per_s(batch, context, hw.bandwidth_Bps, dtype, kv_dtype, hw.flops_bf16)

    env: dict[str, float | Callable[..., float]] = {
        "model.params": float(shape.params),
        "model.weight_bytes": float(shape.weight_bytes(dtype)),
        "model.kv_bytes_per_token": float(shape.kv_bytes_per_token(kv_dtype)),
        "model.kv_bytes_per_token_fp8": float(shape.kv_bytes_per_token("fp8")),
        "model.active_params": float(shape.active_params),
        "hw.bandwidth": hw.bandwidth_Bps,
        "hw.flops": hw.flops_bf16,
        "hw.ridge": hw.ridge,
        "hw.memory": float(hw.memory_bytes),
        "moe.expected_experts": expected_experts,
        "model.decode_weight_bytes": decode_weight_bytes,
        "model.decode_step_bytes": decode_step_bytes,
        "model.decode_flops": decode_flops,
        "roofline.decode_step_s": decode_step_s,
        "roofline.decode_tokens_per_s": decode_tokens_per_s,
        "model.calibrated.decode_step_s": calibrated_decode_step_s,
        "model.calibrated.decode_tokens_per_s": calibrated_decode_tokens_per_s,
    }
    return env
