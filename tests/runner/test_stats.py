"""Point statistics from scripted request records and telemetry samples (pure arithmetic, no server)."""

from __future__ import annotations

import math

import pytest

from runner.checks.stats import (
    distribution,
    gpu_stats,
    halves_gap,
    in_flight_integral,
    mean,
    occupancy,
    open_loop_allowance,
    peak,
    percentile,
    steady_phase,
    steady_requests,
    summarize,
    window,
)
from runner.store.records import RequestRecord, TelemetrySample


def rec(sent_s: float, end_s: float, warmup: bool = False, ok: bool = True, scheduled_s: float = math.nan,
        first_token_s: float | None = math.nan, output_tokens: int = 10, prompt_tokens: int = 5, chunks: int = 10,
        token_times_s: tuple[float, ...] = ()) -> RequestRecord:
    """A request record; scheduled_s nan: the send time; first_token_s nan: a tenth of the way from send to end."""
    if math.isnan(scheduled_s):
        scheduled_s = sent_s
    if first_token_s is not None and math.isnan(first_token_s):
        first_token_s = sent_s + 0.1 * (end_s - sent_s)
    return RequestRecord(index=0, warmup=warmup, scheduled_s=scheduled_s, sent_s=sent_s, first_token_s=first_token_s,
                         end_s=end_s, token_times_s=token_times_s, prompt_tokens=prompt_tokens,
                         output_tokens=output_tokens, chunks=chunks, ok=ok, error=None, status=200)


def timed(sent: float, end: float, tokens: int = 10, **kw: object) -> RequestRecord:
    """A request whose tokens arrive evenly from a tenth of the way in to its end."""
    first = sent + 0.1 * (end - sent)
    times = tuple(first + k * (end - first) / (tokens - 1) for k in range(tokens))
    return rec(sent, end, output_tokens=tokens, chunks=tokens, token_times_s=times, **kw)  # type: ignore[arg-type]


def closed_loop(concurrency: int, waves: int, duration: float = 1.0, ramp: float = 0.0,
                idle: float = 0.0) -> list[RequestRecord]:
    """Fixed-length requests in lockstep waves; the first wave is sent over `ramp` seconds; a slot
    waits `idle` seconds between a completion and its next send."""
    out = []
    for slot in range(concurrency):
        t = slot * ramp / concurrency
        for _ in range(waves):
            out.append(timed(t, t + duration))
            t += duration + idle
    return out


def test_percentile_matches_numpy_linear() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([], 50) is None


def test_steady_phase_is_c_th_send_to_last_send() -> None:
    recs = closed_loop(4, 4, ramp=0.04)
    phase = steady_phase(recs, 4)
    assert phase is not None and (phase.start_s, phase.end_s) == (pytest.approx(0.03), pytest.approx(3.03))
    inside = steady_requests(recs, phase)
    # the ramp's first three requests and the last (drain) wave are left out
    assert len(inside) == 1 + 4 + 4
    assert steady_phase(closed_loop(4, 1), 4) is None  # one wave: no send after the ramp


def test_littles_law_against_the_configured_concurrency() -> None:
    s = summarize(closed_loop(4, 4), 4)
    assert s.littles_law_error == pytest.approx(0.0, abs=1e-9) and s.little_lambda_w == pytest.approx(4.0)
    assert s.mean_in_flight == pytest.approx(4.0) and s.steady_requests == 12
    assert s.window_s == pytest.approx(3.0)
    assert s.output_throughput == pytest.approx(4 * 10 / 1.0, rel=0.05)  # tokens inside the phase only
    # A client that idles 0.25 s before refilling a slot holds fewer than 4 in flight: lambda*W = 4 * 1/1.25.
    idle = summarize(closed_loop(4, 4, idle=0.25), 4)
    assert idle.littles_law_error == pytest.approx(0.2, rel=0.01)


def test_single_wave_has_no_steady_requests_and_a_burst_no_littles_law() -> None:
    one = summarize(closed_loop(8, 1), 8)
    assert one.steady_requests == 0 and one.littles_law_error is None
    assert one.output_throughput == pytest.approx(80.0)  # whole window, still reported
    burst = summarize(closed_loop(8, 1), 8, burst=True)
    assert burst.steady_requests is None and burst.littles_law_error is None


