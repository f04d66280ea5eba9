"""The instrument's streaming server: a minimal OpenAI-compatible `/v1/completions` that streams vLLM
0.32's exact SSE chunk format at a set inter-token interval, with faults on demand, and logs its own
send times. `runner.load.instrument` runs it on a thread or as a process.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import json
import os
import time
import uuid
from array import array
from dataclasses import dataclass, field
from typing import Any

from runner.load.stream_frames import (
    DONE_FRAMED,
    END,
    ID_SPAN,
    JSON,
    SSE,
    Templates,
    error_body,
    first_chunk,
    frame,
    http_head,
    json_response,
    usage_event,
)

HOST = "127.0.0.1"
_now = time.monotonic


@dataclass(frozen=True)
class InstrumentConfig:
    """How the instrument streams. Every `*_every` fault hits the requests whose arrival serial
    (1, 2, 3, ... across the instrument's life) is a multiple of it; 0 turns it off. A request can
    also ask for a fault itself with a body field `"instrument": {"fail_status": 503}` (keys:
    fail_status, hang_after, disconnect_after, error_after, itl_ms)."""

    port: int = 0
    itl_s: float = 0.0  # gap between content chunks; 0 = as fast as it can
    per_chunk_writes: bool = False  # with itl_s 0: one write per chunk (round-robin) instead of per response
    ttft_s: float = 0.0  # delay before the first chunk (paced mode only)
    tokens_per_chunk: int = 1  # vLLM sometimes coalesces several tokens into one chunk
    fail_every: int = 0
    fail_status: int = 500
    hang_every: int = 0  # send hang_after chunks, then nothing (connection left open)
    hang_after: int = 1
    disconnect_every: int = 0  # send disconnect_after chunks, then reset the connection
    disconnect_after: int = 1
    error_every: int = 0  # send error_after chunks, then a vLLM error event and [DONE]
    error_after: int = 1
    api_key: str | None = None  # like `vllm serve --api-key`: 401 without `Authorization: Bearer <key>`
    cpu: int | None = None  # pin the server's thread to this core
    send_log: str | None = None  # JSON lines written by dump() and at exit
    keep_log: bool = True


@dataclass
class StreamLog:
    """One stream as the instrument sent it."""

    serial: int
    key: str  # prompt_key() of the request's prompt
    t_request: float  # request fully received (monotonic)
    max_tokens: int
    chunks: int = 0  # content chunks sent
    times: array = field(default_factory=lambda: array("d"))  # send time of each content chunk
    t_end: float | None = None  # last byte written
    fault: str | None = None

    def as_json(self) -> str:
        return json.dumps({
            "serial": self.serial, "key": self.key, "t_request": self.t_request,
            "max_tokens": self.max_tokens, "chunks": self.chunks, "times": self.times.tolist(),
            "t_end": self.t_end, "fault": self.fault,
        })


def prompt_key(prompt: Any) -> str:
    """Stable short key of a prompt (token ids or text), to pair client records with send logs."""
    if isinstance(prompt, str):
        raw = prompt.encode()
    else:
        raw = array("q", [int(x) for x in prompt]).tobytes()
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def read_send_log(path: str) -> list[StreamLog]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out.append(StreamLog(d["serial"], d["key"], d["t_request"], d["max_tokens"], d["chunks"],
                                     array("d", d["times"]), d["t_end"], d["fault"]))
    return out


# ---------------------------------------------------------------------------------- server
class _Stream:
    __slots__ = ("conn", "fault", "first", "i", "itl", "log", "rest", "span", "stop_after", "usage")

    def __init__(self, conn: StreamServerConn, log: StreamLog, span: bytes, first: bytes, rest: list[bytes],
                 usage: bytes, itl: float, stop_after: int | None, fault: str | None) -> None:
        self.conn = conn
        self.log = log
        self.span = span
        self.first = first
        self.rest = rest
        self.usage = usage
        self.i = 0  # content chunks sent
        self.itl = itl
        self.stop_after = stop_after
        self.fault = fault


class StreamServerConn(asyncio.Protocol):
    def __init__(self, server: StreamServer) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.transport is not None and not self.busy:
            buf = self.buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = buf[:end].split(b"\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if len(buf) < end + 4 + length:
                return
            body = buf[end + 4:end + 4 + length]
            self.buf = buf[end + 4 + length:]
            try:
                method, target, _ = head[0].split(b" ", 2)
            except ValueError:
                self.transport.write(json_response(400, "Bad Request", error_body(400, "bad request")))
                self.transport.close()
                return
            server = self.server
            if server.auth is not None and head[0].startswith(b"POST /v1/") and not _authorized(head, server.auth):
                self.transport.write(json_response(401, "Unauthorized", {"error": "Unauthorized"}))
                continue
            server.handle(self, method, target.split(b"?", 1)[0], body)

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)


def _authorized(head: list[bytes], expected: bytes) -> bool:
    for line in head[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"authorization" and value.strip() == expected:
            return True
    return False


class StreamServer:
    def __init__(self, cfg: InstrumentConfig) -> None:
        self.cfg = cfg
        self.templates = Templates()
        self.serial = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests = 0
        self.connections = 0
        self.logs: list[StreamLog] = []
        self.heap: list[tuple[float, int, _Stream]] = []
        self.pacer: asyncio.Task[None] | None = None
        self.server: asyncio.AbstractServer | None = None
        self.auth = b"Bearer " + cfg.api_key.encode() if cfg.api_key else None

    # ------------------------------------------------------------ routing
    def handle(self, conn: StreamServerConn, method: bytes, path: bytes, body: bytes) -> None:
        if path == b"/v1/completions" and method == b"POST":
            self.completion(conn, body)
        elif path == b"/health":
            conn.write(http_head(200, "OK", JSON, False, 0))
        elif path == b"/v1/models":
            conn.write(json_response(200, "OK", {"object": "list", "data": [
                {"id": "instrument", "object": "model", "owned_by": "studyc", "root": "instrument"}]}))
        elif path == b"/_instrument/stats":
            conn.write(json_response(200, "OK", self.stats()))
        elif path == b"/_instrument/reset" and method == b"POST":
            self.reset()
            conn.write(json_response(200, "OK", {"success": True}))
        elif path == b"/_instrument/dump" and method == b"POST":
            n = self.dump()
            conn.write(json_response(200, "OK", {"streams": n, "path": self.cfg.send_log}))
        else:
            conn.write(json_response(404, "Not Found", error_body(404, "not found")))

    def stats(self) -> dict[str, Any]:
        return {"requests": self.requests, "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                "connections": self.connections, "streams_logged": len(self.logs)}

    def reset(self) -> None:
        self.logs = []
        self.max_in_flight = self.in_flight
        self.requests = 0
        self.connections = 0

    def dump(self) -> int:
        logs, self.logs = self.logs, []
        if self.cfg.send_log:
            tmp = self.cfg.send_log + ".tmp"
            with open(tmp, "w") as f:
                for log in logs:
                    f.write(log.as_json())
                    f.write("\n")
            os.replace(tmp, self.cfg.send_log)
        return len(logs)

    # ------------------------------------------------------------ completions
    def completion(self, conn: StreamServerConn, body: bytes) -> None:
        cfg = self.cfg
        self.serial += 1
        self.requests += 1
        serial = self.serial
        t_req = _now()
        try:
            req = json.loads(body)
            prompt = req.get("prompt", "")
            max_tokens = int(req.get("max_tokens") or 16)
            model_name = str(req.get("model") or "instrument")
            stream = bool(req.get("stream"))
            include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
            ask = req.get("instrument") or {}
        except (ValueError, TypeError, AttributeError) as e:
            conn.write(json_response(400, "Bad Request", error_body(400, f"bad request body: {e}")))
            return
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())

        def every(n: int) -> bool:
            return n > 0 and serial % n == 0

        fail = ask.get("fail_status") or (cfg.fail_status if every(cfg.fail_every) else None)
        if fail:
            conn.write(json_response(int(fail), "Error", error_body(int(fail), "injected failure")))
            return
        stop_after: int | None = None
        fault: str | None = None
        for name, n_every, after in (
            ("hang", cfg.hang_every, cfg.hang_after),
            ("disconnect", cfg.disconnect_every, cfg.disconnect_after),
            ("error", cfg.error_every, cfg.error_after),
        ):
            if f"{name}_after" in ask:
                fault, stop_after = name, int(ask[f"{name}_after"])
            elif every(n_every) and fault is None:
                fault, stop_after = name, after

        model = json.dumps(model_name).encode()
        per = max(1, cfg.tokens_per_chunk)
        first = first_chunk(model, serial, max_tokens, per)
        rest, joined = self.templates.chunks(model, max_tokens, per)
        span = b'"id":"cmpl-%s","object":"text_completion","created":%d' % (
            uuid.uuid4().hex[:16].encode(), int(time.time()))
        usage = frame(usage_event(model, prompt_tokens, max_tokens)) if include_usage else b""
        log = StreamLog(serial, prompt_key(prompt), t_req, max_tokens, fault=fault)
        if cfg.keep_log:
            self.logs.append(log)
        if not stream:
            text = "".join(f" w{(j * 7 + 13) % 4000 + 4}" for j in range(max_tokens))
            conn.write(json_response(200, "OK", {
                "id": "cmpl-" + uuid.uuid4().hex[:16], "object": "text_completion", "created": int(time.time()),
                "model": model_name, "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                          "total_tokens": prompt_tokens + max_tokens}}))
            log.chunks = 1
            log.t_end = _now()
            return
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        conn.busy = True
        itl = float(ask["itl_ms"]) / 1e3 if "itl_ms" in ask else cfg.itl_s
        st = _Stream(conn, log, span, first, rest, usage, itl, stop_after, fault)
        head = http_head(200, "OK", SSE, True)
        if itl <= 0 and fault is None and not cfg.per_chunk_writes:
            # Burst: the whole response in one write (the fastest a server could ever stream).
            data = head + (first + joined).replace(ID_SPAN, span) + usage.replace(ID_SPAN, span) \
                + DONE_FRAMED + END
            t = _now()
            conn.write(data)
            log.chunks = 1 + len(rest)
            log.times = array("d", [t]) * log.chunks if cfg.keep_log else array("d")
            self._done(st)
            return
        conn.write(head)
        self._schedule(st, _now() + (cfg.ttft_s if itl > 0 else 0.0))

    def _schedule(self, st: _Stream, due: float) -> None:
        heapq.heappush(self.heap, (due, st.log.serial, st))
        if self.pacer is None or self.pacer.done():
            self.pacer = asyncio.get_running_loop().create_task(self._pace())

    async def _pace(self) -> None:
        # Busy-polls the loop while streams are paced: uvloop's timers tick in whole milliseconds,
        # far too coarse for 1 ms gaps. The instrument owns its core, so spinning costs nothing.
        heap = self.heap
        while heap:
            now = _now()
            while heap and heap[0][0] <= now:
                due, serial, st = heapq.heappop(heap)
                if self._send_next(st):
                    nxt = due + st.itl
                    heapq.heappush(heap, (nxt if st.itl > 0 else now, serial, st))
            if heap:
                wait = heap[0][0] - _now()
                await asyncio.sleep(wait - 0.0015 if wait > 0.002 else 0)

    def _send_next(self, st: _Stream) -> bool:
        """Send the stream's next chunk; False when it is finished (or abandoned)."""
        conn = st.conn
        if conn.transport is None:  # client went away
            st.log.fault = st.log.fault or "client closed"
            self._done(st)
            return False
        if st.stop_after is not None and st.i >= st.stop_after:
            if st.fault == "hang":
                st.log.t_end = _now()
                self.in_flight -= 1  # counted as ended for in-flight purposes; the socket stays open
                return False
            if st.fault == "disconnect":
                conn.transport.abort()
                self._done(st)
                return False
            if st.fault == "error":
                err = json.dumps(error_body(500, "Internal server error")).encode()
                conn.write(frame(b"data: " + err + b"\n\n") + DONE_FRAMED + END)
                self._done(st)
                return False
        i = st.i
        chunk = st.first if i == 0 else st.rest[i - 1]
        last = i == len(st.rest)
        data = chunk.replace(ID_SPAN, st.span)
        if last:
            data += st.usage.replace(ID_SPAN, st.span) + DONE_FRAMED + END
        t = _now()
        conn.write(data)
        if self.cfg.keep_log:
            st.log.times.append(t)
        st.i = i + 1
        st.log.chunks = st.i
        if last:
            self._done(st)
            return False
        return True

    def _done(self, st: _Stream) -> None:
        st.log.t_end = _now()
        st.conn.busy = False
        self.in_flight -= 1
        if st.conn.buf and st.conn.transport is not None:  # a pipelined request waits
            st.conn.data_received(b"")

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: StreamServerConn(self), HOST, self.cfg.port,
                                               reuse_address=True, backlog=4096)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.pacer is not None:
            self.pacer.cancel()
