"""Prefix-cache control: reset the engine's prefix cache before a point, then verify from the
engine's own counters that the point really ran cold.

`reset` asks (POST /reset_prefix_cache, retried while running requests still hold blocks);
`CacheState` holds what the counters said over the measured window; the `cache_cold` check
(`runner.checks.checks`) reads both and fails closed: a reset that was refused, counters that are missing,
or a window with no prefix-cache queries at all never pass as cold.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from runner.server.http import http_call

RESET_ATTEMPTS = 5

@dataclass(frozen=True)
class ResetResult:
    """One POST /reset_prefix_cache."""

    ok: bool
    status: int  # HTTP status; 0 when no answer came
    body: str


@dataclass(frozen=True)
class ResetOutcome:
    """The reset before a point: whether the engine confirmed it, after how many attempts."""

    ok: bool
    attempts: int
    last: ResetResult | None = None


def confirmed(status: int, body: str) -> bool:
    """True only for HTTP 200 with a JSON body `{"success": true}`."""
    if status != 200:
        return False
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("success") is True


def reset_prefix_cache(
    base_url: str, api_key: str | None, *, reset_running_requests: bool = False, timeout_s: float = 30.0
) -> ResetResult:
    """POST /reset_prefix_cache (needs VLLM_SERVER_DEV_MODE=1). ok only on `{"success": true}`.

    vLLM answers `{"success": false}` while requests still hold blocks; with
    `reset_running_requests` it preempts them first (vLLM >= 0.11 takes that query flag).
    """
    url = base_url.rstrip("/") + "/reset_prefix_cache"
    if reset_running_requests:
        url += "?reset_running_requests=true"
    status, body = http_call("POST", url, api_key, timeout_s)
    return ResetResult(ok=confirmed(status, body), status=status, body=body)


def reset(
    base_url: str, api_key: str | None, *, attempts: int = RESET_ATTEMPTS, pause_s: float = 0.2
) -> ResetOutcome:
    """Reset the prefix cache, retrying (with a growing pause) while blocks are still held."""
    last: ResetResult | None = None
    for attempt in range(1, attempts + 1):
        last = reset_prefix_cache(base_url, api_key)
        if last.ok:
            return ResetOutcome(ok=True, attempts=attempt, last=last)
        if attempt < attempts:
            time.sleep(pause_s * attempt)  # blocks still held by finishing requests
    return ResetOutcome(ok=False, attempts=attempts, last=last)


def reset_all(
    base_urls: tuple[str, ...], api_key: str | None, *, attempts: int = RESET_ATTEMPTS, pause_s: float = 0.2
) -> ResetOutcome:
    """Reset every server of a launch (each replica holds its own prefix cache). ok only when every
    one confirmed; attempts is the most any needed; last is the first refusal, else the last answer."""
    outcomes = [reset(url, api_key, attempts=attempts, pause_s=pause_s) for url in base_urls]
    failed = [o for o in outcomes if not o.ok]
    return ResetOutcome(ok=bool(outcomes) and not failed, attempts=max((o.attempts for o in outcomes), default=0),
                        last=(failed[0] if failed else outcomes[-1]).last if outcomes else None)


@dataclass(frozen=True)
class CacheState:
    """The prefix cache over a measured window: the reset before it (None: not asked for) and the
    engine's hit and query counter deltas (tokens; None where the engine did not export them)."""

    reset_ok: bool | None
    queries: float | None
    hits: float | None

    @property
    def hit_rate(self) -> float | None:
        """hits / queries; None when a counter is missing or there were no queries."""
        if self.queries is None or self.hits is None or self.queries <= 0:
            return None
        return self.hits / self.queries

    def cold(self, max_hit_rate: float, caching: bool = True) -> tuple[bool, str]:
        """(verified cold?, why). Cold only when the reset was confirmed AND the counters show
        queries with a hit rate of at most `max_hit_rate`. Anything unverifiable is not cold. With
        `caching` False (the engine runs with --no-enable-prefix-caching) there is no cache to look up:
        the counters showing no lookups and no hits are what verifies it."""
        if self.reset_ok is not True:
            return False, "reset refused" if self.reset_ok is False else "no reset"
        if self.queries is None or self.hits is None:
            return False, "prefix-cache counters missing: cannot verify"
        if self.queries <= 0 and not caching:
            if self.hits > 0:
                return False, f"prefix caching is off, yet the engine counted {self.hits:g} hit tokens"
            return True, "prefix caching off (--no-enable-prefix-caching): no lookups, no hits"
        if self.queries <= 0:
            return False, "no prefix-cache queries in the window: cannot verify"
        rate = self.hits / self.queries
        return rate <= max_hit_rate, f"hit rate {100 * rate:.2f}% (max {100 * max_hit_rate:.2f}%)"
