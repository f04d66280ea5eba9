"""Reconciliation edges: each item's whole content (status, both values, bound, the detail a user
reads) in every branch, the bounds' exact edges (TTFT/e2e floor, first-token-to-end 20 ms + 1%,
decode 20 ms + 5%), counts per finish reason, counters hidden from one or both scrapes, empty and
one-request windows. Pure: snapshots parsed from Prometheus text, records as plain dataclasses.

Times are multiples of powers of two, so sums and differences are exact and an edge is hit exactly.
The opening scrape holds earlier traffic (a server that ran before the window), so every count and
sum is a difference of two non-zero values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import pytest

from runner.checks.reconcile import (
    Item,
    LatencyBound,
    Reconciliation,
    finished_by_reason,
    reconcile,
    server_step_s,
)
from runner.measure import prometheus
from runner.measure.prometheus import Snapshot

LABELS = 'engine="0",model_name="m"'
SUCCESS = "vllm:request_success_total"
PROMPT = "vllm:prompt_tokens_total"
GEN = "vllm:generation_tokens_total"
E2E_SUM, E2E_COUNT = "vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count"
TTFT_SUM, TTFT_COUNT = "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count"
ITL_SUM, ITL_COUNT = "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count"

RERUN = "then re-run the point"
CLIENT_FIX = ("Fix: give the load generator its own cores (STUDYC_CLIENT_CPUS), run fewer jobs on the machine at "
              "once, then re-run the point")
OTHER_CLIENT_FIX = ("Fix: measure a server no other client uses, with nothing retrying between it and studyc, "
                    "then re-run the point")
FLOOR = "mean client-server excess >= -1 ms"
STREAM = "|client - server first-token-to-end span| <= 20 ms + 1%"
DECODE = "|client - server decode span| <= 20 ms + 5%"
FRONT = "; this is the front-end and transport delay before the engine saw the request"


def hidden(name: str) -> str:
    """The detail of an item whose counter the server does not export, word for word."""
    return (f"the server does not export {name}: cannot verify. Fix: a vLLM that exports it (0.26 or later), "
            "started without --disable-log-stats, with nothing filtering /metrics")


# ------------------------------------------------------------------------------ the fixture
@dataclass(frozen=True)
class Req:
    sent_s: float
    end_s: float
    first_token_s: float | None
    token_times_s: tuple[float, ...]
    prompt_tokens: int = 128
    output_tokens: int = 4
    ok: bool = True
    warmup: bool = False


# Per request, the client sees: TTFT 70.3125 ms, first to last chunk 46.875 ms, the end 7.8125 ms
# after the last chunk, so e2e 125 ms and first token to end 54.6875 ms.
C_TTFT, C_SPAN, C_TAIL = 0.0703125, 0.046875, 0.0078125
# The server's clock: TTFT 46.875 ms (23.4375 ms of front end before it), e2e 97.65625 ms
# (first token to end 50.78125 ms: 3.90625 ms shorter than the client's), inter-token sum 42.96875 ms.
S_TTFT, S_E2E, S_ITL = 0.046875, 0.09765625, 0.04296875


def req(t0: float, *, ttft: float = C_TTFT, span: float = C_SPAN, tail: float = C_TAIL, tokens: int = 4) -> Req:
    first = t0 + ttft
    times = tuple(first + span * k / (tokens - 1) for k in range(tokens)) if tokens > 1 else (first,)
    return Req(sent_s=t0, end_s=times[-1] + tail, first_token_s=first, token_times_s=times, output_tokens=tokens)


FOUR = [req(1.0), req(2.0), req(3.0), req(4.0)]

BEFORE = {PROMPT: 1000.0, GEN: 4000.0, E2E_SUM: 40.0, E2E_COUNT: 16.0, TTFT_SUM: 8.0, TTFT_COUNT: 16.0,
          ITL_SUM: 30.0, ITL_COUNT: 48.0}
BEFORE_REASONS = {"length": 10.0, "stop": 5.0, "abort": 1.0}


def server(n: int, *, ttft: float = S_TTFT, e2e: float = S_E2E, itl: float = S_ITL, tokens: int = 4,
           over: Mapping[str, float] | None = None) -> dict[str, float]:
    """What the server adds over a window of n requests of `tokens` tokens (per-request latencies)."""
    out = {PROMPT: 128.0 * n, GEN: float(tokens * n), E2E_SUM: e2e * n, E2E_COUNT: float(n), TTFT_SUM: ttft * n,
           TTFT_COUNT: float(n), ITL_SUM: itl * n, ITL_COUNT: float((tokens - 1) * n)}
    return {**out, **(over or {})}


def text(values: Mapping[str, float], reasons: Mapping[str, float] | None, drop: Iterable[str] = ()) -> str:
    lines = [f'{SUCCESS}{{{LABELS},finished_reason="{k}"}} {v!r}' for k, v in (reasons or {}).items()]
    lines += [f"{name}{{{LABELS}}} {v!r}" for name, v in values.items() if name not in set(drop)]
    return "\n".join(lines) + "\n"


def window(recs: Sequence[Req], added: Mapping[str, float], reasons: Mapping[str, float] | None = None, *,
           drop: Sequence[str] = (), drop_before: Sequence[str] = (), bound: LatencyBound | None = None,
           ) -> Reconciliation:
    """Reconcile `recs` against a server that added `added` (and `reasons`, default all `length`)
    between an opening scrape at t=0 s and a closing one at t=100 s. `drop`: names the server hides
    from both scrapes (SUCCESS hides the finish-reason counter), `drop_before`: from the first only."""
    reasons = {"length": float(sum(r.ok for r in recs if not r.warmup))} if reasons is None else reasons
    after = {k: BEFORE.get(k, 0.0) + added.get(k, 0.0) for k in BEFORE}
    after_reasons = {k: BEFORE_REASONS.get(k, 0.0) + reasons.get(k, 0.0) for k in {**BEFORE_REASONS, **reasons}}
    hide_success = SUCCESS in drop
    b = prometheus.parse(text(BEFORE, None if hide_success or SUCCESS in drop_before else BEFORE_REASONS,
                           [*drop, *drop_before]), t_s=0.0)
    a = prometheus.parse(text(after, None if hide_success else after_reasons, drop), t_s=100.0)
    return reconcile(b, a, recs, bound)


def names(result: Reconciliation) -> list[str]:
    return [i.name for i in result.items]


# ---------------------------------------------------------------------------- a clean window
def test_every_item_of_a_clean_window() -> None:
    result = window(FOUR, server(4))
    assert result.items == (
        Item("requests", "pass", 4.0, 4.0, "exact", "equal"),
        Item("prompt_tokens", "pass", 512.0, 512.0, "exact", "equal"),
        Item("generation_tokens", "pass", 16.0, 16.0, "exact", "equal"),
        Item("e2e_count", "pass", 4.0, 4.0, "exact", "equal"),
        Item("e2e", "pass", 0.5, 0.390625, FLOOR, "mean client-server excess 27.34 ms per request (at least -1 ms)"),
        Item("ttft_count", "pass", 4.0, 4.0, "exact", "equal"),
        Item("ttft", "pass", 0.28125, 0.1875, FLOOR,
             "mean client-server excess 23.44 ms per request (at least -1 ms)" + FRONT),
        Item("first_to_end", "pass", 0.21875, 0.203125, STREAM,
             "first token to end: client 54.69 ms, server 50.78 ms per request, difference +3.91 ms "
             "(allowed +-20.5)"),
        Item("decode_count", "pass", 12.0, 12.0, "exact", "equal"),
        Item("decode", "pass", 0.1875, 0.171875, DECODE,
             "mean client-server decode span excess +3.91 ms per request (allowed +-22.1)"),
    )
    assert result.status == "pass"
    assert result.frontend_delay_s == 0.0234375
    assert result.message == ("server counters agree with the client's records (10 comparisons); front-end and "
                              "transport delay before the engine saw the request: 23.44 ms mean (reported, not judged)")


def test_item_lookup_names_the_missing_item() -> None:
    with pytest.raises(KeyError) as err:
        window(FOUR, server(4)).item("nope")
    assert err.value.args == ("nope",)


def test_one_request_is_judged_not_skipped() -> None:
    result = window([req(1.0)], server(1))
    assert result.status == "pass", result.message
    assert result.item("e2e") == Item("e2e", "pass", 0.125, 0.09765625, FLOOR,
                                      "mean client-server excess 27.34 ms per request (at least -1 ms)")
    assert result.item("first_to_end").client == 0.0546875 and result.item("first_to_end").status == "pass"
    assert result.frontend_delay_s == 0.0234375


def test_an_empty_window_is_unverified_never_pass() -> None:
    """No request in the window and no server traffic: the counts agree (0 = 0), the latencies have
    nothing to compare, and the whole is unverified."""
    result = window([], server(0))
    none = "no completed requests"
    assert result.items == (
        Item("requests", "pass", 0.0, 0.0, "exact", "equal"),
        Item("prompt_tokens", "pass", 0.0, 0.0, "exact", "equal"),
        Item("generation_tokens", "pass", 0.0, 0.0, "exact", "equal"),
        Item("e2e_count", "pass", 0.0, 0.0, "exact", "equal"),
        Item("e2e", "unverified", 0, 0.0, FLOOR, none),
        Item("ttft_count", "pass", 0.0, 0.0, "exact", "equal"),
        Item("ttft", "unverified", 0, 0.0, FLOOR, none),
        Item("first_to_end", "unverified", None, None, STREAM, none),
        Item("decode_count", "pass", 0.0, 0.0, "exact", "equal"),
        Item("decode", "unverified", 0, 0.0, DECODE, none),
    )
    assert result.status == "unverified" and result.frontend_delay_s is None
    assert result.message == ("e2e: no completed requests; ttft: no completed requests; "
                              "first_to_end: no completed requests; decode: no completed requests")


# ------------------------------------------------------------------------------------ counts
def test_more_on_the_server_names_both_counts_and_the_fix() -> None:
    result = window(FOUR, server(4, over={PROMPT: 640.0}))
    assert result.item("prompt_tokens") == Item(
        "prompt_tokens", "fail", 512.0, 640.0, "exact",
        "server counted 640, client 512 (more on the server: another client on the same server, or a proxy that "
        "retries or duplicates requests. " + OTHER_CLIENT_FIX + ")")
    assert result.status == "fail"


def test_fewer_on_the_server_names_both_counts_and_the_fix() -> None:
    result = window(FOUR, server(4, over={GEN: 15.0}))
    assert result.item("generation_tokens") == Item(
        "generation_tokens", "fail", 16.0, 15.0, "exact",
        "server counted 15, client 16 (fewer on the server: a request answered without reaching the server (a "
        "proxy or cache in between). Fix: point studyc at the server itself, then re-run the point)")


@pytest.mark.parametrize(("name", "item"), [
    (PROMPT, "prompt_tokens"), (GEN, "generation_tokens"), (E2E_COUNT, "e2e_count"), (TTFT_COUNT, "ttft_count"),
    (ITL_COUNT, "decode_count")])
def test_a_hidden_count_is_unverified_with_its_name(name: str, item: str) -> None:
    result = window(FOUR, server(4), drop=[name])
    got = result.item(item)
    assert got == Item(item, "unverified", got.client, None, "exact", hidden(name))
    assert got.client == {"prompt_tokens": 512.0, "generation_tokens": 16.0, "decode_count": 12.0}.get(item, 4.0)
    assert result.status == "unverified"


def test_hidden_finish_reasons_leave_requests_unverified() -> None:
    result = window(FOUR, server(4), drop=[SUCCESS])
    assert result.item("requests") == Item("requests", "unverified", 4.0, None, "exact", hidden(SUCCESS))
    assert "requests_aborted" not in names(result)
    assert result.status == "unverified"


def test_a_counter_only_in_the_closing_scrape_is_unverified() -> None:
    """A counter missing from one scrape has no delta: never a count of 0 before."""
    result = window(FOUR, server(4), drop_before=[PROMPT, SUCCESS])
    assert result.item("prompt_tokens") == Item("prompt_tokens", "unverified", 512.0, None, "exact", hidden(PROMPT))
    assert result.item("requests").status == "unverified"


def test_counts_are_differences_of_the_two_scrapes() -> None:
    """Non-zero counters at the window's opening are subtracted, never added."""
    result = window(FOUR, server(4))
    assert [result.item(n).server for n in ("prompt_tokens", "generation_tokens", "decode_count")] == [
        512.0, 16.0, 12.0]


