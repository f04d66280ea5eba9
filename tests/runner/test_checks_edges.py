"""Each check's whole result (point id, name, passed, severity, value, threshold, status, and the
measured sentence that opens its detail) in each of its branches, so a wrong field or a wrong number
in a detail shows up. The advice that follows the measured sentence is checked by its key words only."""

from __future__ import annotations

from compiler.study import Checks
from runner.checks import checks
from runner.checks.cache import CacheState
from runner.checks.checks import Output
from runner.checks.fidelity import Fidelity
from runner.checks.reconcile import Item, Reconciliation
from runner.store.records import CheckResult, PointSummary
from tests.runner.steps import step

P = step()  # closed loop c4, 8 requests, 8 output tokens, cache reset
PID = P.id
OPEN = step(concurrency=None, rate_rps=2.0)


def same(got: CheckResult | None, want: CheckResult, *words: str) -> None:
    """Every field equal, the detail opening with `want.detail` and holding each of `words`."""
    assert got is not None
    assert (got.point_id, got.name, got.passed, got.severity, got.value, got.threshold, got.status) == (
        want.point_id, want.name, want.passed, want.severity, want.value, want.threshold, want.status)
    assert got.detail.startswith(want.detail), (got.detail, want.detail)
    for word in words:
        assert word in got.detail, (word, got.detail)


def test_steady_state_results() -> None:
    measured = "of 8 requests ran wholly in the steady phase (every one of 4 slots busy), need at least 4"
    same(checks.steady_state(P, PointSummary(steady_requests=4)),
         CheckResult(PID, "steady_state", True, "fail", 4.0, 4.0, f"4 {measured}", "pass"))
    assert checks.steady_state(P, PointSummary(steady_requests=4)).detail == f"4 {measured}"  # type: ignore[union-attr]
    same(checks.steady_state(P, PointSummary(steady_requests=0)),
         CheckResult(PID, "steady_state", False, "fail", 0.0, 4.0, f"0 {measured}; ", "fail"),
         "at least 12 requests (3 waves)", "load.burst = true")
    same(checks.steady_state(P, PointSummary()),
         CheckResult(PID, "steady_state", False, "fail", None, 4.0, f"n/a {measured}; ", "unverified"))


def test_littles_law_closed_loop_results() -> None:
    base = "lambda*W = 3.100 vs configured concurrency 4 over the steady phase: error 22.50% (tolerance 25.00%)"
    ok = checks.littles_law(P, PointSummary(littles_law_error=0.225, little_lambda_w=3.1), 0.25)
    same(ok, CheckResult(PID, "littles_law", True, "fail", 0.225, 0.25, base, "pass"))
    assert ok is not None and ok.detail == base
    same(checks.littles_law(P, PointSummary(littles_law_error=0.5, little_lambda_w=2.0), 0.25),
         CheckResult(PID, "littles_law", False, "fail", 0.5, 0.25,
                     "lambda*W = 2.000 vs configured concurrency 4 over the steady phase: error 50.00% "
                     "(tolerance 25.00%); ", "fail"),
         "fewer requests in flight than configured", "STUDYC_CLIENT_CPUS")
    same(checks.littles_law(P, PointSummary(), 0.25),
         CheckResult(PID, "littles_law", False, "fail", None, 0.25,
                     "lambda*W = n/a vs configured concurrency 4 over the steady phase: error n/a (tolerance 25.00%)",
                     "unverified"))


def test_littles_law_occupancy_needs_both_sides() -> None:
    both = checks.littles_law(P, PointSummary(littles_law_error=0.0, little_lambda_w=4.0, client_in_flight=3.9,
                                                server_in_flight=3.8), 0.25)
    assert both is not None and both.detail.endswith(
        "(tolerance 25.00%); whole window in flight: client 3.900, server 3.800 (judged by reconciliation)")
    for one in (PointSummary(littles_law_error=0.0, client_in_flight=3.9),
                PointSummary(littles_law_error=0.0, server_in_flight=3.8)):
        got = checks.littles_law(P, one, 0.25)
        assert got is not None and got.detail.endswith("(tolerance 25.00%)")


