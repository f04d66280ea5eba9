"""The site built from a real CPU run: parsed HTML, links on disk, offline, escaped study text, and
every page opened in headless Chromium with no console error and every chart drawn."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote, urlsplit

import pytest
from click.testing import CliRunner

from report.pages.site import build_site, default_studies
from studyc.cli import main
from tests.conftest import committed_copy
from tests.fixtures_run import QUICKSTART
from tests.report.browser import FOREST_JS, chromium, chromium_missing, layout_problems

EVIL = '<script>alert(1)</script>'


class Page(HTMLParser):
    """Links, ids, scripts and text of one HTML file; fails on unbalanced tags."""

    VOID: ClassVar[set[str]] = {"meta", "link", "br", "img", "input", "hr", "col", "source", "wbr", "area", "base", "embed"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.scripts: list[dict[str, str | None]] = []
        self.text: list[str] = []
        self.stack: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            assert a["id"] not in self.ids, f"duplicate id {a['id']}"
            self.ids.add(str(a["id"]))
        for key in ("href", "src"):
            if a.get(key):
                self.links.append(str(a[key]))
        if tag == "script":
            self.scripts.append(a)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self.stack and self.stack[-1] == "script":
            return
        self.text.append(data)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    assert not page.problems and page.stack == [], (path, page.problems, page.stack)
    return page


def evil_study(tmp: Path) -> Path:
    """The quickstart with HTML in its title, question, notes and claims (same id, so its run is used)."""
    text = QUICKSTART.read_text()
    text = text.replace('path = "../models/tiny-qwen3"', f'path = "{QUICKSTART.parent.parent / "models/tiny-qwen3"}"')
    text = re.sub(r'^title = ".*"$', f'title = "{EVIL} & \\"quoted\\" title"', text, count=1, flags=re.MULTILINE)
    text = re.sub(r'^question = ".*"$', f'question = "Is {EVIL} shown as text?"', text, count=1, flags=re.MULTILINE)
    for start in ('claim = "A reset point', 'claim = "Four requests'):  # the second is on the audit chart
        text = text.replace(start, f'claim = "</script><img src=x onerror=alert(2)>{EVIL} {start[9:]}')
    path = tmp / "evil.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def site(quickstart_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = build_site([quickstart_db], out, study_paths=[QUICKSTART])
    assert (out / "index.html") in result.pages
    return out


@pytest.fixture(scope="module")
def evil_site(quickstart_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("evil")
    out = tmp / "site"
    build_site([quickstart_db], out, study_paths=[evil_study(tmp)])
    return out


def html_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.html"))


def test_pages_and_downloads_exist(site: Path, quickstart_db: Path) -> None:
    names = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
    for want in ("index.html", "audit.html", "studies/quickstart/index.html", "static/site.js",
                 "static/vendor/vega.min.js", "static/vendor/vega-lite.min.js", "static/vendor/vega-embed.min.js",
                 "studies/quickstart/data/points.csv", "studies/quickstart/data/points.parquet",
                 "studies/quickstart/data/checks.csv"):
        assert want in names
    assert not [n for n in names if "requests" in n]  # the run's requests stay in its results
    import pyarrow.parquet as pq

    points = pq.read_table(site / "studies/quickstart/data/points.parquet")
    assert points.num_rows == 12 and "output_throughput" in points.column_names
    text = " ".join(" ".join(parse(site / "studies/quickstart/index.html").text).split())
    assert f"in the results database {quickstart_db.name} (run " in text
    assert f"studyc export --db {quickstart_db.name} --format csv results-csv" in text


def test_every_relative_link_resolves_and_nothing_is_external(site: Path) -> None:
    for path in html_files(site):
        page = parse(path)
        raw = path.read_text(encoding="utf-8")
        assert "http://" not in raw and "https://" not in raw and "//cdn" not in raw, path
        for link in page.links:
            parts = urlsplit(link)
            assert not parts.scheme and not parts.netloc, f"{path}: external link {link}"
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            assert target.is_file(), f"{path}: broken link {link}"
            if parts.fragment and target.suffix == ".html":
                assert parts.fragment in parse(target).ids, f"{path}: no #{parts.fragment} in {target}"
        for script in page.scripts:
            assert script.get("src") or script.get("type") == "application/json", (path, script)


def test_study_page_content(site: Path) -> None:
    page = parse(site / "studies/quickstart/index.html")
    text = " ".join(" ".join(page.text).split())
    for hyp in ("batching-helps", "cold-means-cold", "kept-cache-hits", "fast-first-token"):
        assert f"h-{hyp}" in page.ids
    for want in ("Does batching raise throughput", "Provenance", "Calibration vs spec sheet",
                 "prefix cache kept between points", "--max-num-seqs", "tiny-qwen3"):
        assert want in text, want
    charts = {i for i in page.ids if i.startswith("chart-")}
    assert {"chart-throughput", "chart-ttft", "chart-itl", "chart-roofline", "chart-cache",
            "chart-littles-law"} <= charts


@pytest.mark.chromium
def test_chromium_loads_every_page_without_errors_and_draws_every_chart(site: Path) -> None:
    why = chromium_missing()
    if why:
        pytest.skip(why)
    with chromium() as browser:
        for path in html_files(site):
            report = browser.load(path)
            assert report.errors == [], (path, report.errors)
            assert all(c["drawn"] == "true" and c["svg"] for c in report.charts), (path, report.charts)
            if path.name == "index.html" and path.parent.name == "quickstart":
                assert len(report.charts) >= 6


@pytest.mark.chromium
def test_chromium_client_sees_console_errors(tmp_path: Path) -> None:
    """The check above can fail: a console error, a throw and a missing script are all reported."""
    why = chromium_missing()
    if why:
        pytest.skip(why)
    bad = tmp_path / "bad.html"
    bad.write_text('<!doctype html><html><head><script src="missing.js"></script></head><body>'
                   '<div class="chart"></div><script>console.error("boom"); throw new Error("thrown")</script>'
                   '</body></html>')
    with chromium() as browser:
        report = browser.load(bad, chart_timeout=3)  # its chart never draws
    joined = "\n".join(report.errors)
    assert "boom" in joined and "thrown" in joined
    assert "missing.js" in joined or "ERR_FILE_NOT_FOUND" in joined
    assert report.charts == [{"id": "", "drawn": None, "svg": False, "marks": 0}]


@pytest.mark.chromium
def test_study_text_is_escaped(evil_site: Path) -> None:
    for path in html_files(evil_site):
        raw = path.read_text(encoding="utf-8")
        assert EVIL not in raw and "<img" not in raw, path
        page = parse(path)
        assert all(s.get("src") or s.get("type") == "application/json" for s in page.scripts), path
    study = evil_site / "studies/quickstart/index.html"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in study.read_text(encoding="utf-8")
    assert EVIL in " ".join(parse(study).text)  # shown as text
    audit = (evil_site / "audit.html").read_text(encoding="utf-8")
    spec = json.loads(re.search(r'<script type="application/json" id="spec-forest">(.*?)</script>', audit, re.DOTALL)[1])
    assert EVIL in json.dumps(spec)  # the tooltip's claim survives as data, not markup
    why = chromium_missing()
    if why:
        pytest.skip(why)
    with chromium() as browser:
        for path in (study, evil_site / "audit.html", evil_site / "index.html"):
            report = browser.load(path)
            assert report.errors == [], (path, report.errors)  # no dialog opened, nothing thrown
            assert EVIL in report.text, path


def test_build_is_reproducible(quickstart_db: Path, site: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    build_site([quickstart_db], again, study_paths=[QUICKSTART])
    first = {p.relative_to(site): p.read_bytes() for p in site.rglob("*") if p.is_file()}
    second = {p.relative_to(again): p.read_bytes() for p in again.rglob("*") if p.is_file()}
    assert first.keys() == second.keys()
    assert [k for k in first if first[k] != second[k]] == []


def test_cli_site_default_studies_and_strict(quickstart_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(QUICKSTART.parent.parent)  # default studies: studies/*.toml with a run
    runner = CliRunner()
    out = tmp_path / "site"
    result = runner.invoke(main, ["site", "--db", str(quickstart_db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "studies/quickstart/index.html").is_file()
    assert sorted(p.name for p in (out / "studies").iterdir()) == ["quickstart"]
    evil = evil_study(tmp_path)  # differs from the file that ran: a warning
    strict = runner.invoke(main, ["site", "--db", str(quickstart_db), "--out", str(tmp_path / "s2"), "--strict",
                                  str(evil)])
    assert strict.exit_code == 1
    assert "--strict" in strict.output and "changed since run" in strict.output
    assert not (tmp_path / "s2").exists()  # gathered, failed, nothing written


def test_cli_audit_json_and_merge(quickstart_db: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["audit", str(QUICKSTART), "--db", str(quickstart_db), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["hypothesis"] for r in rows] == ["batching-helps", "cold-means-cold", "kept-cache-hits", "fast-first-token"]
    for key in ("study", "hypothesis", "claim", "metric", "predicted", "predicted_spec", "measured", "ci_low",
                "ci_high", "spread_low", "spread_high", "n", "error", "verdict", "checks", "run_id"):
        assert all(key in r for r in rows), key
    assert all(r["verdict"] in ("confirmed", "refuted", "inconclusive", "invalid", "not run") for r in rows)
    assert all(r["n"] >= 1 and r["run_id"] for r in rows)
    kept = next(r for r in rows if r["hypothesis"] == "kept-cache-hits")
    assert any("cache = keep" in f for f in kept["flags"])

    table = runner.invoke(main, ["audit", str(QUICKSTART), "--db", str(quickstart_db)])
    assert table.exit_code == 0 and "batching-helps" in table.output

    merged = tmp_path / "merged.duckdb"
    first = runner.invoke(main, ["merge", str(merged), str(quickstart_db)])
    assert first.exit_code == 0 and "1 new run" in first.output, first.output
    again = runner.invoke(main, ["merge", str(merged), str(quickstart_db)])
    assert again.exit_code == 0 and "0 new run" in again.output
    both = runner.invoke(main, ["audit", str(QUICKSTART), "--db", str(quickstart_db), "--db", str(merged), "--json"])
    assert both.exit_code == 0
    assert [r["measured"] for r in json.loads(both.output)] == [r["measured"] for r in rows]

    missing = runner.invoke(main, ["audit", str(QUICKSTART), "--db", str(tmp_path / "nope.duckdb")])
    assert missing.exit_code == 1 and "no such results database" in missing.output


# -- the site as a performance engineer reads it: layout at 1280 and 1920 px ---------------------------

COMMITTED_DB = QUICKSTART.parent.parent / "results" / "h200"
WIDTHS = (1280, 1920)


@pytest.fixture(scope="module")
def h200_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed H200 results rebuilt into a temporary site (a copy of the database, so opening it
    writable may migrate it without touching the committed file)."""

    from runner.store.store import Store

    tmp = tmp_path_factory.mktemp("h200")
    db = tmp / "h200.duckdb"
    committed_copy("h200", db)
    with Store(db):
        pass
    out = tmp / "site"
    build_site([db], out, study_paths=default_studies([db], QUICKSTART.parent), ledger=False)  # its page: test_ledger*
    return out


