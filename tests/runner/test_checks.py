"""Every validity check at its edges: exactly at the tolerance, just above, missing inputs (fail
closed), and the verdict rules. Pure: no server."""

from __future__ import annotations

import pytest

from compiler.study import Checks
from runner import checks
from runner.cache import CacheState
from runner.records import CheckResult, PointSummary
from tests.runner.steps import step

TOL = 0.25  # exact in binary, so "at the tolerance" is exact
ABOVE = 0.25 + 1e-9


def test_littles_law_edges() -> None:
    p = step()
    at = checks.littles_law(p, PointSummary(littles_law_error=TOL, mean_in_flight=3.5), TOL)
    assert at.passed and at.severity == "fail" and at.value == TOL and at.threshold == TOL
    assert at.name == "littles_law" and at.point_id == p.id
    assert "L = 3.500 in flight" in at.detail and "25.00%" in at.detail
    assert not checks.littles_law(p, PointSummary(littles_law_error=ABOVE), TOL).passed
    assert checks.littles_law(p, PointSummary(littles_law_error=0.0), TOL).passed
    missing = checks.littles_law(p, PointSummary(), TOL)
    assert not missing.passed and missing.value is None and "n/a" in missing.detail


def test_concurrency_held_edges() -> None:
    p = step(concurrency=16, requests=8)
    at = checks.concurrency_held(p, PointSummary(concurrency_error=TOL), TOL)
    assert at is not None and at.passed and at.severity == "fail" and at.name == "concurrency_held"
    assert "configured 8" in at.detail  # min(concurrency, requests)
    above = checks.concurrency_held(p, PointSummary(concurrency_error=ABOVE), TOL)
    assert above is not None and not above.passed
    missing = checks.concurrency_held(p, PointSummary(), TOL)
    assert missing is not None and not missing.passed
    assert checks.concurrency_held(step(concurrency=None, rate_rps=2.0), PointSummary(), TOL) is None


@pytest.mark.parametrize(
    ("cache", "passed"),
    [
        (CacheState(True, 100.0, 25.0), True),  # exactly at the limit
        (CacheState(True, 100.0, 0.0), True),
        (CacheState(True, 100.0, 25.0 + 1e-6), False),
        (CacheState(False, 100.0, 0.0), False),  # reset refused
        (CacheState(None, 100.0, 0.0), False),  # no reset recorded
        (CacheState(True, None, 0.0), False),  # queries counter missing
        (CacheState(True, 100.0, None), False),  # hits counter missing
        (CacheState(True, 0.0, 0.0), False),  # zero queries: nothing verified
        (CacheState(True, -1.0, 0.0), False),
    ],
)
def test_cache_cold_fails_closed(cache: CacheState, passed: bool) -> None:
    got = checks.cache_cold(step(cache="reset"), cache, TOL)
    assert got.passed is passed and got.severity == "fail" and got.threshold == TOL
    assert got.detail.startswith("reset + verify: ")


def test_cache_cold_reports_the_hit_rate_not_the_miss_rate() -> None:
    got = checks.cache_cold(step(), CacheState(True, 200.0, 10.0), TOL)
    assert got.value == pytest.approx(0.05) and got.passed and "hit rate 5.00% (max 25.00%)" in got.detail
    refused = checks.cache_cold(step(), CacheState(False, 200.0, 10.0), TOL)
    assert "reset refused" in refused.detail


def test_cache_keep_is_always_a_warning() -> None:
    got = checks.cache_cold(step(cache="keep"), CacheState(None, 100.0, 0.0), TOL)
    assert not got.passed and got.severity == "warn" and got.threshold is None and got.value == 0.0
    assert "kept between points" in got.detail


def test_output_exact_edges() -> None:
    p = step(output_len=8)
    assert checks.output_exact(p, [8, 8]).passed
    wrong = checks.output_exact(p, [8, 7, 9])
    assert not wrong.passed and wrong.value == 2.0 and wrong.severity == "fail"
    assert "1/3 requests returned exactly 8 tokens" in wrong.detail
    assert not checks.output_exact(p, []).passed  # nothing returned: nothing verified


def test_errors_edges() -> None:
    p = step(requests=8)
    assert checks.errors(p, PointSummary(requests_ok=8)).passed
    one_failed = checks.errors(p, PointSummary(requests_ok=7, requests_failed=1))
    assert not one_failed.passed and one_failed.value == 1.0 and "7/8 requests ok, 1 failed" in one_failed.detail
    assert not checks.errors(p, PointSummary(requests_ok=7)).passed  # one missing, none failed
    assert not checks.errors(p, PointSummary(requests_ok=9)).passed  # more than asked for
    assert not checks.errors(p, PointSummary()).passed


