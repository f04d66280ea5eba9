"""What a study page carries: its points and checks, never the run's requests (the page says where they are and
the export command that writes them), and over-time charts thinned to the samples their lines draw."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from report.exporting import export_database
from report.pages.charts import WIDTH, thin_series
from report.pages.site import build_site
from runner.store.records import RequestRecord
from runner.store.store import Store
from studyc.cli import main
from tests.report.helpers import P, make_db, write_study
from tests.report.test_scoring import HYPOTHESES, _points


def _db_with_requests(path: Path) -> Path:
    """The toy study's run `run-1`, its first point committed again with two requests (as a retry is)."""
    make_db(path, _points())
    with Store(path) as store:
        point = store.points("run-1")[0]
        checks = [c for c in store.checks("run-1") if c.point_id == point.point_id]
        requests = [RequestRecord(i, False, 1.0 * i, 1.0 * i, 1.0 * i + 0.1, 1.0 * i + 0.5, (1.0 * i + 0.1,), 8, 1,
                                  1, True, None, 200) for i in range(2)]
        store.commit_point(point, requests, checks, [])
    return path


def _page(site: Path) -> str:
    return (site / "studies/toy/index.html").read_text(encoding="utf-8")


def test_a_page_offers_points_and_checks_and_names_where_its_requests_are(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    study = write_study(tmp_path, HYPOTHESES)
    export_database(_db_with_requests(tmp_path / "r.duckdb"), tmp_path / "results")
    site = tmp_path / "site"
    stale = site / "studies/toy/data/requests.parquet"  # what an earlier build wrote
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    monkeypatch.chdir(tmp_path)
    build_site([Path("results")], site, study_paths=[study])

    data = site / "studies/toy/data"
    assert sorted(p.name for p in data.iterdir()) == ["checks.csv", "points.csv", "points.parquet"]
    assert not list(site.rglob("requests*"))
    page = _page(site)
    for name in ("points.csv", "points.parquet", "checks.csv"):
        assert f'href="data/{name}"' in page
    assert "requests.csv\" download" not in page and 'href="data/requests' not in page
    assert "<code>results/run-1/requests.parquet</code> in the results folder" in page
    assert (Path("results/run-1/requests.parquet")).is_file()
    # the command the page gives writes the file it names, with the run's requests
    command = re.search(r"<code>(studyc export [^<]*)</code>", page)
    named = re.search(r"this one's requests to <code>([^<]*)</code>", page)
    assert command and named
    assert command[1] == "studyc export --db results --format csv results-csv"
    result = CliRunner().invoke(main, shlex.split(command[1])[1:])
    assert result.exit_code == 0, result.output
    rows = Path(named[1]).read_text().splitlines()
    assert named[1] == "results-csv/run-1/requests.csv" and len(rows) == 1 + 2 and '"run-1"' in rows[1]


def test_a_page_built_from_a_database_file_names_the_file(tmp_path: Path) -> None:
    study = write_study(tmp_path, HYPOTHESES)
    db = make_db(tmp_path / "r.duckdb", _points())
    build_site([db], tmp_path / "site", study_paths=[study])
    page = _page(tmp_path / "site")
    # an absolute path is named by its name only: the note names no machine's folders
    note = re.search(r'<p class="requests-note">(.*?)</p>', page, re.DOTALL)
    assert note and str(tmp_path) not in note[1]
    assert "in the results database <code>r.duckdb</code> (run <code>run-1</code>)" in note[1]
    assert "<code>studyc export --db r.duckdb --format csv results-csv</code>" in note[1]


def test_thin_series_keeps_what_a_step_line_draws() -> None:
    """10 Hz over 1,000 s (16 samples a column at WIDTH): a constant quantity is its first and last sample;
    a varying one keeps at most 4 a column, each column's first, last, lowest and highest values."""
    t = [round(0.1 * i, 3) for i in range(10_000)]
    power = [{"t_s": x, "quantity": "power (W)", "value": float((i * 7919) % 301)} for i, x in enumerate(t)]
    clock = [{"t_s": x, "quantity": "memory clock (MHz)", "value": 3201.0} for x in t]
    steps = [{"t_s": x, "quantity": "SM clock (MHz)", "value": 1980.0 - 15 * (i // 2500)} for i, x in enumerate(t)]
    rows = clock + power + steps
    thin = thin_series(rows)

    def of(rs: list[dict[str, object]], q: str) -> list[dict[str, object]]:
        return [r for r in rs if r["quantity"] == q]

    assert of(thin, "memory clock (MHz)") == [clock[0], clock[-1]]
    assert of(thin, "SM clock (MHz)") == [steps[0], steps[2500], steps[5000], steps[7500], steps[-1]]
    kept = of(thin, "power (W)")
    assert len(kept) <= 4 * WIDTH and len(kept) < len(power) // 3
    assert kept[0] == power[0] and kept[-1] == power[-1]
    span = t[-1] - t[0]

    def columns(rs: list[dict[str, object]]) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {}
        for r in rs:
            out.setdefault(min(WIDTH - 1, int(float(str(r["t_s"])) / span * WIDTH)), []).append(float(str(r["value"])))
        return out

    every, some = columns(power), columns(kept)
    assert every.keys() == some.keys()
    for c, values in every.items():
        assert (min(some[c]), max(some[c])) == (min(values), max(values)), c
    assert thin_series([]) == []


def test_the_clocks_chart_embeds_the_thinned_samples(tmp_path: Path) -> None:
    study = write_study(tmp_path, HYPOTHESES)
    nvml = [{"source": "nvml", "t_s": 0.1 * i, "sm_clock_mhz": 1980.0, "power_w": 300.0 + (i * 37) % 50}
            for i in range(5000)]
    db = make_db(tmp_path / "r.duckdb", [P("a", 1, 0, {"output_throughput": 100.0}, telemetry=nvml)])
    build_site([db], tmp_path / "site", study_paths=[study])
    page = _page(tmp_path / "site")
    found = re.search(r'<script type="application/json" id="spec-clocks">(.*?)</script>', page, re.DOTALL)
    assert found
    values = json.loads(found[1])["data"]["values"]
    sm = [v for v in values if v["quantity"] == "SM clock (MHz)"]
    power = [v for v in values if v["quantity"] == "power (W)"]
    assert [v["t_s"] for v in sm] == [0.0, 499.9]
    assert 3 * WIDTH <= len(power) <= 4 * WIDTH
    assert "its first, last, lowest and highest sample" in page
