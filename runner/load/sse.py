"""Bytes-level reader of one streamed HTTP/1.1 `/v1/completions` response, for the load generator.

It decodes the HTTP framing (chunked, Content-Length or close-delimited) and counts SSE events with
C-level `bytes` scans instead of parsing each event: only the final `usage` event (and an error event,
if any) is ever handed to `json.loads`. The caller stamps the time of each socket read; `feed` says how
many content-bearing chunks completed in that read.
"""

from __future__ import annotations

import json

__all__ = ["ProtocolError", "ResponseScanner"]

# A content-bearing chunk is an event with a non-empty `choices` list (what `vllm bench serve` counts
# as a token arrival too); the final usage event has `"choices":[]`. Keys inside JSON string values
# have their quotes escaped, so these patterns only ever match structure, never generated text.
_CONTENT = b'"choices":[{'
_USAGE = b'"usage":{'
_ERROR = b'data: {"error"'
_DONE = b"data: [DONE]\n\n"
_EVENT_END = b"\n\n"
_CRLF = b"\r\n"
_ERROR_BODY_MAX = 2048

# framing modes
_CHUNKED, _LENGTH, _CLOSE = 1, 2, 3


class ProtocolError(Exception):
    """The bytes on the wire are not an HTTP/1.1 response this reader understands."""


