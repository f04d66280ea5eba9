"""vLLM 0.32's SSE completion chunks and the HTTP heads around them, pre-encoded for the instrument's server."""

from __future__ import annotations

import json
import time
from email.utils import formatdate
from typing import Any

ID_SPAN = b'"id":"cmpl-0000000000000000","object":"text_completion","created":1000000000'


def frame(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def _content_event(model: bytes, text: str, finish: str | None) -> bytes:
    fin = b"null" if finish is None else b'"' + finish.encode() + b'"'
    return (
        b"data: {" + ID_SPAN + b',"model":' + model + b',"choices":[{"index":0,"text":'
        + json.dumps(text).encode() + b',"logprobs":null,"finish_reason":' + fin
        + b',"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}\n\n'
    )


class Templates:
    """Pre-rendered framed chunks per (model, max_tokens, tokens_per_chunk); streams swap in their id."""

    def __init__(self) -> None:
        self._cache: dict[tuple[bytes, int, int], tuple[list[bytes], bytes]] = {}

    def chunks(self, model: bytes, max_tokens: int, per: int) -> tuple[list[bytes], bytes]:
        """Framed content chunks 2..n (the first is rendered per stream) and their concatenation."""
        k = (model, max_tokens, per)
        got = self._cache.get(k)
        if got is None:
            n_chunks = -(-max_tokens // per)
            out = []
            for c in range(1, n_chunks):
                words = range(c * per, min((c + 1) * per, max_tokens))
                text = "".join(f" w{(j * 7 + 13) % 4000 + 4}" for j in words)
                out.append(frame(_content_event(model, text, "length" if c == n_chunks - 1 else None)))
            got = (out, b"".join(out))
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[k] = got
        return got


def first_chunk(model: bytes, serial: int, max_tokens: int, per: int) -> bytes:
    # The first word names the stream's serial: a client that keeps generated text (vllm bench's
    # --save-detailed) can be paired with this send log through it.
    n = min(per, max_tokens)
    text = f" w{serial}" + "".join(f" w{(j * 7 + 13) % 4000 + 4}" for j in range(1, n))
    return frame(_content_event(model, text, "length" if max_tokens <= per else None))


def usage_event(model: bytes, prompt_tokens: int, completion_tokens: int) -> bytes:
    return (
        b"data: {" + ID_SPAN + b',"model":' + model + b',"choices":[],"usage":{"prompt_tokens":%d,'
        b'"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}},'
        b'"system_fingerprint":"studyc-instrument"}\n\n'
    ) % (prompt_tokens, prompt_tokens + completion_tokens, completion_tokens)


DONE_FRAMED = frame(b"data: [DONE]\n\n")
END = b"0\r\n\r\n"


class _DateCache:
    def __init__(self) -> None:
        self.sec = -1
        self.value = b""

    def get(self) -> bytes:
        s = int(time.time())
        if s != self.sec:
            self.sec = s
            self.value = formatdate(s, usegmt=True).encode()
        return self.value


_dates = _DateCache()


def http_head(status: int, reason: str, ctype: bytes, chunked: bool, length: int = 0) -> bytes:
    framing = b"transfer-encoding: chunked\r\n" if chunked else b"content-length: %d\r\n" % length
    return (b"HTTP/1.1 %d %s\r\ndate: %s\r\nserver: uvicorn\r\ncontent-type: %s\r\nvary: Origin\r\n%s\r\n"
            % (status, reason.encode(), _dates.get(), ctype, framing))


SSE = b"text/event-stream; charset=utf-8"
JSON = b"application/json"


def json_response(status: int, reason: str, obj: Any) -> bytes:
    body = json.dumps(obj).encode()
    return http_head(status, reason, JSON, False, len(body)) + body


def error_body(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": "InstrumentError", "param": None, "code": status}}
