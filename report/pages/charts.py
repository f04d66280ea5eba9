"""One function per chart: typed rows in, an Altair chart out. Studies with several workloads get one
panel per workload; repeats are drawn as their mean with the min-max spread; every dash style and
marker shape is named in a legend. Pages embed `spec(chart)` as JSON and
vendored vega-embed draws it, so charts work offline. Rows are plain numbers in SI units, except where
a chart converts for display (ms, GB/s), which it says in its axis title.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Ladder:
    """The x axis of a per-point chart: the rows' field for the point's rung and the axis title."""

    field: str
    title: str


CONCURRENCY = Ladder("concurrency", "concurrency")  # closed loop: requests in flight
RATE = Ladder("rate_rps", "rate (req/s)")  # open loop: arrivals per second


def spec(chart: alt.TopLevelMixin) -> dict[str, Any]:
    """The chart as a Vega-Lite dict, without the `$schema` URL (the site references nothing external;
    vega-embed is told the mode instead)."""
    out = chart.to_dict()
    out.pop("$schema", None)
    return out


def _data(rows: Sequence[Row]) -> alt.Data:
    """Inline rows, not validated here: `spec` validates the whole chart, these values in it (Altair's
    debug mode would walk every row twice: half of a big site's build time)."""
    with alt.utils.schemapi.debug_mode(False):
        return alt.Data(values=[dict(r) for r in rows])


def _ladder_axis(rows: Sequence[Row], ladder: Ladder) -> alt.X:
    ticks = sorted({float(r[ladder.field]) for r in rows if r.get(ladder.field)})
    wide = bool(ticks) and min(ticks) > 0 and max(ticks) / min(ticks) >= 8
    scale = alt.Scale(type="log", base=2) if wide else alt.Scale(zero=False)
    return alt.X(f"{ladder.field}:Q", title=ladder.title, scale=scale, axis=alt.Axis(values=ticks, format="~g"))


def _sized(chart: Any, height: int = HEIGHT) -> Any:
    return chart.properties(width=WIDTH, height=height)


def _workloads(rows: Sequence[Row]) -> list[str]:
    return sorted({str(r["workload"]) for r in rows})


def _by_workload(layers: Sequence[Any], rows: Sequence[Row], height: int = HEIGHT) -> Any:
    """The layers on one plot, or one panel per workload (side by side, shared y) when there are several:
    a study of many points stays readable as a few lines per panel."""
    workloads = _workloads(rows)
    if len(workloads) < 2:
        return alt.layer(*layers, data=_data(rows)).properties(width=WIDTH, height=height)
    width = max(260, (2 * WIDTH) // len(workloads) - 40)
    return alt.layer(*layers, data=_data(rows)).properties(width=width, height=height).facet(
        column=alt.Column("workload:N", title="workload", sort=workloads))


def _arm_color() -> alt.Color:
    return alt.Color("arm:N", title="arm")


# A legend entry drawn as a short line in its dash style (a point mark would hide the dashes).
_STROKE_LEGEND = alt.Legend(symbolType="stroke", symbolStrokeColor="#333333", symbolStrokeWidth=2, symbolSize=400)


def _dash_legend(label: str) -> alt.StrokeDash:
    """The dash style of a reference line whose rows carry `what` = label: named in the legend."""
    return alt.StrokeDash("what:N", title=None, scale=alt.Scale(domain=[label], range=[[5, 4]]),
                          legend=_STROKE_LEGEND)


def throughput_chart(rows: Sequence[Row], ladder: Ladder = CONCURRENCY) -> Any:
    """Output throughput vs the ladder per arm (one panel per workload when there are several): the mean
    over repeats as a line, every repeat as a dot, the min-max spread as a rule.
    Rows: arm, workload, <ladder field>, repeat, value."""
    x = _ladder_axis(rows, ladder)
    tip = [alt.Tooltip("arm:N"), alt.Tooltip("workload:N"), alt.Tooltip(f"{ladder.field}:Q"), alt.Tooltip("repeat:Q"),
           alt.Tooltip("value:Q", format=",.1f", title="tok/s")]
    line = alt.Chart().mark_line().encode(x=x, y=alt.Y("mean(value):Q", title="output throughput (tok/s)"),
                                          color=_arm_color())
    spread = alt.Chart().mark_rule(strokeWidth=2).encode(x=x, y="min(value):Q", y2="max(value):Q", color=_arm_color())
    dots = alt.Chart().mark_circle(size=40, opacity=0.7).encode(x=x, y="value:Q", color=_arm_color(), tooltip=tip)
    return _by_workload([line, spread, dots], rows)


def latency_chart(rows: Sequence[Row], what: str, ladder: Ladder = CONCURRENCY) -> Any:
    """p50 and p95 of one latency (TTFT or ITL) vs the ladder per arm, mean over repeats with the min-max
    spread; the percentile is the dash style. Rows: arm, workload, <ladder field>, stat (p50|p95), value_ms."""
    x = _ladder_axis(rows, ladder)
    dash = alt.StrokeDash("stat:N", title="percentile",
                          scale=alt.Scale(domain=["p50", "p95"], range=[[1, 0], [6, 3]]),
                          legend=_STROKE_LEGEND)
    y = alt.Y("mean(value_ms):Q", title=f"{what} (ms)")
    line = alt.Chart().mark_line().encode(x=x, y=y, color=_arm_color(), strokeDash=dash)
    dots = alt.Chart().mark_circle(size=30).encode(
        x=x, y=y, color=_arm_color(), detail="stat:N",
        tooltip=[alt.Tooltip("arm:N"), alt.Tooltip("workload:N"), alt.Tooltip("stat:N"), alt.Tooltip(f"{ladder.field}:Q"),
                 alt.Tooltip("mean(value_ms):Q", format=",.2f", title="mean ms")],
    )
    spread = alt.Chart().mark_rule(strokeWidth=2, opacity=0.6).encode(
        x=x, y="min(value_ms):Q", y2="max(value_ms):Q", color=_arm_color(), detail="stat:N")
    return _by_workload([line, dots, spread], rows)


def roofline_chart(points: Sequence[Row], ceilings: Sequence[Row], ladder: Ladder = CONCURRENCY) -> alt.LayerChart:
    """Measured decode points placed under the roofline: attained FLOP/s vs arithmetic intensity, with the
    calibrated and the spec-sheet ceilings (dash style, in the legend). Points: series (arm · workload),
    <ladder field>, intensity, flops_per_s, fraction; color and marker shape both name the series, in one legend.
    Ceilings: ceiling (label), intensity, flops_per_s."""
    x = alt.X("intensity:Q", title="arithmetic intensity (FLOP/byte, decode model)", scale=alt.Scale(type="log"))
    y = alt.Y("tflops:Q", title="attained TFLOP/s", scale=alt.Scale(type="log"))
    labels = sorted({str(r["ceiling"]) for r in ceilings})
    roofs = alt.Chart(_data([r | {"tflops": r["flops_per_s"] / 1e12} for r in ceilings])).mark_line().encode(
        x=x, y=y, color=alt.value("#555555"),
        strokeDash=alt.StrokeDash("ceiling:N", title="ceiling", sort=labels,
                                  scale=alt.Scale(domain=labels, range=[[1, 0], [6, 3]][: len(labels)]),
                                  legend=_STROKE_LEGEND),
    )
    dots = alt.Chart(_data([r | {"tflops": r["flops_per_s"] / 1e12} for r in points])).mark_point(
        filled=True, size=70
    ).encode(
        x=x, y=y, color=alt.Color("series:N", title="arm · workload"),
        shape=alt.Shape("series:N", title="arm · workload"),
        tooltip=[alt.Tooltip("series:N"), alt.Tooltip(f"{ladder.field}:Q", title="load level"),
                 alt.Tooltip("intensity:Q", format=".3g"), alt.Tooltip("tflops:Q", format=".3g"),
                 alt.Tooltip("fraction:Q", format=".1%", title="of calibrated ceiling")],
    )
    return _sized(alt.layer(roofs, dots), HEIGHT + 40)


def all_zero(rows: Sequence[Row], field: str) -> bool:
    """Whether every row's `field` is 0: such a chart is one line of text instead."""
    return bool(rows) and all(float(r[field]) == 0 for r in rows)


def ladder_chart(rows: Sequence[Row], field: str, title: str, threshold: float | None,
                 threshold_label: str = "", ladder: Ladder = CONCURRENCY, percent: bool = False) -> Any:
    """A per-point quantity vs the ladder per arm (one panel per workload when there are several): the
    mean over repeats as a line with dots, the min-max over repeats as a rule, and a dashed threshold
    named in the legend. Rows: arm, workload, <ladder field>, repeat, <field>."""
    x = _ladder_axis(rows, ladder)
    fmt = ".1%" if percent else ".4f"
    axis = alt.Axis(format="%") if percent else alt.Axis()
    line = alt.Chart().mark_line(point=True).encode(
        x=x, y=alt.Y(f"mean({field}):Q", title=title, axis=axis), color=_arm_color(),
        tooltip=[alt.Tooltip("arm:N"), alt.Tooltip("workload:N"), alt.Tooltip(f"{ladder.field}:Q"),
                 alt.Tooltip(f"mean({field}):Q", format=fmt, title="mean"),
                 alt.Tooltip(f"min({field}):Q", format=fmt, title="min"),
                 alt.Tooltip(f"max({field}):Q", format=fmt, title="max"),
                 alt.Tooltip(f"count({field}):Q", title="repeats")],
    )
    spread = alt.Chart().mark_rule(strokeWidth=2, opacity=0.6).encode(
        x=x, y=f"min({field}):Q", y2=f"max({field}):Q", color=_arm_color())
    layers: list[Any] = [line, spread]
    if threshold is not None:
        layers.append(alt.Chart().transform_aggregate(rows="count()").transform_calculate(
            what=f"{json.dumps(threshold_label)}", threshold=f"{threshold!r}").mark_rule(color="#c62828").encode(
            y=alt.Y("threshold:Q"), strokeDash=_dash_legend(threshold_label)))
    return _by_workload(layers, rows, HEIGHT - 40)


def cache_hit_chart(rows: Sequence[Row], max_cold: float, ladder: Ladder = CONCURRENCY) -> Any:
    """Prefix-cache hit rate per arm and rung, against the highest rate a cold (reset) point may show."""
    return ladder_chart(rows, "hit_rate", "prefix-cache hit rate", max_cold, "max cold hit rate", ladder,
                        percent=True)


def littles_law_chart(rows: Sequence[Row], tolerance: float, ladder: Ladder = CONCURRENCY) -> Any:
    """Little's Law relative error per arm and rung, against the study's tolerance."""
    return ladder_chart(rows, "error", "Little's Law relative error", tolerance, "tolerance", ladder,
                        percent=True)


def thin_series(rows: Sequence[Row], columns: int = WIDTH) -> list[Row]:
    """The samples a step line `columns` pixels wide draws, per quantity: within each column's share of the
    time axis (shared by every quantity) its first, last, lowest and highest sample (M4: Jugel et al., VLDB
    2014), then without a sample equal to the one before it (a step line draws the same without it), the last
    one kept (it ends the line). fp8-kv's NVML, 8,141 samples a quantity over 23 minutes, is 16 a column.
    Rows: t_s, quantity, value, sorted by quantity then t_s."""
    if not rows:
        return []
    t0 = min(float(r["t_s"]) for r in rows)
    span = max(float(r["t_s"]) for r in rows) - t0 or 1.0
    out: list[Row] = []
    for quantity in dict.fromkeys(r["quantity"] for r in rows):
        series = [r for r in rows if r["quantity"] == quantity]
        columns_of: dict[int, list[int]] = {}
        for i, r in enumerate(series):
            columns_of.setdefault(min(columns - 1, int((float(r["t_s"]) - t0) / span * columns)), []).append(i)
        keep = sorted({i for c in columns_of.values() for i in (
            c[0], c[-1], min(c, key=lambda i: series[i]["value"]), max(c, key=lambda i: series[i]["value"]))})
        last = keep[-1]
        out += [series[i] for n, i in enumerate(keep)
                if n == 0 or i == last or series[i]["value"] != series[keep[n - 1]]["value"]]
    return out


def timeseries_chart(rows: Sequence[Row], title: str) -> alt.FacetChart:
    """Quantities over run time, one panel each with its own y scale, thinned to what the line draws
    (thin_series). Rows: t_s, quantity, value."""
    base = alt.Chart(_data(thin_series(rows))).mark_line(interpolate="step-after").encode(
        x=alt.X("t_s:Q", title="time since run start (s)"),
        y=alt.Y("value:Q", title=None),
        tooltip=[alt.Tooltip("quantity:N"), alt.Tooltip("t_s:Q", format=".1f"),
                 alt.Tooltip("value:Q", format=",.3g")],
    ).properties(width=WIDTH, height=110)
    return base.facet(row=alt.Row("quantity:N", title=title)).resolve_scale(y="independent")


def capacity_chart(probes: Sequence[Row], capacities: Sequence[Row], target: float, ladder: Ladder) -> Any:
    """SLO attainment against load per arm, one line per launch's search with each probe's 95% Wilson
    interval as a rule, the attainment a level must hold (dashed) and each launch's capacity as a vertical
    rule. Rows: arm, launch, <ladder field>, attainment, low, high; capacities: arm, launch, capacity."""
    x = _ladder_axis(probes, ladder)
    y = alt.Y("attainment:Q", title="SLO attainment", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1]))
    line = alt.Chart(_data(probes)).mark_line(point=True).encode(
        x=x, y=y, color=_arm_color(), detail="launch:N",
        tooltip=[alt.Tooltip("arm:N"), alt.Tooltip("launch:N"), alt.Tooltip(f"{ladder.field}:Q"),
                 alt.Tooltip("attainment:Q", format=".1%"), alt.Tooltip("low:Q", format=".1%", title="95% low"),
                 alt.Tooltip("high:Q", format=".1%", title="95% high")])
    spread = alt.Chart(_data(probes)).mark_rule(strokeWidth=2, opacity=0.5).encode(
        x=x, y="low:Q", y2="high:Q", color=_arm_color())
    need = alt.Chart(_data([{"what": "attainment to hold", "target": target}])).mark_rule(color="#c62828").encode(
        y=alt.Y("target:Q"), strokeDash=_dash_legend("attainment to hold"))
    layers: list[Any] = [line, spread, need]
    if capacities:
        layers.append(alt.Chart(_data(capacities)).mark_rule(strokeDash=[2, 2]).encode(
            x=alt.X("capacity:Q"), color=_arm_color(),
            tooltip=[alt.Tooltip("arm:N"), alt.Tooltip("launch:N"), alt.Tooltip("capacity:Q", format="~g")]))
    return _sized(alt.layer(*layers))


