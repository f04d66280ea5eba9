"""Point statistics at their edges: window boundaries (a token exactly at the phase start or end),
every distribution field against an independent computation, Little's Law with terms missing,
two-request open loops, equal timestamps, one-token requests."""

from __future__ import annotations

import math

import pytest

from runner.checks.stats import (
    GpuStats,
    distribution,
    gpu_stats,
    halves_gap,
    open_loop_allowance,
    open_loop_little,
    steady_phase,
    summarize,
)
from runner.store.records import RequestRecord, TelemetrySample


def rec(sent_s: float, end_s: float, first_token_s: float | None, token_times_s: tuple[float, ...] = (),
        output_tokens: int = 1, prompt_tokens: int = 1, chunks: int = 1, scheduled_s: float = math.nan,
        warmup: bool = False, ok: bool = True) -> RequestRecord:
    """A request record; scheduled_s nan: the send time."""
    return RequestRecord(index=0, warmup=warmup, scheduled_s=sent_s if math.isnan(scheduled_s) else scheduled_s,
                         sent_s=sent_s, first_token_s=first_token_s, end_s=end_s, token_times_s=token_times_s,
                         prompt_tokens=prompt_tokens, output_tokens=output_tokens, chunks=chunks, ok=ok,
                         error=None, status=200)


def pct(values: list[float], q: float) -> float:
    """numpy's linear percentile, written out again."""
    data = sorted(values)
    pos = (len(data) - 1) * q / 100
    lo = int(pos)
    frac = pos - lo
    return data[lo] if frac == 0 else data[lo] + (data[lo + 1] - data[lo]) * frac


def dist(values: list[float]) -> tuple[float, ...]:
    return (sum(values) / len(values), *(pct(values, q) for q in (50, 90, 95, 99)))


def test_distribution_is_mean_then_p50_p90_p95_p99() -> None:
    values = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert distribution(values) == pytest.approx(dist(values))
    assert distribution(values)[3] == pytest.approx(28.0)  # p95: 16 + 0.75 * 16, not p96
    assert distribution([3.0]) == (3.0, 3.0, 3.0, 3.0, 3.0)  # one value: every percentile is it


# ---- closed loop: the steady phase's boundaries --------------------------------------------------
# Concurrency 3, sends at -1, 0, 1, 4, 5: the steady phase runs from the third send (t=1) to the last (t=5).
CLOSED = [
    rec(-1.0, 1.0, 0.0, (0.0, 0.5, 1.0), output_tokens=3, prompt_tokens=5, chunks=3),  # ends at the start
    rec(0.0, 4.0, 1.0, (1.0, 2.0, 4.0), output_tokens=6, prompt_tokens=7, chunks=3),  # first token at the start
    rec(1.0, 5.0, 5.0, (5.0,), output_tokens=1, prompt_tokens=11, chunks=1),  # wholly inside, ends at the end
    rec(4.0, 8.0, 6.0, (6.0, 7.0, 8.0), output_tokens=3, prompt_tokens=13, chunks=3),
    rec(5.0, 9.0, 7.0, (7.0, 9.0), output_tokens=2, prompt_tokens=17, chunks=2),
]


def test_steady_phase_boundaries_are_counted_once() -> None:
    s = summarize(CLOSED, 3)
    assert s.window_s == 4.0
    # Tokens in [1, 5]: 1.0 of the first (a third of its 3 tokens), 1.0, 2.0, 4.0 of the second (3 of 3
    # chunks carrying 6 tokens), 5.0 of the third.
    assert s.output_throughput == (1 + 6 + 1) / 4
    assert s.chunk_throughput == 5 / 4
    # Completions in (1, 5]: the second and third; prompt tokens of first tokens in (1, 5]: the third.
    assert s.request_throughput == s.goodput == 2 / 4
    assert s.total_throughput == (8 + 11) / 4
    assert s.steady_requests == 1
    # lambda * W = 2 completions / 4 s * 4 s mean time = 2 against C = 3.
    assert s.little_lambda_w == 2.0
    assert s.littles_law_error == pytest.approx(1 / 3)
    assert s.mean_in_flight == (0 + 3 + 4 + 1 + 0) / 4
    assert s.client_in_flight == (2 + 4 + 4 + 4 + 4) / 10
    assert (s.requests_ok, s.input_tokens, s.output_tokens, s.chunks) == (5, 53, 15, 12)


def test_steady_phase_of_zero_length_is_none() -> None:
    recs = [rec(0.0, 1.0, 0.5), rec(1.0, 2.0, 1.5), rec(1.0, 2.0, 1.5)]  # last two sends at once
    assert steady_phase(recs, 2) is None
    phase = steady_phase([*recs, rec(1.5, 2.5, 2.0)], 2)
    assert phase is not None and (phase.start_s, phase.end_s) == (1.0, 1.5)


