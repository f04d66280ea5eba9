"""Headless Chromium driven over the DevTools protocol (a tiny CDP client on aiohttp's websockets):
load a page, collect console errors, uncaught exceptions, failed loads and dialogs, and report which
charts drew an <svg>.
"""

from __future__ import annotations

import asyncio
import base64
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


# The forest plot as drawn: per row (in order), the screen extent of its shaded band, its interval bar and its
# estimate dot (null where the row has none), and the text of an empty row.
FOREST_JS = r"""(() => {
  const svg = document.querySelector("#chart-forest svg");
  if (!svg) return null;
  const box = sel => {
    const e = svg.querySelector(sel);
    if (!e) return null;
    const r = e.getBoundingClientRect();
    return {left: r.left, right: r.right, width: r.width};
  };
  const groups = Array.from(svg.querySelectorAll("g.role-scope")).filter(g => /concat_\d+_group/.test(g.className.baseVal));
  return groups.map((g, i) => ({
    band: box(`.band_${i}_marks path`), interval: box(`.interval_${i}_marks line`),
    estimate: box(`.estimate_${i}_marks path`),
    empty: (svg.querySelector(`.empty_${i}_marks text`) || {textContent: null}).textContent,
  }));
})()"""


# Layout of a page at the current viewport, as a performance engineer reads it: where the verdict cells
# are, which tables are wider than the block that holds them, and how numbers sit under their headers.
# A number cell is a table.list cell whose text is one quantity ("1,024", "0.978x", "98.4%",
# "6.63 ms", "189.3 tok/s", "[0.9x, 1.1x]", "187.5–191.0 tok/s"), whatever its class says.
LAYOUT_JS = r"""(() => {
  const W = window.innerWidth;
  const NUM = /^[\[(]?[-+\u2212]?\d[\d,]*(\.\d+)?(\s?(x|%|ms|s|tok\/s|GB\/s|TFLOP\/s|B|kB|MB|GB))?([,\u2013]\s?[-+\u2212]?\d[\d,]*(\.\d+)?(\s?(x|%|ms|s|tok\/s|GB\/s|TFLOP\/s|B|kB|MB|GB))?)?[\])]?(\s?(x|%|ms|s|tok\/s|GB\/s))?$/;
  const clipRight = el => {  // the right edge of what is visible of el: viewport and clipping ancestors
    let right = W;
    for (let a = el.parentElement; a; a = a.parentElement) {
      const ox = getComputedStyle(a).overflowX;
      if (ox !== "visible") right = Math.min(right, a.getBoundingClientRect().right);
    }
    return right;
  };
  const verdicts = Array.from(document.querySelectorAll("table td .verdict")).map(v => {
    const td = v.closest("td"), r = td.getBoundingClientRect();
    return {text: v.textContent.trim(), left: r.left, right: r.right, visible_right: clipRight(td),
            row: td.parentElement.rowIndex};
  });
  const tables = Array.from(document.querySelectorAll("main table")).map(t => {
    const box = t.parentElement;
    return {cls: t.className, width: t.getBoundingClientRect().width, container: box.clientWidth,
            scroll: t.scrollWidth, container_class: box.className};
  });
  const numbers = [];
  document.querySelectorAll("main table.list").forEach(t => {
    const head = t.tHead ? t.tHead.rows[0] : null;
    Array.from(t.tBodies).forEach(b => Array.from(b.rows).forEach(tr => Array.from(tr.cells).forEach(td => {
      const text = td.innerText.trim().split("\n")[0].trim();
      if (!NUM.test(text) || td.colSpan > 1) return;
      const th = head && head.cells.length === tr.cells.length ? head.cells[td.cellIndex] : null;
      const align = c => getComputedStyle(c).textAlign;
      numbers.push({table: t.className, text: text, align: align(td),
                    header: th ? th.innerText.trim() : null, header_align: th ? align(th) : null});
    })));
  });
  return {width: W, page_width: document.documentElement.scrollWidth, verdicts: verdicts, tables: tables,
          numbers: numbers};
})()"""