# The studies whose pages the tests below read (a whole site of 25 studies takes a minute to build)
SLICE = ("cuda_graphs", "fp8_kv", "mla_kv")


@pytest.fixture(scope="module")
def h200_slice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed H200 results of the studies in SLICE built into a temporary site, as `h200_site` is."""
    tmp = tmp_path_factory.mktemp("h200-slice")
    db = committed_copy("h200", tmp / "h200.duckdb")
    build_site([db], tmp / "site", study_paths=[QUICKSTART.parent / f"{name}.toml" for name in SLICE], ledger=False)
    return tmp / "site"


@pytest.mark.chromium
@pytest.mark.parametrize("width", WIDTHS)
def test_tables_fit_verdicts_visible_numbers_right_aligned(h200_site: Path, width: int,
                                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    """Index, audit and the 48-point fp8-kv page: no table wider than its container, the page never
    scrolls sideways, every verdict cell inside the viewport, every number right-aligned under a
    right-aligned header. Screenshots of each page are kept in the test's temporary folder."""
    why = chromium_missing()
    if why:
        pytest.skip(why)
    shots = tmp_path_factory.mktemp(f"screens-{width}")
    pages = {"index": h200_site / "index.html", "audit": h200_site / "audit.html",
             "fp8-kv": h200_site / "studies/fp8-kv/index.html"}
    headers: set[str] = set()
    with chromium() as browser:
        for name, path in pages.items():
            layout = browser.layout(path, width, screenshot=shots / f"{name}-{width}.png")
            assert layout_problems(layout) == [], (name, width)
            assert (shots / f"{name}-{width}.png").stat().st_size > 10_000
            if name != "index":
                assert layout["verdicts"] and layout["numbers"], name  # the checks saw what they check
            if name == "fp8-kv":
                headers = {str(n["header"]) for n in layout["numbers"]}
    assert {"Input tokens", "Output tokens", "Off band", "n"} <= headers