def test_closed_loop_little_is_the_time_average_in_flight() -> None:
    # C = 2, sends 0, 1, 3: the phase is [1, 3]. No request ran wholly inside it, yet lambda * W in
    # its finite-window form is measured: 1 + 2 + 0 request-seconds inside over 2 s.
    recs = [rec(0.0, 2.0, 1.0), rec(1.0, 4.0, 2.0), rec(3.0, 6.0, 4.0)]
    s = summarize(recs, 2)
    assert s.steady_requests == 0 and s.request_throughput == 1 / 2
    assert s.little_lambda_w == 1.5 and s.littles_law_error == pytest.approx(0.25)
    assert s.tpot_mean_s is None and s.e2e_p50_s is None  # no steady request, no latency
    burst = summarize(recs, 2, burst=True)
    assert burst.little_lambda_w is None and burst.littles_law_error is None and burst.steady_requests is None


# ---- open loop: every distribution field -----------------------------------------------------------
def open_loop() -> list[RequestRecord]:
    recs = []
    for i in range(11):
        sent = float(i)
        ttft = 0.05 * (i + 1) ** 2
        gaps = [0.01 * (i + 1), 0.02 * (i % 3 + 1), 0.005 * (i * i + 1)]
        times = [sent + ttft]
        for g in gaps:
            times.append(times[-1] + g)
        recs.append(rec(sent, times[-1] + 0.001 * i, sent + ttft, tuple(times), output_tokens=4 + i % 2,
                        prompt_tokens=10 + i, chunks=4, scheduled_s=sent - 0.003 * i * i))
    return recs


def test_open_loop_distributions_field_by_field() -> None:
    recs = open_loop()
    s = summarize(recs, None)
    ttft = [r.first_token_s - r.sent_s for r in recs]  # type: ignore[operator]
    e2e = [r.end_s - r.sent_s for r in recs]
    tpot = [(r.end_s - r.first_token_s) / (r.output_tokens - 1) for r in recs]  # type: ignore[operator]
    itl = [b - a for r in recs for a, b in zip(r.token_times_s, r.token_times_s[1:], strict=False)]
    ttft_sched = [r.first_token_s - r.scheduled_s for r in recs]  # type: ignore[operator]
    e2e_sched = [r.end_s - r.scheduled_s for r in recs]
    lag = [r.sent_s - r.scheduled_s for r in recs]
    got = {
        "ttft": (s.ttft_mean_s, s.ttft_p50_s, s.ttft_p90_s, s.ttft_p95_s, s.ttft_p99_s),
        "e2e": (s.e2e_mean_s, s.e2e_p50_s, s.e2e_p90_s, s.e2e_p95_s, s.e2e_p99_s),
        "tpot": (s.tpot_mean_s, s.tpot_p50_s, s.tpot_p90_s, s.tpot_p95_s, s.tpot_p99_s),
        "itl": (s.itl_mean_s, s.itl_p50_s, s.itl_p90_s, s.itl_p95_s, s.itl_p99_s),
    }
    want = {"ttft": dist(ttft), "e2e": dist(e2e), "tpot": dist(tpot), "itl": dist(itl)}
    for name in got:
        assert got[name] == pytest.approx(want[name], rel=1e-12), name
        assert len(set(want[name])) == 5, name  # the five numbers differ, so a swapped field shows
    d = dist(ttft_sched)
    assert (s.ttft_sched_mean_s, s.ttft_sched_p50_s, s.ttft_sched_p99_s) == pytest.approx((d[0], d[1], d[4]))
    d = dist(e2e_sched)
    assert (s.e2e_sched_mean_s, s.e2e_sched_p50_s, s.e2e_sched_p99_s) == pytest.approx((d[0], d[1], d[4]))
    assert s.client_lag_mean_s == pytest.approx(sum(lag) / len(lag))
    assert s.client_lag_p99_s == pytest.approx(pct(lag, 99)) and pct(lag, 99) < max(lag)
    assert s.client_lag_max_s == pytest.approx(max(lag))


def test_one_token_requests_have_no_tpot_and_two_token_ones_do() -> None:
    recs = [rec(0.0, 1.0, 0.5, (0.5,), output_tokens=1), rec(1.0, 2.0, 1.2, (1.2, 2.0), output_tokens=2)]
    s = summarize(recs, None)
    assert s.tpot_mean_s == pytest.approx(0.8) and s.tpot_p99_s == pytest.approx(0.8)
    assert s.itl_mean_s == pytest.approx(0.8)


# ---- Little's Law, open loop ----------------------------------------------------------------------
def test_open_loop_little_with_two_requests() -> None:
    recs = [rec(10.0, 11.0, 10.5), rec(12.0, 14.0, 12.5)]
    lam_w, expected = open_loop_little(recs, recs)
    w = (1.0 + 2.0) / 2
    assert lam_w == pytest.approx(1 / 3 * w)  # one completion interval of 3 s
    assert expected == pytest.approx(1 / 2 * w)  # one scheduled interval of 2 s, not 1 / (12 + 10)
    assert open_loop_little(recs, recs[:1]) == (None, None)