def test_littles_law_open_loop_results() -> None:
    summary = PointSummary(littles_law_error=0.3, client_lag_p99_s=0.5)
    passed = checks.littles_law(OPEN, summary, 0.25, open_allowance=0.05)
    same(passed, CheckResult(
        OPEN.id, "littles_law", True, "fail", 0.3, 0.3,
        "completions/s vs the offered rate: error 30.00% (allowed 30.00%: tolerance 25.00% + span boundary "
        "5.00%); client lag p99 500.0 ms", "pass"))
    assert passed is not None and passed.detail.endswith("client lag p99 500.0 ms")
    same(checks.littles_law(OPEN, summary, 0.25), CheckResult(
        OPEN.id, "littles_law", False, "fail", 0.3, 0.25,
        "completions/s vs the offered rate: error 30.00% (allowed 25.00%: tolerance 25.00% + span boundary "
        "n/a); client lag p99 500.0 ms; completions fell behind the offered rate: the server saturated", "fail"),
         "client sent late", "Fix: a lower rate")
    same(checks.littles_law(OPEN, PointSummary(), 0.25), CheckResult(
        OPEN.id, "littles_law", False, "fail", None, 0.25,
        "completions/s vs the offered rate: error n/a (allowed 25.00%: tolerance 25.00% + span boundary n/a); "
        "client lag p99 n/a", "unverified"))


def test_reconciliation_results() -> None:
    same(checks.reconciliation(P, None), CheckResult(
        PID, "reconciliation", False, "fail", None, None,
        "no server counters at the window's edges were recorded", "unverified"), "cannot verify")
    good = Reconciliation((Item("requests", "pass", 8.0, 8.0, "exact", "ok"),))
    assert checks.reconciliation(P, good) == CheckResult(
        PID, "reconciliation", True, "fail", 0.0, 0.0,
        "server counters agree with the client's records (1 comparisons)", "pass")
    bad = Reconciliation((Item("requests", "fail", 8.0, 9.0, "exact", "server counted 9"),
                          Item("tokens", "unverified", 64.0, None, "exact", "no counter"),
                          Item("ttft", "pass", 1.0, 1.0, "exact", "ok")))
    same(checks.reconciliation(P, bad), CheckResult(
        PID, "reconciliation", False, "fail", 2.0, 0.0, "requests: server counted 9; tokens: no counter", "fail"))


def test_cache_cold_results() -> None:
    same(checks.cache_cold(P, CacheState(True, 100.0, 5.0), 0.05), CheckResult(
        PID, "cache_cold", True, "fail", 0.05, 0.05, "reset + verify: hit rate 5.00% (max 5.00%)", "pass"))
    same(checks.cache_cold(P, CacheState(True, 0.0, 0.0), 0.05, expected=0.8, caching=False), CheckResult(
        PID, "cache_cold", True, "fail", None, 0.8 + 0.05,
        "reset + verify: prefix caching off (--no-enable-prefix-caching): no lookups, no hits", "pass"))
    assert checks.cache_cold(P, CacheState(True, 0.0, 0.0), 0.05).status == "unverified"  # caching on
    kept = step(cache="keep")
    same(checks.cache_cold(kept, CacheState(None, 100.0, 30.0), 0.05), CheckResult(
        kept.id, "cache_cold", False, "warn", 0.3, None,
        "prefix cache kept between points: hit rate 30.00%; this is not a cold measurement"))
    assert checks.cache_cold(kept, CacheState(None, None, None), 0.05).detail.startswith(
        "prefix cache kept between points: hit rate n/a; this is not a cold measurement")


def test_output_exact_results() -> None:
    same(checks.output_exact(P, [Output(8, 8)] * 3), CheckResult(
        PID, "output_exact", True, "fail", 0.0, 0.0, "3/3 requests returned exactly 8 tokens", "pass"))
    same(checks.output_exact(P, [Output(8, 8), Output(0, 5), Output(0, 5)]), CheckResult(
        PID, "output_exact", False, "fail", 0.0, 0.0,
        "1/3 requests returned exactly 8 tokens; 2 reported no usage: cannot count their tokens", "unverified"))
    # One chunk without usage is still "no usage"; no chunk and no tokens is a wrong count.
    assert checks.output_exact(P, [Output(8, 8), Output(0, 1)]).status == "unverified"
    same(checks.output_exact(P, [Output(8, 8), Output(0, 0)]), CheckResult(
        PID, "output_exact", False, "fail", 1.0, 0.0, "1/2 requests returned exactly 8 tokens", "fail"))
    assert "no usage" not in checks.output_exact(P, [Output(8, 8), Output(0, 0)]).detail
    same(checks.output_exact(P, [Output(7, 7), Output(0, 1)]), CheckResult(
        PID, "output_exact", False, "fail", 1.0, 0.0, "0/2 requests returned exactly 8 tokens", "fail"),
         "; 1 reported no usage: cannot count their tokens")


def test_errors_results() -> None:
    same(checks.errors(P, PointSummary(requests_ok=8)), CheckResult(
        PID, "errors", True, "fail", 0.0, 0.0, "8/8 requests ok, 0 failed"))
    same(checks.errors(P, PointSummary(requests_ok=7, requests_failed=1)), CheckResult(
        PID, "errors", False, "fail", 1.0, 0.0, "7/8 requests ok, 1 failed"))


