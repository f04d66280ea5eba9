"""Two kinds of inconclusive: an interval straddling an edge is "underpowered" (wider than the band) or "near an
edge"; the score says which (Score.inconclusive_reason), and so do the audit's JSON, text and markdown and the
study page. Scored from real runs' rows (tests.report.test_scoring_branches), then shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.load import LoadedStudy
from report.audit import json_row, verdict_cell
from report.page_models import HypothesisRow
from report.pages import _hypothesis_row
from report.score_model import Score, Why
from tests.report.test_cliff_scoring import two_launches
from tests.report.test_scoring_branches import hyp, point, run, scores, study

TPUT = "output_throughput"
WHERE = '{ arm = "a", concurrency = 1 }'


def _scored(tmp_path: Path, predict: str, values: tuple[float, float]) -> tuple[LoadedStudy, Score]:
    loaded = study(tmp_path, hyp("h", TPUT, WHERE, predict))
    pts, plan = two_launches(TPUT, values)
    return loaded, scores(loaded, run(pts, plan=plan))["h"]


@pytest.mark.parametrize(("predict", "values", "reason"), [
    # two launches 2% apart: a 95% interval on df 1 is far wider than a ±1% band
    ('{ value = 101.0, tolerance = 0.01 }', (100.0, 102.0), "underpowered"),
    # the same launches against a band as wide as that interval, its mean on the upper edge: near it
    ('{ value = 78.0, tolerance = 0.3 }', (100.0, 102.0), "near an edge"),
    ('{ relation = ">", value = 101.0 }', (100.0, 102.0), "near an edge"),  # a relation has no width
])
def test_a_straddling_interval_says_which_kind(tmp_path: Path, predict: str, values: tuple[float, float],
                                               reason: str) -> None:
    loaded, s = _scored(tmp_path, predict, values)
    assert s.verdict == "inconclusive" and s.has(Why.STRADDLES)
    assert s.inconclusive_reason == reason
    assert s.shown_verdict == f"inconclusive ({reason})"
    assert json_row(s)["inconclusive_reason"] == reason
    assert verdict_cell(s).startswith(f"inconclusive ({reason})")
    row: HypothesisRow = _hypothesis_row(loaded.study, s)
    assert row.inconclusive_reason == reason


@pytest.mark.parametrize(("predict", "values"), [
    ('{ value = 101.0, tolerance = 0.5 }', (100.0, 102.0)),  # confirmed
    ('{ value = 200.0, tolerance = 0.01 }', (100.0, 102.0)),  # refuted
])
def test_a_decided_interval_has_no_reason(tmp_path: Path, predict: str, values: tuple[float, float]) -> None:
    _, s = _scored(tmp_path, predict, values)
    assert s.verdict in ("confirmed", "refuted")
    assert s.inconclusive_reason is None and s.shown_verdict == s.verdict_label
    assert json_row(s)["inconclusive_reason"] is None


def test_one_launch_keeps_its_own_label_without_a_reason(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("h", TPUT, WHERE, '{ value = 101.0, tolerance = 0.01 }'))
    s = scores(loaded, run([point("a", 1, "r1", 100.0, metric=TPUT), point("a", 1, "r2", 102.0, metric=TPUT)]))["h"]
    assert s.verdict == "inconclusive" and s.has(Why.ONE_LAUNCH) and not s.has(Why.STRADDLES)
    assert s.inconclusive_reason is None and s.shown_verdict == "inconclusive (one launch)"


def test_the_text_audit_shows_the_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from report.audit import Audit, print_table

    loaded, s = _scored(tmp_path, '{ value = 101.0, tolerance = 0.01 }', (100.0, 102.0))
    print_table(Audit((loaded,), {}, (s,), {}))
    assert "inconclusive (underpowered)" in capsys.readouterr().out
