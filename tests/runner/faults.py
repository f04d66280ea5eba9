"""Fault makers for validity checks: faults on demand in front of, or beside, a REAL vLLM server.

Fakes exist only to make a fault happen; everything else (engine, counters, load generator) is real.

- `FaultProxy`: a reverse proxy on 127.0.0.1 that forwards everything to the server, streaming,
  except what its `Faults` say: answer `/reset_prefix_cache` with `{"success": false}`, or with
  `{"success": true}` without forwarding it (reset not done); hide counters from `/metrics`; answer
  the k-th completion itself without forwarding it (dropped: the server never sees it); send the
  k-th completion to the server twice (duplicated, as a retrying proxy would).
- `OtherClient`: a second client streaming requests to the same server on a thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from runner.server.engine import free_port

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


@dataclass
class Faults:
    reset: str | None = None  # None: forward; "false": answer success false; "fake": answer true, not forwarded
    hide_metrics: Sequence[str] = ()  # metric name prefixes removed from /metrics (HELP/TYPE lines too)
    drop: Sequence[int] = ()  # 0-based completion numbers answered by the proxy, never forwarded
    duplicate: Sequence[int] = ()  # completion numbers forwarded twice (the extra answer discarded)


@dataclass
class ProxyLog:
    completions: int = 0
    resets_seen: int = 0
    resets_forwarded: int = 0
    dropped: list[int] = field(default_factory=list)
    duplicated: list[int] = field(default_factory=list)


class FaultProxy:
    """A context manager: `with FaultProxy(upstream, Faults(...)) as proxy: proxy.base_url`."""

    def __init__(self, upstream: str, faults: Faults | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults = faults or Faults()
        self.port = free_port()
        self.log = ProxyLog()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._extra: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._main, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            self._session = session
            self._ready.set()
            await self._stop.wait()
            for t in list(self._extra):
                t.cancel()
        await runner.cleanup()

    # --------------------------------------------------------------------- routes
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        body = await request.read()
        if path == "/reset_prefix_cache" and request.method == "POST":
            self.log.resets_seen += 1
            if self.faults.reset == "false":
                return web.json_response({"success": False})
            if self.faults.reset == "fake":
                return web.json_response({"success": True})
            self.log.resets_forwarded += 1
        if path == "/metrics" and self.faults.hide_metrics:
            status, text = await self._fetch(request, body)
            keep = [ln for ln in text.splitlines() if not any(self._names(ln, m) for m in self.faults.hide_metrics)]
            return web.Response(status=status, text="\n".join(keep) + "\n", content_type="text/plain")
        if path == "/v1/completions" and request.method == "POST":
            k = self.log.completions
            self.log.completions += 1
            if k in self.faults.drop:
                self.log.dropped.append(k)
                return await self._answer_itself(request, body)
            if k in self.faults.duplicate:
                self.log.duplicated.append(k)
                task = asyncio.ensure_future(self._discard(request, body))
                self._extra.add(task)
                task.add_done_callback(self._extra.discard)
        return await self._forward(request, body)

    @staticmethod
    def _names(line: str, prefix: str) -> bool:
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            line = line[7:]
        return line.startswith(prefix)

    def _headers(self, request: web.Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k.lower() not in _HOP}

    async def _fetch(self, request: web.Request, body: bytes) -> tuple[int, str]:
        async with self._session.request(request.method, self.upstream + request.path_qs,
                                         headers=self._headers(request), data=body or None) as up:
            return up.status, await up.text()

    async def _forward(self, request: web.Request, body: bytes) -> web.StreamResponse:
        async with self._session.request(request.method, self.upstream + request.path_qs,
                                         headers=self._headers(request), data=body or None) as up:
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            for k, v in up.headers.items():
                if k.lower() not in _HOP:
                    resp.headers[k] = v
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def _discard(self, request: web.Request, body: bytes) -> None:
        async with self._session.request(request.method, self.upstream + request.path_qs,
                                         headers=self._headers(request), data=body) as up:
            await up.read()

    async def _answer_itself(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """A streamed completion in vLLM's format that never reached the server."""
        doc = json.loads(body)
        n = int(doc.get("max_tokens") or 1)
        prompt = doc.get("prompt")
        n_prompt = len(prompt) if isinstance(prompt, list) else 1
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {"id": "cmpl-proxy", "object": "text_completion", "created": int(time.time()), "model": doc.get("model")}
        for _ in range(n):
            event = base | {"choices": [{"index": 0, "text": " w", "logprobs": None, "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await asyncio.sleep(0.002)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
        await resp.write(b"data: " + json.dumps(base | {"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


class OtherClient:
    """Another client on the same server: sends streamed completions one after another on a
    thread until stopped. A context manager; `sent` counts requests it completed."""

    def __init__(self, base_url: str, api_key: str | None, model: str, prompt_ids: Sequence[int],
                 max_tokens: int = 16) -> None:
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.api_key = api_key
        self.body = json.dumps({"model": model, "prompt": list(prompt_ids), "max_tokens": max_tokens,
                                "ignore_eos": True, "temperature": 0, "stream": True}).encode()
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="other-client", daemon=True)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _run(self) -> None:
        headers: dict[str, Any] = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        while not self._stop.is_set():
            req = urllib.request.Request(self.url, data=self.body, headers=headers, method="POST")
            with self._opener.open(req, timeout=60) as resp:
                resp.read()
            self.sent += 1

    def wait_started(self, timeout_s: float = 30.0) -> None:
        """Block until the first request finished (the server is busy with this client)."""
        t_end = time.monotonic() + timeout_s
        while self.sent == 0 and time.monotonic() < t_end:
            time.sleep(0.01)

    def __enter__(self) -> OtherClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
