"""The study page's "where the wall time went" from a real DuckDB file: the phase table and one stacked bar per
launch for a run that stored its phases; "phases not recorded" and its wall for one that did not."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from report.pages.site import build_site
from runner.store.records import PhaseRecord, SegmentRecord
from runner.store.store import Store
from tests.report.helpers import make_db, write_study
from tests.report.test_scoring import HYPOTHESES, _points

# Two segments (the second a --resume on two device slots); launch "" is the run's own.
SEGMENTS = [SegmentRecord(1, datetime(2026, 1, 1), wall_s=100.0, ended="interrupted"),
            SegmentRecord(2, datetime(2026, 1, 2), wall_s=50.0, ended="complete", slots=2)]
PHASES = [PhaseRecord(1, 1, "", "calibration", 6.0),
          PhaseRecord(1, 2, "toy/a", "start: imports (API process)", 20.0),
          PhaseRecord(1, 3, "toy/a", "start (unsplit)", 30.0),
          PhaseRecord(1, 4, "toy/a", "window", 10.0),
          PhaseRecord(1, 5, "toy/a", "stop", 1.0),
          PhaseRecord(2, 1, "toy/b", "start (unsplit)", 40.0),
          PhaseRecord(2, 2, "toy/b", "warmup", 5.0),
          PhaseRecord(2, 3, "toy/b", "window", 20.0),
          PhaseRecord(2, 4, "toy/a", "window", 4.0)]


def _text(page: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", page).split())


def _site(tmp: Path, phases: bool) -> str:
    study = write_study(tmp, HYPOTHESES)
    db = make_db(tmp / "r.duckdb", _points())
    if phases:
        with Store(db) as store:
            store.put_timing("run-1", [*SEGMENTS, *PHASES])
    build_site([db], tmp / "site", study_paths=[study])
    return (tmp / "site/studies/toy/index.html").read_text()


def test_a_run_with_phases_has_its_table_and_a_bar_per_launch(tmp_path: Path) -> None:
    page = _site(tmp_path, phases=True)
    text = _text(page)
    assert "Where the wall time went" in text
    assert "2 segment(s) (interrupted, complete), wall 150.0 s x device slots = 200.0 s" in text
    # each phase summed over segments and launches, its share of the 200 device-slot seconds; the gap is the rest
    for row in ("calibration 6.0 3.0%", "start: imports (API process) 20.0 10.0%", "start (unsplit) 70.0 35.0%",
                "warmup 5.0 2.5%", "window 34.0 17.0%", "stop 1.0 0.5%", "gap 64.0 32.0%"):
        assert row in text, row
    spec = json.loads(re.search(r'id="spec-phases">(.*?)</script>', page, re.S)[1])  # type: ignore[index]
    values = spec["data"]["values"]
    bars = {(v["launch"], v["phase"]): v["seconds"] for v in values}
    assert bars == {("toy/a", "start: imports (API process)"): 20.0, ("toy/a", "start (unsplit)"): 30.0,
                    ("toy/a", "window"): 14.0, ("toy/a", "stop"): 1.0, ("toy/b", "start (unsplit)"): 40.0,
                    ("toy/b", "warmup"): 5.0, ("toy/b", "window"): 20.0}  # the run's own phases are not a bar
    assert spec["encoding"]["y"]["field"] == "launch" and spec["mark"]["type"] == "bar"
    assert "vega-embed" in page and "cdn" not in page.lower()  # drawn by the vendored scripts


def test_a_run_without_phases_says_so_with_its_wall(tmp_path: Path) -> None:
    page = _site(tmp_path, phases=False)
    text = _text(page)
    assert "Where the wall time went" in text and 'id="spec-phases"' not in page
    assert "Phases not recorded: this run was stored before studyc kept them, nor its wall." in text