# ---------------------------------------------------------------------------- finish reasons
def snap(body: str, t_s: float = 0.0) -> Snapshot:
    return prometheus.parse(body, t_s=t_s)


def success(**by_engine_reason: float) -> str:
    """`e0_length=3` -> a request_success sample of engine 0, finished_reason length."""
    out = []
    for key, v in by_engine_reason.items():
        engine, reason = key.split("_", 1)
        out.append(f'{SUCCESS}{{engine="{engine[1:]}",model_name="m",finished_reason="{reason}"}} {v}')
    return "\n".join(out) + "\n"


def test_finished_by_reason_sums_engines_and_subtracts_the_opening() -> None:
    """Two engines (data parallel) each export their own series: counts add up per reason."""
    before = snap(success(e0_length=10, e1_length=7, e0_stop=2, e1_stop=1))
    after = snap(success(e0_length=13, e1_length=9, e0_stop=2, e1_stop=4))
    assert finished_by_reason(before, after) == {"length": 5.0, "stop": 3.0}


def test_a_reason_first_seen_in_the_window_counts_from_zero() -> None:
    """vLLM creates a reason's series when the reason first occurs: absent before means 0 before."""
    before = snap(success(e0_length=10))
    after = snap(success(e0_length=12, e0_repetition=1, e0_abort=2))
    assert finished_by_reason(before, after) == {"abort": 2.0, "length": 2.0, "repetition": 1.0}


