"""Two kinds of inconclusive: an interval straddling an edge is "underpowered" (wider than the band) or "near an
edge"; the score says which (Score.inconclusive_reason), and so do the audit's JSON, text and markdown and the
study page. Scored from real runs' rows (tests.report.test_scoring_branches), then shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.load import LoadedStudy, load_study
from report.audit import Audit, json_row, print_table, verdict_cell
from report.pages.page_models import HypothesisRow
from report.pages.pages import _hypothesis_row, study_page
from report.pages.site import environment
from report.results import latest_runs
from report.scoring.context import build_context
from report.scoring.score_model import Score, Why
from report.scoring.scoring import score
from tests.report.test_cliff_scoring import two_launches
from tests.report.test_run_compare import _run, _study
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
    loaded, s = _scored(tmp_path, '{ value = 101.0, tolerance = 0.01 }', (100.0, 102.0))
    print_table(Audit((loaded,), {}, (s,), {}))
    assert "inconclusive (underpowered)" in capsys.readouterr().out


@pytest.mark.parametrize(("ratios", "shown"), [([1.0, 1.3, 1.002], True), ([1.0, 1.001, 1.002], False)])
def test_the_study_page_shows_the_kind_under_the_verdict(tmp_path: Path, ratios: list[float], shown: bool) -> None:
    study, db = _study(tmp_path), tmp_path / "r.duckdb"
    _run(db, study, "run-1", ratios)  # three blocks, a ratio b / a against 1 ± 5%
    ctx = build_context(load_study(study), latest_runs([db])["toy"])
    html = environment().get_template("study.html").render(page=study_page(ctx, score(ctx), ""))
    assert ('<span class="note inconclusive-reason">underpowered</span>' in html) is shown
    assert ('class="note inconclusive-reason"' in html) is shown
