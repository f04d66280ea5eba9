"""Scoring: every verdict from small databases written through Store, and the statistics under it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from compiler.load import load_study
from report.results import latest_runs
from report.scoring.score_model import Score, Why
from report.scoring.scoring import off_band, score_study
from report.stats.intervals import t_quantile
from report.stats.verdict import judge, straddled
from tests.report.helpers import P, make_db, write_study

HYPOTHESES = '''
[[hypothesis]]
id = "tight"
claim = "c1 throughput is 100 tok/s"
metric = "output_throughput"
where = { arm = "a", concurrency = 1 }
predict = { value = 100.0, tolerance = 0.05 }

[[hypothesis]]
id = "far"
claim = "c4 throughput is 1000 tok/s"
metric = "output_throughput"
where = { arm = "a", concurrency = 4 }
predict = { value = 1000.0, tolerance = 0.05 }

[[hypothesis]]
id = "noisy"
claim = "b at c1 is 100 tok/s"
metric = "output_throughput"
where = { arm = "b", concurrency = 1 }
predict = { value = 100.0, tolerance = 0.05 }

[[hypothesis]]
id = "batching"
claim = "c4 gives more than twice c1"
metric = "output_throughput"
where = { arm = "a" }
predict = { ratio = [{ concurrency = 4 }, { concurrency = 1 }], relation = ">", value = 2.0 }

[[hypothesis]]
id = "broken"
claim = "ttft at b/c4 under 1 s"
metric = "ttft_p50_s"
where = { arm = "b", concurrency = 4 }
predict = { relation = "<", value = 1.0 }

[[hypothesis]]
id = "capacity"
claim = "b holds as many KV tokens as a"
metric = "kv_capacity_tokens"
predict = { ratio = ["b", "a"], range = [0.9, 1.1] }
'''


def _points() -> list[P]:
    pts = []
    for r in range(3):
        pts.append(P("a", 1, r, {"output_throughput": [99.0, 100.0, 101.0][r], "ttft_p50_s": 0.1}))
        pts.append(P("a", 4, r, {"output_throughput": [390.0, 400.0, 410.0][r], "ttft_p50_s": 0.2}))
        # straddles the +-5% band: mean 100, spread 88..112
        pts.append(P("b", 1, r, {"output_throughput": [88.0, 100.0, 112.0][r], "ttft_p50_s": 0.1},
                     failed_checks=[("cache_cold", "warn")]))
        pts.append(P("b", 4, r, {"output_throughput": 400.0, "ttft_p50_s": 0.2},
                     failed_checks=[("littles_law", "fail")] if r == 1 else []))
    return pts


def alone(s: Score) -> str:
    """What a one-launch row's interval would say on its own (the ONE_LAUNCH reason's detail)."""
    assert s.verdict == "inconclusive" and s.verdict_label == "inconclusive (one launch)"
    return next(r.detail for r in s.reasons if r.why is Why.ONE_LAUNCH)


@pytest.fixture()
def scored(tmp_path: Path) -> dict[str, Score]:
    study = load_study(write_study(tmp_path, HYPOTHESES))
    db = make_db(tmp_path / "r.duckdb", _points(), servers={"a": {"kv_capacity_tokens": 1000},
                                                               "b": {"kv_capacity_tokens": 1500}})
    runs = latest_runs([db])
    return {s.hypothesis: s for s in score_study(study, runs["toy"])}


def test_inside_the_band_on_one_launch_is_at_most_inconclusive(scored: dict[str, Score]) -> None:
    """Every arm here ran on one launch: an interval inside the band would confirm, but without launch
    variation it is "inconclusive (one launch)", and says what it would read."""
    s = scored["tight"]
    assert alone(s) == "its 95% interval rests on the repeats of one launch per arm and would read confirmed"
    assert "what would decide it: at least 3 launches per arm (from its repeats" in s.notes[-1] and s.notes[-1].startswith("inconclusive (one launch): ")
    assert s.n == 3 and s.measured == pytest.approx(100.0)
    assert (s.spread_low, s.spread_high) == (99.0, 101.0)
    half = t_quantile(0.975, 2) * 1.0 / math.sqrt(3)
    assert s.ci_low == pytest.approx(100.0 - half) and s.ci_high == pytest.approx(100.0 + half)
    assert s.error == pytest.approx(0.0)
    assert (s.band_low, s.band_high) == pytest.approx((95.0, 105.0))
    assert s.predicted_spec == 100.0  # a plain number needs no hardware


def test_outside_the_band_on_one_launch_is_at_most_inconclusive(scored: dict[str, Score]) -> None:
    s = scored["far"]
    assert alone(s).endswith("would read refuted")
    assert s.verdict_spec == "inconclusive" and s.verdict_spec_label == "inconclusive (one launch)"
    assert s.error == pytest.approx(-0.6)


def test_noise_straddling_the_band_is_inconclusive_and_kept_cache_is_flagged(scored: dict[str, Score]) -> None:
    s = scored["noisy"]
    assert s.measured == pytest.approx(100.0)  # the mean is dead on, the noise is not
    assert s.verdict == "inconclusive"
    assert s.ci_low < 95.0 < s.ci_high
    assert s.checks == ("cache_cold",)
    kept = "prefix cache kept between points (cache = keep) on toy/b/w/c1/r0, toy/b/w/c1/r1, toy/b/w/c1/r2"
    assert s.flags == (kept,)


def test_ratio_of_matching_repeats_relation(scored: dict[str, Score]) -> None:
    s = scored["batching"]
    assert s.values == pytest.approx((390 / 99, 400 / 100, 410 / 101))
    assert alone(s).endswith("would read confirmed")  # both sides on one shared launch
    assert s.targets == ("a/w/4", "a/w/1")


def test_a_point_failing_a_fail_check_makes_it_invalid(scored: dict[str, Score]) -> None:
    s = scored["broken"]
    assert s.verdict == "invalid"
    assert "littles_law" in s.checks
    assert any("toy/b/w/c4/r1" in n and "littles_law" in n for n in s.notes)


def test_server_metric_reads_the_servers_table(scored: dict[str, Score]) -> None:
    s = scored["capacity"]
    assert s.values == (1.5,) and s.n == 1
    assert (s.ci_low, s.ci_high) == (1.5, 1.5)  # one value: the interval is the value
    assert alone(s) == "a single value, no interval; alone it would read refuted"


def test_server_metric_reads_a_resumed_launchs_latest_server(tmp_path: Path) -> None:
    """A resumed launch starts its server again as "<id>~2": the earlier row is kept as it was (here
    a start that failed), and the score reads the latest start of each planned server."""
    from datetime import UTC, datetime

    study = load_study(write_study(tmp_path, HYPOTHESES))
    later = datetime(2030, 1, 1, tzinfo=UTC)
    db = make_db(tmp_path / "r.duckdb", _points(), servers={
        "a": {"kv_capacity_tokens": 1000},
        "b": {"kv_capacity_tokens": None, "status": "failed", "error": "out of memory"},
        "b2": {"server_id": "toy/b~2", "arm": "b", "started_at": later, "kv_capacity_tokens": 1040},
        "c": {"server_id": "toy/c~2", "arm": "c", "started_at": later, "kv_capacity_tokens": 9},  # not planned
    })
    s = {x.hypothesis: x for x in score_study(study, latest_runs([db])["toy"])}["capacity"]
    assert s.values == (1.04,) and alone(s).endswith("would read confirmed")


def test_not_run_without_a_run_or_without_points(tmp_path: Path) -> None:
    study = load_study(write_study(tmp_path, HYPOTHESES))
    assert {s.verdict for s in score_study(study, None)} == {"not run"}
    db = make_db(tmp_path / "r.duckdb", [P("a", 1, 0, {"output_throughput": 100.0})])
    by_id = {s.hypothesis: s for s in score_study(study, latest_runs([db])["toy"])}
    assert alone(by_id["tight"]).endswith("would read confirmed") and by_id["tight"].n == 1
    assert by_id["far"].verdict == "not run"
    assert by_id["batching"].verdict == "not run"


def test_failed_point_status_is_invalid(tmp_path: Path) -> None:
    study = load_study(write_study(tmp_path, HYPOTHESES))
    db = make_db(tmp_path / "r.duckdb", [P("a", 1, 0, {"output_throughput": 100.0}),
                                         P("a", 1, 1, {}, status="failed")])
    s = {s.hypothesis: s for s in score_study(study, latest_runs([db])["toy"])}["tight"]
    assert s.verdict == "invalid"
    assert any("status failed" in n for n in s.notes)


def test_expression_resolved_against_calibration_and_spec(tmp_path: Path) -> None:
    hyp = '''
[[hypothesis]]
id = "roof"
claim = "half the roofline"
metric = "output_throughput"
where = { arm = "a", concurrency = 1 }
predict = { value = "0.5 * roofline.decode_tokens_per_s(batch=1, context=0)", tolerance = 0.1 }
'''
    study = load_study(write_study(tmp_path, hyp))
    db = make_db(tmp_path / "r.duckdb", [P("a", 1, 0, {"output_throughput": 100.0})], calibrated=True,
                 bandwidth_Bps=10e9, flops_bf16=1e12)
    s = score_study(study, latest_runs([db])["toy"])[0]
    # the cpu entry's nominal sheet says 20 GB/s; measured 10 GB/s halves a memory-bound prediction
    assert s.calibrated
    assert s.predicted_spec == pytest.approx(2 * s.predicted, rel=1e-3)
    assert s.band_low == pytest.approx(0.9 * s.predicted)


def test_latest_run_across_databases(tmp_path: Path) -> None:
    from datetime import datetime

    old = make_db(tmp_path / "old.duckdb", [P("a", 1, 0, {"output_throughput": 1.0})], run_id="old",
                  started=datetime(2024, 1, 1))
    new = make_db(tmp_path / "new.duckdb", [P("a", 1, 0, {"output_throughput": 2.0})], run_id="new",
                  started=datetime(2025, 1, 1))
    assert latest_runs([new, old])["toy"].run_id == "new"
    assert latest_runs([old, new])["toy"].run_id == "new"


@pytest.mark.parametrize(
    ("kind", "relation", "low", "high", "ci", "want"),
    [
        ("value", None, 95, 105, (96, 104), "confirmed"),
        ("value", None, 95, 105, (94, 104), "inconclusive"),
        ("value", None, 95, 105, (106, 110), "refuted"),
        ("range", None, 1.04, 1.06, (1.0, 1.03), "refuted"),
        ("relation", ">", 2.0, None, (2.1, 2.5), "confirmed"),
        ("relation", ">", 2.0, None, (1.9, 2.5), "inconclusive"),
        ("relation", ">", 2.0, None, (1.0, 2.0), "refuted"),
        ("relation", "<", None, 0.01, (0.0, 0.0), "confirmed"),
        ("relation", "<=", None, 0.01, (0.0, 0.01), "confirmed"),
        ("relation", "<", None, 0.01, (0.01, 0.02), "refuted"),
    ],
)
def test_judge(kind: str, relation: str | None, low: float | None, high: float | None,
               ci: tuple[float, float], want: str) -> None:
    assert judge(kind, relation, low, high, *ci) == want


def test_ratio_scores_use_the_log_interval(scored: dict[str, Score]) -> None:
    s = scored["batching"]
    assert s.measured == pytest.approx(math.prod(s.values) ** (1 / 3))
    assert 0 < s.ci_low < s.measured < s.ci_high


@pytest.mark.parametrize(
    ("low", "high", "mean", "want"),
    [(95, 105, 100, 0.0), (95, 105, 105, 0.0), (95, 105, 110, 110 / 105 - 1), (95, 105, 90, 90 / 95 - 1),
     (2.0, None, 5.0, 0.0), (2.0, None, 1.0, -0.5), (None, 0.01, 0.0, 0.0), (None, 0.01, 0.02, 1.0),
     (0.0, None, -1.0, None)],
)
def test_off_band_is_the_distance_to_the_band(low: float | None, high: float | None, mean: float,
                                              want: float | None) -> None:
    got = off_band(low, high, mean)
    assert got == (None if want is None else pytest.approx(want))


def test_a_relation_that_holds_is_inside_not_minus_100_percent(tmp_path: Path) -> None:
    hyp = '''
[[hypothesis]]
id = "cold"
claim = "hit rate under 1%"
metric = "prefix_hit_rate"
where = { arm = "a", concurrency = 1 }
predict = { relation = "<", value = 0.01 }
'''
    study = load_study(write_study(tmp_path, hyp))
    db = make_db(tmp_path / "r.duckdb", [P("a", 1, r, {"prefix_hit_rate": 0.0}) for r in range(2)])
    s = score_study(study, latest_runs([db])["toy"])[0]
    assert alone(s).endswith("would read confirmed") and s.off_band == 0.0 and s.error is None


def test_reasons_are_structured(scored: dict[str, Score]) -> None:
    broken = scored["broken"]
    failed = [r for r in broken.reasons if r.why is Why.FAILED_CHECK]
    assert [(r.point, r.checks) for r in failed] == [("toy/b/w/c4/r1", ("littles_law",))]
    assert all(r.invalidates for r in failed)
    noisy = scored["noisy"]
    assert alone(noisy) == ("its 95% interval rests on the repeats of one launch per arm and straddles 95 tok/s "
                            "and 105 tok/s")
    assert not noisy.has(Why.STRADDLES)  # one launch: the one-launch note says what would decide it
    assert not any(r.why is Why.STRADDLES for r in scored["tight"].reasons)
    assert scored["tight"].has(Why.NOT_CALIBRATED)


@pytest.mark.parametrize(
    ("kind", "relation", "low", "high", "ci", "want"),
    [("value", None, 95, 105, (94, 104), (95,)), ("value", None, 95, 105, (90, 110), (95, 105)),
     ("relation", ">", 2.0, None, (1.9, 2.5), (2.0,)), ("relation", "<", None, 1.0, (0.5, 0.9), ()),
     ("value", None, 95, 105, (100, 100), ())],
)
def test_straddled_edges(kind: str, relation: str | None, low: float | None, high: float | None,
                         ci: tuple[float, float], want: tuple[float, ...]) -> None:
    assert straddled(kind, relation, low, high, *ci) == want


def test_audit_json_carries_structured_reasons(scored: dict[str, Score]) -> None:
    import json

    from report.audit import json_row

    row = json.loads(json.dumps(json_row(scored["broken"])))
    failed = [r for r in row["reasons"] if r["why"] == "failed check"]
    assert failed == [{"why": "failed check", "point": "toy/b/w/c4/r1", "checks": ["littles_law"], "edge": None,
                       "unit": "", "count": 0, "detail": "", "label": "", "decide": "",
                       "text": "toy/b/w/c4/r1: failed check littles_law"}]
    assert row["prediction"] == "< 1,000 ms" and row["off_band"] == 0.0 and row["verdict"] == "invalid"
    assert (row["verdict_label"], row["interval_label"], row["confidence"], row["look"]) == (
        "invalid", "95% interval", 0.95, None)
    one = json.loads(json.dumps(json_row(scored["tight"])))
    assert (one["verdict"], one["verdict_label"]) == ("inconclusive", "inconclusive (one launch)")
