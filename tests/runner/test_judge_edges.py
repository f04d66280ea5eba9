"""The judge at its edges: bursts summarized over the whole window, half a pair of edge scrapes,
the server's step feeding the fidelity check, all ITL percentiles withheld, the warm-up halves
taken from the steady requests only, the open-loop allowance, a request without usage."""

from __future__ import annotations

import dataclasses

import pytest

from compiler.study import Checks
from runner.checks.cache import CacheState
from runner.checks.judge import Judgement, ServerSide, judge
from runner.checks.stats import GpuStats, halves_gap, open_loop_allowance
from runner.store.records import CheckResult, PointRecord, PointSummary, RequestRecord
from tests.runner.counters import edges
from tests.runner.steps import step


def rec(i: int, sent: float, end: float, *, out: int = 8, first: float = 0.1) -> RequestRecord:
    times = tuple(sent + first + k * (end - sent - first) / max(out - 1, 1) for k in range(out))
    return RequestRecord(i, False, sent, sent, sent + first, end, times, 16, out, out, True, None, 200)


def waves(concurrency: int, n: int, slow_last: bool = False) -> list[RequestRecord]:
    """`n` lockstep waves of 1 s requests; with `slow_last`, the last wave's first token comes late
    (its time per output token is smaller) so the halves of all requests differ from the steady ones."""
    return [rec(w * concurrency + s, float(w), w + 1.0, first=0.5 if slow_last and w == n - 1 else 0.1)
            for w in range(n) for s in range(concurrency)]


def verdict_of(point_step: object, records: list[RequestRecord], server: ServerSide | None = None,
               **thresholds: float) -> Judgement:
    if server is None:
        before, after = edges(records)
        server = ServerSide(cache=CacheState(True, 100.0, 0.0), before=before, after=after)
    return judge(point_step, records, server, thresholds=Checks(**thresholds),  # type: ignore[arg-type]
                 client_ceiling_chunks_per_s=None)


def check(j: Judgement, name: str) -> CheckResult:
    return next(c for c in j.checks if c.name == name)


def test_stored_server_side_keeps_every_gpu_statistic() -> None:
    summary = PointSummary(power_mean_w=1.0, sm_clock_mean_mhz=2.0, mem_clock_mean_mhz=3.0, temp_max_c=4.0,
                           energy_j=5.0, prefix_queries=6.0, prefix_hits=7.0, preemptions=8.0,
                           kv_cache_usage_peak=0.9)
    side = ServerSide.stored(PointRecord("r", "p", reset_ok=True, summary=summary))
    assert side.gpu == GpuStats(power_mean_w=1.0, sm_clock_mean_mhz=2.0, mem_clock_mean_mhz=3.0, temp_max_c=4.0,
                                energy_j=5.0)
    assert side.cache == CacheState(True, 6.0, 7.0)
    assert (side.preemptions, side.kv_cache_usage_peak, side.before, side.after) == (8.0, 0.9, None, None)


def test_a_burst_is_summarized_over_the_whole_window() -> None:
    records = waves(2, 3)
    burst = verdict_of(step(concurrency=2, requests=6, burst=True), records)
    assert burst.summary.window_s == pytest.approx(3.0)  # first send to last end
    assert burst.summary.steady_requests is None and burst.summary.little_lambda_w is None
    closed = verdict_of(step(concurrency=2, requests=6), records)
    assert closed.summary.window_s == pytest.approx(2.0)  # the steady phase: second send to last send


def test_half_a_pair_of_edge_scrapes_cannot_reconcile() -> None:
    records = waves(2, 3)
    before, _ = edges(records)
    j = verdict_of(step(concurrency=2, requests=6), records,
                   ServerSide(cache=CacheState(True, 100.0, 0.0), before=before, after=None))
    assert check(j, "reconciliation").status == "unverified" and j.reason == "unverified: reconciliation"
    assert j.summary.server_in_flight is None


def test_the_server_step_feeds_the_fidelity_check() -> None:
    records = waves(2, 3)
    with_counters = verdict_of(step(concurrency=2, requests=6), records)
    assert "(server inter-token histogram)" in check(with_counters, "itl_trusted").detail
    without = verdict_of(step(concurrency=2, requests=6), records, ServerSide(cache=CacheState(True, 100.0, 0.0)))
    assert "(client TPOT median)" in check(without, "itl_trusted").detail