class ResponseScanner:
    """Incremental reader of one response. Feed it every read; check `complete` afterwards.

    SSE events must end with a blank line made of LF characters (`\\n\\n`), as vLLM, SGLang and TGI
    write them; a stream framed with CRLF events would count zero chunks and never see `[DONE]`.
    """

    __slots__ = (
        "_crlf",
        "_errbody",
        "_head",
        "_left",
        "_mode",
        "_raw",
        "_tail",
        "_trailer",
        "chunks",
        "complete",
        "done_seen",
        "error",
        "keep_alive",
        "output_tokens",
        "prompt_tokens",
        "reason",
        "status",
    )

    def __init__(self) -> None:
        self.status: int | None = None
        self.reason = ""
        self.keep_alive = True
        self.complete = False  # the HTTP response body has ended
        self.chunks = 0  # content-bearing SSE chunks seen so far
        self.done_seen = False  # `data: [DONE]` was the last event
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.error: str | None = None  # an error event in the stream, or a non-200 body
        self._head = b""
        self._mode = 0
        self._left = 0  # bytes left in the current HTTP chunk's payload (or in a Content-Length body)
        self._crlf = False  # a CRLF (end of the previous chunk's payload) precedes the next size line
        self._raw = b""  # an incomplete chunk-size line carried to the next read
        self._trailer = False  # the zero-size chunk was read: waiting for the end of the trailers
        self._tail = b""  # payload bytes of an SSE event not yet terminated
        self._errbody = b""

    # ------------------------------------------------------------------ reads
    def feed(self, data: bytes) -> int:
        """Consume one read; return how many content-bearing chunks it completed."""
        if self._mode == 0:
            data = self._parse_head(data)
            if self._mode == 0 or not data:
                return 0
        if self.complete:
            if data:
                self.keep_alive = False  # bytes past the end of the response: do not reuse
            return 0
        mode = self._mode
        if mode == _CHUNKED:
            payload = self._dechunk(data)
        elif mode == _LENGTH:
            left = self._left
            if len(data) >= left:
                if len(data) > left:
                    self.keep_alive = False
                payload = data[:left] if len(data) > left else data
                self._left = 0
                self.complete = True
            else:
                payload = data
                self._left = left - len(data)
        else:
            payload = data
        if not payload:
            return 0
        if self.status != 200:
            if len(self._errbody) < _ERROR_BODY_MAX:
                self._errbody += payload[: _ERROR_BODY_MAX - len(self._errbody)]
            return 0
        return self._scan(payload)

    def eof(self) -> None:
        """The peer closed the connection: ends a close-delimited body, anything else is truncated."""
        self.keep_alive = False
        if self._mode == _CLOSE and not self.complete:
            self.complete = True
            if self._tail:  # a final event without its blank line still counts
                self._scan(b"\n\n")

    def failure(self) -> str | None:
        """Why this completed response does not count as a success, or None."""
        if self.status != 200:
            body = self._errbody.decode("utf-8", "replace").strip()
            return f"HTTP {self.status} {self.reason}: {body}".rstrip(": ")
        if self.error is not None:
            return self.error
        if not self.done_seen:
            return "stream ended without data: [DONE]"
        return None

    # ---------------------------------------------------------------- framing
    def _parse_head(self, data: bytes) -> bytes:
        head = self._head + data if self._head else data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > 65536:
                raise ProtocolError("response headers larger than 64 KiB")
            self._head = head
            return b""
        self._head = b""
        lines = head[:end].split(_CRLF)
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        self.status = int(parts[1])
        self.reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
        http10 = parts[0] == b"HTTP/1.0"
        self.keep_alive = not http10
        length = None
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"transfer-encoding":
                chunked = value.endswith(b"chunked")
            elif name == b"content-length":
                length = int(value)
            elif name == b"connection":
                if b"close" in value:
                    self.keep_alive = False
                elif b"keep-alive" in value:
                    self.keep_alive = True
        if chunked:
            self._mode = _CHUNKED
        elif length is not None:
            self._mode = _LENGTH
            self._left = length
            if length == 0:
                self.complete = True
        else:
            self._mode = _CLOSE
            self.keep_alive = False
        return head[end + 4:]

    def _dechunk(self, data: bytes) -> bytes:
        """Strip chunked framing; return the payload bytes in this read (one join per read)."""
        if self._raw:
            data = self._raw + data
            self._raw = b""
        if self._trailer:
            return self._end_trailers(data, 0)
        n = len(data)
        pos = 0
        left = self._left
        out = []
        while pos < n:
            if left:
                end = pos + left
                if end >= n:
                    out.append(data[pos:] if pos else data)
                    left = end - n
                    if not left:
                        self._crlf = True
                    pos = n
                    break
                out.append(data[pos:end])
                pos = end
                left = 0
                self._crlf = True
            start = pos + 2 if self._crlf else pos
            j = data.find(_CRLF, start)
            if j < 0:
                self._raw = data[pos:]
                break
            if self._crlf and not data.startswith(_CRLF, pos):
                raise ProtocolError("chunk payload not followed by CRLF")
            line = data[start:j]
            semi = line.find(b";")
            try:
                size = int(line if semi < 0 else line[:semi], 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
            pos = j + 2
            self._crlf = False
            if size == 0:
                self._left = 0
                self._trailer = True
                self._end_trailers(data, pos)
                return b"".join(out)
            left = size
        self._left = left
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    def _end_trailers(self, data: bytes, pos: int) -> bytes:
        # After the zero-size chunk: optional trailer lines, then an empty line.
        if data.startswith(_CRLF, pos):
            end = pos + 2
        else:
            k = data.find(b"\r\n\r\n", pos)
            if k < 0:
                self._raw = data[pos:]
                return b""
            end = k + 4
        self._trailer = False
        self.complete = True
        if end < len(data):
            self.keep_alive = False
        return b""

    # -------------------------------------------------------------------- SSE
    def _scan(self, payload: bytes) -> int:
        buf = self._tail + payload if self._tail else payload
        cut = buf.rfind(_EVENT_END)
        if cut < 0:
            self._tail = buf
            return 0
        end = cut + 2
        self._tail = buf[end:] if end < len(buf) else b""
        n = buf.count(_CONTENT, 0, end)
        self.chunks += n
        self.done_seen = buf.endswith(_DONE, 0, end)
        u = buf.rfind(_USAGE, 0, end)
        if u >= 0:
            usage = _event_json(buf, u, end).get("usage") or {}
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.output_tokens = int(usage.get("completion_tokens") or 0)
        if self.error is None:
            e = buf.find(_ERROR, 0, end)
            if e >= 0:
                obj = _event_json(buf, e + 6, end).get("error")
                msg = obj.get("message") if isinstance(obj, dict) else obj
                self.error = f"stream error: {msg}"
        return n


def _event_json(buf: bytes, at: int, end: int) -> dict:
    """Parse the one event that contains byte offset `at` (all inside buf[:end])."""
    # Raw newlines never occur inside JSON, so the event starts after the previous blank line.
    start = buf.rfind(_EVENT_END, 0, at)
    start = 0 if start < 0 else start + 2
    if not buf.startswith(b"data:", start):
        return {}
    stop = buf.find(b"\n", at, end)
    try:
        obj = json.loads(buf[start + 5: stop if stop >= 0 else end])
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}
