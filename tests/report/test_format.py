"""The one formatter: numbers, units, durations and predictions."""

from __future__ import annotations

import math

import pytest

from base import format as fmt


@pytest.mark.parametrize(("x", "want"), [(1.0, "1"), (0.5, "0.5"), (1.9405, "1.94"), (220.66, "220.7"),
                                         (1714.2, "1,714"), (790272.0, "790,272"), (1.5e-5, "0.00001500"),
                                         (-0.25, "-0.25"), (math.inf, "-")])
def test_significant(x: float, want: str) -> None:
    assert fmt.significant(x) == want


def test_ratio_percent_and_duration() -> None:
    assert fmt.ratio(0.97819) == "0.978x" and fmt.ratio(None) == "-"
    assert fmt.percent(0.984) == "98.4%" and fmt.percent(0.0) == "0.0%"
    assert fmt.percent(0.0531, signed=True) == "+5.3%" and fmt.percent(-0.022, signed=True) == "-2.2%"
    assert fmt.percent(-0.00001, signed=True) == "0.0%"  # never "-0.0%"
    assert fmt.duration(5) == "0m05s" and fmt.duration(183) == "3m03s" and fmt.duration(3723) == "1h02m03s"


def test_display_units_and_quantities() -> None:
    assert fmt.display_unit("tok/s", ratio=True) == "x"
    assert fmt.display_unit("ratio") == "%" and fmt.display_unit("s") == "ms" and fmt.display_unit("tok/s") == "tok/s"
    assert fmt.quantity(0.006632, "ms") == "6.632 ms"
    assert fmt.quantity(0.984, "%") == "98.4%" and fmt.quantity(0.9782, "x") == "0.978x"
    assert fmt.quantity(189.3, "tok/s") == "189.3 tok/s" and fmt.quantity(None, "x") == "-"
    assert fmt.span(187.5, 191.04, "tok/s", ref=189.3) == "187.5–191.0 tok/s"
    assert fmt.span(0.974, 0.983, "x") == "0.974–0.983x"
    # a machine's rates in tera, measured and predicted, the unit as the metric's is scaled
    assert fmt.display_unit("FLOP/s") == "TFLOP/s" and fmt.display_unit("B/s") == "TB/s"
    assert fmt.quantity(658_209_573_000_000.0, "TFLOP/s") == "658.2 TFLOP/s"
    assert fmt.quantity(4.2698e12, "TB/s") == "4.270 TB/s"
    assert fmt.quantity(824e12, "TFLOP/s", measured=False) == "824 TFLOP/s"
    assert fmt.span(4.2675e12, 4.2722e12, "TB/s", ref=4.2698e12) == "4.268–4.272 TB/s"
    assert (fmt.factor("ms"), fmt.factor("%"), fmt.factor("TB/s"), fmt.factor("tok/s")) == (1e3, 100.0, 1e-12, 1.0)


def test_one_renderer_of_a_prediction() -> None:
    assert fmt.prediction("value", unit="tok/s", value=220.66, tolerance=0.06) == "220.7 tok/s ± 6%"
    assert fmt.prediction("value", unit="x", value=1.0, tolerance=0.02, sides="fp8 ÷ bf16") == "fp8 ÷ bf16: 1x ± 2%"
    assert fmt.prediction("range", unit="x", low=1.04, high=1.06) == "in 1.04x–1.06x"
    assert fmt.prediction("relation", unit="ms", relation="<", value=1.0) == "< 1,000 ms"
    assert fmt.prediction("value", unit="%", value=0.98, tolerance=0.05) == "98% ± 5% (relative)"
    # a plan shows expressions before they are evaluated
    assert fmt.prediction("relation", unit="tok/s", relation=">", value="0.5 * roofline.x") == "> (0.5 * roofline.x)"
    assert fmt.prediction("value", unit="tok/s") == "(not evaluated)"


def test_si_prefixes() -> None:
    assert fmt.si(16.38e9, "B") == "16.38 GB" and fmt.si(1.514e10, "FLOP") == "15.14 GFLOP"
    assert fmt.si(950, "B") == "950 B" and fmt.si(None, "B") == "-"


def test_a_capacity_is_the_level_the_search_probed() -> None:
    assert fmt.digits(2.0, "load") == "2" and fmt.digits(12.5, "load") == "12.5"
    assert fmt.digits(2.0, "tokens") == "2.000"  # other measured numbers keep four significant digits
