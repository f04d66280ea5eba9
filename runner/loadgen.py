"""studyc's load generator: streams `/v1/completions` requests at a closed-loop concurrency or an
open-loop arrival rate and returns one frozen record per request, with the arrival time of every
content-bearing SSE chunk. The runner turns a point's records into its statistics.

Speed is a requirement (it must never be what a study measures): raw asyncio protocols on uvloop, a
bytes-level HTTP/SSE reader (`runner.sse`) that never parses a chunk's JSON, one clock reading per
socket read, and worker processes (each with its own event loop) when one core is not enough.
`benchmarks/loadgen_ceiling.py` measures all of this against `vllm bench serve`.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import hashlib
import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import urlsplit

from runner.records import RequestRecord
from runner.sse import ProtocolError, ResponseScanner

__all__ = [
    "LoadResult",
    "RequestRecord",
    "RequestSpec",
    "auto_workers",
    "make_prompts",
    "run_load",
]

_now = time.monotonic  # CLOCK_MONOTONIC: comparable across processes on one host

# Error texts the runner may match on.
TIMEOUT = "timeout"
POINT_TIMEOUT = "point_timeout"
NOT_SENT = "not sent: point timeout"


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request: a token-id prompt (exact input length) and the number of tokens to generate."""

    prompt_ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class LoadResult:
    """All records of one point (warmup ones flagged), and the measured window."""

    records: tuple[RequestRecord, ...]
    window_start_s: float  # first measured send
    window_end_s: float  # last measured end
    workers: int
    timed_out: bool

    @property
    def measured(self) -> tuple[RequestRecord, ...]:
        return tuple(r for r in self.records if not r.warmup)


