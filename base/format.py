"""The one formatter of numbers, units and predictions, for the site, the terminal and plans. Pure.

One style throughout: ratios as `0.978x`, fractions as percentages `98.4%`, latencies in ms, other
quantities to four significant digits with thousands separators and never in scientific notation,
durations as `3m03s`. A display unit is one of "x" (a ratio), "%" (a 0-1 fraction), "ms" (the value is
in seconds), or a plain unit written after a space ("tok/s", "tokens").
"""

from __future__ import annotations

import math

TIGHT = ("x", "%")  # units written without a space: 0.978x, 98.4%
SCALED = {"FLOP/s": "TFLOP/s", "B/s": "TB/s"}  # a machine's rates, shown in tera: 658.2 TFLOP/s, 4.270 TB/s
FACTOR = {"%": 100.0, "ms": 1e3, "TFLOP/s": 1e-12, "TB/s": 1e-12}  # metric unit -> display unit
NOTHING = "-"


def display_unit(unit: str, *, ratio: bool = False) -> str:
    """The unit a metric's numbers are shown in: "x" for a ratio of two measurements, "%" for a 0-1
    fraction (metric unit "ratio"), "ms" for seconds, "TFLOP/s" and "TB/s" for a machine's rates, else the
    metric's own unit."""
    if ratio:
        return "x"
    if unit == "ratio":
        return "%"
    if unit == "s":
        return "ms"
    return SCALED.get(unit, unit)


def factor(unit: str) -> float:
    """The factor from a metric's own unit to display unit `unit` (1000 for "ms", 100 for "%")."""
    return FACTOR.get(unit, 1.0)


def significant(x: float, digits: int = 4) -> str:
    """`digits` significant digits without trailing zeros, thousands separated, never scientific:
    1, 0.5, 1.94, 220.7, 1,714, 790,272."""
    if not math.isfinite(x):
        return NOTHING
    if abs(x) >= 10**digits:
        return f"{x:,.0f}"
    text = f"{x:.{digits}g}"
    if "e" in text:
        return fixed(x, x, digits)
    whole, dot, frac = text.partition(".")
    return f"{int(whole):,}{dot}{frac}" if whole.lstrip("-").isdigit() and whole != "-0" else text


def fixed(x: float, ref: float, digits: int = 4) -> str:
    """`x` with as many decimals as give `ref` `digits` significant digits, thousands separated, never
    scientific, so the ends of an interval line up with its mean: 189.3, 187.5, 6.632."""
    if not math.isfinite(x):
        return NOTHING
    if ref == 0 or not math.isfinite(ref):
        decimals = 0 if x == int(x) else digits
    else:
        decimals = min(max(digits - 1 - math.floor(math.log10(abs(ref))), 0), 9)
    return f"{x:,.{decimals}f}"


def si(x: float | None, unit: str, digits: int = 4) -> str:
    """A large quantity with an SI prefix: "16.38 GB", "15.14 GFLOP", "950 B"."""
    if x is None or not math.isfinite(x):
        return NOTHING
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{significant(x / size, digits)} {prefix}{unit}"
    return f"{significant(x, digits)} {unit}"


def ratio(x: float | None, decimals: int = 3) -> str:
    """A measured ratio: "0.978x"."""
    return NOTHING if x is None or not math.isfinite(x) else f"{x:.{decimals}f}x"


def percent(x: float | None, decimals: int = 1, *, signed: bool = False) -> str:
    """A fraction as a percentage: 0.984 -> "98.4%"; signed: "+5.3%", "-2.2%", "0.0%"."""
    if x is None or not math.isfinite(x):
        return NOTHING
    if signed and round(100 * x, decimals) != 0:
        return f"{100 * x:+.{decimals}f}%"
    return f"{abs(100 * x) if signed else 100 * x:.{decimals}f}%"


def duration(seconds: float) -> str:
    """A wall-clock estimate: "0m05s", "3m03s", "1h02m03s"."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def digits(x: float, unit: str, *, measured: bool = True, ref: float | None = None) -> str:
    """`x` (in the metric's own unit: seconds, 0-1 fractions) as digits in display unit `unit`.

    Measured ratios keep three decimals (0.978, 1.019): their distance from 1 is the point. Predicted
    numbers are written as given, to four significant digits. Other measured numbers get the decimals
    that give `ref` (default `x`) four significant digits."""
    if not math.isfinite(x):
        return NOTHING
    if unit == "x":
        return f"{x:.3f}" if measured else significant(x)
    if unit == "%":
        return f"{100 * x:.1f}" if measured else significant(100 * x)
    if unit == "load":  # a capacity: a level the search probed, as exact as the search's bracket
        return significant(x)
    scale = factor(unit)
    if not measured:
        return significant(scale * x)
    return fixed(scale * x, scale * (x if ref is None else ref))


def with_unit(text: str, unit: str) -> str:
    if not unit or text == NOTHING:
        return text
    return f"{text}{unit}" if unit in TIGHT else f"{text} {unit}"


def quantity(x: float | None, unit: str, *, measured: bool = True, ref: float | None = None) -> str:
    """`x` with its display unit: "189.3 tok/s", "6.632 ms", "98.4%", "0.978x"; "-" for nothing."""
    if x is None:
        return NOTHING
    return with_unit(digits(x, unit, measured=measured, ref=ref), unit)


def span(low: float | None, high: float | None, unit: str, *, measured: bool = True,
         ref: float | None = None) -> str:
    """An interval, the unit once, both ends as precise as `ref` (its mean): "187.5–191.0 tok/s"."""
    if low is None or high is None:
        return NOTHING
    ref = ref if ref is not None else max(abs(low), abs(high))
    return with_unit(f"{digits(low, unit, measured=measured, ref=ref)}–{digits(high, unit, measured=measured, ref=ref)}",
                     unit)


def prediction(kind: str, *, unit: str, relation: str | None = None, value: float | str | None = None,
               low: float | str | None = None, high: float | str | None = None,
               tolerance: float | None = None, sides: str = "") -> str:
    """A prediction in display unit `unit`: "220.7 tok/s ± 6%", "in 1.04x–1.06x", "< 1,714 tok/s",
    "fp8 ÷ bf16: 1x ± 2%". Values not yet evaluated (expressions, as a plan shows them) are written as
    they are; a relative tolerance on a percentage says so. `kind` is value | range | relation."""

    def q(x: float | str | None) -> str:
        if x is None:
            return "(not evaluated)"
        return f"({x})" if isinstance(x, str) else quantity(x, unit, measured=False)

    if kind == "range" and low is None and high is None:
        text = "(not evaluated)"
    elif kind == "range":
        text = f"in {q(low)}–{q(high)}" if not isinstance(low, str) and not isinstance(high, str) \
            else f"in [{q(low)}, {q(high)}]"
    elif kind == "relation":
        text = f"{relation} {q(value)}"
    elif value is None:
        text = "(not evaluated)"
    else:
        tol = f"{100 * (tolerance if tolerance is not None else 0.05):g}%"
        text = f"{q(value)} ± {tol}" + (" (relative)" if unit == "%" else "")
    return f"{sides}: {text}" if sides else text


def percent_level(confidence: float) -> str:
    """A confidence level as the reader sees it: 0.95 -> "95%", 0.999 -> "99.9%", 0.9975 -> "99.75%"."""
    return f"{100 * confidence:.4g}%"
