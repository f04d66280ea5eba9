"""One function per chart: typed rows in, an Altair chart out. Pages embed `spec(chart)` as JSON and
vendored vega-embed draws it, so charts work offline. Rows are plain numbers in SI units, except where
a chart converts for display (ms, GB/s), which it says in its axis title.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import altair as alt

WIDTH = 520
HEIGHT = 260
VERDICT_COLORS = {
    "confirmed": "#2e7d32",
    "refuted": "#c62828",
    "inconclusive": "#f9a825",
    "invalid": "#6a1b9a",
    "not run": "#9e9e9e",
}

Row = dict[str, Any]


def spec(chart: alt.TopLevelMixin) -> dict[str, Any]:
    """The chart as a Vega-Lite dict, without the `$schema` URL (the site references nothing external;
    vega-embed is told the mode instead)."""
    out = chart.to_dict()
    out.pop("$schema", None)
    return out


def _data(rows: Sequence[Row]) -> alt.Data:
    return alt.Data(values=[dict(r) for r in rows])


def _level_axis(rows: Sequence[Row], title: str) -> alt.X:
    levels = sorted({float(r["level"]) for r in rows if r.get("level")})
    wide = bool(levels) and min(levels) > 0 and max(levels) / min(levels) >= 8
    scale = alt.Scale(type="log", base=2) if wide else alt.Scale(zero=False)
    return alt.X("level:Q", title=title, scale=scale, axis=alt.Axis(values=levels, format="~g"))


def _sized(chart: Any, height: int = HEIGHT) -> Any:
    return chart.properties(width=WIDTH, height=height)


def throughput_chart(rows: Sequence[Row], level_title: str = "concurrency") -> alt.LayerChart:
    """Output throughput vs load level per series (arm, or arm · workload): the mean over repeats as a
    line, every repeat as a dot, the min-max spread as a rule. Rows: series, level, repeat, value."""
    base = alt.Chart(_data(rows)).encode(
        x=_level_axis(rows, level_title), color=alt.Color("series:N", title="arm")
    )
    tip = [alt.Tooltip("series:N"), alt.Tooltip("level:Q"), alt.Tooltip("repeat:Q"),
           alt.Tooltip("value:Q", format=",.1f", title="tok/s")]
    line = base.mark_line().encode(y=alt.Y("mean(value):Q", title="output throughput (tok/s)"))
    spread = base.mark_rule(strokeWidth=2).encode(y="min(value):Q", y2="max(value):Q")
    dots = base.mark_circle(size=40, opacity=0.7).encode(y="value:Q", tooltip=tip)
    return _sized(alt.layer(line, spread, dots))


def latency_chart(rows: Sequence[Row], what: str, level_title: str = "concurrency") -> alt.LayerChart:
    """p50 and p95 of one latency (TTFT or ITL) vs load level per series, mean over repeats with the
    min-max spread. Rows: series, level, stat (p50|p95), value_ms."""
    base = alt.Chart(_data(rows)).encode(
        x=_level_axis(rows, level_title),
        color=alt.Color("series:N", title="arm"),
        strokeDash=alt.StrokeDash("stat:N", title="percentile"),
    )
    line = base.mark_line(point=True).encode(
        y=alt.Y("mean(value_ms):Q", title=f"{what} (ms)"),
        tooltip=[alt.Tooltip("series:N"), alt.Tooltip("stat:N"), alt.Tooltip("level:Q"),
                 alt.Tooltip("mean(value_ms):Q", format=",.2f", title="mean ms")],
    )
    spread = base.mark_rule(strokeWidth=2, opacity=0.6).encode(y="min(value_ms):Q", y2="max(value_ms):Q")
    return _sized(alt.layer(line, spread))


def roofline_chart(points: Sequence[Row], ceilings: Sequence[Row]) -> alt.LayerChart:
    """Measured decode points placed under the roofline: attained FLOP/s vs arithmetic intensity, with the
    calibrated and the spec-sheet ceilings. Points: series, level, intensity, flops_per_s, fraction.
    Ceilings: ceiling (label), intensity, flops_per_s."""
    x = alt.X("intensity:Q", title="arithmetic intensity (FLOP/byte, decode model)", scale=alt.Scale(type="log"))
    y = alt.Y("tflops:Q", title="attained TFLOP/s", scale=alt.Scale(type="log"))
    roofs = alt.Chart(_data([r | {"tflops": r["flops_per_s"] / 1e12} for r in ceilings])).mark_line().encode(
        x=x, y=y, strokeDash=alt.StrokeDash("ceiling:N", title="ceiling"),
        color=alt.value("#555555"),
    )
    dots = alt.Chart(_data([r | {"tflops": r["flops_per_s"] / 1e12} for r in points])).mark_point(
        filled=True, size=70
    ).encode(
        x=x, y=y, color=alt.Color("series:N", title="arm"), shape=alt.Shape("series:N", legend=None),
        tooltip=[alt.Tooltip("series:N"), alt.Tooltip("level:Q", title="load level"),
                 alt.Tooltip("intensity:Q", format=".3g"), alt.Tooltip("tflops:Q", format=".3g"),
                 alt.Tooltip("fraction:Q", format=".1%", title="of calibrated ceiling")],
    )
    return _sized(alt.layer(roofs, dots).resolve_scale(color="independent"), HEIGHT + 40)


def per_point_chart(rows: Sequence[Row], field: str, title: str, threshold: float | None,
                    threshold_label: str = "") -> alt.LayerChart:
    """One bar per measured point (run order) for a per-point quantity, with a threshold rule.
    Rows: point, order, series, <field>."""
    base = alt.Chart(_data(rows))
    bars = base.mark_bar().encode(
        x=alt.X("point:N", sort=alt.EncodingSortField(field="order"), title="point",
                axis=alt.Axis(labelAngle=-60, labelLimit=200)),
        y=alt.Y(f"{field}:Q", title=title),
        color=alt.Color("series:N", title="arm"),
        tooltip=[alt.Tooltip("point:N"), alt.Tooltip(f"{field}:Q", format=".4f")],
    )
    layers: list[Any] = [bars]
    if threshold is not None:
        rule = alt.Chart(_data([{"threshold": threshold, "label": threshold_label}])).mark_rule(
            color="#c62828", strokeDash=[4, 3]
        ).encode(y="threshold:Q", tooltip=[alt.Tooltip("label:N"), alt.Tooltip("threshold:Q")])
        layers.append(rule)
    return _sized(alt.layer(*layers), HEIGHT)


def cache_hit_chart(rows: Sequence[Row], max_cold: float) -> alt.LayerChart:
    """Prefix-cache hit rate of every point, against the highest rate a cold (reset) point may show."""
    return per_point_chart(rows, "hit_rate", "prefix-cache hit rate", max_cold, "max cold hit rate")


def littles_law_chart(rows: Sequence[Row], tolerance: float) -> alt.LayerChart:
    """Little's Law relative error of every point, against the study's tolerance."""
    return per_point_chart(rows, "error", "Little's Law relative error", tolerance, "tolerance")


def timeseries_chart(rows: Sequence[Row], title: str) -> alt.FacetChart:
    """Quantities over run time, one panel each with its own y scale. Rows: t_s, quantity, value."""
    base = alt.Chart(_data(rows)).mark_line(interpolate="step-after").encode(
        x=alt.X("t_s:Q", title="time since run start (s)"),
        y=alt.Y("value:Q", title=None),
        tooltip=[alt.Tooltip("quantity:N"), alt.Tooltip("t_s:Q", format=".1f"),
                 alt.Tooltip("value:Q", format=",.3g")],
    ).properties(width=WIDTH, height=110)
    return base.facet(row=alt.Row("quantity:N", title=title)).resolve_scale(y="independent")


def audit_scatter(rows: Sequence[Row]) -> alt.LayerChart:
    """Predicted vs measured across studies on log axes: the y = x line, each prediction's band as a
    wide translucent bar, the measured 95% interval as a thin rule, a dot per hypothesis colored by
    verdict. Rows: label, claim, verdict, predicted, measured (positive), ci_low, ci_high, band_low,
    band_high (None for an open end); intervals and bands are clipped to the plot's decades."""
    values = [v for r in rows for v in (r["predicted"], r["measured"]) if v and v > 0]
    low, high = (min(values) / 3, max(values) * 3) if values else (0.1, 10.0)
    low, high = 10 ** math.floor(math.log10(low)), 10 ** math.ceil(math.log10(high))

    def clip(v: float | None, open_end: float) -> float:
        return open_end if v is None else min(max(v, low), high)

    rows = [r | {"ci_low": clip(r["ci_low"], low), "ci_high": clip(r["ci_high"], high),
                 "band_low": clip(r["band_low"], low), "band_high": clip(r["band_high"], high)} for r in rows]
    scale = alt.Scale(type="log", domain=[low, high])
    x = alt.X("predicted:Q", title="predicted", scale=scale)
    diagonal = alt.Chart(_data([{"predicted": low, "y": low}, {"predicted": high, "y": high}])).mark_line(
        color="#777777", strokeDash=[5, 4]
    ).encode(x=x, y=alt.Y("y:Q", scale=scale, title="measured"))
    base = alt.Chart(_data(rows))
    band = base.mark_rule(strokeWidth=10, opacity=0.25).encode(
        x=x, y=alt.Y("band_low:Q", scale=scale), y2="band_high:Q",
        color=alt.Color("verdict:N", scale=_verdict_scale(), legend=None),
    )
    ci = base.mark_rule(strokeWidth=1.5).encode(
        x=x, y=alt.Y("ci_low:Q", scale=scale), y2="ci_high:Q",
        color=alt.Color("verdict:N", scale=_verdict_scale(), legend=None),
    )
    dots = base.mark_circle(size=80, opacity=0.9).encode(
        x=x, y=alt.Y("measured:Q", scale=scale, title="measured"),
        color=alt.Color("verdict:N", scale=_verdict_scale(), title="verdict"),
        tooltip=[alt.Tooltip("label:N", title="hypothesis"), alt.Tooltip("claim:N"),
                 alt.Tooltip("verdict:N"), alt.Tooltip("predicted:Q", format=".4g"),
                 alt.Tooltip("measured:Q", format=".4g")],
    )
    chart = alt.layer(diagonal, band, ci, dots)
    assert isinstance(chart, alt.LayerChart)  # a FacetChart only when the layers carry facet encodings
    return chart.properties(width=WIDTH, height=WIDTH)


def _verdict_scale() -> alt.Scale:
    return alt.Scale(domain=list(VERDICT_COLORS), range=list(VERDICT_COLORS.values()))
