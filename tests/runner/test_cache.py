"""Prefix-cache control: the hit rate and the cold verdict from counters, the reset's answer rules,
and retries against a local HTTP endpoint that refuses on demand. (The real reset on the CPU vLLM
server is in test_metrics.py.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runner.checks import cache
from runner.checks.cache import CacheState


def test_hit_rate_needs_both_counters_and_queries() -> None:
    assert CacheState(True, 200.0, 50.0).hit_rate == 0.25
    assert CacheState(True, 200.0, 0.0).hit_rate == 0.0
    assert CacheState(True, 0.0, 0.0).hit_rate is None
    assert CacheState(True, None, 1.0).hit_rate is None
    assert CacheState(True, 1.0, None).hit_rate is None


def test_cold_verdicts_and_reasons() -> None:
    assert CacheState(True, 100.0, 1.0).cold(0.01) == (True, "hit rate 1.00% (max 1.00%)")
    assert CacheState(True, 100.0, 2.0).cold(0.01)[0] is False
    assert CacheState(False, 100.0, 0.0).cold(0.01) == (False, "reset refused")
    assert CacheState(None, 100.0, 0.0).cold(0.01) == (False, "no reset")
    assert CacheState(True, None, 0.0).cold(0.01) == (False, "prefix-cache counters missing: cannot verify")
    assert CacheState(True, 5.0, None).cold(0.01)[0] is False
    assert CacheState(True, 0.0, 0.0).cold(0.01) == (False, "no prefix-cache queries in the window: cannot verify")


def test_cold_with_prefix_caching_off() -> None:
    """An engine with --no-enable-prefix-caching looks nothing up: no lookups and no hits verify it; a hit
    fails; missing counters or a refused reset stay what they are; lookups counted are judged as usual."""
    off = "prefix caching off (--no-enable-prefix-caching): no lookups, no hits"
    assert CacheState(True, 0.0, 0.0).cold(0.01, caching=False) == (True, off)
    assert CacheState(True, 0.0, 1.0).cold(0.01, caching=False) == (
        False, "prefix caching is off, yet the engine counted 1 hit tokens")
    assert CacheState(True, None, 0.0).cold(0.01, caching=False)[0] is False
    assert CacheState(True, 0.0, None).cold(0.01, caching=False)[0] is False
    assert CacheState(False, 0.0, 0.0).cold(0.01, caching=False) == (False, "reset refused")
    assert CacheState(True, 100.0, 2.0).cold(0.01, caching=False)[0] is False
    assert CacheState(True, 100.0, 1.0).cold(0.01, caching=False)[0] is True
    # One lookup counted: caching was on after all, judged by its hit rate (with caching on too).
    assert CacheState(True, 1.0, 0.0).cold(0.01, caching=False) == (True, "hit rate 0.00% (max 1.00%)")
    assert CacheState(True, 1.0, 0.0).cold(0.01) == (True, "hit rate 0.00% (max 1.00%)")


@pytest.mark.parametrize(
    ("status", "body", "ok"),
    [
        (200, '{"success": true}', True),
        (200, '{"success": false}', False),
        (200, '{"success": "true"}', False),
        (200, "[true]", False),
        (200, "not json", False),
        (500, '{"success": true}', False),
        (0, "", False),
    ],
)
def test_only_an_explicit_success_is_confirmed(status: int, body: str, ok: bool) -> None:
    assert cache.confirmed(status, body) is ok


class _Refuser(BaseHTTPRequestHandler):
    """Answers POST /reset_prefix_cache with success false `refusals` times, then true."""

    refusals = 0
    calls: list[str] = []

    def do_POST(self) -> None:
        type(self).calls.append(self.path + " " + (self.headers.get("Authorization") or ""))
        ok = len(type(self).calls) > type(self).refusals
        body = b'{"success": true}' if ok else b'{"success": false}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def refuser() -> Iterator[type[_Refuser]]:
    handler = type("Handler", (_Refuser,), {"refusals": 0, "calls": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.base_url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def test_reset_retries_until_confirmed(refuser: type[_Refuser]) -> None:
    refuser.refusals = 2
    got = cache.reset(refuser.base_url, "key", attempts=5, pause_s=0.0)  # type: ignore[attr-defined]
    assert got.ok and got.attempts == 3 and got.last is not None and got.last.ok
    assert refuser.calls == ["/reset_prefix_cache Bearer key"] * 3


def test_reset_gives_up_after_its_attempts(refuser: type[_Refuser]) -> None:
    refuser.refusals = 10
    got = cache.reset(refuser.base_url, None, attempts=2, pause_s=0.0)  # type: ignore[attr-defined]
    assert not got.ok and got.attempts == 2 and got.last is not None and got.last.status == 200
    assert len(refuser.calls) == 2 and refuser.calls[0] == "/reset_prefix_cache "


def test_reset_running_requests_flag_is_sent(refuser: type[_Refuser]) -> None:
    url = refuser.base_url + "/"  # type: ignore[attr-defined]
    assert cache.reset_prefix_cache(url, None, reset_running_requests=True).ok
    assert refuser.calls[0].startswith("/reset_prefix_cache?reset_running_requests=true")


def test_reset_without_a_server_is_not_ok() -> None:
    got = cache.reset("http://127.0.0.1:9", None, attempts=1, pause_s=0.0)
    assert not got.ok and got.last is not None and got.last.status == 0


def test_reset_all_asks_every_replica_and_fails_if_one_refuses(refuser: type[_Refuser]) -> None:
    """Each replica holds its own prefix cache: a launch's reset is confirmed only when every server
    confirmed it (resetting the first one alone left the others warm)."""
    url = refuser.base_url  # type: ignore[attr-defined]
    both = cache.reset_all((url, url + "/"), "key", attempts=1, pause_s=0.0)
    assert both.ok and both.attempts == 1 and len(refuser.calls) == 2
    down = cache.reset_all((url, "http://127.0.0.1:9"), "key", attempts=2, pause_s=0.0)
    assert not down.ok and down.attempts == 2 and down.last is not None and down.last.status == 0
    assert not cache.reset_all((), None).ok  # nothing asked: nothing confirmed


def test_reset_waits_longer_after_each_refusal_and_not_after_the_last(
        refuser: type[_Refuser], monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(cache.time, "sleep", slept.append)
    refuser.refusals = 10
    got = cache.reset(refuser.base_url, None, attempts=3, pause_s=0.5)  # type: ignore[attr-defined]
    assert got.ok is False and got.attempts == 3
    assert slept == [0.5, 1.0]  # a growing pause between attempts, none after the third
    assert got.last is not None and got.last.body == '{"success": false}'
    slept.clear()
    down = cache.reset_all((refuser.base_url,), "key", attempts=2, pause_s=0.25)  # type: ignore[attr-defined]
    assert down.ok is False and slept == [0.25]


def test_reset_all_sends_each_replica_the_key_at_its_own_path(refuser: type[_Refuser]) -> None:
    """A base URL with or without its trailing slash reaches /reset_prefix_cache; the first refusal is the
    answer kept, even when a later replica confirmed; nothing asked is no attempt and no answer."""
    url = refuser.base_url  # type: ignore[attr-defined]
    both = cache.reset_all((url, url + "/"), "key", attempts=1, pause_s=0.0)
    assert refuser.calls == ["/reset_prefix_cache Bearer key"] * 2
    assert both.last is not None and both.last.body == '{"success": true}'
    first_down = cache.reset_all(("http://127.0.0.1:9", url), "key", attempts=1, pause_s=0.0)
    assert first_down.ok is False and first_down.last is not None and first_down.last.status == 0
    nothing = cache.reset_all((), None)
    assert nothing.attempts == 0 and nothing.last is None