def test_a_reason_gone_from_the_closing_scrape_counts_as_zero_there() -> None:
    """A series that vanished (the server restarted in between) counts 0 after: the counts go down
    and the requests item fails, never passes."""
    before = snap(success(e0_length=10, e0_stop=5))
    after = snap(success(e0_length=14))
    assert finished_by_reason(before, after) == {"length": 4.0, "stop": -5.0}
    requests = reconcile(replace(before, t_s=0.0), replace(after, t_s=100.0), FOUR).item("requests")
    assert (requests.status, requests.client, requests.server) == ("fail", 4.0, -1.0)


def test_a_sample_without_a_reason_label_is_kept_under_the_empty_reason() -> None:
    before = snap(f'{SUCCESS}{{model_name="m"}} 3\n' + success(e0_length=1))
    after = snap(f'{SUCCESS}{{model_name="m"}} 5\n' + success(e0_length=4))
    assert finished_by_reason(before, after) == {"": 2.0, "length": 3.0}


def test_finished_by_reason_needs_the_counter_in_both_scrapes() -> None:
    some, none = snap(success(e0_length=4)), snap(f"{PROMPT} 1\n")
    assert finished_by_reason(none, some) is None
    assert finished_by_reason(some, none) is None
    assert finished_by_reason(some, some) == {"length": 0.0}