def test_open_loop_compares_completions_with_the_offered_rate() -> None:
    # 21 requests scheduled every 0.5 s, each 0.2 s long: the server keeps up.
    kept = [timed(0.5 * i, 0.5 * i + 0.2) for i in range(21)]
    s = summarize(kept, None)
    assert s.littles_law_error == pytest.approx(0.0, abs=1e-9)
    assert open_loop_allowance(kept) == pytest.approx(2 * 0.2 / 10.0)
    # Requests take 0.05 s longer each: a queue grows, completions fall behind the offered rate.
    behind = [timed(0.5 * i, 0.5 * i + 0.2 + 0.05 * i) for i in range(21)]
    assert summarize(behind, None).littles_law_error == pytest.approx(1 - 10 / 11, rel=0.01)


def test_open_loop_latency_from_the_schedule_and_the_lag() -> None:
    late = [rec(0.5 * i + 0.1, 0.5 * i + 0.3, scheduled_s=0.5 * i) for i in range(5)]
    s = summarize(late, None)
    assert s.e2e_mean_s == pytest.approx(0.2) and s.e2e_sched_mean_s == pytest.approx(0.3)
    assert s.client_lag_mean_s == pytest.approx(0.1) and s.client_lag_max_s == pytest.approx(0.1)
    assert s.ttft_sched_p50_s == pytest.approx(0.1 + 0.02)


def test_server_occupancy_over_the_whole_window() -> None:
    recs = closed_loop(2, 2)
    assert occupancy(3.8, recs) == pytest.approx(1.9)
    assert occupancy(None, recs) is None
    assert summarize(recs, 2).client_in_flight == pytest.approx(2.0)


def test_warmup_records_are_excluded() -> None:
    recs = closed_loop(2, 2) + [rec(-5.0, -4.0, warmup=True)]
    s = summarize(recs, 2, burst=True)
    assert s.requests_ok == 4
    assert s.window_s == pytest.approx(2.0)


def test_halves_gap_sees_a_slow_start() -> None:
    slow = [rec(i, i + (2.0 if i < 2 else 1.0), output_tokens=11) for i in range(4)]
    assert halves_gap(slow) > 0.4
    steady = [rec(i, i + 1.0, output_tokens=11) for i in range(4)]
    assert halves_gap(steady) == pytest.approx(0.0, abs=1e-9)
    # A first half that is faster than the second is no sign of a missing warmup.
    slow_end = [rec(i, i + (1.0 if i < 2 else 2.0), output_tokens=11) for i in range(4)]
    assert halves_gap(slow_end) < 0


def test_percentile_of_one_value_and_the_ends() -> None:
    assert percentile([7.0], 99) == 7.0
    assert percentile([7.0], 0) == 7.0
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0
    assert percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert percentile([0.0, 10.0], 25) == pytest.approx(2.5)


def test_mean_and_distribution_of_nothing_are_none() -> None:
    assert mean([]) is None
    assert mean([1.0, 2.0, 6.0]) == 3.0
    assert distribution([]) == (None, None, None, None, None)
    assert distribution([2.0]) == (2.0, 2.0, 2.0, 2.0, 2.0)


def test_in_flight_integral_clips_to_the_window() -> None:
    assert in_flight_integral([(0.0, 2.0), (1.0, 3.0)], 1.0, 2.0) == pytest.approx(2.0)
    assert in_flight_integral([(0.0, 1.0)], 1.0, 2.0) == 0.0  # touching the edge adds nothing
    assert in_flight_integral([(5.0, 4.0)], 0.0, 10.0) == 0.0  # an empty span adds nothing
    assert in_flight_integral([], 0.0, 1.0) == 0.0


def test_window_is_first_measured_send_to_last_measured_end() -> None:
    recs = [rec(-3.0, 9.0, warmup=True), rec(1.0, 2.0), rec(0.5, 4.0)]
    w = window(recs)
    assert w is not None and (w.start_s, w.end_s) == (0.5, 4.0)
    assert w.duration_s == pytest.approx(3.5)
    assert window([rec(0.0, 1.0, warmup=True)]) is None