def test_bunched_gaps_withhold_every_itl_percentile() -> None:
    def bunch(r: RequestRecord) -> RequestRecord:
        t = r.token_times_s
        return dataclasses.replace(r, token_times_s=tuple(t[i - i % 4 + 3] if i % 4 < 3 else t[i]
                                                          for i in range(len(t))))
    records = [bunch(r) for r in waves(2, 3)]
    s = verdict_of(step(concurrency=2, requests=6), records).summary
    assert (s.itl_p50_s, s.itl_p90_s, s.itl_p95_s, s.itl_p99_s) == (None, None, None, None)
    assert s.itl_mean_s is not None and s.tpot_p99_s is not None


def test_warmup_halves_come_from_the_steady_requests() -> None:
    records = waves(2, 3, slow_last=True)  # the last wave runs past the last send: not steady
    j = verdict_of(step(concurrency=2, requests=6), records)
    steady = [r for r in records if r.sent_s >= 0.0 and r.end_s <= 2.0]
    assert check(j, "warmup_sufficient").value == pytest.approx(halves_gap(steady)) == 0.0
    assert halves_gap(records) != pytest.approx(0.0)  # all requests would give another answer


def test_open_loop_gets_the_span_allowance() -> None:
    records = [rec(i, 0.5 * i, 0.5 * i + 1.0) for i in range(6)]
    j = verdict_of(step(concurrency=None, rate_rps=2.0, requests=6), records, littles_law_tolerance=0.1)
    allowance = open_loop_allowance(records)
    assert allowance is not None and allowance > 0
    assert check(j, "littles_law").threshold == pytest.approx(0.1 + allowance)
    closed = verdict_of(step(concurrency=2, requests=6), waves(2, 3), littles_law_tolerance=0.1)
    assert check(closed, "littles_law").threshold == 0.1


def test_a_request_that_streamed_without_usage_is_unverified() -> None:
    records = waves(2, 3)
    records[-1] = dataclasses.replace(records[-1], output_tokens=0)  # chunks arrived, no usage event
    j = verdict_of(step(concurrency=2, requests=6), records)
    assert check(j, "output_exact").status == "unverified"


def test_goodput_and_attainment_are_read_by_the_study_slo() -> None:
    """Every request's first token comes 0.1 s after its send: a 50 ms TTFT objective meets none of them,
    a 500 ms one all; without an objective there is no attainment to read."""
    from compiler.slo import Slo

    records = waves(2, 4)
    before, after = edges(records)
    server = ServerSide(cache=CacheState(True, 100.0, 0.0), before=before, after=after)
    point = step(concurrency=2, requests=8, warmup=0)
    strict = judge(point, records, server, thresholds=Checks(), client_ceiling_chunks_per_s=None,
                   slo=Slo(ttft_ms=50.0))
    loose = judge(point, records, server, thresholds=Checks(), client_ceiling_chunks_per_s=None,
                  slo=Slo(ttft_ms=500.0))
    none = judge(point, records, server, thresholds=Checks(), client_ceiling_chunks_per_s=None)
    assert strict.summary.slo_attainment == 0.0 and loose.summary.slo_attainment == 1.0
    assert none.summary.slo_attainment is None


def test_the_client_stall_is_stored_with_the_point() -> None:
    records = waves(2, 4)
    before, after = edges(records)
    server = ServerSide(cache=CacheState(True, 100.0, 0.0), before=before, after=after)
    j = judge(step(concurrency=2, requests=8, warmup=0), records, server, thresholds=Checks(),
              client_ceiling_chunks_per_s=None, client_stall_s=0.25)
    assert j.summary.client_stall_max_s == 0.25


def test_prefix_caching_is_on_unless_the_engine_turns_it_off() -> None:
    """No lookups in the window: with prefix caching on (the default) the cold cache cannot be verified;
    with it off (--no-enable-prefix-caching) no lookups and no hits are what verifies it."""
    records = waves(2, 4)
    before, after = edges(records)
    server = ServerSide(cache=CacheState(True, 0.0, 0.0), before=before, after=after)
    point = step(concurrency=2, requests=8, warmup=0)
    on = judge(point, records, server, thresholds=Checks(), client_ceiling_chunks_per_s=None)
    off = judge(point, records, server, thresholds=Checks(), client_ceiling_chunks_per_s=None, prefix_caching=False)
    assert not check(on, "cache_cold").passed and "cannot verify" in check(on, "cache_cold").detail
    assert check(off, "cache_cold").passed


@pytest.mark.parametrize(("index", "asked"), [(-1, None), (0, 5), (1, 6), (2, 7), (3, None)])
def test_a_request_is_held_to_its_own_max_tokens_by_index(index: int, asked: int | None) -> None:
    from runner.checks.checks import Expectation
    from runner.checks.judge import _asked

    assert _asked(Expectation(output_tokens=(5, 6, 7)), index) == asked
    assert _asked(None, index) is None