def workload_chart(lengths: Sequence[Row], arrivals: Sequence[Row]) -> Any:
    """What a shaped workload sent, one row of panels per workload: the histogram of its measured requests'
    prompt and output tokens, and when each request was scheduled (a dot per request, by turn).
    Rows: workload, what ("prompt tokens" / "output tokens"), tokens; arrivals: workload, offset_s, turn."""
    hist = alt.Chart(_data(lengths)).mark_bar(opacity=0.7).encode(
        x=alt.X("tokens:Q", bin=alt.Bin(maxbins=30), title="tokens per request"),
        y=alt.Y("count():Q", title="requests", stack=None),
        color=alt.Color("what:N", title=None),
        tooltip=[alt.Tooltip("what:N"), alt.Tooltip("count():Q", title="requests")],
    ).properties(width=300, height=HEIGHT // 2)
    when = alt.Chart(_data(arrivals)).mark_tick(thickness=1).encode(
        x=alt.X("offset_s:Q", title="scheduled send, s after the point's first"),
        y=alt.Y("turn:O", title="turn"),
        tooltip=[alt.Tooltip("offset_s:Q", format=".3f"), alt.Tooltip("turn:O")],
    ).properties(width=300, height=HEIGHT // 2)
    return alt.hconcat(hist.facet(row=alt.Row("workload:N", title=None)),
                       when.facet(row=alt.Row("workload:N", title=None))).resolve_scale(color="independent")