def layout_problems(layout: dict[str, Any]) -> list[str]:
    """What is wrong with a page's layout at its viewport width, one line each; [] when nothing is."""
    out = []
    width = layout["width"]
    if layout["page_width"] > width + 1:
        out.append(f"page scrolls sideways: {layout['page_width']} px wide in a {width} px viewport")
    for v in layout["verdicts"]:
        right = min(width, v["visible_right"])
        if v["left"] < 0 or v["right"] > right + 1:
            out.append(f"verdict cell {v['text']!r} (row {v['row']}) spans {v['left']:.0f}-{v['right']:.0f} px, "
                       f"visible only to {right:.0f} px")
    for t in layout["tables"]:
        if max(t["width"], t["scroll"]) > t["container"] + 1:
            out.append(f"table.{t['cls'] or '(none)'} is {max(t['width'], t['scroll']):.0f} px wide in a "
                       f"{t['container']} px container ({t['container_class'] or 'no class'})")
    for n in layout["numbers"]:
        if n["align"] not in ("right", "end"):
            out.append(f"number {n['text']!r} in table.{n['table']} is aligned {n['align']}")
        if n["header"] is not None and n["header_align"] not in ("right", "end"):
            out.append(f"header {n['header']!r} over number {n['text']!r} in table.{n['table']} is aligned "
                       f"{n['header_align']}")
    return out


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
    probe: Any = None  # what the `probe` script passed to `load` returned, after the charts drew


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

    async def _load(self, url: str, timeout: float, chart_timeout: float, probe: str | None) -> PageReport:
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
                    report.probe = await cdp.evaluate(probe) if probe else None
                    _problems(cdp.events, report)
                    return report
            finally:
                async with http.get(f"http://127.0.0.1:{self.port}/json/close/{target['id']}") as resp:
                    await resp.read()

    async def _layout(self, url: str, width: int, height: int, screenshot: Path | None) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http:
            async with http.put(f"http://127.0.0.1:{self.port}/json/new?about:blank") as resp:
                target = await resp.json(content_type=None)
            try:
                async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    cdp = Cdp(ws)
                    await cdp.call("Page.enable")
                    await cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                                   deviceScaleFactor=1, mobile=False)
                    await cdp.call("Page.navigate", url=url)
                    await cdp.wait_event("Page.loadEventFired", 60)
                    deadline = time.monotonic() + 60
                    while time.monotonic() < deadline:  # charts change the layout as they draw
                        charts = await cdp.evaluate(CHARTS_JS) or []
                        if all(c["drawn"] for c in charts):
                            break
                        await asyncio.sleep(0.1)
                    layout: dict[str, Any] = await cdp.evaluate(LAYOUT_JS)
                    if screenshot is not None:
                        shot = await cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                                              clip={"x": 0, "y": 0, "width": width, "scale": 1,
                                                    "height": await cdp.evaluate(
                                                        "document.documentElement.scrollHeight")})
                        screenshot.write_bytes(base64.b64decode(shot["data"]))
                    return layout
            finally:
                async with http.get(f"http://127.0.0.1:{self.port}/json/close/{target['id']}") as resp:
                    await resp.read()

    def layout(self, path: Path, width: int, height: int = 900, screenshot: Path | None = None) -> dict[str, Any]:
        """The page's layout at a `width` px viewport (see LAYOUT_JS); with `screenshot`, the whole page
        as a PNG there."""
        return asyncio.run(self._layout(path.resolve().as_uri(), width, height, screenshot))

    def load(self, path: Path, timeout: float = 60.0, chart_timeout: float | None = None,
             probe: str | None = None) -> PageReport:
        """Open a file; wait up to `timeout` for its load event, then up to `chart_timeout` (default the
        same) for every chart to report drawn; then run the `probe` script, if any (PageReport.probe)."""
        return asyncio.run(self._load(path.resolve().as_uri(), timeout,
                                      timeout if chart_timeout is None else chart_timeout, probe))


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
