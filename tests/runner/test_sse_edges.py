"""The response reader at its edges: exact boundaries of framing, headers, trailers and events.

Each test feeds hand-made bytes and checks the reader's state after every read that matters, so an
off-by-one in a length, a search started at the wrong offset or a flag left unset shows up.
"""

from __future__ import annotations

import pytest

from runner.load.sse import ProtocolError, ResponseScanner

OK = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
CONTENT = b'data: {"id":"c","choices":[{"index":0,"text":"a"}]}\n\n'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4}}\n\n'
DONE = b"data: [DONE]\n\n"


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def length_response(body: bytes, head: bytes = b"HTTP/1.1 200 OK") -> bytes:
    return head + b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body


def test_fresh_reader_state() -> None:
    sc = ResponseScanner()
    assert (sc.status, sc.reason, sc.keep_alive, sc.complete, sc.chunks, sc.done_seen) == (
        None, "", True, False, 0, False)
    assert (sc.prompt_tokens, sc.output_tokens, sc.error) == (0, 0, None)
    assert sc.failure() == "HTTP None"  # nothing read is not a success
    assert sc.feed(b"HTTP/1.1 200 OK\r\n") == 0 and sc.keep_alive is True and sc.status is None


# ---- status line and headers ---------------------------------------------------------------------
def test_status_line_without_reason() -> None:
    sc = ResponseScanner()
    sc.feed(b"HTTP/1.1 204\r\ncontent-length: 0\r\n\r\n")
    assert (sc.status, sc.reason, sc.complete, sc.keep_alive) == (204, "", True, True)
    assert sc.failure() == "HTTP 204"


def test_content_length_zero_is_complete_at_once() -> None:
    sc = ResponseScanner()
    assert sc.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n") == 0
    assert sc.complete is True and sc.keep_alive is True


@pytest.mark.parametrize("line", [b"", b"HTTP/1.1", b"SMTP 200 OK"])
def test_bad_status_lines(line: bytes) -> None:
    with pytest.raises(ProtocolError, match=r"^bad status line " + repr(line).replace("[", r"\[") + "$"):
        ResponseScanner().feed(line + b"\r\ncontent-length: 0\r\n\r\n")


def test_bad_status_line_is_quoted_to_80_bytes() -> None:
    line = b"X" * 100
    with pytest.raises(ProtocolError) as err:
        ResponseScanner().feed(line + b"\r\n\r\n")
    assert str(err.value) == f"bad status line {line[:80]!r}"


def test_headers_up_to_64_kib_are_accepted() -> None:
    sc = ResponseScanner()
    sc.feed(b"a" * 65536)  # exactly 64 KiB, still no blank line: keep waiting
    assert sc.status is None
    with pytest.raises(ProtocolError, match=r"^response headers larger than 64 KiB$"):
        sc.feed(b"a")


