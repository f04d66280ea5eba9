"""Checks on shaped workloads: each request's output against its own max_tokens, and the cold-cache check
against the hit rate the workload's shared prefixes make expected (cold at the point's start)."""

from __future__ import annotations

import pytest

from compiler.study import Checks
from compiler.workload import Shape, Uniform
from runner.checks import checks
from runner.checks.cache import CacheState
from runner.checks.checks import Expectation, Output
from runner.checks.expect import point_expectation
from runner.checks.judge import judge
from runner.store.records import PointSummary
from tests.runner.steps import step
from tests.runner.test_judge import closed_loop, side

SHAPED = step(shape=Shape(input=16, output=Uniform(dist="uniform", min=2, max=9)))


def test_output_exact_reads_each_requests_own_length() -> None:
    ok = checks.output_exact(SHAPED, [Output(3, 3, 3), Output(9, 9, 9)])
    assert ok.status == "pass" and "2/2 requests returned exactly the tokens they asked for" in ok.detail
    short = checks.output_exact(SHAPED, [Output(3, 3, 3), Output(8, 8, 9)])
    assert short.status == "fail" and short.value == 1.0
    # no expected count given: the point's output_len, as for a classic point
    assert checks.output_exact(step(output_len=8), [Output(8, 8)]).status == "pass"
    assert checks.output_exact(step(output_len=8), [Output(7, 7)]).status == "fail"


@pytest.mark.parametrize(("hits", "expected", "status"), [
    (60.0, 0.5, "fail"),  # 60% hits where 50% are expected: more than a cold start allows
    (51.0, 0.5, "pass"),  # exactly expected + max_cold_hit_rate
    (51.0 + 1e-6, 0.5, "fail"),
    (30.0, 0.5, "pass"),  # fewer hits than the bound: concurrency, eviction
    (1.0, 0.0, "pass"),
    (1.0 + 1e-6, 0.0, "fail"),
])
def test_cache_cold_allows_the_expected_hit_rate(hits: float, expected: float, status: str) -> None:
    got = checks.cache_cold(step(), CacheState(True, 100.0, hits), 0.01, expected)
    assert got.status == status, got.detail
    assert got.threshold == pytest.approx(expected + 0.01)
    if expected:
        assert "50.00% expected from the workload's shared prefixes" in got.detail


def test_cache_cold_still_needs_a_confirmed_reset() -> None:
    got = checks.cache_cold(step(), CacheState(False, 100.0, 10.0), 0.01, 0.5)
    assert got.status == "fail" and "reset refused" in got.detail


def test_judge_passes_expectations_to_the_checks() -> None:
    records = closed_loop()  # 8 measured requests of 8 tokens, indexes 0-7
    base = judge(step(), records, side(records), thresholds=Checks(), client_ceiling_chunks_per_s=None)
    assert {c.name: c.status for c in base.checks}["output_exact"] == "pass"
    wrong = Expectation(output_tokens=(8,) * 7 + (9,))
    got = judge(step(), records, side(records), thresholds=Checks(), client_ceiling_chunks_per_s=None, expected=wrong)
    assert {c.name: c.status for c in got.checks}["output_exact"] == "fail"
    warm = side(records, cache=CacheState(True, 100.0, 40.0))
    cold = judge(step(), records, warm, thresholds=Checks(), client_ceiling_chunks_per_s=None)
    assert {c.name: c.status for c in cold.checks}["cache_cold"] == "fail"
    shared = judge(step(), records, warm, thresholds=Checks(), client_ceiling_chunks_per_s=None,
                   expected=Expectation(hit_rate=0.4))
    assert {c.name: c.status for c in shared.checks}["cache_cold"] == "pass"


def test_point_expectation_from_the_step() -> None:
    got = point_expectation(SHAPED.model_copy(update={"requests": 50}))
    assert len(got.output_tokens) == 50 and set(got.output_tokens) <= set(range(2, 10)) and got.hit_rate == 0.0
    fewshot = step(prefix_len=32, input_len=40, requests=10,
                   shape=Shape(input=40, output=4, templates=2, block_tokens=16))
    # 8 of 10 requests hit their template's 2 blocks: 8 x 32 / (10 x 40)
    assert point_expectation(fewshot).hit_rate == pytest.approx(256 / 400)
    classic = point_expectation(step(requests=4))
    assert classic.output_tokens == (8, 8, 8, 8) and classic.hit_rate == 0.0


MULTI = step(requests=16, shape=Shape(input=16, output=8, turns=4, think_s=0.5))  # 4 conversations at c4


def test_too_few_waves_counts_multi_turn_requests_in_conversations() -> None:
    fail = checks.steady_state(MULTI, PointSummary(steady_requests=0))
    assert fail is not None and fail.status == "fail"
    assert "Fix: give at least 48 requests (3 waves: 12 conversations of 4 turns)" in fail.detail
    assert "load.search.waves" not in fail.detail
    little = checks.littles_law(MULTI, PointSummary(), 0.03)
    assert little is not None and "Fix: at least 48 requests (3 waves: 12 conversations of 4 turns)" in little.detail
    ok = checks.steady_state(MULTI, PointSummary(steady_requests=4))
    assert ok is not None and ok.status == "pass" and "Fix" not in ok.detail
    single = checks.steady_state(step(), PointSummary(steady_requests=0))
    assert single is not None and "Fix: give at least 12 requests (3 waves), or set load.burst" in single.detail


def test_a_search_probe_with_too_few_waves_names_search_waves() -> None:
    probe = MULTI.model_copy(update={"id": "s/a/w/search/c4/r1"})
    fail = checks.steady_state(probe, PointSummary(steady_requests=1))
    assert fail is not None and "48 requests (3 waves: 12 conversations of 4 turns), or set load.search.waves = 3, " \
        "or set load.burst = true" in fail.detail
    little = checks.littles_law(probe, PointSummary(), 0.03)
    assert little is not None and "or set load.search.waves = 3, then re-run the point" in little.detail