@pytest.mark.chromium
def test_layout_checks_fail_on_the_old_layout(tmp_path: Path) -> None:
    """The layout checks can fail: the old page layout (a wide table scrolling inside its box with the
    verdict last, left-aligned headers over right-aligned numbers) trips each of them."""
    why = chromium_missing()
    if why:
        pytest.skip(why)
    cells = "".join(f"<td>a long claim text number {i} that goes on</td>" for i in range(12))
    old = tmp_path / "old.html"
    old.write_text(
        '<!doctype html><html><body><main><div style="overflow-x:auto">'
        '<table class="list"><thead><tr><th>Workload</th><th>Input tokens</th><th>Output tokens</th>'
        + "<th>x</th>" * 12 + '<th>Verdict</th></tr></thead><tbody><tr><td>decode</td>'
        '<td style="text-align:right">1,024</td><td style="text-align:right">0.978x</td>'
        + cells.replace("<td>", '<td style="white-space:nowrap">')
        + '<td><span class="verdict">refuted</span></td></tr></tbody></table></div>'
        '<table class="list"><thead><tr><th style="text-align:right">n</th></tr></thead>'
        '<tbody><tr><td>12.5 ms</td></tr></tbody></table></main></body></html>')
    with chromium() as browser:
        problems = layout_problems(browser.layout(old, 1280))
    assert any(p.startswith("verdict cell 'refuted'") for p in problems), problems
    assert any(p.startswith("table.list is") for p in problems), problems
    assert any(p.startswith("header 'Input tokens' over number '1,024'") for p in problems), problems
    assert any(p.startswith("header 'Output tokens' over number '0.978x'") for p in problems), problems
    assert "number '12.5 ms' in table.list is aligned start" in problems, problems


