"""Prediction expressions: the grammar, evaluation, and the model/hardware environment."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from compiler.expr import Expr, ExprError, parse
from compiler.hardware import get_hardware
from compiler.modelconfig import load_model
from compiler.predict_env import build_env, env_names

MODELS = Path(__file__).resolve().parents[2] / "models"


def double(x: float) -> float:
    return 2 * x


def add(batch: float, context: float = 0.0) -> float:
    return batch + context


# ---- grammar and arithmetic ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1 + 2 * 3", 7.0),
        ("(1 + 2) * 3", 9.0),
        ("2 ** 10", 1024.0),
        ("-3 + +1", -2.0),
        ("7 / 2", 3.5),
        ("1e3 * 0.5", 500.0),
        ("min(3, 1, 2) + max(4, 5)", 6.0),
        ("-2 ** 2", -4.0),  # Python precedence
    ],
)
def test_arithmetic(text: str, value: float) -> None:
    assert parse(text).evaluate({}) == value


def test_names_and_calls_are_collected() -> None:
    expr = parse("0.8 * roofline.decode_tokens_per_s(batch=1, context=640) / hw.bandwidth + min(a, 2)")
    assert expr.names == frozenset({"roofline.decode_tokens_per_s", "hw.bandwidth", "a"})
    assert expr.calls == frozenset({"roofline.decode_tokens_per_s"})
    assert expr.text == "0.8 * roofline.decode_tokens_per_s(batch=1, context=640) / hw.bandwidth + min(a, 2)"


def test_evaluate_with_values_and_functions() -> None:
    env: dict[str, float | Callable[..., float]] = {"x.y": 4.0, "f.double": double, "f.add": add}
    assert parse("x.y * 2").evaluate(env) == 8.0
    assert parse("f.double(x.y + 1)").evaluate(env) == 10.0
    assert parse("f.add(1, context=2)").evaluate(env) == 3.0
    assert parse("f.add(batch=1, context=f.double(3))").evaluate(env) == 7.0


def test_parse_once_evaluate_many_and_equality() -> None:
    expr = parse("a * 2")
    assert [expr.evaluate({"a": v}) for v in (1.0, 2.5)] == [2.0, 5.0]
    assert expr == parse("a * 2")
    assert Expr(text="a * 2", names=frozenset({"a"})).evaluate({"a": 3.0}) == 6.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("'text'", "only numbers are allowed as constants"),
        ("True", "only numbers are allowed as constants"),
        ("a[0]", "subscripts are not allowed"),
        ("a < b", "comparisons are not allowed"),
        ("a and b", "and/or are not allowed"),
        ("lambda: 1", "lambdas are not allowed"),
        ("1 if a else 2", "conditional expressions are not allowed"),
        ("[1, 2]", "lists are not allowed"),
        ("f(1).x", "attribute access is only allowed on names"),
        ("(1).real", "attribute access is only allowed on names"),
        ("a.__class__", "may not start with '_'"),
        ("__import__('os')", "may not start with '_'"),
        ("f(1)(2)", "only named functions can be called"),
        ("f(*a)", r"\*args are not allowed"),
        ("f(**a)", r"\*\*kwargs is not allowed"),
        ("7 // 2", "operator FloorDiv is not allowed"),
        ("7 % 2", "operator Mod is not allowed"),
        ("~1", "unary operator Invert is not allowed"),
        ("not 1", "unary operator Not is not allowed"),
        ("min()", r"min\(\) takes one or more positional numbers"),
        ("max(a=1)", r"max\(\) takes one or more positional numbers"),
        ("1 +", "cannot parse"),
        ("import os", "cannot parse"),
        ("   ", "empty expression"),
    ],
)
def test_rejected(text: str, message: str) -> None:
    with pytest.raises(ExprError, match=message):
        parse(text)


def test_rejection_names_the_expression_and_column() -> None:
    message = r"^in 'hw\.bandwidth < 1': comparisons are not allowed .* at column 1$"
    with pytest.raises(ExprError, match=message):
        parse("hw.bandwidth < 1")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope + 1", "unknown name 'nope'; known: a, f"),
        ("1 / (a - 2)", "division by zero"),
        ("10 ** 10 ** 10", "numeric overflow"),
        ("1e308 * 10", "does not evaluate to a finite real number"),
        ("(0 - 8) ** 0.5", "complex number"),
        ("f", "'f' is a function: call it"),
        ("a(1)", "'a' is a number, not a function"),
        ("f(1, 2, 3)", r"bad call to f\(\)"),
        ("f(y=1)", r"bad call to f\(\)"),
    ],
)
def test_evaluation_errors(text: str, message: str) -> None:
    with pytest.raises(ExprError, match=message):
        parse(text).evaluate({"a": 2.0, "f": double})


def test_non_number_values_and_results_are_errors() -> None:
    with pytest.raises(ExprError, match="'s' is not a number"):
        parse("s").evaluate({"s": "3"})  # type: ignore[dict-item]
    with pytest.raises(ExprError, match=r"g\(\) is not a number \(got '3'\)"):
        parse("g()").evaluate({"g": lambda: "3"})  # type: ignore[dict-item,return-value]


def test_errors_raised_inside_functions_become_expr_errors() -> None:
    def bad(batch: float) -> float:
        raise ValueError("batch must be positive")

    with pytest.raises(ExprError, match=r"f\(\) failed: batch must be positive"):
        parse("f(0)").evaluate({"f": bad})


# ---- the prediction environment -----------------------------------------------------------------
def test_env_names_match_build_env() -> None:
    env = build_env(load_model(MODELS / "qwen3-8b"), get_hardware("h100"))
    assert set(env) == env_names()
    assert {name for name, v in env.items() if callable(v)} == {
        "moe.expected_experts", "model.decode_weight_bytes", "model.decode_step_bytes", "model.decode_flops",
        "roofline.decode_step_s", "roofline.decode_tokens_per_s",
        "model.calibrated.decode_step_s", "model.calibrated.decode_tokens_per_s"}
    for name in ("model.params", "model.weight_bytes", "model.kv_bytes_per_token",
                 "model.kv_bytes_per_token_fp8", "model.active_params", "moe.expected_experts",
                 "model.decode_weight_bytes",
                 "roofline.decode_step_s", "roofline.decode_tokens_per_s",
                 "hw.bandwidth", "hw.flops", "hw.ridge", "hw.memory"):
        assert name in env_names()


def test_qwen3_8b_on_h100_expressions() -> None:
    env = build_env(load_model(MODELS / "qwen3-8b"), get_hardware("h100"))
    assert parse("model.params").evaluate(env) == 8_190_735_360
    assert parse("model.weight_bytes / 1e9").evaluate(env) == pytest.approx(16.381, abs=1e-3)
    assert parse("model.kv_bytes_per_token * 1024 / 2**20").evaluate(env) == 144.0
    assert parse("model.kv_bytes_per_token_fp8 * 1024 / 2**20").evaluate(env) == 72.0
    assert parse("hw.bandwidth").evaluate(env) == 3.35e12
    assert parse("hw.ridge").evaluate(env) == pytest.approx(989e12 / 3.35e12)
    # Batch 1, context 640 (128 in / 1024 out, midway): weights + 640 tokens of KV over 3.35 TB/s.
    step_bytes = 2 * (8_190_735_360 - 151_936 * 4096) + 640 * 147_456
    assert parse("roofline.decode_step_s(1, 640)").evaluate(env) == pytest.approx(step_bytes / 3.35e12)
    assert parse("0.8 * roofline.decode_tokens_per_s(batch=1, context=640)").evaluate(env) == pytest.approx(
        0.8 * 3.35e12 / step_bytes
    )
    assert parse("model.decode_weight_bytes(64) / model.decode_weight_bytes(batch=1)").evaluate(env) == 1.0


def test_kv_dtype_and_weight_dtype_flow_into_the_env() -> None:
    shape = load_model(MODELS / "qwen3-8b")
    env = build_env(shape, get_hardware("h200"), dtype="fp8", kv_dtype="fp8")
    assert parse("model.weight_bytes").evaluate(env) == shape.params
    assert parse("model.kv_bytes_per_token").evaluate(env) == 73_728
    expected = shape.decode_weight_bytes(2, "fp8") + 2 * 10 * 73_728
    assert parse("model.decode_step_bytes(2, 10)").evaluate(env) == expected


def test_moe_expressions_on_dsv2_lite() -> None:
    env = build_env(load_model(MODELS / "deepseek-v2-lite"), get_hardware("h100"))
    assert parse("moe.expected_experts(1)").evaluate(env) == pytest.approx(6.0)
    assert parse("moe.expected_experts(batch=64)").evaluate(env) == pytest.approx(63.882, abs=1e-3)
    ratio = parse("model.decode_weight_bytes(64) / model.decode_weight_bytes(1)").evaluate(env)
    assert ratio == pytest.approx(6.311, abs=1e-3)


def test_dense_model_has_no_expected_experts_in_expressions() -> None:
    env = build_env(load_model(MODELS / "qwen3-8b"), get_hardware("h100"))
    with pytest.raises(ExprError, match="qwen3-8b is a dense model"):
        parse("moe.expected_experts(8)").evaluate(env)
    with pytest.raises(ExprError, match="batch must be positive"):
        parse("roofline.decode_step_s(0, 10)").evaluate(env)


def test_roofline_turns_compute_bound_at_large_batch() -> None:
    shape = load_model(MODELS / "qwen3-8b")
    slow_flops = get_hardware("h100").calibrated(flops_bf16=1e12)
    env = build_env(shape, slow_flops)
    compute_s = shape.decode_flops(512, 0) / 1e12
    assert parse("roofline.decode_step_s(512, 0)").evaluate(env) == pytest.approx(compute_s)
