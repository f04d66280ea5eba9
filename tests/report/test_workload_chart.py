"""The study page's workload chart: what a shaped workload sent, read from its stored requests (lengths and
send times as measured); none for a study whose workloads are all the classic fixed-length one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compiler.load import load_study
from report.pages.study_charts import study_charts
from report.results import latest_runs
from report.scoring.context import build_context
from runner.store.records import CheckResult, PointRecord, PointSummary, RequestRecord
from runner.store.store import Store
from tests.report.helpers import P, make_db, write_study

CONVERSATION = """
[workloads.talk]
input_len = 32
output_len = 8
turns = 2
think_s = 0.1
"""


def _request(i: int, turn: int, prompt: int, at: float) -> RequestRecord:
    return RequestRecord(index=i, warmup=False, scheduled_s=at, sent_s=at, first_token_s=at + 0.1, end_s=at + 0.5,
                         token_times_s=(at + 0.1, at + 0.5), prompt_tokens=prompt, output_tokens=8, chunks=2,
                         ok=True, error=None, status=200, conversation=i // 2, turn=turn)


def _rows(spec: Any) -> list[dict[str, Any]]:
    """Every inline data row of a Vega-Lite spec, wherever it sits."""
    if isinstance(spec, dict):
        found = [r for r in spec.get("values", []) if isinstance(r, dict)] if isinstance(spec.get("values"), list) else []
        return found + [r for k, v in spec.items() if k != "values" for r in _rows(v)]
    if isinstance(spec, list):
        return [r for v in spec for r in _rows(v)]
    return []


def _with_talk(tmp_path: Path) -> tuple[Path, Path]:
    study = write_study(tmp_path, "")
    study.write_text(study.read_text().replace("[load]", CONVERSATION + "\n[load]"))
    db = make_db(tmp_path / "r.duckdb", [P("a", 1, 1, {"output_throughput": 10.0})])
    point = PointRecord(run_id="run-1", point_id="toy/a/talk/c1/r1", server_id="toy/a", arm="a", workload="talk",
                        concurrency=1, repeat=1, status="ok", cache_policy="reset", valid=True,
                        summary=PointSummary(output_throughput=10.0, prefix_hit_rate=0.25))
    sent = [_request(0, 0, 32, 100.0), _request(1, 1, 72, 100.7), _request(2, 0, 32, 101.0),
            _request(3, 1, 72, 101.6)]
    with Store(db) as store:
        store.commit_point(point, sent, [CheckResult(point.point_id, "errors", True, "fail", 0.0, 0.0, "ok")], [])
    return study, db


def test_a_shaped_workload_is_charted_from_its_stored_requests(tmp_path: Path) -> None:
    study, db = _with_talk(tmp_path)
    data = latest_runs([db])["toy"]
    charts, _ = study_charts(build_context(load_study(study), data), data)
    chart = next(c for c in charts if c.id == "workload")
    assert "talk: 4 requests of toy/a/talk/c1/r1, prefix-cache hit rate 25" in chart.caption
    values = _rows(chart.spec)
    prompts = sorted(v["tokens"] for v in values if v.get("what") == "prompt tokens")
    assert prompts == [32, 32, 72, 72]  # the classic workload w is not charted: only talk's four requests
    offsets = sorted((v["offset_s"], v["turn"]) for v in values if "offset_s" in v)
    assert offsets == [(0.0, 0), (0.7, 1), (1.0, 0), (1.6, 1)]  # from the first scheduled send


def test_classic_workloads_get_no_workload_chart(tmp_path: Path) -> None:
    study = write_study(tmp_path, "")
    db = make_db(tmp_path / "r.duckdb", [P("a", 1, 1, {"output_throughput": 10.0})])
    data = latest_runs([db])["toy"]
    charts, _ = study_charts(build_context(load_study(study), data), data)
    assert all(c.id != "workload" for c in charts)