@pytest.mark.chromium
def test_forest_plot_draws_every_hypothesis_and_fp8_kv_c1_outside_its_band(h200_site: Path) -> None:
    """The audit page and the fp8-kv page draw the forest plot without a console error, one row per
    hypothesis; fp8-kv's c1 (0.974x) sits visibly left of its 0.98x-1.02x band; c8 (0.989x, 0.984-0.994x at
    the run's look 12) has its estimate and its whole interval inside the band."""
    why = chromium_missing()
    if why:
        pytest.skip(why)
    audit_rows = (h200_site / "audit.html").read_text().count('<td class="verdict-col">')
    with chromium() as browser:
        audit = browser.load(h200_site / "audit.html", probe=FOREST_JS)
        fp8 = browser.load(h200_site / "studies/fp8-kv/index.html", probe=FOREST_JS)
    for report in (audit, fp8):
        assert report.errors == [], report.errors
        forest = report.charts[0]
        assert (forest["id"], forest["drawn"], forest["svg"]) == ("chart-forest", "true", True)
    assert audit_rows >= 20 and len(audit.probe) == audit_rows
    # a row without an estimate says why: not run, or measured but stopped (kv-capacity-slo's first run, its
    # searches stopped by invalid probes)
    assert all(r["estimate"] or r["empty"] in ("not run", "invalid") for r in audit.probe), [
        r["empty"] for r in audit.probe if not r["estimate"]]
    c1, c8 = fp8.probe[0], fp8.probe[1]
    assert c1["band"]["left"] - c1["estimate"]["right"] > 30, c1
    assert c1["band"]["left"] - c1["interval"]["right"] > 4, c1
    assert c8["band"]["left"] < c8["interval"]["left"] < c8["estimate"]["left"], c8
    assert c8["interval"]["right"] < c8["band"]["right"], c8


