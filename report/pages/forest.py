"""The forest plot of the audit: every hypothesis as a row, its predicted band (or a relation's allowed
side) shaded and its measured interval drawn over it, coloured by verdict. Scores in, an Altair chart out.

Each row has its own x axis, in the row's display unit (log for a ratio, linear for a plain value), zoomed
to its band and interval: on one shared axis the rows span 0.1x to 10x and a 0.6% miss (fp8-kv at c1,
0.974x against a 0.98x edge) is under a pixel; here it is tens of pixels, and ms, tok/s and % rows keep
their units instead of being divided by a prediction that a relation does not have.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import altair as alt

from base import format as fmt
from report.pages.charts import VERDICT_COLORS, WIDTH, _data
from report.scoring import score_text
from report.scoring.score_model import Score

ROW_HEIGHT = 26
PAD = 0.12  # of the row's span (log span for a log axis), left and right of what it shows
BAND_COLOR = "#90a4ae"
EDGE_COLOR = "#455a64"


@dataclass(frozen=True)
class ForestRow:
    """One hypothesis on the plot, numbers in its display unit (ms, %, x, tok/s); None: not there (an open
    band end, no interval, not measured)."""

    label: str
    verdict: str
    unit: str
    log: bool
    kind: str  # value | range | relation
    relation: str | None
    estimate: float | None
    low: float | None
    high: float | None
    band_low: float | None
    band_high: float | None
    predicted: float | None
    text: str  # the row's label under its name: verdict, estimate, interval at its level, prediction
    tooltip: tuple[tuple[str, str], ...]  # (title, text)

    @property
    def empty(self) -> bool:
        """Nothing measured: the row is its text alone ("not run")."""
        return self.estimate is None


def forest_row(s: Score, label: str) -> ForestRow:
    """A score as a row of the plot; `label` names it ("fp8-kv/neutral-at-c1" on the audit page)."""
    unit = s.display_unit
    k = fmt.factor(unit)

    def shown(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else k * x

    low, high = (s.ci_low, s.ci_high) if s.n >= 2 else (None, None)
    values = [v for v in (s.measured, low, high, s.band_low, s.band_high) if v is not None]
    log = s.ratio and all(v > 0 for v in values)
    if s.measured is None:
        text = s.verdict if s.verdict == "not run" else f"{s.verdict}: not measured"
    else:
        at = f"{score_text.interval(s)}, {s.interval_label}" if low is not None else "one value, no interval"
        text = f"{s.verdict_label} · {score_text.mean(s)} ({at}) · predicted {score_text.prediction(s)}"
    tip = (("hypothesis", label), ("claim", s.claim), ("verdict", s.verdict_label),
           ("predicted", score_text.prediction(s)), ("measured", score_text.mean(s)),
           ("interval", score_text.interval(s)), ("level", s.interval_label if low is not None else "-"),
           ("n", str(s.n)))
    return ForestRow(label=label, verdict=s.verdict, unit=unit, log=log, kind=s.kind, relation=s.relation,
                     estimate=shown(s.measured), low=shown(low), high=shown(high), band_low=shown(s.band_low),
                     band_high=shown(s.band_high), predicted=shown(s.predicted) if s.kind == "value" else None,
                     text=text, tooltip=tip)


def domain(row: ForestRow) -> tuple[float, float]:
    """The row's x range: its estimate, interval and band edges, padded by PAD of their span (in log
    space on a log axis) so nothing sits on the frame."""
    values = [v for v in (row.estimate, row.low, row.high, row.band_low, row.band_high) if v is not None]
    if row.log:
        lo, hi = math.log(min(values)), math.log(max(values))
        pad = PAD * (hi - lo) or 0.05
        return math.exp(lo - pad), math.exp(hi + pad)
    lo, hi = min(values), max(values)
    pad = PAD * (hi - lo) or 0.05 * abs(lo) or 1.0
    return lo - pad, hi + pad


def _shade(row: ForestRow, lo: float, hi: float) -> tuple[float, float] | None:
    """The shaded stretch: the band (value, range) or the allowed side of a relation's threshold, open
    ends run to the frame."""
    if row.band_low is None and row.band_high is None:
        return None
    left = lo if row.band_low is None else max(row.band_low, lo)
    right = hi if row.band_high is None else min(row.band_high, hi)
    return (left, right) if left < right else None


def _axis(row: ForestRow) -> alt.Axis:
    suffix = row.unit if row.unit in ("x", "%") else f" {row.unit}" if row.unit else ""
    # a log axis leaves some tick labels blank: those stay blank rather than read as a bare unit
    return alt.Axis(title=None, format=",.4~r", labelExpr=f"datum.label ? datum.label + {suffix!r} : ''",
                    tickCount=6 if row.unit in ("x", "%") else 4, grid=False)


def _verdict_color() -> alt.Color:
    return alt.Color("verdict:N", title="verdict", scale=alt.Scale(domain=list(VERDICT_COLORS),
                                                                    range=list(VERDICT_COLORS.values())))


def _title(row: ForestRow) -> alt.TitleParams:
    return alt.TitleParams(row.label, subtitle=row.text, anchor="start", fontSize=12, subtitleFontSize=11,
                           subtitleColor="#333333", limit=WIDTH + 120, subtitlePadding=2)


def _row_chart(row: ForestRow, i: int) -> Any:
    """One row: shade, edges, the predicted value (dotted), the interval and the estimate; or, with
    nothing measured, its text in an empty frame."""
    middle = alt.value(ROW_HEIGHT / 2)
    if row.empty:
        empty = alt.Chart(_data([{"verdict": row.verdict, "text": row.verdict}]), name=f"empty_{i}").mark_text(
            color=VERDICT_COLORS.get(row.verdict, "#333333"), fontSize=12, fontStyle="italic").encode(
            x=alt.value(WIDTH / 2), y=middle, text="text:N")
        return alt.layer(empty, title=_title(row)).properties(width=WIDTH, height=ROW_HEIGHT)
    lo, hi = domain(row)
    x_scale = alt.Scale(type="log" if row.log else "linear", domain=[lo, hi], nice=False, zero=False)
    tip = [alt.Tooltip(f"t{j}:N", title=title) for j, (title, _) in enumerate(row.tooltip)]
    datum = {"verdict": row.verdict, "estimate": row.estimate, "low": row.low, "high": row.high,
             **{f"t{j}": text for j, (_, text) in enumerate(row.tooltip)}}
    layers: list[Any] = []
    shade = _shade(row, lo, hi)
    if shade is not None:
        layers.append(alt.Chart(_data([{"left": shade[0], "right": shade[1]}]), name=f"band_{i}").mark_rect(
            color=BAND_COLOR, opacity=0.35).encode(x=alt.X("left:Q", scale=x_scale, axis=_axis(row)), x2="right:Q"))
    edges = [e for e in (row.band_low, row.band_high) if e is not None and lo <= e <= hi]
    if edges:
        layers.append(alt.Chart(_data([{"edge": e} for e in edges]), name=f"edge_{i}").mark_rule(
            color=EDGE_COLOR, strokeWidth=1.5).encode(x=alt.X("edge:Q", scale=x_scale, axis=_axis(row))))
    if row.predicted is not None and lo <= row.predicted <= hi:
        layers.append(alt.Chart(_data([{"predicted": row.predicted}]), name=f"predicted_{i}").mark_rule(
            color=EDGE_COLOR, strokeDash=[2, 2], opacity=0.7).encode(
            x=alt.X("predicted:Q", scale=x_scale, axis=_axis(row))))
    if row.low is not None and row.high is not None:
        layers.append(alt.Chart(_data([datum]), name=f"interval_{i}").mark_rule(strokeWidth=3).encode(
            x=alt.X("low:Q", scale=x_scale, axis=_axis(row)), x2="high:Q", y=middle, color=_verdict_color(),
            tooltip=tip))
    layers.append(alt.Chart(_data([datum]), name=f"estimate_{i}").mark_point(
        filled=True, size=80, opacity=1, stroke="white", strokeWidth=1).encode(
        x=alt.X("estimate:Q", scale=x_scale, axis=_axis(row)), y=middle, color=_verdict_color(), tooltip=tip))
    return alt.layer(*layers, title=_title(row)).properties(width=WIDTH, height=ROW_HEIGHT)


def forest_chart(rows: Sequence[ForestRow]) -> alt.VConcatChart:
    """Every row stacked, each on its own x axis, one verdict legend for all."""
    chart = alt.vconcat(*(_row_chart(r, i) for i, r in enumerate(rows)), spacing=14)
    return chart.resolve_scale(x="independent", color="shared").configure_view(stroke="#dddddd")


def forest_caption(rows: Sequence[ForestRow]) -> str:
    """The caption: how to read a row (the level each interval was read at is in its text)."""
    log = " (log scale for a ratio)" if any(r.log for r in rows) else ""
    return ("One row per hypothesis, each on its own axis in its own unit" + log + ", zoomed to what it shows. "
            "Shaded: the predicted band or range, or the side a relation allows of its threshold (solid line); "
            "dotted: the predicted value. Bar: the measured interval, at the level written under the row; dot: "
            "the estimate. Colour: the verdict. A row not run is empty.")