def test_summary_of_no_measured_request_has_counts_only() -> None:
    s = summarize([rec(0.0, 1.0, warmup=True)], 1)
    assert (s.requests_ok, s.requests_failed, s.window_s, s.output_throughput) == (0, 0, None, None)
    assert s.littles_law_error is None and s.steady_requests is None


def test_summary_counts_failed_requests_apart() -> None:
    recs = [rec(0.0, 1.0), rec(0.0, 1.0, ok=False), rec(0.0, 1.0, output_tokens=4, prompt_tokens=3, chunks=2)]
    s = summarize(recs, None)
    assert (s.requests_ok, s.requests_failed) == (2, 1)
    assert (s.input_tokens, s.output_tokens, s.chunks) == (8, 14, 12)
    assert s.output_throughput == pytest.approx(14.0)
    assert s.total_throughput == pytest.approx(22.0)
    assert s.request_throughput == pytest.approx(2.0) and s.goodput == pytest.approx(2.0)
    assert s.chunk_throughput == pytest.approx(12.0)
    assert s.steady_requests is None  # open loop: no steady phase sought


def test_summary_latencies() -> None:
    recs = [rec(0.0, 1.0, first_token_s=0.2, output_tokens=5, token_times_s=(0.2, 0.4, 0.7)),
            rec(1.0, 3.0, first_token_s=1.5, output_tokens=1)]
    s = summarize(recs, None)
    assert s.ttft_mean_s == pytest.approx(0.35) and s.ttft_p50_s == pytest.approx(0.35)
    assert s.e2e_p99_s == pytest.approx(1.99)
    assert s.tpot_mean_s == pytest.approx(0.2)  # the one-token request has no TPOT
    assert s.itl_mean_s == pytest.approx(0.25) and s.itl_p90_s == pytest.approx(0.29)


def test_halves_gap_needs_two_requests_with_tokens() -> None:
    assert halves_gap([rec(0.0, 1.0, output_tokens=11)]) is None
    assert halves_gap([rec(0.0, 1.0, output_tokens=1), rec(1.0, 2.0, output_tokens=1)]) is None
    assert halves_gap([rec(0.0, 1.0, output_tokens=11, ok=False), rec(1.0, 2.0, output_tokens=11)]) is None
    # Sorted by send time, not by list order.
    recs = [rec(1.0, 2.0, output_tokens=11), rec(0.0, 2.0, output_tokens=11)]
    assert halves_gap(recs) == pytest.approx(1.0)


def test_gpu_stats_from_nvml_samples_only() -> None:
    samples = [
        TelemetrySample("p", "nvml", 0.0, sm_clock_mhz=1000.0, mem_clock_mhz=3000.0, power_w=100.0, temp_c=40.0,
                        energy_j=10.0),
        TelemetrySample("p", "nvml", 0.1, sm_clock_mhz=2000.0, power_w=300.0, temp_c=50.0, energy_j=40.0),
        TelemetrySample("p", "metrics", 0.1, kv_cache_usage=0.5, power_w=999.0),
    ]
    g = gpu_stats(samples)
    assert (g.power_mean_w, g.sm_clock_mean_mhz, g.mem_clock_mean_mhz, g.temp_max_c) == (200.0, 1500.0, 3000.0, 50.0)
    assert g.energy_j == 30.0
    assert g.energy_per_token_j(10) == 3.0
    assert g.energy_per_token_j(0) is None
    one = gpu_stats(samples[:1])
    assert one.energy_j is None and one.energy_per_token_j(10) is None
    assert gpu_stats([]).power_mean_w is None


def test_peak_of_one_source() -> None:
    samples = [TelemetrySample("p", "metrics", 0.0, kv_cache_usage=0.2),
               TelemetrySample("p", "metrics", 0.1, kv_cache_usage=None),
               TelemetrySample("p", "metrics", 0.2, kv_cache_usage=0.7),
               TelemetrySample("p", "nvml", 0.2, kv_cache_usage=0.9)]
    assert peak(samples, "kv_cache_usage") == 0.7
    assert peak(samples[1:2], "kv_cache_usage") is None
