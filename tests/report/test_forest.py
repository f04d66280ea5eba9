"""The forest plot's spec: one row per hypothesis, its band or relation side shaded, its interval and
estimate coloured by verdict, a log axis for ratios, the level in the row's text, "not run" rows empty."""

from __future__ import annotations

import math
from typing import Any

import pytest

from report.pages import forest
from report.pages.charts import VERDICT_COLORS, WIDTH, spec
from report.scoring.score_model import Score


def score(**kw: Any) -> Score:
    fields: dict[str, Any] = {f: None for f in Score.__dataclass_fields__}
    fields.update(study_id="s", hypothesis="h", claim="c", metric="output_throughput", unit="tok/s",
                  kind="value", ratio=False, targets=(), values=(), n=0, verdict="not run", verdict_spec="not run",
                  calibrated=True, checks=(), flags=(), reasons=(), point_ids=(), interval="", confidence=0.95,
                  look=None)
    fields.update(kw)
    return Score(**fields)


# fp8-kv at c1 as published: 0.974x in a 0.98-1.02 band, read at the last of twelve looks
C1 = score(hypothesis="neutral-at-c1", ratio=True, targets=("fp8/decode/c1", "bf16/decode/c1"), predicted=1.0,
           tolerance=0.02, band_low=0.98, band_high=1.02, measured=0.97395, ci_low=0.96885, ci_high=0.97909, n=10,
           verdict="refuted", confidence=0.999, look=(10, 12))
FAST = score(hypothesis="small-is-overhead-bound", kind="relation", relation="<", predicted=1715.4,
             band_high=1715.4, measured=501.4, ci_low=230.6, ci_high=772.2, n=3, verdict="confirmed")
NOT_RUN = score(hypothesis="never", ratio=True, kind="relation", relation=">", predicted=1.0, band_low=1.0)


def layers(chart: dict[str, Any], i: int) -> dict[str, dict[str, Any]]:
    """Row i's layers by kind (band, edge, predicted, interval, estimate, empty), each with its data (Altair
    lifts a lone layer's data to the row)."""
    row = chart["vconcat"][i]
    return {layer["name"].rsplit("_", 1)[0]: {"data": row.get("data")} | layer for layer in row["layer"]}


def px(row: forest.ForestRow, x: float) -> float:
    """Where x lands on the row's WIDTH px, on its scale."""
    lo, hi = forest.domain(row)
    f = (lambda v: math.log(v)) if row.log else (lambda v: v)
    return WIDTH * (f(x) - f(lo)) / (f(hi) - f(lo))


def test_one_row_per_hypothesis_in_order_with_band_interval_and_verdict_colours() -> None:
    rows = [forest.forest_row(s, f"s/{s.hypothesis}") for s in (C1, FAST, NOT_RUN)]
    chart = spec(forest.forest_chart(rows))
    assert [r["title"]["text"] for r in chart["vconcat"]] == ["s/neutral-at-c1", "s/small-is-overhead-bound", "s/never"]
    c1 = layers(chart, 0)
    assert set(c1) == {"band", "edge", "predicted", "interval", "estimate"}
    assert c1["band"]["data"]["values"] == [{"left": 0.98, "right": 1.02}]
    assert [v["edge"] for v in c1["edge"]["data"]["values"]] == [0.98, 1.02]
    (datum,) = c1["interval"]["data"]["values"]
    assert (datum["low"], datum["high"], datum["estimate"], datum["verdict"]) == (0.96885, 0.97909, 0.97395, "refuted")
    for kind in ("interval", "estimate"):
        color = c1[kind]["encoding"]["color"]
        assert color["field"] == "verdict"
        assert color["scale"] == {"domain": list(VERDICT_COLORS), "range": list(VERDICT_COLORS.values())}
    assert c1["band"]["mark"]["color"] not in VERDICT_COLORS.values()  # the band is the prediction, not a verdict
    assert chart["resolve"]["scale"] == {"x": "independent", "color": "shared"}


def test_a_ratio_is_on_a_log_axis_a_plain_value_on_a_linear_one() -> None:
    chart = spec(forest.forest_chart([forest.forest_row(C1, "a"), forest.forest_row(FAST, "b")]))
    assert layers(chart, 0)["estimate"]["encoding"]["x"]["scale"]["type"] == "log"
    assert layers(chart, 1)["estimate"]["encoding"]["x"]["scale"]["type"] == "linear"
    lo, hi = forest.domain(forest.forest_row(C1, "a"))
    assert layers(chart, 0)["band"]["encoding"]["x"]["scale"]["domain"] == [lo, hi]
    # a ratio with a value <= 0 cannot sit on a log axis: linear, still drawn
    negative = forest.forest_row(score(ratio=True, measured=0.5, ci_low=-0.1, ci_high=1.1, n=3, predicted=1.0,
                                       band_low=0.9, band_high=1.1, verdict="inconclusive"), "c")
    assert not negative.log and negative.low == -0.1


def test_fp8_kv_c1_is_visibly_outside_its_band() -> None:
    """0.974x against a 0.98x edge: the estimate tens of pixels left of the band, the whole bar clear of it."""
    row = forest.forest_row(C1, "fp8-kv/neutral-at-c1")
    assert px(row, 0.98) - px(row, C1.measured or 0) > 40
    assert px(row, 0.98) - px(row, C1.ci_high or 0) > 5
    assert 0 < px(row, C1.ci_low or 0) and px(row, 1.02) < WIDTH  # everything inside the frame