@pytest.mark.parametrize(("ends", "scheds"), [
    ([2.0, 2.0], [0.0, 1.0]),  # every completion at one instant: no completion rate
    ([2.0, 3.0], [1.0, 1.0]),  # every send scheduled at one instant: no offered rate
])  # fmt: skip
def test_open_loop_little_needs_a_spread(ends: list[float], scheds: list[float]) -> None:
    recs = [rec(s, e, None, scheduled_s=s) for e, s in zip(ends, scheds, strict=True)]
    assert open_loop_little(recs, recs) == (None, None)


def test_open_loop_little_uses_first_and_last_not_neighbours() -> None:
    # Ends 1, 1, 3 (two at once first) and schedules 0, 2, 2: rates over the whole spread.
    recs = [rec(0.0, 1.0, None), rec(0.5, 1.0, None, scheduled_s=2.0), rec(2.0, 3.0, None)]
    lam_w, expected = open_loop_little(recs, recs)
    w = ((1 - 0) + (1 - 2) + (3 - 2)) / 3
    assert lam_w == pytest.approx(2 / 2 * w) and expected == pytest.approx(2 / 2 * w)
    late = [rec(0.0, 1.0, None), rec(1.0, 3.0, None), rec(1.5, 3.0, None, scheduled_s=0.0)]
    lam_w, expected = open_loop_little(late, late)
    assert lam_w is not None and expected is not None  # ends 1, 3, 3 and schedules 0, 0, 1 still spread


# ---- open-loop allowance --------------------------------------------------------------------------
def test_open_loop_allowance_values_and_edges() -> None:
    recs = [rec(10.0, 11.0, None), rec(11.0, 13.0, None), rec(14.0, 24.0, None)]
    assert open_loop_allowance(recs) == pytest.approx(2 * 2.0 / 4.0)  # median W 2 over the 4 s schedule
    with_failure = [*recs, rec(15.0, 100.0, None, ok=False), rec(16.0, 200.0, None, ok=False)]
    assert open_loop_allowance(with_failure) == pytest.approx(2 * 2.0 / 6.0)  # failures stretch T, not W
    assert open_loop_allowance(recs[:2]) == pytest.approx(2 * 1.5 / 1.0)  # two requests are enough
    assert open_loop_allowance(recs[:1]) is None
    same = [rec(1.0, 2.0, None), rec(1.0, 3.0, None)]
    assert open_loop_allowance(same) is None
    assert open_loop_allowance([rec(1.0, 2.0, None), rec(1.0, 3.0, None), rec(2.0, 3.0, None)]) == \
        pytest.approx(2 * 1.0 / 1.0)
    assert open_loop_allowance([rec(0.0, 2.0, None), rec(1.0, 3.0, None), rec(1.0, 3.0, None)]) == \
        pytest.approx(2 * 2.0 / 1.0)


# ---- warm-up halves, GPU stats ---------------------------------------------------------------------
def test_halves_gap_value_with_two_token_requests() -> None:
    recs = [rec(0.0, 1.0, 0.0, output_tokens=2), rec(1.0, 1.5, 1.0, output_tokens=2),
            rec(2.0, 5.0, 2.0, output_tokens=4), rec(3.0, 3.5, 3.0, output_tokens=1)]
    # TPOTs 1.0, 0.5, 1.0 (the one-token request has none): halves [1.0] and [0.5, 1.0].
    assert halves_gap(recs) == pytest.approx((1.0 - 0.75) / 0.75)


def test_halves_gap_with_a_zero_tpot_half_is_none() -> None:
    recs = [rec(0.0, 1.0, 1.0, output_tokens=5), rec(1.0, 2.0, 1.5, output_tokens=5)]
    assert halves_gap(recs) is None


def test_energy_per_token_and_energy_over_three_samples() -> None:
    assert GpuStats(energy_j=10.0).energy_per_token_j(1) == 10.0
    assert GpuStats(energy_j=10.0).energy_per_token_j(0) is None
    samples = [TelemetrySample("p", "nvml", float(t), energy_j=e) for t, e in ((0, 10.0), (1, 20.0), (2, 50.0))]
    assert gpu_stats(samples).energy_j == 40.0


def test_no_measured_request_leaves_rates_none() -> None:
    s = summarize([rec(0.0, 1.0, 0.5, warmup=True)], None)
    assert s.window_s is None and s.output_throughput is None and s.requests_ok == 0
    assert math.isclose(summarize([rec(0.0, 2.0, 1.0)], None).window_s or 0, 2.0)


def test_a_request_without_token_times_adds_no_tokens_to_the_phase() -> None:
    # An empty completion (no chunk arrived) inside the steady phase: no tokens, not one.
    recs = [*CLOSED[:2], rec(1.0, 5.0, None, (), output_tokens=0, prompt_tokens=11, chunks=0), *CLOSED[3:]]
    s = summarize(recs, 3)
    assert s.output_throughput == (1 + 6) / 4 and s.chunk_throughput == 4 / 4
