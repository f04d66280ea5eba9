"""compiler.workload's helpers at their edges: the mean a plan estimates with, the text a page shows, the
shortest length validation checks against, and a trace fingerprinted by content, not by where it lies."""

from __future__ import annotations

import pytest

from compiler.workload import (
    Histogram,
    LogNormal,
    Normal,
    Shape,
    TraceRef,
    Uniform,
    explicit_floor,
    length_floor,
    length_mean,
    length_text,
)

HIST = Histogram(dist="histogram", values=(10, 20, 70), weights=(1.0, 2.0, 1.0))


def test_length_mean() -> None:
    assert length_mean(HIST) == pytest.approx((10 + 40 + 70) / 4)  # the weighted mean, weights summing to 4
    assert length_mean(Histogram(dist="histogram", values=(8,), weights=(0.5,))) == 8.0
    assert length_mean(Uniform(dist="uniform", min=10, max=31)) == 20.5
    assert length_mean(Normal(dist="normal", mean=300, sd=50)) == 300 and length_mean(128) == 128.0


def test_length_text() -> None:
    assert length_text(None) == "from the trace"
    assert length_text(4096) == "4,096" and length_text(Uniform(dist="uniform", min=64, max=1024)) == "uniform 64-1,024"
    assert length_text(HIST) == "histogram (3 lengths)"
    assert length_text(Histogram(dist="histogram", file="lengths.csv")) == "histogram (lengths.csv)"
    assert length_text(LogNormal(dist="lognormal", mean=300, sd=50.5)) == "lognormal 300 sd 50.5"


def test_length_floor_skips_zero_weights_and_defaults_to_one() -> None:
    assert length_floor(Histogram(dist="histogram", values=(3, 5, 9), weights=(0.0, 1.0, 1.0))) == 5
    assert length_floor(Histogram(dist="histogram", values=(3, 5), weights=(1.0, 0.0))) == 3
    assert length_floor(Histogram(dist="histogram", values=(3, 5), weights=(0.5, 1.0))) == 3  # a weight under 1
    assert length_floor(Normal(dist="normal", mean=30, sd=5)) == 1 and length_floor(Normal(dist="normal", mean=30,
                                                                                           sd=5, min=4)) == 4
    assert length_floor(Uniform(dist="uniform", min=7, max=9)) == 7 and length_floor(12) == 12


def test_explicit_floor() -> None:
    assert explicit_floor(HIST) and not explicit_floor(Histogram(dist="histogram", file="x.csv"))
    assert explicit_floor(Normal(dist="normal", mean=30, sd=5, min=2))
    assert not explicit_floor(Normal(dist="normal", mean=30, sd=5)) and explicit_floor(5)


def test_a_trace_is_fingerprinted_by_content_not_path() -> None:
    one = Shape(trace=TraceRef(path="/a/t.jsonl", sha256="1" * 64, rows=3), trace_arrivals=True)
    moved = Shape(trace=TraceRef(path="/b/t.jsonl", sha256="1" * 64, rows=3), trace_arrivals=True)
    changed = Shape(trace=TraceRef(path="/a/t.jsonl", sha256="2" * 64, rows=3), trace_arrivals=True)
    assert one.fingerprint_payload() == moved.fingerprint_payload() != changed.fingerprint_payload()
    payload = Shape(input=Uniform(dist="uniform", min=1, max=2), output=3, think_s=0.5).fingerprint_payload()
    assert payload["input"] == {"dist": "uniform", "min": 1, "max": 2} and payload["think_s"] == 0.5
    assert "path" not in str(one.fingerprint_payload()) and one.fingerprint_payload()["trace"] == {
        "sha256": "1" * 64, "rows": 3}


def test_the_fingerprint_payload_is_plain_json() -> None:
    """JSON types only (a histogram's lengths a list, not a tuple): the payload is hashed as JSON, and the plan
    read back from JSON must give the same payload."""
    payload = Shape(input=Histogram(dist="histogram", values=(1, 2), weights=(1.0, 3.0)), output=3).fingerprint_payload()
    assert payload["input"] == {"dist": "histogram", "file": None, "values": [1, 2], "weights": [1.0, 3.0]}
    assert type(payload["input"]["values"]) is list  # type: ignore[index]


def test_a_histogram_with_a_weight_missing_is_refused_not_cut_short() -> None:
    """Validation refuses it; built past validation, the mean and floor still refuse it (zip strict)."""
    bad = Histogram.model_construct(dist="histogram", file=None, values=(1, 2, 3), weights=(1.0, 1.0))
    with pytest.raises(ValueError):
        length_mean(bad)
    with pytest.raises(ValueError):
        length_floor(bad)
