"""Every validity check at its edges: exactly at the tolerance, just above, missing inputs (fail
closed), and the verdict rules. Pure: no server."""

from __future__ import annotations

import pytest

from compiler.study import Checks
from runner.checks import checks
from runner.checks.cache import CacheState
from runner.checks.checks import Output
from runner.checks.fidelity import Fidelity
from runner.checks.reconcile import Item, Reconciliation
from runner.store.records import CheckResult, PointSummary
from tests.runner.steps import step

TOL = 0.25  # exact in binary, so "at the tolerance" is exact
ABOVE = 0.25 + 1e-9


def test_steady_state_edges() -> None:
    p = step(concurrency=4, requests=16)
    at = checks.steady_state(p, PointSummary(steady_requests=4))
    assert at is not None and at.passed and at.status == "pass" and at.severity == "fail" and at.threshold == 4.0
    below = checks.steady_state(p, PointSummary(steady_requests=3))
    assert below is not None and below.status == "fail" and "load.burst = true" in below.detail
    one_wave = checks.steady_state(step(concurrency=4, requests=4), PointSummary(steady_requests=0))
    assert one_wave is not None and not one_wave.passed and "at least 12 requests" in one_wave.detail
    missing = checks.steady_state(p, PointSummary())
    assert missing is not None and missing.status == "unverified" and not missing.passed
    assert checks.steady_state(step(concurrency=4, requests=4, burst=True), PointSummary()) is None
    assert checks.steady_state(step(concurrency=None, rate_rps=2.0), PointSummary()) is None


def test_littles_law_closed_loop_edges() -> None:
    p = step()
    at = checks.littles_law(p, PointSummary(littles_law_error=TOL, little_lambda_w=3.0), TOL)
    assert at is not None and at.passed and at.severity == "fail" and at.value == TOL and at.threshold == TOL
    assert "lambda*W = 3.000 vs configured concurrency 4" in at.detail and "25.00%" in at.detail
    above = checks.littles_law(p, PointSummary(littles_law_error=ABOVE), TOL)
    assert above is not None and above.status == "fail" and "STUDYC_CLIENT_CPUS" in above.detail
    missing = checks.littles_law(p, PointSummary(), TOL)
    assert missing is not None and missing.status == "unverified" and "n/a" in missing.detail
    assert checks.littles_law(step(concurrency=4, requests=4, burst=True), PointSummary(), TOL) is None
    both = checks.littles_law(p, PointSummary(littles_law_error=0.0, client_in_flight=3.2, server_in_flight=3.1), TOL)
    assert both is not None and "client 3.200, server 3.100" in both.detail


def test_littles_law_open_loop_adds_the_span_allowance() -> None:
    p = step(concurrency=None, rate_rps=2.0)
    got = checks.littles_law(p, PointSummary(littles_law_error=0.3), TOL, open_allowance=0.05)
    assert got is not None and got.passed and got.threshold == pytest.approx(0.30)
    behind = checks.littles_law(p, PointSummary(littles_law_error=0.31), TOL, open_allowance=0.05)
    assert behind is not None and behind.status == "fail" and "saturated" in behind.detail


def _reconciled(status: str) -> Reconciliation:
    return Reconciliation((Item("requests", status, 8.0, 9.0, "exact", "server counted 9"),))  # type: ignore[arg-type]


