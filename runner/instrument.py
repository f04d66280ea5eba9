"""Loopback streaming instrument: a minimal OpenAI-compatible `/v1/completions` SSE server that
streams vLLM 0.32's exact chunk format at a set inter-token interval and logs its own send times.

The load generator's self-test (`runner.loadgen_limit`), its tests and `benchmarks/loadgen_ceiling.py`
drive it. Faults on demand (an HTTP error, a hung stream, a dropped connection, an error event)
exercise what a real server cannot be made to do. It binds 127.0.0.1 only.

    python -m runner.instrument --port 0 --itl-ms 1 --send-log sends.jsonl --cpu 0
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import json
import os
import signal
import sys
import threading
import time
import uuid
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from email.utils import formatdate
from typing import Any, Self

__all__ = ["Instrument", "InstrumentConfig", "StreamLog", "prompt_key", "read_send_log"]

HOST = "127.0.0.1"
_now = time.monotonic
_ID_SPAN = b'"id":"cmpl-0000000000000000","object":"text_completion","created":1000000000'


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


# ------------------------------------------------------------------------------ wire format
def _frame(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def _content_event(model: bytes, text: str, finish: str | None) -> bytes:
    fin = b"null" if finish is None else b'"' + finish.encode() + b'"'
    return (
        b"data: {" + _ID_SPAN + b',"model":' + model + b',"choices":[{"index":0,"text":'
        + json.dumps(text).encode() + b',"logprobs":null,"finish_reason":' + fin
        + b',"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}\n\n'
    )


class _Templates:
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
                out.append(_frame(_content_event(model, text, "length" if c == n_chunks - 1 else None)))
            got = (out, b"".join(out))
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[k] = got
        return got


def _first_chunk(model: bytes, serial: int, max_tokens: int, per: int) -> bytes:
    # The first word names the stream's serial: a client that keeps generated text (vllm bench's
    # --save-detailed) can be paired with this send log through it.
    n = min(per, max_tokens)
    text = f" w{serial}" + "".join(f" w{(j * 7 + 13) % 4000 + 4}" for j in range(1, n))
    return _frame(_content_event(model, text, "length" if max_tokens <= per else None))


def _usage_event(model: bytes, prompt_tokens: int, completion_tokens: int) -> bytes:
    return (
        b"data: {" + _ID_SPAN + b',"model":' + model + b',"choices":[],"usage":{"prompt_tokens":%d,'
        b'"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}},'
        b'"system_fingerprint":"studyc-instrument"}\n\n'
    ) % (prompt_tokens, prompt_tokens + completion_tokens, completion_tokens)


_DONE_FRAMED = _frame(b"data: [DONE]\n\n")
_END = b"0\r\n\r\n"


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


def _head(status: int, reason: str, ctype: bytes, chunked: bool, length: int = 0) -> bytes:
    framing = b"transfer-encoding: chunked\r\n" if chunked else b"content-length: %d\r\n" % length
    return (b"HTTP/1.1 %d %s\r\ndate: %s\r\nserver: uvicorn\r\ncontent-type: %s\r\nvary: Origin\r\n%s\r\n"
            % (status, reason.encode(), _dates.get(), ctype, framing))


_SSE = b"text/event-stream; charset=utf-8"
_JSON = b"application/json"


def _json_response(status: int, reason: str, obj: Any) -> bytes:
    body = json.dumps(obj).encode()
    return _head(status, reason, _JSON, False, len(body)) + body


def _error_body(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": "InstrumentError", "param": None, "code": status}}


# ---------------------------------------------------------------------------------- server
class _Stream:
    __slots__ = ("conn", "fault", "first", "i", "itl", "log", "rest", "span", "stop_after", "usage")

    def __init__(self, conn: _ServerConn, log: StreamLog, span: bytes, first: bytes, rest: list[bytes],
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


class _ServerConn(asyncio.Protocol):
    def __init__(self, server: _Server) -> None:
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
                self.transport.write(_json_response(400, "Bad Request", _error_body(400, "bad request")))
                self.transport.close()
                return
            server = self.server
            if server.auth is not None and head[0].startswith(b"POST /v1/") and not _authorized(head, server.auth):
                self.transport.write(_json_response(401, "Unauthorized", {"error": "Unauthorized"}))
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


class _Server:
    def __init__(self, cfg: InstrumentConfig) -> None:
        self.cfg = cfg
        self.templates = _Templates()
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
    def handle(self, conn: _ServerConn, method: bytes, path: bytes, body: bytes) -> None:
        if path == b"/v1/completions" and method == b"POST":
            self.completion(conn, body)
        elif path == b"/health":
            conn.write(_head(200, "OK", _JSON, False, 0))
        elif path == b"/v1/models":
            conn.write(_json_response(200, "OK", {"object": "list", "data": [
                {"id": "instrument", "object": "model", "owned_by": "studyc", "root": "instrument"}]}))
        elif path == b"/_instrument/stats":
            conn.write(_json_response(200, "OK", self.stats()))
        elif path == b"/_instrument/reset" and method == b"POST":
            self.reset()
            conn.write(_json_response(200, "OK", {"success": True}))
        elif path == b"/_instrument/dump" and method == b"POST":
            n = self.dump()
            conn.write(_json_response(200, "OK", {"streams": n, "path": self.cfg.send_log}))
        else:
            conn.write(_json_response(404, "Not Found", _error_body(404, "not found")))

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
    def completion(self, conn: _ServerConn, body: bytes) -> None:
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
            conn.write(_json_response(400, "Bad Request", _error_body(400, f"bad request body: {e}")))
            return
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())

        def every(n: int) -> bool:
            return n > 0 and serial % n == 0

        fail = ask.get("fail_status") or (cfg.fail_status if every(cfg.fail_every) else None)
        if fail:
            conn.write(_json_response(int(fail), "Error", _error_body(int(fail), "injected failure")))
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
        first = _first_chunk(model, serial, max_tokens, per)
        rest, joined = self.templates.chunks(model, max_tokens, per)
        span = b'"id":"cmpl-%s","object":"text_completion","created":%d' % (
            uuid.uuid4().hex[:16].encode(), int(time.time()))
        usage = _frame(_usage_event(model, prompt_tokens, max_tokens)) if include_usage else b""
        log = StreamLog(serial, prompt_key(prompt), t_req, max_tokens, fault=fault)
        if cfg.keep_log:
            self.logs.append(log)
        if not stream:
            text = "".join(f" w{(j * 7 + 13) % 4000 + 4}" for j in range(max_tokens))
            conn.write(_json_response(200, "OK", {
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
        head = _head(200, "OK", _SSE, True)
        if itl <= 0 and fault is None and not cfg.per_chunk_writes:
            # Burst: the whole response in one write (the fastest a server could ever stream).
            data = head + (first + joined).replace(_ID_SPAN, span) + usage.replace(_ID_SPAN, span) \
                + _DONE_FRAMED + _END
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
                err = json.dumps(_error_body(500, "Internal server error")).encode()
                conn.write(_frame(b"data: " + err + b"\n\n") + _DONE_FRAMED + _END)
                self._done(st)
                return False
        i = st.i
        chunk = st.first if i == 0 else st.rest[i - 1]
        last = i == len(st.rest)
        data = chunk.replace(_ID_SPAN, st.span)
        if last:
            data += st.usage.replace(_ID_SPAN, st.span) + _DONE_FRAMED + _END
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
        self.server = await loop.create_server(lambda: _ServerConn(self), HOST, self.cfg.port,
                                               reuse_address=True, backlog=4096)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.pacer is not None:
            self.pacer.cancel()


def _pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})  # pid 0 = the calling thread


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()


class Instrument:
    """The instrument on a background thread of this process (tests, self-test).

        with Instrument(InstrumentConfig(itl_s=0.001)) as inst:
            run_load(inst.base_url, "m", specs)
            logs = inst.send_log()
    """

    def __init__(self, cfg: InstrumentConfig | None = None, **kw: Any) -> None:
        cfg = cfg or InstrumentConfig()
        self.cfg = replace(cfg, **kw) if kw else cfg
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: _Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> Self:
        ready = threading.Event()
        err: list[Exception] = []

        def main() -> None:
            _pin(self.cfg.cpu)
            loop = _new_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._server = _Server(self.cfg)
            try:
                self.port = loop.run_until_complete(self._server.start())
            except Exception as e:
                err.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._server.stop())
            loop.close()

        self._thread = threading.Thread(target=main, name="studyc-instrument", daemon=True)
        self._thread.start()
        ready.wait()
        if err:
            raise err[0]
        return self

    def _call(self, fn: Any) -> Any:
        assert self._loop is not None

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def stats(self) -> dict[str, Any]:
        return self._call(lambda: self._server.stats())  # type: ignore[union-attr]

    def reset(self) -> None:
        self._call(lambda: self._server.reset())  # type: ignore[union-attr]

    def send_log(self) -> list[StreamLog]:
        """A copy of the streams logged so far, in arrival order."""
        return self._call(lambda: [replace(x, times=array("d", x.times)) for x in self._server.logs])  # type: ignore[union-attr]

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------------- CLI
def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runner.instrument", description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    ap.add_argument("--itl-ms", type=float, default=0.0, help="gap between chunks; 0 = one write per response")
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--per-chunk-writes", action="store_true", help="with --itl-ms 0: one write per chunk")
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--send-log", default=None, help="JSON lines of per-stream send times (POST /_instrument/dump)")
    ap.add_argument("--no-log", action="store_true", help="keep no send log (saves memory in long bursts)")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this core")
    ap.add_argument("--api-key", default=None)
    for name in ("fail", "hang", "disconnect", "error"):
        ap.add_argument(f"--{name}-every", type=int, default=0)
    ap.add_argument("--fail-status", type=int, default=500)
    a = ap.parse_args(list(argv) if argv is not None else None)
    cfg = InstrumentConfig(
        port=a.port, itl_s=a.itl_ms / 1e3, ttft_s=a.ttft_ms / 1e3, tokens_per_chunk=a.tokens_per_chunk,
        per_chunk_writes=a.per_chunk_writes,
        fail_every=a.fail_every, fail_status=a.fail_status, hang_every=a.hang_every,
        disconnect_every=a.disconnect_every, error_every=a.error_every, cpu=a.cpu, send_log=a.send_log,
        keep_log=not a.no_log, api_key=a.api_key,
    )
    _pin(cfg.cpu)
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    server = _Server(cfg)
    port = loop.run_until_complete(server.start())
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY {port}", flush=True)
    loop.run_until_complete(stop.wait())
    loop.run_until_complete(server.stop())
    if cfg.send_log and server.logs:
        server.dump()
    loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