def test_warmup_sufficient_edges() -> None:
    p = step()
    at = checks.warmup_sufficient(p, TOL, TOL)
    assert at.passed and at.severity == "warn"
    assert not checks.warmup_sufficient(p, ABOVE, TOL).passed
    assert checks.warmup_sufficient(p, -0.5, TOL).passed  # a faster first half is no warmup problem
    assert not checks.warmup_sufficient(p, None, TOL).passed


def test_client_headroom_edges() -> None:
    p = step()
    at = checks.client_headroom(p, PointSummary(chunk_throughput=500.0), 1000.0, 0.5)
    assert at is not None and at.passed and at.severity == "warn" and at.value == 0.5 and at.threshold == 0.5
    assert "500 chunks/s = 50.00%" in at.detail
    above = checks.client_headroom(p, PointSummary(chunk_throughput=500.5), 1000.0, 0.5)
    assert above is not None and not above.passed
    missing = checks.client_headroom(p, PointSummary(), 1000.0, 0.5)
    assert missing is not None and not missing.passed
    assert checks.client_headroom(p, PointSummary(chunk_throughput=1.0), None, 0.5) is None
    assert checks.client_headroom(p, PointSummary(chunk_throughput=1.0), 0.0, 0.5) is None


def _good_summary() -> PointSummary:
    return PointSummary(requests_ok=8, littles_law_error=0.0, concurrency_error=0.0, chunk_throughput=10.0)


def test_evaluate_runs_every_check_in_order() -> None:
    found = checks.evaluate(
        step(), _good_summary(), thresholds=Checks(), cache=CacheState(True, 10.0, 0.0), output_lengths=[8] * 8,
        halves_gap=0.0, client_ceiling_chunks_per_s=1000.0,
    )
    assert [c.name for c in found] == [
        "littles_law", "concurrency_held", "cache_cold", "output_exact", "errors", "warmup_sufficient",
        "client_headroom",
    ]
    assert all(c.passed for c in found)
    assert checks.verdict(found) == (True, False)


def test_evaluate_uses_each_threshold() -> None:
    t = Checks(littles_law_tolerance=0.1, max_cold_hit_rate=0.2, warmup_tolerance=0.3, client_ceiling_fraction=0.4)
    found = {c.name: c for c in checks.evaluate(
        step(), _good_summary(), thresholds=t, cache=CacheState(True, 10.0, 0.0), output_lengths=[8] * 8,
        halves_gap=0.0, client_ceiling_chunks_per_s=1000.0,
    )}
    assert found["littles_law"].threshold == 0.1 and found["concurrency_held"].threshold == 0.1
    assert found["cache_cold"].threshold == 0.2 and found["warmup_sufficient"].threshold == 0.3
    assert found["client_headroom"].threshold == 0.4


def test_open_loop_without_ceiling_has_five_checks() -> None:
    found = checks.evaluate(
        step(concurrency=None, rate_rps=1.0), _good_summary(), thresholds=Checks(),
        cache=CacheState(True, 10.0, 0.0), output_lengths=[8] * 8, halves_gap=0.0, client_ceiling_chunks_per_s=None,
    )
    assert [c.name for c in found] == ["littles_law", "cache_cold", "output_exact", "errors", "warmup_sufficient"]


def _c(name: str, passed: bool, severity: str) -> CheckResult:
    return CheckResult("p", name, passed, severity, None, None, "")  # type: ignore[arg-type]


def test_verdict_fail_checks_decide_validity_and_warnings_only_flag() -> None:
    assert checks.verdict([]) == (True, False)
    assert checks.verdict([_c("a", True, "fail"), _c("b", True, "warn")]) == (True, False)
    assert checks.verdict([_c("a", False, "fail"), _c("b", True, "warn")]) == (False, False)
    assert checks.verdict([_c("a", True, "fail"), _c("b", False, "warn")]) == (True, True)
    assert checks.verdict([_c("a", False, "fail"), _c("b", False, "warn")]) == (False, True)
    assert checks.verdict([_c("a", True, "fail"), _c("b", False, "fail")]) == (False, False)
    assert checks.verdict([_c("a", False, "warn"), _c("b", True, "warn")]) == (True, True)


def test_within_is_inclusive_and_fails_closed() -> None:
    assert checks.within(0.5, 0.5) and checks.within(0.0, 0.5) and checks.within(-1.0, 0.5)
    assert not checks.within(0.5000001, 0.5)
    assert not checks.within(None, 0.5)