def test_warmup_sufficient_results() -> None:
    measured = "time per output token: the first half of the steady requests was"
    same(checks.warmup_sufficient(P, 0.1, 0.2), CheckResult(
        PID, "warmup_sufficient", True, "warn", 0.1, 0.2,
        f"{measured} 10.00% slower than the second (tolerance 20.00% either way)", "pass"))
    same(checks.warmup_sufficient(P, -0.2, 0.2), CheckResult(
        PID, "warmup_sufficient", False, "warn", -0.25, 0.2,
        "time per output token: the second half of the steady requests was 25.00% slower than the first "
        "(tolerance 20.00% either way); the server slowed during the window", "fail"))
    same(checks.warmup_sufficient(P, None, 0.2), CheckResult(
        PID, "warmup_sufficient", False, "warn", None, 0.2, f"{measured} n/a slower than the second",
        "unverified"))
    # No warmup requests: flagged even when the halves agree (the warm-up trap), the halves still shown.
    bare = step(warmup=0)
    same(checks.warmup_sufficient(bare, 0.0, 0.2), CheckResult(
        bare.id, "warmup_sufficient", False, "warn", 0.0, 0.2,
        "no warmup requests (warmup = 0): the point's first measured requests were the first the server saw",
        "fail"), f"{measured} 0.00% slower")
    assert checks.warmup_sufficient(step(warmup=1), 0.0, 0.2).passed  # one warmup request: judged as usual


def test_client_headroom_results() -> None:
    same(checks.client_headroom(P, PointSummary(chunk_throughput=250.0), 1000.0, 0.5), CheckResult(
        PID, "client_headroom", True, "warn", 0.25, 0.5, "250 chunks/s = 25.00% of the client's measured ceiling",
        "pass"))
    same(checks.client_headroom(P, PointSummary(), 1000.0, 0.5), CheckResult(
        PID, "client_headroom", False, "warn", None, 0.5, "0 chunks/s = n/a of the client's measured ceiling",
        "unverified"))
    # A ceiling below one chunk per second is still a measured ceiling.
    slow = checks.client_headroom(P, PointSummary(chunk_throughput=0.25), 0.5, 0.6)
    assert slow is not None and slow.value == 0.5 and slow.passed
    assert checks.client_headroom(P, PointSummary(chunk_throughput=1.0), 0.0, 0.5) is None
    assert checks.client_headroom(P, PointSummary(chunk_throughput=1.0), -1.0, 0.5) is None
    assert checks.client_headroom(P, PointSummary(chunk_throughput=1.0), None, 0.5) is None


def test_evaluate_passes_the_open_loop_allowance() -> None:
    evidence = checks.Evidence(
        cache=CacheState(True, 10.0, 0.0), outputs=[Output(8, 8)] * 8, halves_gap=0.0,
        client_ceiling_chunks_per_s=None, reconciliation=None,
        fidelity=Fidelity("pass", 10, 0, 0.1, "server inter-token histogram", "clean"), open_allowance=0.1)
    found = {c.name: c for c in checks.evaluate(OPEN, PointSummary(requests_ok=8, littles_law_error=0.3),
                                                 thresholds=Checks(littles_law_tolerance=0.25), evidence=evidence)}
    assert found["littles_law"].threshold == 0.35 and found["littles_law"].passed


def test_verdict_reason_lists_every_name() -> None:
    def c(name: str, status: str) -> CheckResult:
        return CheckResult("p", name, status == "pass", "fail", None, None, "", status)  # type: ignore[arg-type]

    assert checks.verdict_reason([c("a", "fail"), c("b", "fail")]) == "invalid: a, b"
    assert checks.verdict_reason([c("a", "unverified"), c("b", "unverified")]) == "unverified: a, b"
    assert checks.verdict_reason([c("a", "fail"), c("b", "unverified"), c("d", "unverified")]) == (
        "invalid: a (unverified: b, d)")


def test_evaluate_passes_the_engines_prefix_caching() -> None:
    """A window with no lookups is cold on an engine with prefix caching off, and unverifiable on one with it
    on: `evaluate` hands the engine's setting to cache_cold."""
    def found(caching: bool) -> CheckResult:
        evidence = checks.Evidence(
            cache=CacheState(True, 0.0, 0.0), outputs=[Output(8, 8)] * 8, halves_gap=0.0,
            client_ceiling_chunks_per_s=None, reconciliation=None,
            fidelity=Fidelity("pass", 10, 0, 0.1, "server inter-token histogram", "clean"), prefix_caching=caching)
        return {c.name: c for c in checks.evaluate(step(), PointSummary(requests_ok=8), thresholds=Checks(),
                                                    evidence=evidence)}["cache_cold"]

    assert found(False).status == "pass" and found(True).status == "unverified"