def test_the_fp8_kv_page_embeds_what_its_charts_draw(h200_slice: Path) -> None:
    """fp8-kv's page was 2.1 MB, 1.9 MB of it the clocks chart's 32,564 NVML samples (10 Hz over 23 minutes)
    and 19 MB of requests beside it: now its four quantities are at most 4 samples a pixel column, and its
    folder holds the points and checks only."""
    from report.pages.charts import WIDTH

    page = h200_slice / "studies/fp8-kv/index.html"
    assert page.stat().st_size < 500_000
    raw = page.read_text()
    spec = json.loads(re.search(r'id="spec-clocks">(.*?)</script>', raw, re.S)[1])  # type: ignore[index]
    quantities = [v["quantity"] for v in spec["data"]["values"]]
    assert len(set(quantities)) == 4 and max(quantities.count(q) for q in quantities) <= 4 * WIDTH
    assert quantities.count("memory clock (MHz)") == 2  # 3,201 MHz throughout: where the line starts and ends
    data = sorted(p.name for p in (h200_slice / "studies/fp8-kv/data").iterdir())
    assert data == ["checks.csv", "points.csv", "points.parquet"]
    assert "<code>h200.duckdb</code> (run <code>20261202T152456-8d4fc8</code>)" in raw


def test_study_page_shows_wall_time_starts_and_interference(h200_slice: Path) -> None:
    """A run's wall time against its measurement windows, and each server's start with its compile
    cache, as stored (cuda-graphs on the H200: 670.1 s over 89.63 s; graphs cold then warm, eager no compile)."""
    page = (h200_slice / "studies/cuda-graphs/index.html").read_text()
    assert "wall time vs measurement windows" in page and "670.1 s over 89.63 s of windows (7.5x)" in page
    assert "cold compile cache" in page and "warm compile cache" in page


def test_the_pages_say_where_the_gpu_time_went(site: Path) -> None:
    """A run with phases: its table and a bar per launch on the study page; on the index, its
    GPU-seconds per decided hypothesis, never "wall only"."""
    page = parse(site / "studies/quickstart/index.html")
    text = " ".join(" ".join(page.text).split())
    assert "timing" in page.ids and "chart-phases" in page.ids
    assert "Where the wall time went" in text and "ramp/drain" in text and "1 segment(s) (complete)" in text
    index = " ".join(" ".join(parse(site / "index.html").text).split())
    assert "GPU time per decided hypothesis" in index and "GPU-s" in index and "wall only" not in index


def test_runs_without_phases_say_wall_only(h200_slice: Path) -> None:
    """The committed H200 runs were stored before phases were: their wall, said to be the wall only."""
    index = " ".join(" ".join(parse(h200_slice / "index.html").text).split())
    assert "wall only" in index and "GPU-s" in index
    page = " ".join(" ".join(parse(h200_slice / "studies/cuda-graphs/index.html").text).split())
    assert "Phases not recorded" in page and "670.1 s (wall only)" in page
    # fp8-kv's run was resumed twice before segments were stored: its wall is the last segment's, a lower bound
    assert "at least 122 GPU-s each (487 GPU-s, 4 of 5 decided; wall of its last segment only, 2 earlier not " \
        "recorded)" in index


def test_the_mla_kv_rerun_shows_its_stored_phases(h200_slice: Path) -> None:
    """mla-kv's latest run (2026-12-05, on an H100; the first stored with its phases was 2026-12-03's): one
    complete segment of 550.7 s, a bar for each of its six launches."""
    page = parse(h200_slice / "studies/mla-kv/index.html")
    text = " ".join(" ".join(page.text).split())
    assert "chart-phases" in page.ids and "1 segment(s) (complete), wall 550.7 s" in text
    assert "start: torch.compile" in text and "Phases not recorded" not in text
    raw = (h200_slice / "studies/mla-kv/index.html").read_text()
    spec = json.loads(re.search(r'id="spec-phases">(.*?)</script>', raw, re.S)[1])  # type: ignore[index]
    assert len({v["launch"] for v in spec["data"]["values"]}) == 6


def test_interference_fact_says_what_was_measured() -> None:
    from report.pages.pages import _interference
    from runner.execute.parallel import interference_result

    (kept,) = _interference(json.dumps(interference_result("s/a/w/c1/r1", [100.0, 102.0], 90.0, "s/b/L1")))
    assert kept.label == "interference" and "beside s/b/L1" in kept.value and "one launch at a time" in kept.value
    (missing,) = _interference(json.dumps(interference_result("s/a/w/c1/r1", [100.0, None], 90.0, None)))
    assert "not measured" in missing.value
    assert _interference(None) == [] and _interference("not json") == []
