"""The load generator's HTTP client: keep-alive connections on raw asyncio protocols, one streamed
`/v1/completions` request at a time each, read by `runner.load.sse` with one clock reading per socket read.

`Client.request` never raises for what happens to a request: it appends an `Outcome` (and returns it).

Replicas: a Client may hold several targets (the servers of one launch) and a `Balancer`
(`runner.load.balance`) that picks one per request; a later turn of a conversation asks for the replica
its first turn went to.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from runner.load.balance import BALANCE_POLICIES, Balancer
from runner.load.sse import ProtocolError, ResponseScanner
from runner.load.workload import RequestSpec

__all__ = [
    "BALANCE_POLICIES", "NOT_SENT", "POINT_TIMEOUT", "TIMEOUT", "Balancer", "Client", "Outcome", "Endpoint",
    "make_target", "now",
]

now = time.monotonic  # CLOCK_MONOTONIC: comparable across processes on one host

# Error texts the runner may match on.
TIMEOUT = "timeout"
POINT_TIMEOUT = "point_timeout"
NOT_SENT = "not sent: point timeout"

PREPARED_BYTES = 256 * 2**20  # the most a worker holds of bodies encoded ahead of the window


class Outcome(NamedTuple):
    """One request as a worker saw it; compact so that it crosses a process pipe cheaply.

    `runs` packs (read time, content chunks in that read) pairs as doubles (`array("d")` bytes).
    """

    request_index: int
    warmup: bool
    scheduled_s: float
    sent_s: float
    first_token_s: float | None
    end_s: float
    runs: bytes
    prompt_tokens: int
    output_tokens: int
    chunks: int
    ok: bool
    error: str | None
    status: int | None
    replica: int = 0  # index of the target (server) that answered it


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    path: str
    header: bytes  # request line + fixed headers, up to "Content-Length: "
    body_base: dict[str, Any]


def make_target(base_url: str, model: str, api_key: str | None, extra_body: Mapping | None) -> Endpoint:
    u = urlsplit(base_url)
    if u.scheme != "http":
        raise ValueError(f"base_url must be http://host:port (got {base_url!r})")
    host = u.hostname or "127.0.0.1"
    port = u.port or 80
    path = (u.path.rstrip("/") or "") + "/v1/completions"
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    header = (
        f"POST {path} HTTP/1.1\r\nHost: {hostport}\r\nUser-Agent: studyc-loadgen\r\n"
        f"Accept: text/event-stream\r\nContent-Type: application/json\r\n{auth}Content-Length: "
    ).encode()
    body: dict[str, Any] = {
        "model": model,
        "prompt": None,
        "max_tokens": None,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if extra_body:
        body.update(extra_body)
    return Endpoint(host, port, path, header, body)


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time. The hot path is data_received."""

    __slots__ = ("alive", "end", "err", "first", "fut", "got", "runs", "scan", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.scan = ResponseScanner()
        self.runs = array("d")  # (read time, content chunks in that read) pairs
        self.first: float | None = None
        self.fut: asyncio.Future[None] | None = None
        self.end = 0.0
        self.err: str | None = None
        self.alive = True
        self.got = False  # any byte of the current response arrived

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        t = now()
        fut = self.fut
        if fut is None:  # bytes while idle: the connection is out of step; drop it
            self.alive = False
            self.transport.abort()  # type: ignore[union-attr]
            return
        self.got = True
        scan = self.scan
        try:
            n = scan.feed(data)
        except ProtocolError as e:
            self._finish(t, f"protocol error: {e}")
            self.alive = False
            self.transport.abort()  # type: ignore[union-attr]
            return
        if n:
            if self.first is None:
                self.first = t
            runs = self.runs
            runs.append(t)
            runs.append(n)
        if scan.complete:
            self._finish(t, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        if self.fut is None:
            return
        t = now()
        self.scan.eof()
        if self.scan.complete:
            self._finish(t, None)
        else:
            why = f": {exc}" if exc else ""
            self._finish(t, f"disconnected{why}" if self.got else f"connection closed before response{why}")

    def _finish(self, t: float, err: str | None) -> None:
        fut = self.fut
        if fut is None:
            return
        self.fut = None
        self.end = t
        self.err = err
        if not fut.done():
            fut.set_result(None)

    def start(self, fut: asyncio.Future[None]) -> None:
        self.scan = ResponseScanner()
        self.runs = array("d")
        self.first = None
        self.err = None
        self.got = False
        self.fut = fut

    def cancel(self, why: str) -> None:
        """Abort the request in flight (timeout): the connection cannot be reused."""
        self.alive = False
        self._finish(now(), why)
        if self.transport is not None:
            self.transport.abort()


class Client:
    """Sends requests to one target over a pool of keep-alive connections, on the running loop.

    `arm(deadline)` bounds everything: past it, requests in flight are aborted ("point_timeout")
    and `expired` tells the caller to send no more.
    """

    def __init__(self, target: Endpoint | tuple[Endpoint, ...], request_timeout_s: float,
                 balancer: Balancer | None = None) -> None:
        self.targets = target if isinstance(target, tuple) else (target,)
        self.target = self.targets[0]
        self.balancer = balancer if balancer is not None else Balancer("least_outstanding", len(self.targets))
        if self.balancer.n != len(self.targets):
            raise ValueError(f"the balancer has {self.balancer.n} targets, the client {len(self.targets)}")
        self.request_timeout_s = request_timeout_s
        self.outcomes: list[Outcome] = []
        self.pools: list[list[_Conn]] = [[] for _ in self.targets]
        self.idle = self.pools[0]
        self.active: set[_Conn] = set()
        self._expired = False
        self.deadline = math.inf
        self._base = dict(self.target.body_base)
        self._dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode
        self._prepared: list[bytes] = []

    def _body(self, spec: RequestSpec) -> bytes:
        """The request's body with its Content-Length value in front: the same for every replica."""
        body = self._base
        body["prompt"] = spec.prompt_ids
        body["max_tokens"] = spec.max_tokens
        b = self._dumps(body).encode()
        return str(len(b)).encode() + b"\r\n\r\n" + b

    def prepare(self, specs: Sequence[RequestSpec], most_bytes: int = PREPARED_BYTES) -> int:
        """Encode the measured requests' bodies now, before the window opens. Encoding a wave of
        long prompts at send time stalls the loop (c128 x 1,024 tokens: ~16 ms in the window's
        first millisecond, benchmarks/prepared_bodies.py). Stops at `most_bytes`; the rest are
        encoded when sent. Returns how many were prepared."""
        prepared: list[bytes] = []
        total = 0
        for spec in specs:
            b = self._body(spec)
            total += len(b)
            if total > most_bytes:
                break
            prepared.append(b)
        self._prepared = prepared
        return len(prepared)

    def _encode(self, index: int, spec: RequestSpec, warmup: bool, replica: int = 0) -> bytes:
        prepared = self._prepared
        if not warmup and index < len(prepared):
            return self.targets[replica].header + prepared[index]
        return self.targets[replica].header + self._body(spec)

    async def _connect(self, timeout: float, replica: int = 0) -> _Conn:
        loop = asyncio.get_running_loop()
        tgt = self.targets[replica]
        _, conn = await asyncio.wait_for(
            loop.create_connection(_Conn, tgt.host, tgt.port), timeout=max(timeout, 0.001)
        )
        return conn

    async def request(self, index: int, spec: RequestSpec, warmup: bool, scheduled: float,
                      replica: int | None = None) -> Outcome:
        """Send one request and record its outcome; `replica`: this server, not the balancer's pick."""
        if len(self.targets) == 1:
            return await self._request(index, spec, warmup, scheduled, 0)
        replica = self.balancer.pick() if replica is None else self.balancer.hold(replica)
        try:
            return await self._request(index, spec, warmup, scheduled, replica)
        finally:
            self.balancer.release(replica)

    async def _request(self, index: int, spec: RequestSpec, warmup: bool, scheduled: float, replica: int) -> Outcome:
        loop = asyncio.get_running_loop()
        payload = self._encode(index, spec, warmup, replica)
        idle = self.pools[replica]
        sent = now()
        limit = min(sent + self.request_timeout_s, self.deadline)
        why_late = TIMEOUT if sent + self.request_timeout_s <= self.deadline else POINT_TIMEOUT
        for attempt in (0, 1):
            conn = None
            while idle:
                c = idle.pop()
                if c.alive and not c.transport.is_closing():  # type: ignore[union-attr]
                    conn = c
                    break
            reused = conn is not None
            if conn is None:
                try:
                    conn = await self._connect(limit - now(), replica)
                except TimeoutError:
                    return self._failed(index, warmup, scheduled, sent, why_late, replica)
                except OSError as e:
                    return self._failed(index, warmup, scheduled, sent, f"connect failed: {e}", replica)
            if attempt:
                sent = now()
            fut = loop.create_future()
            conn.start(fut)
            self.active.add(conn)
            timer = at(loop, limit, conn.cancel, why_late)
            conn.transport.write(payload)  # type: ignore[union-attr]
            try:
                await fut
            finally:
                timer.cancel()
                self.active.discard(conn)
            # A pooled connection the server had already closed: retry once on a fresh one.
            if reused and not conn.got and conn.err is not None and conn.err.startswith("connection closed"):
                continue
            break
        assert conn is not None  # each pass binds a connection or returns
        err = conn.err
        scan = conn.scan
        if conn.alive and err is None and scan.complete and scan.keep_alive:
            idle.append(conn)  # the response was read to its end: reusable
        elif conn.alive and conn.transport is not None:
            conn.alive = False
            conn.transport.close()
        if err is None:
            err = scan.failure()
        out = Outcome(
            index, warmup, scheduled, sent, conn.first, conn.end, conn.runs.tobytes(), scan.prompt_tokens,
            scan.output_tokens, scan.chunks, err is None, err, scan.status, replica,
        )
        self.outcomes.append(out)
        return out

    def _failed(self, index: int, warmup: bool, scheduled: float, sent: float, err: str, replica: int = 0) -> Outcome:
        out = Outcome(index, warmup, scheduled, sent, None, now(), b"", 0, 0, 0, False, err, None, replica)
        self.outcomes.append(out)
        return out

    def arm(self, deadline: float) -> None:
        self.deadline = deadline
        if math.isfinite(deadline):
            at(asyncio.get_running_loop(), deadline, self._expire)

    @property
    def expired(self) -> bool:
        """Past the deadline. The clock is read too: a request's own timer at the deadline can fire
        before the point's, and the slot it frees must not send another request."""
        return self._expired or now() >= self.deadline

    def _expire(self) -> None:
        if self._expired:
            return
        self._expired = True
        for conn in list(self.active):
            conn.cancel(POINT_TIMEOUT)

    def close(self) -> None:
        for pool in self.pools:
            for c in pool:
                if c.transport is not None:
                    c.transport.close()
            pool.clear()


class _At:
    """A one-shot timer at a time.monotonic() instant. uvloop's clock ticks in whole milliseconds,
    so a timer can fire up to 1 ms early: it re-arms until the instant has really passed."""

    __slots__ = ("args", "fn", "handle", "loop", "when")

    def __init__(self, loop: asyncio.AbstractEventLoop, when: float, fn: Callable[..., None], args: tuple) -> None:
        self.loop = loop
        self.when = when
        self.fn = fn
        self.args = args
        self.handle = loop.call_later(max(when - now(), 0.0), self._fire)

    def _fire(self) -> None:
        left = self.when - now()
        if left > 0:
            self.handle = self.loop.call_later(left, self._fire)
        else:
            self.fn(*self.args)

    def cancel(self) -> None:
        self.handle.cancel()


def at(loop: asyncio.AbstractEventLoop, when: float, fn: Callable[..., None], *args: Any) -> _At:
    """Call `fn(*args)` on `loop` once time.monotonic() has reached `when`."""
    return _At(loop, when, fn, args)
