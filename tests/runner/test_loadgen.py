"""The load generator against the loopback instrument (and its bytes-level reader on real vLLM bytes):
exact counts, record fields, failures recorded never raised, timeouts, closed-loop concurrency,
open-loop arrivals."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import socket
import statistics
import time

import pytest

from runner.instrument import Instrument, InstrumentConfig, prompt_key
from runner.loadgen import (
    POINT_TIMEOUT,
    TIMEOUT,
    LoadResult,
    RequestRecord,
    RequestSpec,
    arrival_times,
    auto_workers,
    make_prompts,
    run_load,
)
from runner.sse import ResponseScanner

# A real `vllm serve` 0.32 (CPU, tiny Qwen3) answer: 8 tokens in 6 chunks, then usage and [DONE].
VLLM_RAW = (
    b"HTTP/1.1 200 OK\r\ndate: Sun, 29 Nov 2026 22:58:01 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\nvary: Origin\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"".join(
        b"%x\r\n%s\r\n" % (len(ev), ev)
        for ev in [
            b'data: {"id":"cmpl-91f7c4be4be9d00f","object":"text_completion","created":1795993082,"model":'
            b'"/tmp/lg/tiny","choices":[{"index":0,"text":"%s","logprobs":null,"finish_reason":%s,'
            b'"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}\n\n' % (text, fin)
            for text, fin in [
                (b" w4042", b"null"), (b" w3454", b"null"), (b" w4042 w3454", b"null"),
                (b" w4042", b"null"), (b" w3454", b"null"), (b" w4042 w3454", b'"length"'),
            ]
        ]
        + [
            (
                b'data: {"id":"cmpl-91f7c4be4be9d00f","object":"text_completion","created":1795993082,"model":'
                b'"/tmp/lg/tiny","choices":[],"usage":{"prompt_tokens":64,"total_tokens":72,"completion_tokens":8,'
                b'"prompt_tokens_details":{"cached_tokens":0}},"system_fingerprint":"vllm-0.32.0-5bbd9e62"}\n\n'
            ),
            b"data: [DONE]\n\n",
        ]
    )
    + b"0\r\n\r\n"
)


def specs(n: int, max_tokens: int, *, input_len: int = 16, salt: str = "") -> list[RequestSpec]:
    return [RequestSpec(p, max_tokens)
            for p in make_prompts(n, input_len, vocab_lo=4, vocab_hi=4096, seed=3, salt=salt)]


def max_overlap(records: list[RequestRecord]) -> int:
    edges = sorted([(r.sent_s, 1) for r in records] + [(r.end_s, -1) for r in records],
                   key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


# ----------------------------------------------------------------------------- the byte reader
def scan_all(raw: bytes, cuts: list[int]) -> tuple[ResponseScanner, int]:
    sc = ResponseScanner()
    total = 0
    prev = 0
    for c in [*cuts, len(raw)]:
        total += sc.feed(raw[prev:c])
        prev = c
    return sc, total


def test_reader_on_real_vllm_bytes_at_every_split_point() -> None:
    for cut in range(1, len(VLLM_RAW)):
        sc, n = scan_all(VLLM_RAW, [cut])
        assert (n, sc.chunks, sc.output_tokens, sc.prompt_tokens) == (6, 6, 8, 64), cut
        assert sc.complete and sc.done_seen and sc.keep_alive and sc.failure() is None


def test_reader_byte_by_byte_and_random_splits() -> None:
    sc, n = scan_all(VLLM_RAW, list(range(1, len(VLLM_RAW))))
    assert (n, sc.output_tokens, sc.complete) == (6, 8, True)
    rng = random.Random(5)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(VLLM_RAW)), rng.randrange(1, 30)))
        sc, n = scan_all(VLLM_RAW, cuts)
        assert (n, sc.output_tokens, sc.done_seen, sc.complete) == (6, 8, True, True)


def test_reader_counts_events_split_across_http_chunks() -> None:
    # A server may cut an SSE event anywhere between HTTP chunks; counts must not change.
    body = VLLM_RAW.split(b"\r\n\r\n", 1)[1]
    events = b""
    rest = body
    while True:
        line, _, rest = rest.partition(b"\r\n")
        size = int(line, 16)
        if not size:
            break
        events += rest[:size]
        rest = rest[size + 2:]
    head = VLLM_RAW.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
    rechunked = b"".join(b"%x;ext=1\r\n%s\r\n" % (7, events[i:i + 7]) if len(events[i:i + 7]) == 7
                         else b"%x\r\n%s\r\n" % (len(events[i:i + 7]), events[i:i + 7])
                         for i in range(0, len(events), 7))
    sc, n = scan_all(head + rechunked + b"0\r\nx-trailer: 1\r\n\r\n", [100, 333])
    assert (n, sc.output_tokens, sc.done_seen, sc.complete) == (6, 8, True, True)


def test_reader_content_length_and_http_errors() -> None:
    body = b'{"error":{"message":"boom","code":500}}'
    sc, n = scan_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body),
                     [20])
    assert n == 0 and sc.complete and sc.status == 500
    assert sc.failure() == f"HTTP 500 Internal Server Error: {body.decode()}"


def test_reader_flags_error_event_and_missing_done() -> None:
    err = b'data: {"error": {"message": "Internal server error", "type": "InternalServerError"}}\n\n'
    raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(err), err) + b"0\r\n\r\n"
    sc, _ = scan_all(raw, [])
    assert sc.failure() == "stream error: Internal server error"
    cut = VLLM_RAW.replace(b"e\r\ndata: [DONE]\n\n\r\n", b"")
    sc, _ = scan_all(cut, [])
    assert sc.complete and sc.failure() == "stream ended without data: [DONE]"


# ------------------------------------------------------------------------------- the generator
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_exact_token_counts_and_record_fields(workers: int) -> None:
    with Instrument() as inst:
        res = run_load(inst.base_url, "m", specs(30, 17, input_len=24), concurrency=4, workers=workers)
    assert isinstance(res, LoadResult) and res.workers == max(workers, 1) and not res.timed_out
    assert [r.index for r in res.records] == list(range(30))
    for r in res.records:
        assert r.ok and r.error is None and r.status == 200 and not r.warmup
        assert (r.prompt_tokens, r.output_tokens, r.chunks, len(r.token_times_s)) == (24, 17, 17, 17)
        assert r.scheduled_s <= r.sent_s <= r.first_token_s == r.token_times_s[0] <= r.end_s  # type: ignore[operator]
        assert list(r.token_times_s) == sorted(r.token_times_s) and r.token_times_s[-1] <= r.end_s
    assert res.window_start_s == min(r.sent_s for r in res.records)
    assert res.window_end_s == max(r.end_s for r in res.records)


def test_chunks_are_not_tokens() -> None:
    with Instrument(tokens_per_chunk=4) as inst:
        res = run_load(inst.base_url, "m", specs(5, 10), concurrency=2, workers=0)
    assert {(r.output_tokens, r.chunks, len(r.token_times_s)) for r in res.records} == {(10, 3, 3)}


def test_paced_token_times_follow_the_stream() -> None:
    reqs = specs(3, 12)
    with Instrument(itl_s=0.002) as inst:
        res = run_load(inst.base_url, "m", reqs, concurrency=3, workers=1)
        logs = {x.key: x for x in inst.send_log()}
    for r, spec in zip(res.records, reqs, strict=True):
        log = logs[prompt_key(spec.prompt_ids)]
        assert r.ok and r.chunks == len(log.times) == 12
        # one clock for both processes: every chunk is stamped after the instrument sent it
        assert all(c >= s for c, s in zip(r.token_times_s, log.times, strict=True))
        assert r.token_times_s[-1] >= log.times[-1] >= log.t_request + 11 * 0.002


def test_warmup_is_flagged_run_first_and_outside_the_window() -> None:
    with Instrument(itl_s=0.001) as inst:
        res = run_load(inst.base_url, "m", specs(6, 5), concurrency=2, workers=1,
                       warmup=specs(3, 5, salt="warmup"))
    warm = [r for r in res.records if r.warmup]
    assert [r.index for r in warm] == [0, 1, 2] and all(r.ok for r in warm)
    assert len(res.measured) == 6
    assert max(r.end_s for r in warm) <= res.window_start_s == min(r.sent_s for r in res.measured)


def test_http_errors_are_recorded_not_raised() -> None:
    with Instrument(fail_every=3, fail_status=500) as inst:
        res = run_load(inst.base_url, "m", specs(12, 4), concurrency=1, workers=0)
    bad = [r for r in res.records if not r.ok]
    assert len(bad) == 4
    for r in bad:
        assert r.status == 500 and r.error is not None and r.error.startswith("HTTP 500")
        assert "injected failure" in r.error and r.chunks == 0 and r.first_token_s is None
    assert all(r.output_tokens == 4 for r in res.records if r.ok)


def test_stream_error_event_and_disconnect_are_recorded() -> None:
    with Instrument(error_every=2, error_after=2, disconnect_every=3, disconnect_after=1) as inst:
        res = run_load(inst.base_url, "m", specs(6, 6), concurrency=1, workers=0)
    by_error: dict[str | None, int] = {}
    for r in res.records:
        key = (r.error or "").split(":")[0] or None
        by_error[key] = by_error.get(key, 0) + 1
    # serials 2 and 4 get an error event, 3 and 6 a reset (the disconnect fault is checked first)
    assert by_error == {None: 2, "stream error": 2, "disconnected": 2}
    cut = next(r for r in res.records if r.error and r.error.startswith("disconnected"))
    assert cut.chunks == 1 and cut.status == 200 and not cut.ok


def test_connection_refused_is_recorded() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        res = run_load(f"http://127.0.0.1:{port}", "m", specs(3, 2), concurrency=2, workers=0)
    assert [r.ok for r in res.records] == [False] * 3
    assert all(r.error and r.error.startswith("connect failed") for r in res.records)


def test_api_key_and_extra_body_reach_the_server() -> None:
    with Instrument(api_key="k") as inst:
        good = run_load(inst.base_url, "m", specs(2, 3), api_key="k", workers=0)
        denied = run_load(inst.base_url, "m", specs(2, 3), workers=0)
        teapot = run_load(inst.base_url, "m", specs(2, 3), api_key="k", workers=0,
                          extra_body={"instrument": {"fail_status": 418}})
    assert all(r.ok for r in good.records)
    assert {r.status for r in denied.records} == {401} and not any(r.ok for r in denied.records)
    assert {r.status for r in teapot.records} == {418}


def test_hung_stream_is_cancelled_and_recorded_as_timeout() -> None:
    with Instrument(hang_every=2, hang_after=1) as inst:
        t0 = time.monotonic()
        res = run_load(inst.base_url, "m", specs(4, 3), concurrency=4, workers=1, request_timeout_s=0.5)
        wall = time.monotonic() - t0
    hung = [r for r in res.records if not r.ok]
    assert len(hung) == 2 and all(r.error == TIMEOUT for r in hung)
    assert all(r.chunks == 1 and r.end_s - r.sent_s >= 0.5 for r in hung)
    assert all(r.ok for r in res.records if r not in hung)
    assert not res.timed_out and wall < 10


def test_point_timeout_bounds_the_whole_point() -> None:
    with Instrument(hang_every=1, hang_after=0) as inst:
        t0 = time.monotonic()
        res = run_load(inst.base_url, "m", specs(6, 3), concurrency=2, workers=1, point_timeout_s=1.0)
        wall = time.monotonic() - t0
    assert res.timed_out and wall < 8
    errors = sorted(r.error or "" for r in res.records)
    assert errors.count(POINT_TIMEOUT) == 2
    assert errors.count("not sent: point timeout") == 4
    assert not any(r.ok for r in res.records)


@pytest.mark.parametrize("workers", [1, 2])
def test_closed_loop_concurrency_is_never_exceeded(workers: int) -> None:
    with Instrument(itl_s=0.001) as inst:
        res = run_load(inst.base_url, "m", specs(40, 20), concurrency=5, workers=workers)
        stats = inst.stats()
    assert all(r.ok for r in res.records)
    assert stats["max_in_flight"] == 5 and max_overlap(list(res.records)) == 5
    assert stats["connections"] <= 5  # keep-alive: one connection per slot, reused


def test_all_at_once_when_neither_concurrency_nor_rate() -> None:
    with Instrument(itl_s=0.002) as inst:
        res = run_load(inst.base_url, "m", specs(8, 10), workers=0)
        assert inst.stats()["max_in_flight"] == 8
    assert all(r.ok for r in res.records)


def test_open_loop_arrivals_follow_the_rate() -> None:
    rate, n, seed = 200.0, 100, 7
    with Instrument() as inst:
        res = run_load(inst.base_url, "m", specs(n, 4), rate_rps=rate, seed=seed, workers=1)
    recs = sorted(res.records, key=lambda r: r.index)
    assert all(r.ok for r in recs)
    expect = arrival_times(n, rate, seed=seed)
    t0 = recs[0].scheduled_s
    for r, off in zip(recs, expect, strict=True):
        assert r.scheduled_s - t0 == pytest.approx(off, abs=1e-6)  # exactly the seeded schedule
        assert r.sent_s >= r.scheduled_s - 1e-6  # never early
    lateness = sorted(r.sent_s - r.scheduled_s for r in recs)
    assert lateness[n // 2] < 0.005  # sent on time (sleep to 1 ms short, then spin)


def test_open_loop_with_a_cap_and_two_workers() -> None:
    with Instrument(itl_s=0.002) as inst:
        res = run_load(inst.base_url, "m", specs(30, 10), rate_rps=2000, concurrency=3, workers=2)
        stats = inst.stats()
    assert all(r.ok for r in res.records) and res.workers == 2
    assert stats["max_in_flight"] <= 3 and max_overlap(list(res.records)) <= 3


def test_arrival_processes() -> None:
    n, rate = 20_000, 50.0

    def gaps(kind: str, b: float = 1.0, seed: int = 1) -> list[float]:
        t = arrival_times(n, rate, arrival=kind, burstiness=b, seed=seed)
        return [y - x for x, y in itertools.pairwise(t)]

    assert arrival_times(3, rate)[0] == 0.0
    for kind, b, cv in (("poisson", 1.0, 1.0), ("gamma", 0.5, math.sqrt(2)), ("gamma", 4.0, 0.5)):
        g = gaps(kind, b)
        mean = statistics.fmean(g)
        assert mean == pytest.approx(1 / rate, rel=0.03), kind
        assert statistics.pstdev(g) / mean == pytest.approx(cv, rel=0.05), (kind, b)
    assert {round(x, 12) for x in gaps("constant")} == {round(1 / rate, 12)}
    assert gaps("poisson", seed=1) == gaps("poisson", seed=1) != gaps("poisson", seed=2)
    with pytest.raises(ValueError):
        arrival_times(3, 0.0)
    with pytest.raises(ValueError):
        arrival_times(3, 1.0, arrival="uniformish")


def test_run_load_from_async_code() -> None:
    with Instrument() as inst:
        async def main() -> LoadResult:
            return run_load(inst.base_url, "m", specs(3, 2), workers=0)

        res = asyncio.run(main())
    assert all(r.ok for r in res.records)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError):
        run_load("https://127.0.0.1:1", "m", specs(1, 1))
    with pytest.raises(ValueError):
        run_load("http://127.0.0.1:1", "m", specs(1, 1), concurrency=0)


def test_auto_workers_scale_with_streams_and_cpus() -> None:
    assert auto_workers(1, None, 10, cpus=16) == 1
    assert auto_workers(512, None, 10_000, cpus=16) == 1
    assert auto_workers(1024, None, 10_000, cpus=16) == 2
    assert auto_workers(8192, None, 10_000, cpus=8) == 7
    assert auto_workers(4096, None, 10_000, cpus=2) == 1
    assert auto_workers(None, 5.0, 100, cpus=16) == 1


# ------------------------------------------------------------------------------------ prompts
def test_make_prompts_exact_deterministic_and_unique() -> None:
    a = make_prompts(300, 40, vocab_lo=4, vocab_hi=4096, seed=1)
    assert a == make_prompts(300, 40, vocab_lo=4, vocab_hi=4096, seed=1)
    assert a != make_prompts(300, 40, vocab_lo=4, vocab_hi=4096, seed=2)
    assert all(len(p) == 40 and all(4 <= t < 4096 for t in p) for p in a)
    assert len({p[0] for p in a}) == 300  # no two share even a first token


def test_make_prompts_shared_prefix_then_distinct() -> None:
    a = make_prompts(50, 64, vocab_lo=4, vocab_hi=4096, seed=1, prefix_len=32)
    assert len({p[:32] for p in a}) == 1
    assert len({p[32] for p in a}) == 50


def test_make_prompts_more_than_the_vocabulary() -> None:
    a = make_prompts(40, 8, vocab_lo=0, vocab_hi=10, seed=0)
    assert len({p[:2] for p in a}) == 40
    with pytest.raises(ValueError):
        make_prompts(11, 1, vocab_lo=0, vocab_hi=10, seed=0)
    with pytest.raises(ValueError):
        make_prompts(2, 4, vocab_lo=0, vocab_hi=10, seed=0, prefix_len=5)


def test_salts_share_no_prefix() -> None:
    measured = make_prompts(100, 48, vocab_lo=4, vocab_hi=4096, seed=9, prefix_len=16)
    warm = make_prompts(100, 48, vocab_lo=4, vocab_hi=4096, seed=9, prefix_len=16, salt="warmup")
    assert measured[0][:16] != warm[0][:16]
    assert not {p[:16] for p in measured} & {p[:16] for p in warm}
    plain_m = make_prompts(100, 48, vocab_lo=4, vocab_hi=4096, seed=9)
    plain_w = make_prompts(100, 48, vocab_lo=4, vocab_hi=4096, seed=9, salt="warmup")
    assert not {p[:4] for p in plain_m} & {p[:4] for p in plain_w}


def test_instrument_config_roundtrip_used_by_tests() -> None:
    # keyword overrides build on a config
    inst = Instrument(InstrumentConfig(itl_s=0.5), fail_every=2)
    assert inst.cfg.itl_s == 0.5 and inst.cfg.fail_every == 2