def test_completed_reasons_add_up_and_the_rest_fail_as_aborted() -> None:
    """length, stop and repetition are completions; abort and error on the server, with no request
    failed on the client, are someone else's requests."""
    clean = window(FOUR, server(4), {"length": 2.0, "stop": 1.0, "repetition": 1.0})
    assert clean.item("requests") == Item("requests", "pass", 4.0, 4.0, "exact", "equal")
    assert "requests_aborted" not in names(clean) and clean.status == "pass"
    aborted = window(FOUR, server(4), {"length": 4.0, "abort": 1.0, "error": 2.0})
    assert aborted.item("requests").status == "pass"
    assert aborted.item("requests_aborted") == Item(
        "requests_aborted", "fail", 0.0, 3.0, "exact",
        "the server aborted or failed 3 requests the client did not see fail: requests of another client, or a "
        "proxy that gave up on them. " + OTHER_CLIENT_FIX)
    assert names(aborted)[:2] == ["requests", "requests_aborted"] and aborted.status == "fail"


# ------------------------------------------------------------------------------------ window
def test_warmup_ending_after_the_opening_scrape_fails_the_window() -> None:
    warm = [Req(-1.0, 0.5, -0.9, (-0.9, 0.4), warmup=True), Req(-1.0, 3.0, -0.9, (-0.9, 2.0), warmup=True),
            Req(-2.0, 0.0, -1.9, (-1.9, -0.1), warmup=True)]  # the last ends exactly at the scrape: not late
    result = window([*warm, *FOUR], server(4))
    assert result.items[0] == Item(
        "window", "fail", 2.0, None, "exact",
        "2 warmup requests ended after the window opened, so the counters include warmup work. Fix: take the "
        "opening scrape after the last warmup response, then re-run the point")
    assert names(result).count("window") == 1
    assert result.status == "fail"


