"""Closed-loop statistics of multi-turn load from scripted records: a slot holds a conversation, so the
steady phase runs from the C-th first turn, and Little's Law counts think time as occupied, but not
a client that idles past a turn's due time, nor the slot of a conversation that a failed turn ended."""

from __future__ import annotations

from dataclasses import replace

import pytest

from runner.checks.stats import steady_phase, summarize, thinking
from runner.store.records import RequestRecord


def turn(conv: int, k: int, sent: float, end: float, scheduled: float | None = None, ok: bool = True) -> RequestRecord:
    first = sent + 0.1 * (end - sent)
    times = tuple(first + j * (end - first) / 9 for j in range(10))
    return RequestRecord(index=0, warmup=False, scheduled_s=sent if scheduled is None else scheduled, sent_s=sent,
                         first_token_s=first, end_s=end, token_times_s=times, prompt_tokens=5, output_tokens=10,
                         chunks=10, ok=ok, error=None if ok else "HTTP 500", status=200 if ok else 500,
                         conversation=conv, turn=k)


def slots(c: int, convs: int, turns: int, request_s: float, think_s: float, lag_s: float = 0.0) -> list[RequestRecord]:
    """`c` slots, each running `convs` conversations of `turns` turns back to back; turn k > 0 is due
    `think_s` after turn k - 1 ended and sent `lag_s` after it is due; slot s starts at s * 0.1."""
    out = []
    n = 0
    for s in range(c):
        t = 0.1 * s
        for _ in range(convs):
            for k in range(turns):
                due = t
                if k:
                    due = t + think_s
                    t = due + lag_s
                out.append(turn(n, k, t, t + request_s, scheduled=due))
                t += request_s
            n += 1
    return out


def test_think_spans_run_from_a_turns_end_to_the_next_ones_due_time() -> None:
    recs = [turn(0, 0, 0.0, 1.0), turn(0, 1, 3.0, 4.0, scheduled=2.5), turn(1, 0, 0.0, 1.0)]
    assert thinking(recs) == [(1.0, 2.5)]
    assert thinking([turn(-1, 0, 0.0, 1.0), turn(-1, 0, 1.0, 2.0)]) == []  # single requests never think


def test_no_think_span_after_a_failed_turn_or_for_warmup() -> None:
    failed = [turn(0, 0, 0.0, 1.0, ok=False), turn(0, 1, 9.0, 9.0, scheduled=9.0, ok=False)]
    assert thinking(failed) == []
    warm = [replace(r, warmup=True) for r in (turn(0, 0, 0.0, 1.0), turn(0, 1, 2.0, 3.0, scheduled=2.0))]
    assert thinking(warm) == []


def test_the_steady_phase_runs_from_the_c_th_first_turn_to_the_last_first_turn() -> None:
    recs = slots(2, 4, 3, request_s=1.0, think_s=1.0)  # a conversation lasts 5 s
    phase = steady_phase(recs, 2)
    assert phase is not None and (phase.start_s, phase.end_s) == pytest.approx((0.1, 15.1))
    # Counting every send instead would start at the second send (0.1) and end at the last (19.1).
    assert steady_phase(recs[:3], 2) is None  # one conversation per slot or less: no steady phase


def test_littles_law_holds_with_think_time_and_fails_for_an_idle_client() -> None:
    held = summarize(slots(2, 5, 3, request_s=1.0, think_s=1.0), 2)
    assert held.littles_law_error == pytest.approx(0.0, abs=1e-9) and held.little_lambda_w == pytest.approx(2.0)
    # Requests in flight alone are 3 of every 5 seconds of a slot: what the check read before counting think time.
    assert held.mean_in_flight == pytest.approx(2 * 3 / 5, rel=0.02)
    # A client that sends each later turn 0.5 s past its due time holds its slots idle: 1 s of 6 per conversation.
    idle = summarize(slots(2, 5, 3, request_s=1.0, think_s=1.0, lag_s=0.5), 2)
    assert idle.littles_law_error == pytest.approx(1 / 6, rel=0.03)
    assert idle.client_lag_max_s == pytest.approx(0.5)


def test_single_turn_little_is_unchanged() -> None:
    recs = slots(2, 6, 1, request_s=1.0, think_s=5.0)  # one turn: the think time never applies
    s = summarize(recs, 2)
    assert s.littles_law_error == pytest.approx(0.0, abs=1e-9) and s.little_lambda_w == s.mean_in_flight
