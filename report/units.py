"""Unit-aware numbers for sentences and tables: tok/s, ms for latencies, % for rates, x for ratios.

Shared by the "Against the seed" note on study pages and `studyc audit --markdown`. Pure.
"""

from __future__ import annotations

import math

from compiler.metrics import METRICS
from report.scoring import Score

TIGHT = ("x", "%")  # suffixes written without a space: 0.978x, 98.4%


def display_unit(score: Score) -> str:
    """The unit a score's numbers are shown in: x (ratio), % (a 0-1 metric), ms (seconds), else the metric's."""
    if score.ratio:
        return "x"
    metric = METRICS.get(score.metric)
    unit = metric.unit if metric else score.unit
    if unit == "ratio":
        return "%"
    if unit == "s":
        return "ms"
    return unit


def number(x: float, unit: str, *, measured: bool = True, ref: float | None = None) -> str:
    """`x` (in the metric's own unit) as digits in the display unit, without the unit.

    Measured ratios keep three decimals (0.978, 1.019) because their distance from 1 is the point;
    predicted numbers are written as given, to four significant digits (1, 0.5, 1.94, 220.7, 1,714).
    Other measured numbers get the decimals that give `ref` (default `x`) four significant digits, so
    the ends of an interval line up with its mean: 189.3, 187.5–191.0."""
    if not math.isfinite(x):
        return "-"
    if unit == "x":
        return f"{x:.3f}" if measured else f"{x:.4g}"
    if unit == "%":
        return f"{100 * x:.1f}"
    scale = 1e3 if unit == "ms" else 1.0
    if not measured:
        return _sig(scale * x)
    return _fixed(scale * x, scale * (x if ref is None else ref))


def with_unit(digits: str, unit: str) -> str:
    if not unit or digits == "-":
        return digits
    return f"{digits}{unit}" if unit in TIGHT else f"{digits} {unit}"


def quantity(x: float | None, unit: str, *, measured: bool = True) -> str:
    """`x` with its display unit: "189.3 tok/s", "6.63 ms", "98.4%", "0.978x"; "-" for nothing."""
    if x is None:
        return "-"
    return with_unit(number(x, unit, measured=measured), unit)


def span(low: float | None, high: float | None, unit: str, *, measured: bool = True,
         ref: float | None = None) -> str:
    """An interval with the unit once, as many decimals as `ref` (its mean) shows: "187.5–191.0 tok/s"."""
    if low is None or high is None:
        return "-"
    ref = ref if ref is not None else max(abs(low), abs(high))
    return with_unit(f"{number(low, unit, measured=measured, ref=ref)}–{number(high, unit, measured=measured, ref=ref)}",
                     unit)


def _fixed(x: float, ref: float, digits: int = 4) -> str:
    """`x` with as many decimals as give `ref` four significant digits, thousands separated, never
    scientific: 189.3, 1,714, 790,272, 6.632."""
    if ref == 0 or not math.isfinite(ref):
        decimals = 0 if x == int(x) else digits
    else:
        decimals = min(max(digits - 1 - math.floor(math.log10(abs(ref))), 0), 9)
    return f"{x:,.{decimals}f}"


def _sig(x: float, digits: int = 4) -> str:
    """Four significant digits without trailing zeros, thousands separated, never scientific."""
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    text = f"{x:.{digits}g}"
    if "e" in text:
        return _fixed(x, x, digits)
    whole, dot, frac = text.partition(".")
    return f"{int(whole):,}{dot}{frac}" if whole.lstrip("-").isdigit() and whole != "-0" else text


def ratio_sides(targets: tuple[str, ...]) -> str:
    """"fp8 ÷ bf16" from the targets "fp8/decode/1", "bf16/decode/1": only the parts that differ."""
    if len(targets) != 2:
        return ""
    top, bottom = (t.split("/") for t in targets)
    if len(top) != len(bottom):
        return f"{targets[0]} ÷ {targets[1]}"
    keep = [i for i, (a, b) in enumerate(zip(top, bottom, strict=True)) if a != b] or list(range(len(top)))
    return f"{'/'.join(top[i] for i in keep)} ÷ {'/'.join(bottom[i] for i in keep)}"


def prediction(score: Score) -> str:
    """The prediction in display units, like the terminal table: "220.7 tok/s ± 6%", "in [1.04x, 1.06x]",
    "< 1,714 tok/s", "fp8 ÷ bf16 1x ± 2%"; a relative tolerance on a percentage says so."""
    if score.predicted is None:
        return "(not evaluated)"
    unit = display_unit(score)

    def q(x: float | None) -> str:
        return quantity(x, unit, measured=False)

    if score.kind == "range":
        text = f"in [{q(score.band_low)}, {q(score.band_high)}]"
    elif score.kind == "relation":
        text = f"{score.relation} {q(score.predicted)}"
    else:
        tol = f"{100 * (score.tolerance if score.tolerance is not None else 0.05):g}%"
        text = f"{q(score.predicted)} ± {tol}" + (" (relative)" if unit == "%" else "")
    sides = ratio_sides(score.targets) if score.ratio else ""
    return f"{sides}: {text}" if sides else text


def measured(score: Score, *, spread: bool = False, n: bool = False) -> str:
    """The measured mean with its 95% interval, and when asked the min-max spread over repeats and n:
    "189.3 tok/s (95% CI 187.5–191.0 tok/s)"; one value has no interval and says so."""
    if score.measured is None:
        return "not measured"
    unit = display_unit(score)
    main = quantity(score.measured, unit)
    if score.n < 2:
        parts = ["a single value"]
    else:
        ref = score.measured
        parts = [f"95% CI {span(score.ci_low, score.ci_high, unit, ref=ref)}"]
        if spread:
            parts.append(f"spread {span(score.spread_low, score.spread_high, unit, ref=ref)}")
    if n:
        parts.append(f"n = {score.n}")
    return f"{main} ({'; '.join(parts)})"
