"""Loopback streaming instrument: a minimal OpenAI-compatible `/v1/completions` SSE server that
streams vLLM 0.32's exact chunk format at a set inter-token interval and logs its own send times.

The load generator's self-test (`runner.load.loadgen_limit`), its tests and `benchmarks/loadgen_ceiling.py`
drive it. Faults on demand (an HTTP error, a hung stream, a dropped connection, an error event)
exercise what a real server cannot be made to do. It binds 127.0.0.1 only.

    python -m runner.load.instrument --port 0 --itl-ms 1 --send-log sends.jsonl --cpu 0
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
from array import array
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Self

from runner.load.stream_server import HOST, InstrumentConfig, StreamLog, StreamServer


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
        self._server: StreamServer | None = None
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
            self._server = StreamServer(self.cfg)
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
    ap = argparse.ArgumentParser(prog="python -m runner.load.instrument", description=__doc__.split("\n\n")[0])
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
    server = StreamServer(cfg)
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
