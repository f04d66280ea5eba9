"""The formatter at its boundaries: each comparison from both sides, each default against a given value."""

from __future__ import annotations

import math

import pytest

from base import format as fmt


@pytest.mark.parametrize(("x", "digits", "want"), [
    (9999.4, 4, "9,999"), (10_000.0, 4, "10,000"), (12_345.6, 4, "12,346"), (-10_000.0, 4, "-10,000"),
    (99.0, 2, "99"), (100.0, 2, "100"),
    (1714.25, 6, "1,714.25"),  # a fraction after a separated whole part
    (-1714.2, 4, "-1,714"), (-1234.56, 6, "-1,234.56"),  # negatives are separated too
    (1.5e-5, 2, "0.000015"),  # the scientific fallback keeps the digits asked for
    (math.nan, 4, "-"), (-math.inf, 4, "-"),
])
def test_significant_digits_and_thousands(x: float, digits: int, want: str) -> None:
    assert fmt.significant(x, digits) == want


@pytest.mark.parametrize(("x", "ref", "digits", "want"), [
    (2.5, 0.0, 4, "2.5000"), (3.0, 0.0, 4, "3"), (3.0, 0.0, 2, "3"), (2.5, 0.0, 2, "2.50"),  # ref 0: whole or digits
    (3.0, math.inf, 4, "3"), (2.5, math.nan, 4, "2.5000"),  # a non-finite ref is as no ref
    (2.5, 1.0, 4, "2.500"), (2.5, 2.0, 4, "2.500"),  # ref 1 is an ordinary ref
    (999.5, 999.5, 4, "999.5"), (1000.0, 1000.0, 4, "1,000"), (12_345.0, 12_345.0, 4, "12,345"),  # never below 0
    (1.234e-6, 1.234e-6, 4, "0.000001234"),  # nine decimals: the cap, reached
    (1.234e-7, 1.234e-7, 4, "0.000000123"),  # ten wanted, nine given
    (1.5, -150.0, 4, "1.5"),  # the magnitude of a negative ref
    (math.inf, 1.0, 4, "-"),
])
def test_fixed_decimals(x: float, ref: float, digits: int, want: str) -> None:
    assert fmt.fixed(x, ref, digits) == want


@pytest.mark.parametrize(("x", "want"), [
    (999.0, "999 B"), (1e3, "1 kB"), (5e3, "5 kB"),
    (999_999.0, "1,000 kB"), (1e6, "1 MB"), (4e6, "4 MB"),
    (1e9, "1 GB"), (1e12, "1 TB"), (3e12, "3 TB"),
    (1e15, "1 PB"), (2e15, "2 PB"), (2.5e18, "2,500 PB"),
    (-2e9, "-2 GB"), (-1e3, "-1 kB"), (-950.0, "-950 B"),
    (None, "-"), (math.inf, "-"), (math.nan, "-"),
])
def test_si_prefix_boundaries(x: float | None, want: str) -> None:
    assert fmt.si(x, "B") == want


def test_si_digits() -> None:
    assert fmt.si(1.23456e9, "B") == "1.235 GB"
    assert fmt.si(1.23456e9, "B", 6) == "1.23456 GB" and fmt.si(1.23456e9, "B", 2) == "1.2 GB"
    assert fmt.si(123.456, "B", 6) == "123.456 B" and fmt.si(123.456, "B") == "123.5 B"


@pytest.mark.parametrize(("x", "decimals", "signed", "want"), [
    (None, 1, False, "-"), (math.inf, 1, False, "-"), (math.nan, 1, True, "-"),
    (-0.5, 1, False, "-50.0%"),  # unsigned keeps the sign
    (0.98764, 2, False, "98.76%"), (0.98764, 0, False, "99%"),
    (0.004, 1, True, "+0.4%"), (-0.004, 1, True, "-0.4%"),  # rounded to the decimals, not to a whole
    (0.000499, 1, True, "0.0%"), (-0.000499, 1, True, "0.0%"),  # rounds to zero: no sign
    (0.0005, 1, True, "+0.1%"),
    (0.0531, 0, True, "+5%"), (0.00499, 0, True, "0%"), (0.0049, 2, True, "+0.49%"),
])
def test_percent(x: float | None, decimals: int, signed: bool, want: str) -> None:
    assert fmt.percent(x, decimals, signed=signed) == want