def test_reconciliation_follows_its_items_and_fails_closed() -> None:
    p = step()
    ok = checks.reconciliation(p, _reconciled("pass"))
    assert ok.passed and ok.status == "pass" and ok.severity == "fail"
    bad = checks.reconciliation(p, _reconciled("fail"))
    assert bad.status == "fail" and "server counted 9" in bad.detail and bad.value == 1.0
    unverified = checks.reconciliation(p, _reconciled("unverified"))
    assert unverified.status == "unverified" and not unverified.passed
    nothing = checks.reconciliation(p, None)
    assert nothing.status == "unverified" and "no server counters" in nothing.detail
    assert checks.reconciliation(p, Reconciliation(())).status == "unverified"


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
    unverifiable = cache.reset_ok is True and (cache.queries is None or cache.hits is None or cache.queries <= 0)
    assert got.status == ("pass" if passed else "unverified" if unverifiable else "fail")


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
    assert checks.output_exact(p, [Output(8, 8), Output(8, 7)]).passed
    wrong = checks.output_exact(p, [Output(8, 8), Output(7, 7), Output(9, 9)])
    assert not wrong.passed and wrong.status == "fail" and wrong.value == 2.0 and wrong.severity == "fail"
    assert "1/3 requests returned exactly 8 tokens" in wrong.detail
    nothing = checks.output_exact(p, [])  # nothing returned: nothing verified
    assert nothing.status == "unverified"
    no_usage = checks.output_exact(p, [Output(8, 8), Output(0, 8)])  # streamed chunks, no usage event
    assert no_usage.status == "unverified" and "reported no usage" in no_usage.detail
    assert checks.output_exact(p, [Output(0, 0)]).status == "fail"  # no tokens at all is wrong


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
    assert at is not None and at.passed and at.severity == "warn"
    above = checks.warmup_sufficient(p, ABOVE, TOL)
    assert above is not None and above.status == "fail"
    # the other way: a second half slower than the first (the server slowed during the window)
    slowed = checks.warmup_sufficient(p, -0.5, TOL)  # the second half twice as slow: 100% slower
    assert slowed is not None and slowed.status == "fail" and slowed.value == -1.0
    assert "the second half of the steady requests was 100.00% slower than the first" in slowed.detail
    assert "slowed during the window" in slowed.detail and "warming up" not in slowed.detail
    on_edge = checks.warmup_sufficient(p, -0.5, 1.0)  # the second half's excess is exactly the tolerance
    assert on_edge is not None and on_edge.passed
    beyond = checks.warmup_sufficient(p, -0.5 - 1e-9, 1.0)
    assert beyond is not None and beyond.status == "fail"
    # judged as the slower half's excess over the faster one: a gap of -0.22 is the second half 28% slower
    skewed = checks.warmup_sufficient(p, -0.22, TOL)
    assert skewed is not None and skewed.status == "fail" and skewed.value == pytest.approx(-0.22 / 0.78)
    clean = checks.warmup_sufficient(p, -0.1, TOL)  # 11% slower second half, within 25%
    assert clean is not None and clean.passed and clean.value == pytest.approx(-0.1 / 0.9)
    assert checks.halves_slowdown(0.0) == 0.0 and checks.halves_slowdown(0.3) == 0.3
    even = checks.warmup_sufficient(p, 0.0, TOL)
    assert even is not None and even.passed and "the first half of the steady requests was 0.00%" in even.detail
    missing = checks.warmup_sufficient(p, None, TOL)
    assert missing is not None and missing.status == "unverified"
    assert checks.warmup_sufficient(step(requests=4, burst=True), 1.5, TOL) is None  # a burst: not judged


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


def test_itl_trusted_follows_fidelity() -> None:
    p = step()
    clean = checks.itl_trusted(p, Fidelity("pass", 100, 3, 0.002, "server inter-token histogram", "3 of 100"))
    assert clean.passed and clean.severity == "warn" and clean.value == 0.03 and clean.threshold == 0.25
    bunched = checks.itl_trusted(p, Fidelity("fail", 100, 60, 0.002, "client TPOT median", "60 of 100: Fix: x"))
    assert bunched.status == "fail" and "Fix" in bunched.detail
    assert checks.itl_trusted(p, Fidelity("unverified", 0, 0, None, "none", "no gaps")).status == "unverified"


def _good_summary() -> PointSummary:
    return PointSummary(requests_ok=8, littles_law_error=0.0, steady_requests=4, chunk_throughput=10.0)


def _evidence(**over: object) -> checks.Evidence:
    fields: dict[str, object] = dict(
        cache=CacheState(True, 10.0, 0.0), outputs=[Output(8, 8)] * 8, halves_gap=0.0,
        client_ceiling_chunks_per_s=1000.0, reconciliation=_reconciled("pass"),
        fidelity=Fidelity("pass", 10, 0, 0.1, "server inter-token histogram", "clean"),
    )
    return checks.Evidence(**(fields | over))  # type: ignore[arg-type]


def test_evaluate_runs_every_check_in_order() -> None:
    found = checks.evaluate(step(), _good_summary(), thresholds=Checks(), evidence=_evidence())
    assert [c.name for c in found] == [
        "steady_state", "littles_law", "reconciliation", "cache_cold", "output_exact", "errors",
        "warmup_sufficient", "client_headroom", "itl_trusted",
    ]
    assert all(c.passed for c in found)
    assert checks.verdict(found) == (True, False) and checks.verdict_reason(found) == "valid"


def test_evaluate_uses_each_threshold() -> None:
    t = Checks(littles_law_tolerance=0.1, max_cold_hit_rate=0.2, warmup_tolerance=0.3, client_ceiling_fraction=0.4)
    found = {c.name: c for c in checks.evaluate(step(), _good_summary(), thresholds=t, evidence=_evidence())}
    assert found["littles_law"].threshold == 0.1
    assert found["cache_cold"].threshold == 0.2 and found["warmup_sufficient"].threshold == 0.3
    assert found["client_headroom"].threshold == 0.4


def test_open_loop_without_ceiling() -> None:
    found = checks.evaluate(step(concurrency=None, rate_rps=1.0), _good_summary(), thresholds=Checks(),
                            evidence=_evidence(client_ceiling_chunks_per_s=None))
    assert [c.name for c in found] == ["littles_law", "reconciliation", "cache_cold", "output_exact", "errors",
                                       "warmup_sufficient", "itl_trusted"]


