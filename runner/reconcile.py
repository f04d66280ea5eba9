"""Cross-instrument reconciliation: the server's own counters against the client's records.

Pure: two `/metrics` snapshots taken at the measured window's edges (the first after warmup and
any cache reset, the second after the last measured request ended) and the client's records of
that window in, typed results out. No I/O.

Counts must agree exactly: requests the server finished, prompt tokens, generation tokens, and
the counts of its latency histograms. Latency sums agree within `LatencyBound`: the client's
interval of a request contains the server's (vLLM starts its clock when the API server has parsed
the request and stops it when the engine's last output is processed; the client adds connect,
HTTP and SSE transport), so the mean per-request excess `client - server` must lie in
`[floor_s, abs_s + rel * server mean]`.

What a failure means: another client on the same server (the server counts more), a proxy that
retries or duplicates (more), a request answered without reaching the server (fewer), a lagging
client or something queueing in front of the server (client latencies exceed the server's by more
than transport). A counter the server does not export makes its item `unverified`, never `pass`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from runner.metrics import Snapshot

Status = Literal["pass", "fail", "unverified"]

REQUEST_SUCCESS = "vllm:request_success_total"  # label finished_reason: stop, length, abort, error, ...
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
E2E = "vllm:e2e_request_latency_seconds"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"

# Finish reasons of a request that ran to its end (vLLM 0.26 and 0.32 also count abort/error here).
COMPLETED_REASONS = ("length", "stop", "repetition")


class WindowRecord(Protocol):
    """The fields of a client request record that reconciliation reads."""

    @property
    def warmup(self) -> bool: ...
    @property
    def sent_s(self) -> float: ...
    @property
    def first_token_s(self) -> float | None: ...
    @property
    def end_s(self) -> float: ...
    @property
    def token_times_s(self) -> tuple[float, ...]: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def ok(self) -> bool: ...


@dataclass(frozen=True)
class LatencyBound:
    """Allowed mean per-request excess of the client's latency over the server's, in seconds.

    Defaults from the CPU server (tests/runner/test_reconcile.py, notes in benchmarks/README.md):
    window means of 1.5 to 6.5 ms per request at c1 to c16 on two shared cores, single requests
    up to 7.7 ms (e2e). The bound is about three times the largest window mean, plus 5% of the
    server's mean for long requests whose API-server event loop is busy.
    """

    abs_s: float = 0.020
    rel: float = 0.05
    floor_s: float = -0.001  # the client's interval contains the server's: only clock noise below 0

    def high(self, server_mean_s: float) -> float:
        return self.abs_s + self.rel * max(server_mean_s, 0.0)

    def describe(self) -> str:
        return f"mean client-server excess in [{self.floor_s * 1e3:g} ms, {self.abs_s * 1e3:g} ms + {self.rel:.0%}]"


@dataclass(frozen=True)
class Item:
    """One comparison between the two instruments."""

    name: str
    status: Status
    client: float | None
    server: float | None
    bound: str  # "exact" or LatencyBound.describe()
    message: str


@dataclass(frozen=True)
class Reconciliation:
    items: tuple[Item, ...]

    @property
    def status(self) -> Status:
        states = {i.status for i in self.items}
        if "fail" in states:
            return "fail"
        if "unverified" in states or not self.items:
            return "unverified"
        return "pass"

    @property
    def message(self) -> str:
        bad = [i for i in self.items if i.status != "pass"]
        if not self.items:
            return "nothing to reconcile"
        if not bad:
            return f"server counters agree with the client's records ({len(self.items)} comparisons)"
        return "; ".join(f"{i.name}: {i.message}" for i in bad)

    def item(self, name: str) -> Item:
        for i in self.items:
            if i.name == name:
                return i
        raise KeyError(name)


# ----------------------------------------------------------------------------------- helpers
def _delta(before: Snapshot, after: Snapshot, name: str) -> float | None:
    a, b = after.get(name), before.get(name)
    return None if a is None or b is None else a - b


def _by_reason(snap: Snapshot) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in snap.series(REQUEST_SUCCESS):
        reason = s.labels.get("finished_reason", "")
        out[reason] = out.get(reason, 0.0) + s.value
    return out


def finished_by_reason(before: Snapshot, after: Snapshot) -> dict[str, float] | None:
    """Requests the server finished over the window, per finish reason; None without the counter."""
    if not before.series(REQUEST_SUCCESS) or not after.series(REQUEST_SUCCESS):
        return None
    b, a = _by_reason(before), _by_reason(after)
    return {k: a.get(k, 0.0) - b.get(k, 0.0) for k in sorted(set(a) | set(b))}


def _exact(name: str, client: float, server: float | None, what: str) -> Item:
    if server is None:
        return Item(name, "unverified", client, None, "exact", f"the server does not export {what}")
    if server == client:
        return Item(name, "pass", client, server, "exact", "equal")
    more = "more" if server > client else "fewer"
    return Item(name, "fail", client, server, "exact",
                f"server counted {server:g}, client {client:g} ({more} on the server: another client, a retry "
                "or duplicate, or a request answered without reaching the server)")


def _latency(name: str, client_sum: float, n: int, server_sum: float | None, bound: LatencyBound,
             what: str, two_sided: bool = False) -> Item:
    if server_sum is None:
        return Item(name, "unverified", client_sum, None, bound.describe(), f"the server does not export {what}")
    if n == 0:
        return Item(name, "unverified", client_sum, server_sum, bound.describe(), "no completed requests")
    excess = (client_sum - server_sum) / n
    server_mean = server_sum / n
    hi = bound.high(server_mean)
    lo = -hi if two_sided else bound.floor_s
    text = f"mean client-server excess {excess * 1e3:.2f} ms per request (allowed {lo * 1e3:.1f} to {hi * 1e3:.1f})"
    if lo <= excess <= hi:
        return Item(name, "pass", client_sum, server_sum, bound.describe(), text)
    why = ("the client saw requests take longer than the server did: a lagging client, or something queueing "
           "or retrying in front of the server") if excess > hi else (
           "the server counted more time than the client saw: its counters include other requests")
    return Item(name, "fail", client_sum, server_sum, bound.describe(), f"{text}: {why}")


# ------------------------------------------------------------------------------------ public
def reconcile(
    before: Snapshot,
    after: Snapshot,
    records: Sequence[WindowRecord],
    bound: LatencyBound | None = None,
) -> Reconciliation:
    """Compare the server's counters over [before, after] with the client's measured records.

    `records` are the window's requests; warmup records, if passed, are ignored but must have
    ended before `before` was taken (otherwise the window holds warmup and the result fails).
    """
    bound = bound or LatencyBound()
    items: list[Item] = []
    warm = [r for r in records if r.warmup]
    measured = [r for r in records if not r.warmup]
    late = [r for r in warm if r.end_s > before.t_s]
    if late:
        items.append(Item("window", "fail", float(len(late)), None, "exact",
                          f"{len(late)} warmup requests ended after the window opened"))
    outside = [r for r in measured if r.sent_s < before.t_s or r.end_s > after.t_s]
    if outside:
        items.append(Item("window", "fail", float(len(outside)), None, "exact",
                          f"{len(outside)} measured requests fall outside the counter snapshots"))

    done = [r for r in measured if r.ok]
    failed = len(measured) - len(done)
    reasons = finished_by_reason(before, after)
    completed = None if reasons is None else sum(reasons.get(k, 0.0) for k in COMPLETED_REASONS)
    items.append(_exact("requests", float(len(done)), completed, REQUEST_SUCCESS))
    if reasons is not None and not failed:
        ended_early = sum(v for k, v in reasons.items() if k not in COMPLETED_REASONS)
        if ended_early:
            items.append(Item("requests_aborted", "fail", 0.0, ended_early, "exact",
                              f"the server aborted or failed {ended_early:g} requests the client did not see fail"))

    if failed:
        why = f"{failed} requests failed on the client: the server's counts include their partial work"
        for name in ("prompt_tokens", "generation_tokens", "e2e", "ttft", "decode"):
            items.append(Item(name, "unverified", None, None, "exact", why))
        return Reconciliation(tuple(items))

    items.append(_exact("prompt_tokens", float(sum(r.prompt_tokens for r in done)),
                        _delta(before, after, PROMPT_TOKENS), PROMPT_TOKENS))
    items.append(_exact("generation_tokens", float(sum(r.output_tokens for r in done)),
                        _delta(before, after, GENERATION_TOKENS), GENERATION_TOKENS))

    n = len(done)
    items.extend(_histogram("e2e", E2E, n, sum(r.end_s - r.sent_s for r in done), before, after, bound))
    with_first = [r for r in done if r.first_token_s is not None]
    if len(with_first) == n:
        ttft_sum = sum(r.first_token_s - r.sent_s for r in with_first if r.first_token_s is not None)
        items.extend(_histogram("ttft", TTFT, n, ttft_sum, before, after, bound))
    else:
        items.append(Item("ttft", "unverified", None, None, bound.describe(),
                          f"{n - len(with_first)} completed requests have no first-token time"))
    items.extend(_decode(done, before, after, bound))
    return Reconciliation(tuple(items))


def _histogram(name: str, metric: str, n: int, client_sum: float, before: Snapshot, after: Snapshot,
               bound: LatencyBound) -> Iterable[Item]:
    count = _delta(before, after, metric + "_count")
    yield _exact(f"{name}_count", float(n), count, metric + "_count")
    if count is not None and count != n:
        yield Item(name, "unverified", client_sum, None, bound.describe(), "histogram count disagrees")
        return
    yield _latency(name, client_sum, n, _delta(before, after, metric + "_sum"), bound, metric + "_sum")


def _decode(done: Sequence[WindowRecord], before: Snapshot, after: Snapshot,
            bound: LatencyBound) -> Iterable[Item]:
    """The server's inter-token histogram has one entry per generated token after the first.

    Its count is exact; its sum (first to last token, per request) is compared with the client's
    first-to-last chunk span, which holds only when each request's tokens came in at least two chunks.
    """
    expected = float(sum(max(r.output_tokens - 1, 0) for r in done))
    count = _delta(before, after, ITL + "_count")
    yield _exact("decode_count", expected, count, ITL + "_count")
    spans = [r.token_times_s[-1] - r.token_times_s[0] for r in done if len(r.token_times_s) >= 2]
    if len(spans) != len(done):
        yield Item("decode", "unverified", None, None, bound.describe(), "requests with fewer than two chunks")
        return
    if count is not None and count != expected:
        yield Item("decode", "unverified", sum(spans), None, bound.describe(), "histogram count disagrees")
        return
    # Both ends are transport-delayed, so the span's excess can have either sign.
    yield _latency("decode", sum(spans), len(spans), _delta(before, after, ITL + "_sum"), bound, ITL + "_sum",
                   two_sided=True)


def server_step_s(before: Snapshot, after: Snapshot) -> float | None:
    """The server's mean inter-token time over the window (its decode step as a request sees it)."""
    count = _delta(before, after, ITL + "_count")
    total = _delta(before, after, ITL + "_sum")
    if not count or total is None or count <= 0:
        return None
    return total / count