@pytest.mark.parametrize(("x", "unit", "measured", "want"), [
    (1.0, "x", True, "1.000"), (1.0, "x", False, "1"),
    (0.98, "%", True, "98.0"), (0.98, "%", False, "98"), (0.98765, "%", False, "98.77"),
    (2.0, "load", True, "2"), (2.0, "load", False, "2"),
    (0.0066, "ms", True, "6.600"), (0.0066, "ms", False, "6.6"),
    (6.582e14, "TFLOP/s", True, "658.2"), (6.5e14, "TFLOP/s", False, "650"),
    (4.27e12, "TB/s", True, "4.270"), (4.27e12, "TB/s", False, "4.27"),
    (2.0, "tokens", True, "2.000"), (2.0, "tokens", False, "2"),
    (math.inf, "x", True, "-"), (math.nan, "tokens", False, "-"),
])
def test_digits_measured_and_predicted(x: float, unit: str, measured: bool, want: str) -> None:
    assert fmt.digits(x, unit, measured=measured) == want


def test_digits_ref() -> None:
    assert fmt.digits(2.0, "tokens", ref=1000.0) == "2" and fmt.digits(2.0, "tokens", ref=0.02) == "2.00000"
    assert fmt.digits(0.5, "ms", ref=0.05) == "500.00"  # the ref is scaled like x
    assert fmt.digits(2.0, "tokens", measured=False, ref=1000.0) == "2"


def test_with_unit_and_quantity() -> None:
    assert fmt.with_unit("5", "") == "5" and fmt.with_unit("-", "tok/s") == "-" and fmt.with_unit("-", "x") == "-"
    assert fmt.with_unit("5", "tok/s") == "5 tok/s" and fmt.with_unit("5", "x") == "5x" and fmt.with_unit("5", "%") == "5%"
    assert fmt.quantity(2.0, "tokens", ref=1000.0) == "2 tokens" and fmt.quantity(2.0, "tokens") == "2.000 tokens"
    assert fmt.quantity(1.0, "x", measured=False) == "1x" and fmt.quantity(math.nan, "tok/s") == "-"


def test_span() -> None:
    assert fmt.span(None, 1.0, "x") == "-" and fmt.span(1.0, None, "x") == "-" and fmt.span(None, None, "x") == "-"
    assert fmt.span(0.5, 150.0, "tokens") == "0.5–150.0 tokens"  # ref defaults to the larger end
    assert fmt.span(-150.0, 0.5, "tokens") == "-150.0–0.5 tokens"  # in magnitude
    assert fmt.span(1.0, 2.0, "tokens", ref=1000.0) == "1–2 tokens"  # a given ref is kept
    assert fmt.span(1.0, 2.0, "x") == "1.000–2.000x" and fmt.span(1.0, 2.0, "x", measured=False) == "1–2x"


@pytest.mark.parametrize(("kwargs", "want"), [
    ({"kind": "range", "unit": "x"}, "(not evaluated)"),
    ({"kind": "range", "unit": "x", "low": 1.0, "high": None}, "in 1x–(not evaluated)"),
    ({"kind": "range", "unit": "x", "low": None, "high": 2.0}, "in (not evaluated)–2x"),
    ({"kind": "range", "unit": "x", "low": 1.0, "high": 2.0}, "in 1x–2x"),
    ({"kind": "range", "unit": "x", "low": "a", "high": "b"}, "in [(a), (b)]"),
    ({"kind": "range", "unit": "x", "low": "a", "high": 2.0}, "in [(a), 2x]"),
    ({"kind": "range", "unit": "x", "low": 1.0, "high": "b"}, "in [1x, (b)]"),
    ({"kind": "range", "unit": "tok/s", "low": 1.0, "high": 2.0, "sides": "s"}, "s: in 1 tok/s–2 tok/s"),
    ({"kind": "relation", "unit": "ms", "relation": "<"}, "< (not evaluated)"),
    ({"kind": "relation", "unit": "%", "relation": ">=", "value": 0.5}, ">= 50%"),
    ({"kind": "value", "unit": "tok/s", "value": 100.0}, "100 tok/s ± 5%"),  # the default tolerance
    ({"kind": "value", "unit": "tok/s", "value": 100.0, "tolerance": 0.1}, "100 tok/s ± 10%"),
    ({"kind": "value", "unit": "tok/s", "value": 100.0, "tolerance": 0.0}, "100 tok/s ± 0%"),
    ({"kind": "value", "unit": "%", "value": 0.5}, "50% ± 5% (relative)"),
    ({"kind": "value", "unit": "x", "value": 1.0}, "1x ± 5%"),  # relative only for a percentage
    ({"kind": "value", "unit": "x", "value": "r.x", "tolerance": 0.02}, "(r.x) ± 2%"),
    ({"kind": "value", "unit": "x", "sides": "a ÷ b"}, "a ÷ b: (not evaluated)"),
])
def test_prediction(kwargs: dict, want: str) -> None:
    assert fmt.prediction(**kwargs) == want


@pytest.mark.parametrize(("confidence", "want"), [
    (0.95, "95%"), (0.999, "99.9%"), (0.9975, "99.75%"), (0.5, "50%"), (0.99994, "99.99%"),
])
def test_percent_level(confidence: float, want: str) -> None:
    assert fmt.percent_level(confidence) == want
