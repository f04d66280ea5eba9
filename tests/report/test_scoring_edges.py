"""Scoring's pure rules at their edges: an interval touching a band edge, `>=` against `>`, the t
quantile between and on table rows, one value, a ratio of exactly 0, the distance to the band."""

from __future__ import annotations

from typing import Any

import pytest

from report.scoring.score_model import Reason, Score, Why, verdict_counts
from report.scoring.scoring import off_band
from report.stats.verdict import VERDICTS, judge, straddled


# ---- band and relation verdicts -------------------------------------------------------------------
@pytest.mark.parametrize(("low", "high", "verdict"), [
    (1.0, 2.0, "confirmed"),  # exactly the band
    (1.0, 1.5, "confirmed"),  # touching the low edge from inside
    (1.5, 2.0, "confirmed"),  # touching the high edge from inside
    (0.5, 1.0, "inconclusive"),  # touching the band from below is not outside it
    (2.0, 2.5, "inconclusive"),  # touching the band from above
    (0.5, 0.999, "refuted"),
    (2.001, 3.0, "refuted"),
    (0.5, 1.5, "inconclusive"),
])  # fmt: skip
def test_band_verdict_at_the_edges(low: float, high: float, verdict: str) -> None:
    assert judge("range", None, 1.0, 2.0, low, high) == verdict
    assert judge("value", None, 1.0, 2.0, low, high) == verdict


@pytest.mark.parametrize(("relation", "low", "high", "verdict"), [
    (">=", 1.0, 2.0, "confirmed"),  # at the threshold holds for >=
    (">", 1.0, 2.0, "inconclusive"),  # ... and not for >
    (">", 1.5, 2.0, "confirmed"),
    (">", 0.5, 1.0, "refuted"),
    (">=", 0.5, 0.9, "refuted"),
    ("<=", 0.5, 1.0, "confirmed"),
    ("<", 0.5, 1.0, "inconclusive"),
    ("<", 1.0, 2.0, "refuted"),
    ("<=", 1.5, 2.0, "refuted"),
])  # fmt: skip
def test_relation_verdict_at_the_threshold(relation: str, low: float, high: float, verdict: str) -> None:
    low_edge, high_edge = (1.0, None) if relation in (">", ">=") else (None, 1.0)
    assert judge("relation", relation, low_edge, high_edge, low, high) == verdict


def test_a_band_needs_both_edges() -> None:
    with pytest.raises(AssertionError):
        judge("range", None, 1.0, None, 1.0, 2.0)


def test_straddled_edges() -> None:
    assert straddled("range", None, 1.0, 2.0, 0.5, 1.5) == (1.0,)
    assert straddled("range", None, 1.0, 2.0, 1.0, 1.5) == (1.0,)  # an edge at the interval's end counts
    assert straddled("range", None, 1.0, 2.0, 1.5, 2.0) == (2.0,)
    assert straddled("range", None, 1.0, 2.0, 0.5, 2.5) == (1.0, 2.0)
    assert straddled("range", None, 1.0, 2.0, 1.0, 1.0) == ()  # a point interval straddles nothing
    assert straddled("relation", ">=", 1.0, None, 0.5, 1.5) == (1.0,)
    assert straddled("relation", "<=", None, 2.0, 1.5, 2.5) == (2.0,)
    assert straddled("relation", "<", 0.1, 2.0, 0.0, 1.0) == ()  # only the relation's own threshold


def test_off_band_distance() -> None:
    assert off_band(1.0, 2.0, 1.0) == 0.0 and off_band(1.0, 2.0, 2.0) == 0.0  # on an edge is inside
    assert off_band(2.0, 4.0, 1.0) == pytest.approx(-0.5)
    assert off_band(2.0, 4.0, 5.0) == pytest.approx(0.25)
    assert off_band(-2.0, 4.0, -3.0) == pytest.approx(-0.5)  # relative to |edge|
    assert off_band(0.0, 1.0, -1.0) is None
    assert off_band(None, 1.0, -100.0) == 0.0 and off_band(1.0, None, 100.0) == 0.0


# ---- reasons and counts -------------------------------------------------------------------------------
def score(verdict: str, *reasons: Reason) -> Score:
    fields: dict[str, Any] = {f: None for f in Score.__dataclass_fields__}
    fields.update(study_id="s", hypothesis="h", claim="c", metric="output_throughput", unit="tok/s",
                  kind="value", ratio=False, targets=(), values=(), n=0, verdict=verdict, verdict_spec=verdict,
                  calibrated=False, checks=(), flags=(), reasons=reasons, point_ids=(), interval="")
    return Score(**fields)


def test_verdict_counts_every_verdict_in_order() -> None:
    scores = [score("confirmed"), score("confirmed"), score("refuted")]
    counts = verdict_counts(scores)
    assert list(counts) == list(VERDICTS)
    assert counts == {"confirmed": 2, "refuted": 1, "inconclusive": 0, "invalid": 0, "not run": 0}


def test_score_has_a_reason_only_when_given() -> None:
    s = score("invalid", Reason(Why.FAILED_CHECK, point="p", checks=("errors",)))
    assert s.has(Why.FAILED_CHECK) and not s.has(Why.STRADDLES)
    assert s.notes == ("p: failed check errors",)
    assert not score("confirmed").has(Why.FAILED_CHECK)