@pytest.mark.parametrize("stray", [req(-0.5), req(99.9)], ids=["sent-before-opening", "ended-after-closing"])
def test_a_measured_request_outside_the_snapshots_fails_the_window(stray: Req) -> None:
    result = window([*FOUR, stray], server(5))
    assert result.items[0] == Item(
        "window", "fail", 1.0, None, "exact",
        "1 measured requests fall outside the counter snapshots, so the counters miss part of their work. Fix: "
        "take the closing scrape after the last measured response, then re-run the point")
    assert names(result).count("window") == 1 and result.status == "fail"


def test_the_window_is_closed_at_both_edges() -> None:
    """[before, after]: a request sent at the opening scrape's time or ending at the closing one's is
    inside, and a warmup request ending at the opening scrape's time is not late."""
    edge = [req(0.0), req(1.0), req(2.0), req(100.0 - 0.125)]
    assert edge[0].sent_s == 0.0 and edge[-1].end_s == 100.0
    warm = Req(-1.0, 0.0, -0.9, (-0.9, -0.5), warmup=True)
    result = window([warm, *edge], server(4))
    assert "window" not in names(result)
    assert result.status == "pass", result.message


def test_late_warmup_and_stray_requests_give_two_window_items() -> None:
    warm = Req(-1.0, 0.5, -0.9, (-0.9, 0.4), warmup=True)
    result = window([warm, *FOUR, req(-0.5), req(99.95)], server(6))
    assert [(i.name, i.client) for i in result.items[:2]] == [("window", 1.0), ("window", 2.0)]
    assert "warmup" in result.items[0].message and "outside" in result.items[1].message


# ----------------------------------------------------------------------- client failures
def test_a_client_failure_leaves_every_latency_unverified() -> None:
    bad = Req(sent_s=5.0, end_s=6.0, first_token_s=None, token_times_s=(), output_tokens=0, ok=False)
    result = window([*FOUR, bad], server(4), {"length": 4.0, "error": 1.0})
    why = ("1 requests failed on the client, and the server's counts include their partial work: cannot verify. "
           "Fix: remove the cause of the failures (see the errors check), then re-run the point")
    assert result.items == (
        Item("requests", "pass", 4.0, 4.0, "exact", "equal"),
        *(Item(name, "unverified", None, None, "exact", why)
          for name in ("prompt_tokens", "generation_tokens", "e2e", "ttft", "first_to_end", "decode")),
    )
    assert result.status == "unverified" and result.frontend_delay_s is None


# --------------------------------------------------------------------------- latency floor
def test_floor_edge_is_inclusive_and_the_failure_reads_whole() -> None:
    """TTFT/e2e: the mean excess may equal the floor, not go below it (a dyadic floor: exact edge)."""
    bound = LatencyBound(floor_s=-0.0078125)
    text_bound = "mean client-server excess >= -7.8125 ms"
    at = window(FOUR, server(4, e2e=0.125 + 0.0078125), bound=bound).item("e2e")
    assert at == Item("e2e", "pass", 0.5, 0.53125, text_bound,
                      "mean client-server excess -7.81 ms per request (at least -7.8125 ms)")
    below = window(FOUR, server(4, e2e=0.125 + 0.01171875), bound=bound).item("e2e")
    assert below == Item(
        "e2e", "fail", 0.5, 0.546875, text_bound,
        "mean client-server excess -11.72 ms per request (at least -7.8125 ms): the server counted more time "
        "than the client saw, so its sums include requests the client did not send (another client on the same "
        "server). " + OTHER_CLIENT_FIX)


def test_default_floor_is_minus_one_millisecond() -> None:
    assert window(FOUR, server(4, e2e=0.125 + 0.0009765625)).item("e2e").status == "pass"
    assert window(FOUR, server(4, e2e=0.125 + 0.001953125)).item("e2e").status == "fail"


def test_ttft_below_the_floor_fails_and_is_still_reported() -> None:
    result = window(FOUR, server(4, ttft=C_TTFT + 0.015625, e2e=0.125 + 0.015625))
    item = result.item("ttft")
    assert (item.status, item.client, item.server, item.bound) == ("fail", 0.28125, 0.34375, FLOOR)
    assert item.message.startswith("mean client-server excess -15.62 ms per request (at least -1 ms): the server "
                                   "counted more time than the client saw")
    assert result.status == "fail"


