"""Per-request SLOs as `vllm bench serve --goodput` judges them, goodput and SLO attainment on hand-made records."""

from __future__ import annotations

import pytest

from compiler.slo import Slo
from runner.checks.stats import meets_slo, summarize
from runner.store.records import RequestRecord


def req(sent: float, first: float | None, end: float, tokens: int = 5, ok: bool = True,
        times: tuple[float, ...] | None = None, warmup: bool = False) -> RequestRecord:
    if times is None and first is not None:
        times = tuple(first + k * (end - first) / max(tokens - 1, 1) for k in range(tokens))
    return RequestRecord(index=0, warmup=warmup, scheduled_s=sent, sent_s=sent, first_token_s=first, end_s=end,
                         token_times_s=times or (), prompt_tokens=8, output_tokens=tokens, chunks=len(times or ()),
                         ok=ok, error=None if ok else "boom", status=200 if ok else 500)


def test_ttft_at_the_limit_meets_it_and_just_over_does_not() -> None:
    slo = Slo(ttft_ms=100)
    assert meets_slo(req(0.0, 0.1, 1.0), slo)
    assert not meets_slo(req(0.0, 0.1001, 1.0), slo)


def test_tpot_is_end_minus_first_over_tokens_minus_one() -> None:
    # (1.0 - 0.2) / (5 - 1) = 0.2 s per token
    assert meets_slo(req(0.0, 0.2, 1.0, tokens=5), Slo(tpot_ms=200))
    assert not meets_slo(req(0.0, 0.2, 1.0, tokens=5), Slo(tpot_ms=199.9))
    # one token: TPOT is 0, as the bench counts it
    assert meets_slo(req(0.0, 0.2, 1.0, tokens=1), Slo(tpot_ms=0.001))


def test_e2el_is_from_the_send() -> None:
    assert meets_slo(req(1.0, 1.1, 3.0), Slo(e2el_ms=2000))
    assert not meets_slo(req(1.0, 1.1, 3.0001), Slo(e2el_ms=2000))


def test_itl_is_every_gap_of_the_request() -> None:
    even = req(0.0, 0.1, 0.5, times=(0.1, 0.2, 0.3, 0.4, 0.5))
    assert meets_slo(even, Slo(itl_ms=100.0001))
    one_long = req(0.0, 0.1, 0.6, times=(0.1, 0.2, 0.3, 0.4, 0.6))
    assert not meets_slo(one_long, Slo(itl_ms=150)) and meets_slo(one_long, Slo(itl_ms=200.0001))
    assert meets_slo(req(0.0, 0.1, 0.1, tokens=1, times=(0.1,)), Slo(itl_ms=1))  # no gap: nothing to break


def test_every_objective_must_hold() -> None:
    slo = Slo(ttft_ms=100, e2el_ms=1000)
    assert meets_slo(req(0.0, 0.05, 0.9), slo)
    assert not meets_slo(req(0.0, 0.05, 1.1), slo)
    assert not meets_slo(req(0.0, 0.15, 0.9), slo)


def test_a_failed_request_meets_nothing_and_no_slo_means_completed() -> None:
    assert not meets_slo(req(0.0, 0.05, 0.9, ok=False), Slo(e2el_ms=10_000))
    assert not meets_slo(req(0.0, 0.05, 0.9, ok=False), None)
    assert meets_slo(req(0.0, 5.0, 9.0), None)
    assert not meets_slo(req(0.0, None, 0.9), Slo(e2el_ms=10_000))  # completed without a token: fail closed


def open_loop() -> list[RequestRecord]:
    """Five measured requests over [0, 6] s: TTFTs 0.1, 0.2, 0.3, 0.1 s and one failed; a warmup one outside."""
    return [req(-5.0, -4.9, -4.0, warmup=True), req(0.0, 0.1, 1.0), req(1.0, 1.2, 2.0), req(2.0, 2.3, 4.0),
            req(3.0, None, 3.5, ok=False), req(4.0, 4.1, 6.0)]


def test_goodput_and_attainment_over_the_window() -> None:
    s = summarize(open_loop(), None, slo=Slo(ttft_ms=200))
    assert s.window_s == pytest.approx(6.0)
    assert s.request_throughput == pytest.approx(4 / 6)
    assert s.goodput == pytest.approx(3 / 6)
    assert s.slo_attainment == pytest.approx(3 / 5)  # 3 of 5 measured (the failed one counts, the warmup not)


def test_without_an_slo_goodput_is_every_completed_request() -> None:
    s = summarize(open_loop(), None)
    assert s.goodput == s.request_throughput == pytest.approx(4 / 6) and s.slo_attainment is None


def test_attainment_of_all_and_none() -> None:
    assert summarize(open_loop()[:4], None, slo=Slo(ttft_ms=300)).slo_attainment == 1.0
    assert summarize(open_loop()[:4], None, slo=Slo(ttft_ms=50)).slo_attainment == 0.0


def test_closed_loop_goodput_is_over_the_steady_phase() -> None:
    # two slots, three waves of 1 s: the steady phase runs from the 2nd send (t=0) to the last (t=2)
    rows = [req(t, t + 0.1 + 0.3 * (t == 1.0), t + 1.0) for t in (0.0, 1.0, 2.0) for _ in range(2)]
    s = summarize(rows, 2, slo=Slo(ttft_ms=200))
    assert s.window_s == pytest.approx(2.0) and s.request_throughput == pytest.approx(4 / 2)  # ends at 1 and 2
    assert s.goodput == pytest.approx(2 / 2)  # the two ending at 2 s missed their TTFT
    assert s.slo_attainment == pytest.approx(4 / 6)
