"""The site from small written databases: strict mode, studies without a run, vendored JS versions."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import altair as alt
import pytest

from report.pages.site import SiteError, build_site, json_script
from tests.report.helpers import REPO, P, make_db, write_study
from tests.report.test_scoring import HYPOTHESES, _points


def test_strict_lists_failed_checks_and_writes_nothing(tmp_path: Path) -> None:
    study = write_study(tmp_path, HYPOTHESES)
    db = make_db(tmp_path / "r.duckdb", _points())
    with pytest.raises(SiteError) as err:
        build_site([db], tmp_path / "site", strict=True, study_paths=[study])
    message = err.value.message
    assert "toy: point toy/b/w/c4/r1 failed check littles_law" in message
    assert not (tmp_path / "site").exists()
    result = build_site([db], tmp_path / "site", study_paths=[study])  # without --strict: shown, not fatal
    assert any("littles_law" in w for w in result.warnings)
    page = (tmp_path / "site/studies/toy/index.html").read_text()
    assert "invalid" in page and "littles_law" in page


def test_missing_metric_is_a_warning(tmp_path: Path) -> None:
    hyp = '''
[[hypothesis]]
id = "power"
claim = "power is measured"
metric = "power_mean_w"
where = { arm = "a", concurrency = 1 }
predict = { relation = ">", value = 1.0 }
'''
    study = write_study(tmp_path, hyp)
    db = make_db(tmp_path / "r.duckdb", [P("a", 1, 0, {"output_throughput": 1.0})])
    with pytest.raises(SiteError, match="toy/power: not measured"):
        build_site([db], tmp_path / "site", strict=True, study_paths=[study])


def test_a_study_without_a_run_gets_a_page_of_not_run(tmp_path: Path) -> None:
    ran = write_study(tmp_path, HYPOTHESES)
    other = write_study(tmp_path, HYPOTHESES, study_id="other", title="Never ran")
    db = make_db(tmp_path / "r.duckdb", _points())
    build_site([db], tmp_path / "site", study_paths=[other, ran])
    page = (tmp_path / "site/studies/other/index.html").read_text()
    assert "not run" in page and "no run in the results database" in page
    assert not (tmp_path / "site/studies/other/data").exists()
    forest = json.loads(re.search(r'<script type="application/json" id="spec-forest">(.*?)</script>', page,
                                  re.S).group(1))  # type: ignore[union-attr]
    assert forest["vconcat"] and all(row["title"]["subtitle"] == "not run" and row["data"]["values"][0]["text"]
                                     == "not run" for row in forest["vconcat"])  # every row empty but its text
    ran_page = (tmp_path / "site/studies/toy/index.html").read_text()
    assert '"subtitle":"not run"' not in ran_page and 'id="spec-forest"' in ran_page
    index = (tmp_path / "site/index.html").read_text()
    assert index.index("studies/other/index.html") < index.index("studies/toy/index.html")  # sorted


def test_json_script_cannot_close_its_element() -> None:
    out = str(json_script({"claim": "</script><script>alert(1)</script> & co"}, 'x"y'))
    assert out.count("</script>") == 1 and "<script>alert" not in out
    assert 'id="x&#34;y"' in out
    body = out.split(">", 1)[1].rsplit("</script>", 1)[0]
    assert json.loads(body) == {"claim": "</script><script>alert(1)</script> & co"}


def test_vendored_vega_matches_altair() -> None:
    versions = json.loads((REPO / "site_templates/static/vendor/VERSIONS.json").read_text())
    schema = alt.SCHEMA_VERSION.lstrip("v")  # altair writes specs for exactly this vega-lite
    assert versions["vega-lite"]["version"].split(".")[:2] == schema.split(".")[:2]
    assert versions["vega"]["version"].split(".")[0] == "6" and versions["vega-embed"]["version"].startswith("7.")
    check = subprocess.run([sys.executable, str(REPO / "scripts/vendor_vega.py"), "--check"],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout


@pytest.mark.chromium
def test_calibrated_gpu_run_shows_ceilings_and_clocks(tmp_path: Path) -> None:
    study = write_study(tmp_path, HYPOTHESES)
    nvml = [{"source": "nvml", "t_s": 0.5 * i, "sm_clock_mhz": 1980.0 - i, "power_w": 300.0 + i} for i in range(6)]
    points = [P("a", 1, 0, {"output_throughput": 100.0, "mean_in_flight": 1.0}, telemetry=nvml)]
    db = make_db(tmp_path / "r.duckdb", points, calibrated=True, bandwidth_Bps=10e9, flops_bf16=0.5e12)
    build_site([db], tmp_path / "site", study_paths=[study])
    page = (tmp_path / "site/studies/toy/index.html").read_text()
    assert 'id="chart-clocks"' in page and "SM clock (MHz)" in page and "power (W)" in page
    assert "calibrated (measured this run)" in page and "spec sheet (cpu, nominal)" in page
    assert "50.0% of spec" in page  # 10 GB/s measured vs the 20 GB/s nominal sheet
    from tests.report.browser import chromium, chromium_missing

    if chromium_missing():
        pytest.skip(chromium_missing())
    with chromium() as browser:
        report = browser.load(tmp_path / "site/studies/toy/index.html")
    assert report.errors == []
    drawn = {c["id"] for c in report.charts if c["drawn"] == "true" and c["svg"]}
    assert {"chart-clocks", "chart-roofline", "chart-throughput"} <= drawn


def _spec(page: str, chart: str) -> dict[str, object]:
    import re

    found = re.search(rf'<script type="application/json" id="spec-{chart}">(.*?)</script>', page, re.DOTALL)
    assert found, chart
    return dict(json.loads(found[1]))


def test_many_points_are_one_panel_per_workload_and_an_all_zero_chart_is_a_line(tmp_path: Path) -> None:
    hyp = '[[hypothesis]]\nid = "h"\nclaim = "c"\nmetric = "output_throughput"\n' \
          'where = { arm = "a", workload = "v", concurrency = 1 }\npredict = { relation = ">", value = 1.0 }\n'
    study = write_study(tmp_path, hyp)
    study.write_text(study.read_text().replace("[workloads.w]", "[workloads.v]\ninput_len = 512\noutput_len = 8\n\n"
                                               "[workloads.w]"))
    points = [P(arm, level, r, {"output_throughput": 100.0 * level + r, "ttft_p50_s": 0.1, "ttft_p95_s": 0.2,
                                "prefix_hit_rate": 0.0, "littles_law_error": 0.01 * r}, workload=w)
              for arm in ("a", "b") for w in ("v", "w") for level in (1, 4) for r in range(3)]
    db = make_db(tmp_path / "r.duckdb", points)
    build_site([db], tmp_path / "site", study_paths=[study])
    page = (tmp_path / "site/studies/toy/index.html").read_text()
    for chart in ("throughput", "ttft", "littles-law"):
        spec = _spec(page, chart)
        assert spec["facet"] == {"column": {"field": "workload", "sort": ["v", "w"], "title": "workload",
                                            "type": "nominal"}}, chart
    assert 'data-spec="spec-cache"' not in page
    assert '<p class="chart-summary" id="chart-cache"><strong>Prefix-cache hit rate:</strong> 0% on all 24 points' in page


def test_one_workload_is_one_plot_and_every_dash_is_in_a_legend(tmp_path: Path) -> None:
    study = write_study(tmp_path, HYPOTHESES)
    points = [P(p.arm, p.concurrency, p.repeat, p.metrics | {"ttft_p95_s": 0.3, "littles_law_error": 0.01})
              for p in _points()]
    db = make_db(tmp_path / "r.duckdb", points)
    build_site([db], tmp_path / "site", study_paths=[study])
    page = (tmp_path / "site/studies/toy/index.html").read_text()
    assert "facet" not in _spec(page, "throughput")
    ttft = json.dumps(_spec(page, "ttft"))
    assert '"strokeDash": {"field": "stat"' in ttft and '"title": "percentile"' in ttft
    little = json.dumps(_spec(page, "littles-law"))
    assert '"domain": ["tolerance"]' in little and '"legend": {' in little


def test_a_study_edited_since_its_run_is_flagged_only_when_its_plan_differs(tmp_path: Path) -> None:
    """Notes written after a run change the file's hash, not what was measured or claimed."""
    from compiler.load import load_study
    from compiler.plan import Plan
    from report.run_compare import plan_differs
    from runner.store.store import Store

    repo = Path(__file__).resolve().parents[2]
    text = (repo / "studies/fp8_kv.toml").read_text()
    (tmp_path / "models").symlink_to(repo / "models")  # "../models/qwen3-8b" as the run's plan spelled it
    tmp_path = tmp_path / "studies"
    tmp_path.mkdir()
    with Store(repo / "results/h200", read_only=True) as store:
        run = store.latest_run("fp8-kv")
    assert run is not None
    budget = json.loads(run.plan_json or "{}")["design"]["budget"]  # the stored run's, where the file has moved on
    text = re.sub(r"budget = \{[^}]*\}", f"budget = {{ blocks = {budget['blocks']}, minutes = {budget['minutes']:g} }}", text)
    noted = tmp_path / "noted.toml"
    noted.write_text(text.replace('notes = "', 'notes = "Edited after the run. ', 1))
    assert plan_differs(load_study(noted), Plan.from_stored(run.plan_json)) == ""
    wider = tmp_path / "wider.toml"
    wider.write_text(text.replace("tolerance = 0.03", "tolerance = 0.05"))
    assert plan_differs(load_study(wider), Plan.from_stored(run.plan_json)) == "its plan differs (hypotheses)"
    fewer = tmp_path / "fewer.toml"
    fewer.write_text(text.replace("max_model_len = 4096", "max_model_len = 8192"))  # another server
    assert "launches" in plan_differs(load_study(fewer), Plan.from_stored(run.plan_json))