def test_a_ttft_below_the_floor_is_not_called_a_front_end_delay() -> None:
    """Below the floor the server's TTFT sums hold time the client never saw (another client's):
    that excess is no front-end delay, so it is neither named one in the detail nor reported as
    `frontend_delay_s`."""
    result = window(FOUR, server(4, ttft=C_TTFT + 0.015625))
    assert result.item("ttft").status == "fail"
    assert result.item("ttft").message.endswith("(another client on the same server). " + OTHER_CLIENT_FIX)
    assert result.frontend_delay_s is None
    assert "front-end" not in result.message


def test_hidden_latency_sums_leave_their_items_unverified() -> None:
    e2e = window(FOUR, server(4), drop=[E2E_SUM])
    assert e2e.item("e2e") == Item("e2e", "unverified", 0.5, None, FLOOR, hidden(E2E_SUM))
    assert e2e.item("first_to_end") == Item(
        "first_to_end", "unverified", None, None, STREAM,
        "needs the e2e and TTFT sums of both instruments (see the e2e and ttft items)")
    assert e2e.item("ttft").status == "pass" and e2e.frontend_delay_s == 0.0234375
    ttft = window(FOUR, server(4), drop=[TTFT_SUM])
    assert ttft.item("ttft") == Item("ttft", "unverified", 0.28125, None, FLOOR, hidden(TTFT_SUM))
    assert ttft.item("first_to_end").status == "unverified" and ttft.item("e2e").status == "pass"
    assert ttft.frontend_delay_s is None and ttft.status == "unverified"


def test_a_hidden_histogram_count_still_judges_the_sum() -> None:
    """Without the count the sum is read as the client's request count's: judged, while the count
    item alone stays unverified."""
    result = window(FOUR, server(4), drop=[E2E_COUNT, TTFT_COUNT])
    assert result.item("e2e").status == "pass" and result.item("e2e").server == 0.390625
    assert result.item("ttft").status == "pass" and result.frontend_delay_s == 0.0234375
    assert result.item("first_to_end").status == "pass"
    assert result.status == "unverified"


def test_a_histogram_count_that_disagrees_withholds_its_sum() -> None:
    result = window(FOUR, server(4, over={E2E_COUNT: 5.0}))
    assert result.item("e2e_count").status == "fail"
    assert result.item("e2e") == Item("e2e", "unverified", 0.5, None, FLOOR,
                                      "its histogram count disagrees (see e2e_count)")


def test_a_request_without_a_first_token_leaves_ttft_unverified() -> None:
    recs = [*FOUR[:3], replace(FOUR[3], first_token_s=None)]
    result = window(recs, server(4))
    assert result.item("ttft") == Item(
        "ttft", "unverified", None, None, FLOOR,
        "1 completed requests have no first-token time (no content chunk): cannot verify. Fix: output_len of at "
        "least 1 token with content, then re-run the point")
    assert "ttft_count" not in names(result)
    assert result.item("first_to_end").status == "unverified"
    assert result.frontend_delay_s is None and result.status == "unverified"
    assert "front-end" not in result.message


# ------------------------------------------------------------------ first token to end
def test_stream_bound_is_20_ms_plus_1_percent_of_the_server_span() -> None:
    b = LatencyBound()
    assert b.stream_high(0.0) == 0.020
    assert b.stream_high(0.5) == pytest.approx(0.025, abs=1e-15)
    assert b.stream_high(2.0) == pytest.approx(0.040, abs=1e-15)
    assert b.stream_high(-1.0) == 0.020  # a negative server span adds nothing
    assert b.high(0.2) == pytest.approx(0.030, abs=1e-15) and b.high(-1.0) == 0.020


def long_window(server_span: float, diff: float) -> Reconciliation:
    """Two-token requests whose server first-token-to-end span is `server_span`; the client's is
    longer by `diff` (its end read late; negative: its first token read late)."""
    recs = [req(float(t), span=server_span, tail=diff, tokens=2) if diff >= 0 else
            req(float(t), ttft=C_TTFT - diff, span=server_span + diff, tail=0.0, tokens=2) for t in (1, 2, 3, 4)]
    return window(recs, server(4, e2e=S_TTFT + server_span, itl=server_span, tokens=2))


