"""A capacity's interval widened to its search's levels is a resolution bound, never labelled with a level
("95%"): it holds the interval at that level and the levels the search could not tell apart."""

from __future__ import annotations

import pytest

from compiler.load import load_study
from report.scoring.context import build_context
from report.scoring.score_model import Why
from report.scoring.score_text import labelled, read_at
from report.scoring.scoring import score
from tests.conftest import REPO, committed_runs

DB = REPO / "results/h200"


@pytest.mark.skipif(not DB.exists(), reason="the committed results database is not here")
def test_no_capacity_interval_is_labelled_with_a_level() -> None:
    loaded = load_study(REPO / "studies/kv_capacity_slo.toml")
    scores = score(build_context(loaded, committed_runs()["kv-capacity-slo"]))
    bracketed = [s for s in scores if s.has(Why.SEARCH_RESOLUTION)]
    assert bracketed, "the committed capacity run no longer brackets its interval"
    for s in bracketed:
        assert s.interval_label == "resolution bound" and read_at(s) == "resolution bound"
        assert labelled(s).startswith("resolution bound ") and "%" not in labelled(s)
    others = [s for s in scores if not s.has(Why.SEARCH_RESOLUTION) and s.n >= 2]
    assert all("% interval" in s.interval_label for s in others)