# --------------------------------------------------------------------------------------- prompts
def make_prompts(
    n: int,
    input_len: int,
    *,
    vocab_lo: int,
    vocab_hi: int,
    seed: int,
    prefix_len: int = 0,
    salt: str = "",
) -> list[tuple[int, ...]]:
    """Deterministic token-id prompts of exactly `input_len` ids in [vocab_lo, vocab_hi).

    All prompts share their first `prefix_len` ids (drawn from seed and salt); after that, each
    prompt differs from every other one at position `prefix_len` (and `prefix_len + 1` once `n`
    exceeds the vocabulary), so no two share a leading block beyond the prefix. Prompts made with
    different salts come from independent random streams: the chance that two of them share their
    first 16 ids is about V**-16, i.e. none.
    """
    if not 0 <= prefix_len <= input_len:
        raise ValueError(f"prefix_len {prefix_len} must be within [0, input_len={input_len}]")
    vocab = vocab_hi - vocab_lo
    if vocab < 2:
        raise ValueError(f"vocabulary [{vocab_lo}, {vocab_hi}) too small")
    free = input_len - prefix_len
    if n > 1 and (free == 0 or (free == 1 and n > vocab) or n > vocab * vocab):
        raise ValueError(f"cannot make {n} distinct prompts with {free} ids after the prefix")
    digest = hashlib.sha256(f"studyc-prompts|{seed}|{salt}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:16], "big"))
    lo = vocab_lo
    prefix = [lo + rng.randrange(vocab) for _ in range(prefix_len)]
    first = list(range(lo, vocab_hi))
    rng.shuffle(first)
    second = list(range(lo, vocab_hi))
    rng.shuffle(second)
    out: list[tuple[int, ...]] = []
    rand = rng.randrange
    for i in range(n):
        ids = prefix.copy()
        if free:
            ids.append(first[i % vocab])
            if free > 1:
                ids.append(second[(i // vocab) % vocab] if n > vocab else lo + rand(vocab))
                ids.extend([lo + rand(vocab) for _ in range(free - 2)])
        out.append(tuple(ids))
    return out


# ------------------------------------------------------------------------------------- arrivals
def arrival_times(n: int, rate_rps: float, *, arrival: str = "poisson", burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Seeded arrival offsets (seconds from the start; the first request at 0).

    `poisson`: exponential gaps; `gamma`: gamma gaps with shape `burstiness` (< 1 burstier, > 1 more
    regular) and the same mean 1/rate, as `vllm bench serve` draws them; `constant`: equal gaps.
    """
    if not rate_rps > 0 or math.isinf(rate_rps):
        raise ValueError(f"rate_rps must be a positive finite number, got {rate_rps}")
    if arrival not in ("poisson", "gamma", "constant"):
        raise ValueError(f"arrival must be poisson, gamma or constant, got {arrival!r}")
    if arrival == "gamma" and not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    rng = random.Random(seed)
    scale = 1.0 / (rate_rps * burstiness)
    t = 0.0
    out = []
    for _ in range(n):
        out.append(t)
        if arrival == "poisson":
            t += rng.expovariate(rate_rps)
        elif arrival == "gamma":
            t += rng.gammavariate(burstiness, scale)
        else:
            t += 1.0 / rate_rps
    return out


# --------------------------------------------------------------------------------------- client
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
        t = _now()
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
        t = _now()
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
        self._finish(_now(), why)
        if self.transport is not None:
            self.transport.abort()


# compact record: (index, warmup, scheduled, sent, first, end, runs bytes, prompt_tokens,
#                  output_tokens, chunks, ok, error, status)
_Row = tuple


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    path: str
    header: bytes  # request line + fixed headers, up to "Content-Length: "
    body_base: dict[str, Any]


def _target(base_url: str, model: str, api_key: str | None, extra_body: Mapping | None) -> _Target:
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
    return _Target(host, port, path, header, body)


@dataclass(frozen=True)
class _Plan:
    """Everything one worker needs; pickled to worker processes."""

    target: _Target
    specs: tuple[RequestSpec, ...]  # all measured requests (workers pull indices)
    warmup: tuple[tuple[int, RequestSpec], ...]  # this worker's warmup (index, spec)
    warmup_concurrency: int
    concurrency: int | None  # closed loop: this worker's slots; open loop: its in-flight cap or None
    open_loop: tuple[tuple[int, float], ...] | None  # this worker's (index, offset from t0)
    request_timeout_s: float
    busy_poll: bool = False
    cpus: tuple[int, ...] | None = None


class _Worker:
    """Runs a plan on one event loop."""

    def __init__(self, plan: _Plan, take: Callable[[], int | None]) -> None:
        self.plan = plan
        self.take = take
        self.rows: list[_Row] = []
        self.idle: list[_Conn] = []
        self.active: set[_Conn] = set()
        self.expired = False
        self.spinning = False
        self.deadline = math.inf
        tgt = plan.target
        self._header = tgt.header
        self._base = dict(tgt.body_base)
        self._dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode

    # ---------------------------------------------------------------- one request
    def _encode(self, spec: RequestSpec) -> bytes:
        body = self._base
        body["prompt"] = spec.prompt_ids
        body["max_tokens"] = spec.max_tokens
        b = self._dumps(body).encode()
        return self._header + str(len(b)).encode() + b"\r\n\r\n" + b

    async def _connect(self, timeout: float) -> _Conn:
        loop = asyncio.get_running_loop()
        tgt = self.plan.target
        _, conn = await asyncio.wait_for(
            loop.create_connection(_Conn, tgt.host, tgt.port), timeout=max(timeout, 0.001)
        )
        return conn

    async def request(self, index: int, spec: RequestSpec, warmup: bool, scheduled: float) -> None:
        loop = asyncio.get_running_loop()
        payload = self._encode(spec)
        sent = _now()
        limit = min(sent + self.plan.request_timeout_s, self.deadline)
        why_late = TIMEOUT if sent + self.plan.request_timeout_s <= self.deadline else POINT_TIMEOUT
        for attempt in (0, 1):
            conn = None
            while self.idle:
                c = self.idle.pop()
                if c.alive and not c.transport.is_closing():  # type: ignore[union-attr]
                    conn = c
                    break
            reused = conn is not None
            if conn is None:
                try:
                    conn = await self._connect(limit - _now())
                except TimeoutError:
                    self._row(index, warmup, scheduled, sent, None, _now(), None, why_late)
                    return
                except OSError as e:
                    self._row(index, warmup, scheduled, sent, None, _now(), None, f"connect failed: {e}")
                    return
            if attempt:
                sent = _now()
            fut = loop.create_future()
            conn.start(fut)
            self.active.add(conn)
            timer = _at(loop, limit, conn.cancel, why_late)
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
        end = conn.end
        err = conn.err
        scan = conn.scan
        if conn.alive and err is None and scan.complete and scan.keep_alive:
            self.idle.append(conn)  # the response was read to its end: reusable
        elif conn.alive and conn.transport is not None:
            conn.alive = False
            conn.transport.close()
        if err is None:
            err = scan.failure()
        self.rows.append((
            index, warmup, scheduled, sent, conn.first, end, conn.runs.tobytes(), scan.prompt_tokens,
            scan.output_tokens, scan.chunks, err is None, err, scan.status,
        ))

    def _row(self, index: int, warmup: bool, scheduled: float, sent: float, first: float | None,
             end: float, status: int | None, err: str) -> None:
        self.rows.append((index, warmup, scheduled, sent, first, end, b"", 0, 0, 0, False, err, status))

    # ---------------------------------------------------------------- loops
    async def run_warmup(self, deadline: float) -> None:
        if not self.plan.warmup:
            return
        self._arm(deadline)
        items = list(self.plan.warmup)
        it = iter(items)

        async def slot() -> None:
            for index, spec in it:
                if self.expired:
                    return
                await self.request(index, spec, True, _now())

        await asyncio.gather(*(slot() for _ in range(max(1, self.plan.warmup_concurrency))))

    async def run_measured(self, t0: float, deadline: float) -> None:
        self._arm(deadline)
        spinner = None
        if self.plan.busy_poll:
            spinner = asyncio.get_running_loop().create_task(self._spin())
        try:
            if self.plan.open_loop is None:
                await self._closed()
            else:
                await self._open(t0)
        finally:
            self.spinning = False
            if spinner is not None:
                await spinner

    async def _spin(self) -> None:
        # A ready callback on every pass makes the loop poll sockets with a zero timeout, so the
        # worker never sleeps in epoll_wait and wakes up ~4x sooner when a chunk lands.
        self.spinning = True
        while self.spinning:
            await asyncio.sleep(0)

    async def _closed(self) -> None:
        specs = self.plan.specs
        take = self.take

        async def slot() -> None:
            while not self.expired:
                i = take()
                if i is None:
                    return
                await self.request(i, specs[i], False, _now())

        await asyncio.gather(*(slot() for _ in range(max(1, self.plan.concurrency or 1))))

    async def _open(self, t0: float) -> None:
        specs = self.plan.specs
        cap = self.plan.concurrency
        sem = asyncio.Semaphore(cap) if cap else None
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()

        async def capped(i: int, at: float) -> None:
            try:
                await self.request(i, specs[i], False, at)
            finally:
                sem.release()  # type: ignore[union-attr]

        for i, offset in self.plan.open_loop or ():
            at = t0 + offset
            # uvloop's timers tick in whole milliseconds: sleep to 1 ms short, then yield-spin.
            delay = at - _now()
            if delay > 0.0015:
                await asyncio.sleep(delay - 0.001)
            while _now() < at and not self.expired:
                await asyncio.sleep(0)
            if self.expired:
                break
            if sem is not None:
                await sem.acquire()
                if self.expired:
                    sem.release()
                    break
                task = loop.create_task(capped(i, at))
            else:
                task = loop.create_task(self.request(i, specs[i], False, at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    def _arm(self, deadline: float) -> None:
        self.deadline = deadline
        if math.isfinite(deadline):
            loop = asyncio.get_running_loop()
            _at(loop, deadline, self._expire)

    def _expire(self) -> None:
        if self.expired:
            return
        self.expired = True
        for conn in list(self.active):
            conn.cancel(POINT_TIMEOUT)

    def close(self) -> None:
        for c in self.idle:
            if c.transport is not None:
                c.transport.close()
        self.idle.clear()


class _At:
    """A one-shot timer at a time.monotonic() instant. uvloop's clock ticks in whole milliseconds,
    so a timer can fire up to 1 ms early: it re-arms until the instant has really passed."""

    __slots__ = ("args", "fn", "handle", "loop", "when")

    def __init__(self, loop: asyncio.AbstractEventLoop, when: float, fn: Callable[..., None], args: tuple) -> None:
        self.loop = loop
        self.when = when
        self.fn = fn
        self.args = args
        self.handle = loop.call_later(max(when - _now(), 0.0), self._fire)

    def _fire(self) -> None:
        left = self.when - _now()
        if left > 0:
            self.handle = self.loop.call_later(left, self._fire)
        else:
            self.fn(*self.args)

    def cancel(self) -> None:
        self.handle.cancel()


def _at(loop: asyncio.AbstractEventLoop, when: float, fn: Callable[..., None], *args: Any) -> _At:
    return _At(loop, when, fn, args)


# -------------------------------------------------------------------------------- orchestration
def auto_workers(concurrency: int | None, rate_rps: float | None, n_requests: int, *,
                 cpus: int | None = None) -> int:
    """Worker processes for a point when the caller does not say.

    One uvloop worker reads 1.0-1.4 M SSE chunks/s when reads coalesce, and spends ~5 us per read
    when each chunk arrives alone (~200 k reads/s; reads coalesce as load rises), on one core of
    this kind (benchmarks/README.md): far above what a server streams. Beyond 512 streams in flight
    add a worker per 512, up to the CPUs this process may use, leaving one for the runner.
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if concurrency is not None:
        streams = concurrency
    elif rate_rps is None:
        streams = n_requests  # all at once
    else:
        streams = 512  # open loop without a cap: in flight depends on the server; one worker
    want = max(1, math.ceil(streams / 512))
    return max(1, min(want, cpus - 1 if cpus > 2 else 1))


def _setup_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


class _LocalCounter:
    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0

    def __call__(self) -> int | None:
        i = self.i
        if i >= self.n:
            return None
        self.i = i + 1
        return i


class _FileCounter:
    """The next measured index, shared by worker processes: 8 bytes in a file under flock(2)."""

    def __init__(self, path: str, n: int) -> None:
        self.fd = os.open(path, os.O_RDWR)
        self.n = n

    def __call__(self) -> int | None:
        fd = self.fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            i = int.from_bytes(os.pread(fd, 8, 0), "little")
            if i >= self.n:
                return None
            os.pwrite(fd, (i + 1).to_bytes(8, "little"), 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return i


def _worker_main(fd: int) -> None:
    """A worker process (`python -m runner.loadgen --worker FD`): warm up, report, wait for go,
    measure, send its rows back over the socket FD."""
    gc.disable()
    pipe = Connection(fd)
    plan, counter_path, n, deadline = pipe.recv()
    if plan.cpus:
        os.sched_setaffinity(0, plan.cpus)
    loop = _setup_loop()
    asyncio.set_event_loop(loop)
    worker = _Worker(plan, _FileCounter(counter_path, n))
    try:
        loop.run_until_complete(worker.run_warmup(deadline))
        pipe.send(("warm",))
        msg = pipe.recv()
        if msg[0] == "go":
            loop.run_until_complete(worker.run_measured(msg[1], deadline))
        worker.close()
        loop.run_until_complete(asyncio.sleep(0))
        pipe.send(("rows", worker.rows, worker.expired))
    finally:
        loop.close()
        pipe.close()


def _run_inprocess(plans: list[_Plan], n: int, deadline: float) -> tuple[list[_Row], bool]:
    """workers=0: the single worker on this process's own thread (no spawn; for tests and debugging)."""
    result: list[_Row] = []
    expired = False

    def body() -> None:
        nonlocal expired
        loop = _setup_loop()
        frozen = gc.isenabled()
        gc.disable()
        try:
            worker = _Worker(plans[0], _LocalCounter(n))
            loop.run_until_complete(worker.run_warmup(deadline))
            loop.run_until_complete(worker.run_measured(_now(), deadline))
            worker.close()
            loop.run_until_complete(asyncio.sleep(0))
            result.extend(worker.rows)
            expired = worker.expired
        finally:
            loop.close()
            if frozen:
                gc.enable()

    try:
        asyncio.get_running_loop()
        in_loop = True
    except RuntimeError:
        in_loop = False
    if in_loop:  # called from async code: keep its loop free, run ours on a thread
        th = threading.Thread(target=body, name="studyc-loadgen")
        th.start()
        th.join()
    else:
        body()
    return result, expired


def _run_processes(plans: list[_Plan], n: int, deadline: float) -> tuple[list[_Row], bool]:
    # Each worker is `python -m runner.loadgen --worker FD`: no fork (the runner may hold threads
    # and locks) and no re-import of the caller's __main__ (multiprocessing's spawn would).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    cfd, counter_path = tempfile.mkstemp(prefix="studyc-loadgen-", dir=shm)
    os.write(cfd, bytes(8))
    os.close(cfd)
    pipes: list[Connection] = []
    procs: list[subprocess.Popen] = []
    rows: list[_Row] = []
    timed_out = False
    grace = 30.0
    try:
        for plan in plans:
            mine, theirs = socket.socketpair()
            p = subprocess.Popen(
                [sys.executable, "-m", "runner.loadgen", "--worker", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=env, close_fds=True,
            )
            theirs.close()
            procs.append(p)
            pipe = Connection(mine.detach())
            pipes.append(pipe)
            pipe.send((plan, counter_path, n, deadline))
        live = []
        for pipe in pipes:
            try:
                if _poll(pipe, deadline + grace):
                    pipe.recv()
                    live.append(pipe)
            except (EOFError, OSError):
                pass  # the worker died: its requests are filled in as lost
        t0 = _now() + 0.002
        for pipe in live:
            pipe.send(("go", t0))
        for pipe in live:
            try:
                if _poll(pipe, deadline + grace):
                    _, got, expired = pipe.recv()
                    rows.extend(got)
                    timed_out = timed_out or expired
                else:
                    timed_out = True
            except (EOFError, OSError):
                pass
    finally:
        for pipe in pipes:
            pipe.close()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        os.unlink(counter_path)
    return rows, timed_out


def _poll(pipe: Any, until: float) -> bool:
    left = until - _now()
    return bool(pipe.poll(None if math.isinf(left) else max(left, 0.0)))


def run_load(
    base_url: str,
    model: str,
    requests: Sequence[RequestSpec],
    *,
    api_key: str | None = None,
    concurrency: int | None = None,
    rate_rps: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    warmup: Sequence[RequestSpec] = (),
    request_timeout_s: float = 600.0,
    point_timeout_s: float | None = None,
    workers: int | None = None,
    extra_body: Mapping | None = None,
    busy_poll: bool = False,
    cpus: Collection[int] | None = None,
) -> LoadResult:
    """Run one load point and return a record per request (warmup ones flagged); never raises for
    what happens to requests.

    Closed loop (`rate_rps` None): `concurrency` requests in flight until all are done; with neither
    given, all requests at once. Open loop: arrivals from a seeded process at `rate_rps`
    (`arrival`: poisson, gamma with shape `burstiness`, or constant), the first at the start; a
    `concurrency` given with a rate caps the requests in flight. Warmup runs first, to completion,
    at `concurrency` (or all at once) and stays out of the window. A request past
    `request_timeout_s` is aborted and recorded as "timeout"; when `point_timeout_s` runs out, the
    requests in flight are aborted ("point_timeout") and the unsent ones recorded as not sent.

    `workers`: processes, each with its own event loop, sharing concurrency and requests; None picks
    by concurrency (`auto_workers`); 0 runs on this process's thread without spawning.
    `busy_poll`: keep each worker's loop spinning through the measured window (a core at 100% per
    worker) so chunk timestamps are taken ~6 us after arrival instead of ~25 us; only where the load
    generator has cores of its own (never beside a CPU vLLM server on a 2-core machine).
    `cpus`: pin the worker processes to these CPUs (e.g. {1} on a 2-core machine, where a CPU vLLM
    pins its model thread to core 0); None leaves them where this process may run.
    """
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if request_timeout_s <= 0:
        raise ValueError("request_timeout_s must be > 0")
    target = _target(base_url, model, api_key, extra_body)
    specs = tuple(requests)
    n = len(specs)
    wspecs = tuple(warmup)
    open_loop = rate_rps is not None
    pinned = tuple(sorted(cpus)) if cpus else None
    if workers is None:
        workers = auto_workers(concurrency, rate_rps, n, cpus=len(pinned) if pinned else None)
    inprocess = workers == 0
    nw = max(1, min(workers, max(n, 1))) if not inprocess else 1
    if not open_loop:
        conc = concurrency if concurrency is not None else max(n, 1)
        nw = min(nw, conc)
    start = _now()
    deadline = start + point_timeout_s if point_timeout_s is not None else math.inf

    # Split: closed-loop slots and warmup evenly; open-loop arrivals round-robin in time order.
    offsets = arrival_times(n, rate_rps, arrival=arrival, burstiness=burstiness, seed=seed) \
        if rate_rps is not None else None
    wconc = concurrency if concurrency is not None else max(len(wspecs), 1)
    plans = []
    for w in range(nw):
        if offsets is not None:  # open loop
            share = tuple((i, offsets[i]) for i in range(w, n, nw))
            cap = _share(concurrency, w, nw) if concurrency is not None else None
        else:
            share = None
            cap = _share(conc, w, nw)
        plans.append(_Plan(
            target=target,
            specs=specs,
            warmup=tuple((i, wspecs[i]) for i in range(w, len(wspecs), nw)),
            warmup_concurrency=max(1, _share(wconc, w, nw)),
            concurrency=cap,
            open_loop=share,
            request_timeout_s=request_timeout_s,
            busy_poll=busy_poll,
            cpus=pinned,
        ))

    if inprocess:
        rows, timed_out = _run_inprocess(plans, n, deadline)
    else:
        rows, timed_out = _run_processes(plans, n, deadline)
    timed_out = timed_out or any(r[11] in (POINT_TIMEOUT, NOT_SENT) for r in rows)
    return _assemble(rows, specs, wspecs, offsets, deadline, nw, timed_out)


def _share(total: int, w: int, nw: int) -> int:
    return total // nw + (1 if w < total % nw else 0)


def _assemble(rows: list[_Row], specs: Sequence[RequestSpec], wspecs: Sequence[RequestSpec],
              offsets: list[float] | None, deadline: float, nw: int, timed_out: bool) -> LoadResult:
    seen_m: dict[int, _Row] = {}
    seen_w: dict[int, _Row] = {}
    for r in rows:
        (seen_w if r[1] else seen_m)[r[0]] = r
    t_fill = deadline if math.isfinite(deadline) else _now()
    first_sent = min((r[3] for r in rows if not r[1]), default=t_fill)
    records: list[RequestRecord] = []
    for pool, count, warm in ((seen_w, len(wspecs), True), (seen_m, len(specs), False)):
        for i in range(count):
            row = pool.get(i)
            if row is None:  # never sent (point timeout) or lost with a dead worker
                sched = first_sent + offsets[i] if (offsets is not None and not warm) else t_fill
                why = NOT_SENT if timed_out else "lost: worker process died"
                records.append(RequestRecord(i, warm, sched, t_fill, None, t_fill, (), 0, 0, 0, False,
                                             why, None))
                continue
            records.append(RequestRecord(
                index=row[0], warmup=row[1], scheduled_s=row[2], sent_s=row[3], first_token_s=row[4],
                end_s=row[5], token_times_s=_expand(row[6]), prompt_tokens=row[7], output_tokens=row[8],
                chunks=row[9], ok=row[10], error=row[11], status=row[12],
            ))
    measured = [r for r in records if not r.warmup and r.error != NOT_SENT]
    w0 = min((r.sent_s for r in measured), default=t_fill)
    w1 = max((r.end_s for r in measured), default=t_fill)
    return LoadResult(tuple(records), w0, w1, nw, timed_out)


def _expand(runs: bytes) -> tuple[float, ...]:
    if not runs:
        return ()
    a = array("d")
    a.frombytes(runs)
    out: list[float] = []
    ext = out.extend
    for k in range(0, len(a), 2):
        c = int(a[k + 1])
        if c == 1:
            out.append(a[k])
        else:
            ext(repeat(a[k], c))
    return tuple(out)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        from runner.loadgen import _worker_main as entry  # the importable module, not this __main__ copy

        entry(int(sys.argv[2]))
    else:
        sys.exit("usage: python -m runner.loadgen --worker FD (started by run_load)")