def test_burst_leaves_out_the_steady_state_checks() -> None:
    found = checks.evaluate(step(requests=4, burst=True), _good_summary(), thresholds=Checks(),
                            evidence=_evidence(halves_gap=1.5))
    names = [c.name for c in found]
    assert "steady_state" not in names and "littles_law" not in names and "warmup_sufficient" not in names


def _c(name: str, passed: bool, severity: str, status: str | None = None) -> CheckResult:
    return CheckResult("p", name, passed, severity, None, None, "", status)  # type: ignore[arg-type]


def test_unverified_is_not_valid_and_named_apart_from_failed() -> None:
    unverified = [_c("reconciliation", False, "fail", "unverified"), _c("errors", True, "fail")]
    assert checks.verdict(unverified) == (False, False)
    assert checks.verdict_reason(unverified) == "unverified: reconciliation"
    both = [*unverified, _c("littles_law", False, "fail")]
    assert checks.verdict_reason(both) == "invalid: littles_law (unverified: reconciliation)"
    assert checks.verdict_reason([_c("w", False, "warn", "unverified")]) == "valid"
    with pytest.raises(ValueError):
        _c("x", True, "fail", "unverified")  # an unverified check cannot pass


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


def test_every_failed_or_unverified_check_names_its_cause_and_fix() -> None:
    """What happened and what to change, for each check that did not pass (key words of each)."""
    p = step(concurrency=4, requests=16)
    cases: list[tuple[CheckResult | None, tuple[str, ...]]] = [
        (checks.steady_state(p, PointSummary(steady_requests=3)), ("too few waves", "Fix: give at least 12")),
        (checks.steady_state(p, PointSummary()), ("no request completed", "Fix:")),
        (checks.littles_law(p, PointSummary(littles_law_error=0.2), 0.03),
         ("could not keep the slots full", "CPU contention", "fewer jobs", "STUDYC_CLIENT_CPUS", "more requests")),
        (checks.littles_law(p, PointSummary(), 0.03), ("cannot verify", "Fix: at least 12 requests")),
        (checks.littles_law(step(concurrency=None, rate_rps=2.0), PointSummary(littles_law_error=0.5), 0.03, 0.0),
         ("fell behind the offered rate", "Fix: a lower rate", "STUDYC_CLIENT_CPUS")),
        (checks.reconciliation(p, None), ("no server counters", "Fix: re-run the point")),
        (checks.cache_cold(p, CacheState(False, 10.0, 0.0), TOL), ("reset refused", "VLLM_SERVER_DEV_MODE=1")),
        (checks.cache_cold(p, CacheState(True, None, None), TOL), ("counters missing", "Fix: enable prefix caching")),
        (checks.cache_cold(p, CacheState(True, 0.0, 0.0), TOL), ("no prefix-cache queries", "--enable-prefix-caching")),
        (checks.cache_cold(p, CacheState(True, 100.0, 90.0), TOL), ("reset was not done", "Fix: reset the server")),
        (checks.output_exact(step(output_len=8), [Output(7, 7)]), ("ended requests early", "Fix: max_model_len")),
        (checks.output_exact(step(output_len=8), [Output(0, 8)]), ("no usage", "include_usage")),
        (checks.output_exact(step(output_len=8), []), ("no request completed", "errors check")),
        (checks.errors(step(requests=8), PointSummary(requests_ok=7, requests_failed=1)),
         ("refused, dropped or timed out", "Fix:", "request_timeout_s")),
        (checks.warmup_sufficient(p, 0.5, TOL), ("still warming up", "Fix: more warmup requests (load.warmup)")),
        (checks.warmup_sufficient(p, -0.5, TOL), ("slowed during the window", "Fix: check the GPU's clocks")),
        (checks.warmup_sufficient(p, None, TOL), ("cannot verify", "Fix: more requests")),
        (checks.client_headroom(p, PointSummary(chunk_throughput=900.0), 1000.0, 0.5),
         ("near its own limit", "STUDYC_CLIENT_CPUS", "fewer jobs")),
        (checks.client_headroom(p, PointSummary(), 1000.0, 0.5), ("cannot verify", "Fix:")),
        (checks.itl_trusted(p, Fidelity("unverified", 0, 0, None, "none", "no token gaps to judge")),
         ("cannot verify", "Fix: output_len of at least 2")),
    ]
    for got, words in cases:
        assert got is not None and not got.passed, got
        for w in words:
            assert w in got.detail, (got.name, w, got.detail)
    passed = checks.littles_law(p, PointSummary(littles_law_error=0.0), 0.03)
    assert passed is not None and passed.passed and "Fix" not in passed.detail  # a pass names no fix
