"""The bytes-level response reader: real vLLM bytes split at every point, HTTP framings, the
[DONE] and usage events, error events and error bodies, chunks that carry several tokens."""

from __future__ import annotations

import random

import pytest

from runner.load.sse import ProtocolError, ResponseScanner

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


def _chunked(*events: bytes, head: bytes = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n") -> bytes:
    return head + b"".join(b"%x\r\n%s\r\n" % (len(ev), ev) for ev in events) + b"0\r\n\r\n"


def _content(text: bytes) -> bytes:
    return b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"%s"}]}\n\n' % text


_USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"total_tokens":9,"completion_tokens":4}}\n\n'
_DONE = b"data: [DONE]\n\n"


def test_several_events_in_one_read_are_counted_in_that_read() -> None:
    raw = _chunked(_content(b"a"), _content(b"b") + _content(b"c"), _USAGE, _DONE)
    sc = ResponseScanner()
    assert sc.feed(raw) == 3  # one socket read, three content chunks
    assert (sc.prompt_tokens, sc.output_tokens, sc.done_seen, sc.failure()) == (5, 4, True, None)


def test_a_chunk_with_several_tokens_counts_once() -> None:
    # vLLM may put several tokens in one event: the reader counts events; tokens come from usage.
    raw = _chunked(_content(b" w1 w2 w3"), _content(b" w4"), _USAGE, _DONE)
    sc, n = scan_all(raw, [])
    assert (n, sc.chunks, sc.output_tokens) == (2, 2, 4)


def test_usage_event_is_not_a_content_chunk_and_generated_text_cannot_fake_structure() -> None:
    # Text that looks like the patterns arrives JSON-escaped, so it never matches them.
    sneaky = _content(b'\\"choices\\":[{ \\"usage\\":{ data: [DONE]')
    raw = _chunked(sneaky, _USAGE, _DONE)
    sc, n = scan_all(raw, [len(raw) // 2])
    assert (n, sc.output_tokens, sc.done_seen) == (1, 4, True)


def test_without_usage_the_token_counts_stay_zero() -> None:
    sc, n = scan_all(_chunked(_content(b"a"), _DONE), [])
    assert (n, sc.prompt_tokens, sc.output_tokens, sc.failure()) == (1, 0, 0, None)


def test_done_must_be_the_last_event() -> None:
    sc, _ = scan_all(_chunked(_DONE, _content(b"late")), [])
    assert sc.complete and not sc.done_seen
    assert sc.failure() == "stream ended without data: [DONE]"


def test_error_event_with_a_plain_string_and_the_first_error_wins() -> None:
    raw = _chunked(_content(b"a"), b'data: {"error": "first"}\n\n', b'data: {"error": "second"}\n\n', _DONE)
    sc, n = scan_all(raw, [])
    assert n == 1 and sc.failure() == "stream error: first"


def test_close_delimited_body_ends_at_eof_and_keeps_a_final_event_without_blank_line() -> None:
    raw = b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + _content(b"a") + _USAGE + b"data: [DONE]"
    sc, n = scan_all(raw, [40])
    assert not sc.complete and not sc.keep_alive
    sc.eof()
    assert sc.complete and sc.done_seen and sc.output_tokens == 4 and n == 1


def test_truncated_chunked_body_is_not_complete() -> None:
    raw = _chunked(_content(b"a"), _USAGE, _DONE)
    sc, _ = scan_all(raw[:-5], [])
    sc.eof()
    assert not sc.complete and not sc.keep_alive


def test_bytes_past_the_end_forbid_reuse() -> None:
    raw = _chunked(_content(b"a"), _DONE)
    sc, _ = scan_all(raw + b"HTTP/1.1 200 OK\r\n", [])
    assert sc.complete and not sc.keep_alive
    sc2, _ = scan_all(raw, [])
    assert sc2.keep_alive


def test_connection_close_header_forbids_reuse() -> None:
    head = b"HTTP/1.1 200 OK\r\nConnection: close\r\ntransfer-encoding: chunked\r\n\r\n"
    sc, _ = scan_all(_chunked(_content(b"a"), _DONE, head=head), [])
    assert sc.complete and not sc.keep_alive


def test_error_body_is_kept_short() -> None:
    body = b"x" * 10_000
    sc, _ = scan_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body), [])
    failure = sc.failure()
    assert failure is not None and failure.startswith("HTTP 503 Service Unavailable: xxx")
    assert len(failure) < 2100


@pytest.mark.parametrize("raw", [
    b"SMTP 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcXY\r\n0\r\n\r\n",
])
def test_malformed_responses_raise_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        ResponseScanner().feed(raw)


def test_oversized_headers_raise_protocol_error() -> None:
    sc = ResponseScanner()
    with pytest.raises(ProtocolError, match="64 KiB"):
        for _ in range(100):
            sc.feed(b"x-pad: " + b"a" * 1000 + b"\r\n")