def test_http10_closes_unless_keep_alive_is_asked() -> None:
    sc = ResponseScanner()
    sc.feed(length_response(b"", head=b"HTTP/1.0 200 OK"))
    assert sc.keep_alive is False
    sc = ResponseScanner()
    sc.feed(b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 0\r\n\r\n")
    assert sc.keep_alive is True
    sc = ResponseScanner()
    sc.feed(b"HTTP/1.0 200 OK\r\nConnection: upgrade\r\ncontent-length: 0\r\n\r\n")
    assert sc.keep_alive is False
    sc = ResponseScanner()
    sc.feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 0\r\n\r\n")
    assert sc.keep_alive is False


def test_close_delimited_body_is_never_reused() -> None:
    sc = ResponseScanner()
    sc.feed(b"HTTP/1.1 200 OK\r\n\r\n" + CONTENT)
    assert sc.keep_alive is False and not sc.complete
    sc.eof()
    assert sc.complete and sc.keep_alive is False and sc.chunks == 1


def test_eof_sets_keep_alive_false() -> None:
    sc = ResponseScanner()
    sc.feed(length_response(b"abc"))
    sc.eof()
    assert sc.keep_alive is False


# ---- Content-Length ------------------------------------------------------------------------------
def test_content_length_body_over_several_reads() -> None:
    body = CONTENT + USAGE + DONE
    raw = length_response(body)
    head_len = len(raw) - len(body)
    sc = ResponseScanner()
    assert sc.feed(raw[: head_len + 10]) == 0
    assert not sc.complete
    assert sc.feed(raw[head_len + 10: head_len + len(CONTENT) + 5]) == 1
    assert not sc.complete
    assert sc.feed(raw[head_len + len(CONTENT) + 5:]) == 0
    assert sc.complete and sc.keep_alive is True and sc.done_seen and sc.output_tokens == 4


def test_content_length_ignores_bytes_past_the_body() -> None:
    sc = ResponseScanner()
    assert sc.feed(length_response(DONE) + CONTENT) == 0  # the extra event is not part of this response
    assert sc.complete and sc.chunks == 0 and sc.done_seen and sc.keep_alive is False


def test_bytes_after_a_complete_response_in_a_later_read() -> None:
    sc = ResponseScanner()
    sc.feed(length_response(DONE))
    assert sc.complete and sc.keep_alive is True
    assert sc.feed(CONTENT) == 0
    assert sc.keep_alive is False and sc.chunks == 0
    assert sc.feed(b"") == 0 and sc.keep_alive is False


# ---- error bodies --------------------------------------------------------------------------------
def test_error_body_over_two_reads_is_kept_whole_and_capped() -> None:
    raw = length_response(b"a" * 2000 + b"b" * 100, head=b"HTTP/1.1 500 Oops")
    sc = ResponseScanner()
    sc.feed(raw[:-100])
    sc.feed(raw[-100:])
    assert sc.failure() == "HTTP 500 Oops: " + "a" * 2000 + "b" * 48  # 2048 bytes kept in all


def test_error_body_with_bad_utf8_and_an_empty_body() -> None:
    sc = ResponseScanner()
    sc.feed(length_response(b"caf\xe9!", head=b"HTTP/1.1 400 Bad Request"))
    assert sc.failure() == "HTTP 400 Bad Request: caf\ufffd!"
    sc = ResponseScanner()
    sc.feed(length_response(b"", head=b"HTTP/1.1 404 Not Found"))
    assert sc.failure() == "HTTP 404 Not Found"
    sc = ResponseScanner()
    sc.feed(length_response(b"  \n", head=b"HTTP/1.1 502 Bad Gateway"))
    assert sc.failure() == "HTTP 502 Bad Gateway"


# ---- chunked framing -----------------------------------------------------------------------------
def test_chunk_payload_must_end_with_crlf() -> None:
    with pytest.raises(ProtocolError) as err:
        ResponseScanner().feed(OK + b"3\r\nabcXY\r\n")
    assert str(err.value) == "chunk payload not followed by CRLF"


def test_empty_or_long_chunk_size_lines_are_refused() -> None:
    with pytest.raises(ProtocolError, match=r"^bad chunk size line b''$"):
        ResponseScanner().feed(OK + b"\r\n5\r\nhello\r\n")
    line = b"g" * 60
    with pytest.raises(ProtocolError) as err:
        ResponseScanner().feed(OK + line + b"\r\n")
    assert str(err.value) == f"bad chunk size line {line[:40]!r}"


def test_chunk_extensions_are_ignored() -> None:
    sc = ResponseScanner()
    n = sc.feed(OK + b"%x;a=1;b=2\r\n%s\r\n" % (len(CONTENT), CONTENT) + chunk(DONE) + b"0\r\n\r\n")
    assert (n, sc.complete, sc.done_seen) == (1, True, True)


def test_chunk_ending_exactly_at_a_read_boundary() -> None:
    raw = OK + chunk(CONTENT) + chunk(DONE) + b"0\r\n\r\n"
    end_of_payload = len(OK) + len(b"%x\r\n" % len(CONTENT)) + len(CONTENT)
    sc = ResponseScanner()
    assert sc.feed(raw[:end_of_payload]) == 1
    assert sc.feed(raw[end_of_payload:]) == 0
    assert sc.complete and sc.done_seen and sc.keep_alive


def test_terminal_chunk_then_one_stray_byte() -> None:
    sc = ResponseScanner()
    sc.feed(OK + chunk(DONE) + b"0\r\n\r\nX")
    assert sc.complete and sc.keep_alive is False
    sc = ResponseScanner()
    sc.feed(OK + chunk(DONE) + b"0\r\n\r\n")
    assert sc.complete and sc.keep_alive is True


def test_trailers_exact_end_and_stray_bytes() -> None:
    body = OK + chunk(DONE) + b"0\r\nx-t: 1\r\n\r\n"
    sc = ResponseScanner()
    sc.feed(body)
    assert sc.complete and sc.keep_alive is True
    sc = ResponseScanner()
    sc.feed(body + b"X")
    assert sc.complete and sc.keep_alive is False
    sc = ResponseScanner()
    sc.feed(body + b"\r\n\r\n")  # a blank line after the trailers is past the end too
    assert sc.complete and sc.keep_alive is False


def test_trailers_split_over_reads_and_earlier_blank_lines() -> None:
    # The payload itself ends in CRLF, so "\r\n\r\n" occurs before the terminal chunk; only the
    # blank line after the trailers ends the response.
    raw = OK + chunk(b"ab\r\n") + b"0\r\nx-t: 1\r\n"
    sc = ResponseScanner()
    sc.feed(raw)
    assert not sc.complete
    sc.feed(b"x-u: 2\r\n")
    assert not sc.complete
    sc.feed(b"\r\n")
    assert sc.complete and sc.keep_alive is True


# ---- SSE events ----------------------------------------------------------------------------------
def test_done_then_a_partial_event_in_the_same_read() -> None:
    sc = ResponseScanner()
    sc.feed(OK + chunk(CONTENT + DONE + b"data: {"))
    assert sc.done_seen is True  # the last complete event is [DONE]
    sc.feed(chunk(b'"choices":[{"text":"x"}]}\n\n') + b"0\r\n\r\n")
    assert sc.done_seen is False and sc.chunks == 2


def test_last_usage_event_wins() -> None:
    # With continuous usage stats every event carries usage; the final one holds the totals.
    first = b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n'
    last = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
    sc = ResponseScanner()
    sc.feed(OK + chunk(first + last + DONE) + b"0\r\n\r\n")
    assert (sc.chunks, sc.prompt_tokens, sc.output_tokens) == (1, 5, 2)


def test_usage_with_zero_or_null_counts() -> None:
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":null,"completion_tokens":0}}\n\n'
    sc = ResponseScanner()
    sc.feed(OK + chunk(usage + DONE) + b"0\r\n\r\n")
    assert (sc.prompt_tokens, sc.output_tokens) == (0, 0)


def test_usage_event_without_a_space_after_data() -> None:
    sc = ResponseScanner()
    sc.feed(OK + chunk(b'data:{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}\n\n'))
    assert (sc.prompt_tokens, sc.output_tokens) == (3, 7)


def test_usage_after_a_comment_or_a_stray_blank_line() -> None:
    for before in (b": keep-alive\n\n", b"\n\n"):
        sc = ResponseScanner()
        sc.feed(OK + chunk(before + USAGE))
        assert (sc.prompt_tokens, sc.output_tokens) == (5, 4), before


def test_usage_inside_a_json_array_is_ignored() -> None:
    sc = ResponseScanner()
    sc.feed(OK + chunk(b'data: [{"usage":{"prompt_tokens":3,"completion_tokens":7}}]\n\n'))
    assert (sc.prompt_tokens, sc.output_tokens) == (0, 0)


def test_an_error_event_counts_only_once_complete() -> None:
    sc = ResponseScanner()
    sc.feed(OK + chunk(CONTENT + b'data: {"error": {"message": "bo'))
    assert sc.error is None
    sc.feed(chunk(b'om"}}\n\n'))
    assert sc.error == "stream error: boom"


def test_a_response_that_starts_with_a_blank_line_is_refused() -> None:
    with pytest.raises(ProtocolError, match=r"^bad status line b''$"):
        ResponseScanner().feed(b"\r\n\r\n")


def test_an_unfinished_usage_event_does_not_clear_the_last_counts() -> None:
    first = b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n'
    sc = ResponseScanner()
    sc.feed(OK + chunk(first + b'data: {"choices":[{"text":"b"}],"usage":{"prompt_'))
    assert (sc.chunks, sc.prompt_tokens, sc.output_tokens) == (1, 5, 1)
    sc.feed(chunk(b'tokens":5,"completion_tokens":2}}\n\n'))
    assert (sc.chunks, sc.prompt_tokens, sc.output_tokens) == (2, 5, 2)