def test_the_row_text_and_tooltip_carry_the_level_it_was_read_at() -> None:
    row = forest.forest_row(C1, "fp8-kv/neutral-at-c1")
    assert row.text == ("refuted · 0.974x (0.969–0.979x, 99.9% interval, look 10 of 12) · "
                        "predicted fp8 ÷ bf16: 1x ± 2%")
    assert dict(row.tooltip)["level"] == "99.9% interval, look 10 of 12"
    chart = spec(forest.forest_chart([row]))
    assert chart["vconcat"][0]["title"]["subtitle"] == row.text
    tip = layers(chart, 0)["estimate"]["encoding"]["tooltip"]
    (datum,) = layers(chart, 0)["estimate"]["data"]["values"]
    assert {t["title"]: datum[t["field"]] for t in tip}["level"] == "99.9% interval, look 10 of 12"
    fixed = forest.forest_row(score(measured=2.0, ci_low=1.9, ci_high=2.1, n=3, verdict="confirmed",
                                    predicted=2.0, band_low=1.8, band_high=2.2, unit="tokens"), "x")
    assert "95% interval)" in fixed.text and "look" not in fixed.text


def test_a_not_run_row_is_empty_but_for_its_text() -> None:
    row = forest.forest_row(NOT_RUN, "s/never")
    assert row.empty and row.text == "not run"
    chart = spec(forest.forest_chart([forest.forest_row(C1, "a"), row]))
    empty = layers(chart, 1)
    assert set(empty) == {"empty"} and empty["empty"]["mark"]["type"] == "text"
    assert empty["empty"]["data"]["values"] == [{"verdict": "not run", "text": "not run"}]
    assert "scale" not in empty["empty"]["encoding"]["x"]  # no axis for nothing measured


def test_a_relation_shades_its_allowed_side_to_the_frame() -> None:
    below = forest.forest_row(FAST, "b")
    lo, hi = forest.domain(below)
    chart = spec(forest.forest_chart([below]))
    assert layers(chart, 0)["band"]["data"]["values"] == [{"left": lo, "right": 1715.4}]
    assert "predicted" not in layers(chart, 0)  # a relation has a threshold, not a predicted value
    above = forest.forest_row(score(ratio=True, kind="relation", relation=">", predicted=1.1, band_low=1.1,
                                    measured=3.75, ci_low=2.39, ci_high=5.89, n=3, verdict="confirmed"), "a")
    lo, hi = forest.domain(above)
    assert spec(forest.forest_chart([above]))["vconcat"][0]["layer"][0]["data"]["values"] == [
        {"left": 1.1, "right": hi}]


def test_domain_pads_each_side_by_its_share_of_the_span() -> None:
    linear = forest.forest_row(FAST, "b")
    lo, hi = forest.domain(linear)
    span = 1715.4 - 230.6
    assert lo == pytest.approx(230.6 - forest.PAD * span) and hi == pytest.approx(1715.4 + forest.PAD * span)
    lo, hi = forest.domain(forest.forest_row(C1, "a"))
    log_span = math.log(1.02 / 0.96885)
    assert math.log(lo) == pytest.approx(math.log(0.96885) - forest.PAD * log_span)
    assert math.log(hi) == pytest.approx(math.log(1.02) + forest.PAD * log_span)
    point = forest.forest_row(score(measured=5.0, n=1, verdict="confirmed"), "p")  # one value, no band
    lo, hi = forest.domain(point)
    assert lo < 5.0 < hi


def test_display_units_scale_ms_and_percent() -> None:
    ms = forest.forest_row(score(metric="ttft_p50_s", unit="s", measured=0.0123, ci_low=0.012, ci_high=0.0126,
                                 n=3, predicted=0.012, band_low=0.0114, band_high=0.0126, verdict="confirmed"), "t")
    assert ms.unit == "ms" and ms.estimate == pytest.approx(12.3) and ms.band_high == pytest.approx(12.6)
    pct = forest.forest_row(score(metric="prefix_hit_rate", unit="ratio", measured=0.984, ci_low=0.98,
                                  ci_high=0.99, n=4, predicted=0.984, band_low=0.93, band_high=1.03,
                                  verdict="confirmed"), "p")
    assert pct.unit == "%" and pct.estimate == pytest.approx(98.4)
    one = forest.forest_row(score(measured=4.74, ci_low=4.74, ci_high=4.74, n=1, verdict="confirmed",
                                  predicted=4.74, band_low=4.6, band_high=4.88, ratio=True), "m")
    assert one.low is None and "one value, no interval" in one.text
    assert "interval" not in layers(spec(forest.forest_chart([one])), 0)


def test_a_one_launch_row_says_so_in_its_text_and_tooltip() -> None:
    """max-num-seqs's ttft-halves as published: inside its band on one launch per arm, so inconclusive; the
    row says "(one launch)" where a plain straddle would not."""
    from report.scoring.score_model import Reason, Why

    one = score(hypothesis="ttft-halves", ratio=True, predicted=0.5, tolerance=0.2, band_low=0.4, band_high=0.6,
                measured=0.483, ci_low=0.465, ci_high=0.502, n=3, verdict="inconclusive",
                reasons=(Reason(Why.ONE_LAUNCH, detail="would read confirmed"),))
    row = forest.forest_row(one, "max-num-seqs/ttft-halves")
    assert row.text.startswith("inconclusive (one launch) · 0.483x")
    assert dict(row.tooltip)["verdict"] == "inconclusive (one launch)" and row.verdict == "inconclusive"
    plain = forest.forest_row(score(**{**one.__dict__, "reasons": ()}), "x")
    assert plain.text.startswith("inconclusive · ")
