"""Headless Chromium driven over the DevTools protocol (a tiny CDP client on aiohttp's websockets):
load a page, collect console errors, uncaught exceptions, failed loads and dialogs, and report which
charts drew an <svg>.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--mute-audio",
)  # fmt: skip

CHARTS_JS = """(() => Array.from(document.querySelectorAll('div.chart')).map(el => ({
  id: el.id, drawn: el.getAttribute('data-drawn'), svg: el.querySelector('svg') !== null,
  marks: el.querySelectorAll('svg .mark-symbol path, svg .mark-line path, svg .mark-rect path, svg .mark-rule line').length
})))()"""


def chromium_missing() -> str | None:
    if shutil.which("chromium") is None:
        return "headless Chromium not installed: run scripts/setup_chromium.sh"
    return None


@dataclass
class PageReport:
    url: str
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, failed loads, dialogs
    warnings: list[str] = field(default_factory=list)
    charts: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""
    text: str = ""


class Cdp:
    """One page target: calls are answered in order; events seen meanwhile are kept."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    async def _receive(self, timeout: float) -> dict[str, Any]:
        msg = await self.ws.receive(timeout=timeout)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise RuntimeError(f"DevTools connection closed: {msg.type}")
        return json.loads(msg.data)

    async def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        call_id = self.next_id
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        while True:
            msg = await self._receive(max(0.1, deadline - time.monotonic()))
            if msg.get("id") == call_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    async def wait_event(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e["method"] == name for e in self.events):
            msg = await self._receive(max(0.1, deadline - time.monotonic()))
            if "method" in msg:
                self.events.append(msg)

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")


def _problems(events: list[dict[str, Any]], report: PageReport) -> None:
    for e in events:
        method, p = e["method"], e.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            if p.get("type") in ("error", "assert"):
                report.errors.append(f"console.{p['type']}: {text}")
            elif p.get("type") == "warning":
                report.warnings.append(f"console.warn: {text}")
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            report.errors.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Log.entryAdded":
            entry = p.get("entry", {})
            if entry.get("level") == "error":
                report.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())
            elif entry.get("level") == "warning":
                report.warnings.append(f"log: {entry.get('text')}")
        elif method == "Page.javascriptDialogOpening":
            report.errors.append(f"dialog opened: {p.get('type')} {p.get('message')}")
        elif method == "Network.loadingFailed":
            report.errors.append(f"load failed: {p.get('errorText')} ({p.get('requestId')})")


class Browser:
    def __init__(self, port: int) -> None:
        self.port = port

    async def _load(self, url: str, timeout: float, chart_timeout: float) -> PageReport:
        async with aiohttp.ClientSession() as http:
            async with http.put(f"http://127.0.0.1:{self.port}/json/new?about:blank") as resp:
                target = await resp.json(content_type=None)
            try:
                async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    cdp = Cdp(ws)
                    for domain in ("Runtime", "Log", "Page", "Network"):
                        await cdp.call(f"{domain}.enable")
                    cdp.events.clear()
                    await cdp.call("Page.navigate", url=url)
                    await cdp.wait_event("Page.loadEventFired", timeout)
                    report = PageReport(url)
                    deadline = time.monotonic() + chart_timeout
                    while True:  # vega-embed draws asynchronously after load
                        report.charts = await cdp.evaluate(CHARTS_JS) or []
                        if all(c["drawn"] for c in report.charts) or time.monotonic() > deadline:
                            break
                        await asyncio.sleep(0.1)
                    await asyncio.sleep(0.3)  # let late console messages arrive
                    await cdp.evaluate("1")
                    report.title = await cdp.evaluate("document.title") or ""
                    report.text = await cdp.evaluate("document.body.innerText") or ""
                    _problems(cdp.events, report)
                    return report
            finally:
                async with http.get(f"http://127.0.0.1:{self.port}/json/close/{target['id']}") as resp:
                    await resp.read()

    def load(self, path: Path, timeout: float = 60.0, chart_timeout: float | None = None) -> PageReport:
        """Open a file; wait up to `timeout` for its load event, then up to `chart_timeout` (default the
        same) for every chart to report drawn."""
        return asyncio.run(self._load(path.resolve().as_uri(), timeout, timeout if chart_timeout is None else chart_timeout))


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium with remote debugging on a free port, stopped (its process only) at exit."""
    with tempfile.TemporaryDirectory(prefix="studyc-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
                    raise RuntimeError(f"chromium did not start (exit {proc.poll()}): {err}")
                time.sleep(0.1)
            yield Browser(int(port_file.read_text().split()[0]))
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop Chromium and the helpers it started (its own session's process group), so none still
    writes into the profile folder while it is removed."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:  # helpers of the group may outlive the browser briefly
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