@pytest.mark.parametrize(("span", "allowed"), [(0.5, "25.0"), (1.033, "30.3"), (2.0, "40.0")])
def test_first_to_end_at_the_default_bound(span: float, allowed: str) -> None:
    hi = 0.020 + 0.01 * span
    for sign in (1, -1):
        inside = long_window(span, sign * (hi - 0.0005)).item("first_to_end")
        assert inside.status == "pass", inside.message
        assert inside.message.endswith(f"ms (allowed +-{allowed})")
        assert long_window(span, sign * (hi + 0.0005)).item("first_to_end").status == "fail"


def test_first_to_end_edge_is_inclusive_both_ways() -> None:
    """|diff| equal to stream_abs + stream_rel x the server's span passes (dyadic bound: exact)."""
    bound = LatencyBound(stream_abs_s=0.015625, stream_rel=0.5)  # 15.625 ms + 50% of 50.78125 ms
    hi = 0.015625 + 0.5 * (S_E2E - S_TTFT)
    for diff, status in ((hi, "pass"), (-hi, "pass"), (hi + 2 ** -10, "fail"), (-hi - 2 ** -10, "fail")):
        # the client's first-token-to-end span equals the server's, then its end read `diff` late,
        # or (diff < 0) its first token read -diff late
        recs = [req(float(t), tail=S_E2E - S_TTFT - C_SPAN + max(diff, 0.0)) for t in (1, 2, 3, 4)]
        recs = [replace(r, first_token_s=(r.first_token_s or 0.0) - min(diff, 0.0)) for r in recs]
        item = window(recs, server(4), bound=bound).item("first_to_end")
        assert item.status == status, (diff, item.message)
        assert item.bound == "|client - server first-token-to-end span| <= 15.625 ms + 50%"


def test_first_to_end_failures_read_whole() -> None:
    late_end = window([replace(r, end_s=r.end_s + 0.03125) for r in FOUR], server(4)).item("first_to_end")
    assert late_end == Item(
        "first_to_end", "fail", 0.34375, 0.203125, STREAM,
        "first token to end: client 85.94 ms, server 50.78 ms per request, difference +35.16 ms (allowed +-20.5): "
        "the client saw requests end later after their first token than the server made them: the client lagged "
        "while streaming (starved of CPU, a GC pause), so its e2e, TPOT and ITL are inflated (the load generator's longest loop stall: not "
        "measured). " + CLIENT_FIX)
    late_first = window([replace(r, first_token_s=(r.first_token_s or 0) + 0.03125) for r in FOUR],
                        server(4)).item("first_to_end")
    assert late_first == Item(
        "first_to_end", "fail", 0.09375, 0.203125, STREAM,
        "first token to end: client 23.44 ms, server 50.78 ms per request, difference -27.34 ms (allowed +-20.5): "
        "the client saw the first token later, relative to the end, than the server made it: the client was slow "
        "to read the first token, so its TTFT is inflated (the client, or on a shared CPU the API server's writer, "
        "starved of CPU; the itl_trusted check shows whether tokens came bunched) (the load generator's longest "
        "loop stall: not measured). " + CLIENT_FIX)


# ------------------------------------------------------------------------------------ decode
def test_decode_edge_is_inclusive_both_ways() -> None:
    """|excess| equal to abs + rel x the server's mean inter-token sum passes (dyadic bound: exact)."""
    bound = LatencyBound(abs_s=0.015625, rel=0.5)  # 15.625 ms + 50% of 42.96875 ms
    hi = 0.015625 + 0.5 * S_ITL
    for excess, status in ((hi, "pass"), (-hi, "pass"), (hi + 2 ** -10, "fail"), (-hi - 2 ** -10, "fail")):
        recs = [req(float(t), span=S_ITL + excess) for t in (1, 2, 3, 4)]
        item = window(recs, server(4), bound=bound).item("decode")
        assert item.status == status, (excess, item.message)
        assert item.bound == "|client - server decode span| <= 15.625 ms + 50%"


def test_decode_bound_is_20_ms_plus_5_percent_of_the_server_mean() -> None:
    """A server mean of 400 ms allows 40 ms (not 20 ms + 5% of the window's sum)."""
    for excess, status in ((0.0395, "pass"), (-0.0395, "pass"), (0.0405, "fail"), (-0.0405, "fail")):
        recs = [req(float(t), span=0.4 + excess) for t in (1, 2, 3, 4)]
        item = window(recs, server(4, itl=0.4, e2e=S_TTFT + 0.4 + excess)).item("decode")
        assert item.status == status, (excess, item.message)
        assert item.message.split(": ")[0].endswith("(allowed +-40.0)")


def test_decode_failures_read_whole() -> None:
    slow = window([req(float(t), span=C_SPAN + 0.03125) for t in (1, 2, 3, 4)], server(4)).item("decode")
    assert slow == Item(
        "decode", "fail", 0.3125, 0.171875, DECODE,
        "mean client-server decode span excess +35.16 ms per request (allowed +-22.1): the client's first-to-last "
        "token span is longer than the server's: the client lagged while streaming (starved of CPU, a GC pause) "
        "(the load generator's longest loop stall: not measured). " + CLIENT_FIX)
    fast = window(FOUR, server(4, itl=C_SPAN + 0.03125)).item("decode")
    assert fast == Item(
        "decode", "fail", 0.1875, 0.3125, DECODE,
        "mean client-server decode span excess -31.25 ms per request (allowed +-23.9): the client's first-to-last "
        "token span is shorter than the server's: the client read the first token late (starved of CPU), or the "
        "server's sums include requests the client did not send (another client on the same server) (the load "
        "generator's longest loop stall: not measured). " + CLIENT_FIX + "; and measure a server no other client uses")


def test_requests_in_one_chunk_leave_decode_unverified() -> None:
    recs = [*FOUR[:3], replace(FOUR[3], token_times_s=FOUR[3].token_times_s[-1:])]
    assert window(recs, server(4)).item("decode") == Item(
        "decode", "unverified", None, None, DECODE,
        "1 requests came in fewer than two chunks: no decode span to compare. Fix: output_len of at least 2, "
        "then re-run the point")


def test_one_token_requests_expect_no_inter_token_entries() -> None:
    recs = [req(float(t), tokens=1) for t in (1, 2)]
    result = window(recs, server(2, tokens=1, itl=0.0))
    assert result.item("decode_count") == Item("decode_count", "pass", 0.0, 0.0, "exact", "equal")
    assert result.item("decode").status == "unverified"


def test_decode_count_disagreeing_withholds_the_sum() -> None:
    result = window(FOUR, server(4, over={ITL_COUNT: 13.0}))
    assert result.item("decode_count").status == "fail"
    assert result.item("decode") == Item("decode", "unverified", 0.1875, None, DECODE,
                                         "the inter-token histogram count disagrees (see decode_count)")


def test_hidden_inter_token_histogram() -> None:
    no_sum = window(FOUR, server(4), drop=[ITL_SUM])
    assert no_sum.item("decode") == Item("decode", "unverified", 0.1875, None, DECODE, hidden(ITL_SUM))
    no_count = window(FOUR, server(4), drop=[ITL_COUNT])
    assert no_count.item("decode").status == "pass" and no_count.item("decode").server == 0.171875


# ------------------------------------------------------------------------------- server step
def test_server_step_needs_both_halves_of_the_histogram() -> None:
    def step(before: str, after: str) -> float | None:
        return server_step_s(snap(before), snap(after, 1.0))

    assert step(f"{ITL_SUM} 1.0\n{ITL_COUNT} 10\n", f"{ITL_SUM} 1.25\n{ITL_COUNT} 11\n") == 0.25  # one gap
    assert step(f"{ITL_SUM} 1.0\n{ITL_COUNT} 10\n", f"{ITL_SUM} 1.5\n{ITL_COUNT} 14\n") == 0.125
    assert step(f"{ITL_COUNT} 10\n", f"{ITL_COUNT} 14\n") is None  # sum hidden
    assert step(f"{ITL_SUM} 1.0\n", f"{ITL_SUM} 1.5\n") is None  # count hidden
    assert step(f"{ITL_SUM} 1.0\n{ITL_COUNT} 10\n", f"{ITL_SUM} 1.0\n{ITL_COUNT} 10\n") is None  # no token
    assert step(f"{ITL_SUM} 1.0\n{ITL_COUNT} 10\n", f"{ITL_SUM} 0.5\n{ITL_COUNT} 6\n") is None  # went back
