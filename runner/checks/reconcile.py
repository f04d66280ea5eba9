"""Cross-instrument reconciliation: the server's own counters against the client's records.

Pure: two `/metrics` snapshots taken at the measured window's edges (the first after warmup and
any cache reset, the second after the last measured request ended) and the client's records of
that window in, typed results out. No I/O.

Counts must agree exactly: requests the server finished, prompt tokens, generation tokens, and
the counts of its latency histograms.

Latencies. vLLM starts a request's clock when its API-server process gets to the request (parsed,
`arrival_time`) and stops it at engine iterations. The client's clock starts earlier: connect and
HTTP transport in, and the API server's own front end, whose event loop, busy streaming the
outputs of the requests in flight, admits new requests one at a time (a few ms each under load;
tens of ms per request at c64 on the H200). That front-end and transport delay `front` is common to
a request's first token and its end; per request

    client TTFT = front + server TTFT + out_first      client e2e = front + server e2e + out_end

with `out_*` the transport of the response chunks. So, per request, over the window's sums:

- `ttft`, `e2e`: each mean excess (client - server) is at least `floor_s` (clock noise only): the
  client cannot see a request sooner than the server made it. Below the floor the server counted
  time the client never saw: its sums include another client's requests.
- `first_to_end`: the client's first-token-to-end span against the server's, i.e. e2e excess minus
  TTFT excess, in which `front` cancels: within +-(`stream_abs_s` + `stream_rel` x the server's
  span). A client that lags while streaming (reads the end late), or reads the first token late
  (so its TTFT is inflated), fails it. The load generator measures its own longest event-loop
  stall in the window (`client_stall_s`), an upper bound on how late it read any chunk, so the
  client's share of a difference is at most that stall: the item fails when the client's share
  (the whole difference without a measured stall, else the smaller of the difference and the
  stall) exceeds the bound. A larger difference therefore never passes where a smaller one fails.
  A difference beyond the bound from a client whose stall is within it is the server's output path
  (its API process sending first tokens late while it admits a burst of requests) and passes with
  that said. Without the stall (points stored before it was measured) a difference beyond the bound fails.
- `decode`: the client's first-to-last chunk span against the server's inter-token sum, two-sided
  within +-(`abs_s` + `rel` x the server's mean), the client's share judged as for `first_to_end`.
- The TTFT excess itself is reported, not judged: the point's front-end and transport delay
  before the engine saw the request (`Reconciliation.frontend_delay_s`, stored as the point's
  `frontend_delay_s`). It is part of the serving stack's TTFT, not a fault of the measurement.

What the latency items cannot catch: a delay added equally to a request's first token and its end
before the server's clock starts. A queue or proxy in front of the server, or a client that stamps
its send and then waits for a CPU before the bytes leave, is indistinguishable from the server's own
front end: it only raises `frontend_delay_s`. (Counts still catch a proxy that drops, retries or
duplicates.)

What a failure means: another client on the same server (the server counts more, or more time), a
proxy that retries or duplicates (more), a request answered without reaching the server (fewer),
warmup inside the window, a client that lags while streaming. A counter the server does not export
makes its item `unverified`, never `pass`. Every failure's message names the cause and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from runner.measure.prometheus import Snapshot
from runner.store.records import RequestRecord

Status = Literal["pass", "fail", "unverified"]

REQUEST_SUCCESS = "vllm:request_success_total"  # label finished_reason: stop, length, abort, error, ...
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
E2E = "vllm:e2e_request_latency_seconds"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"

# Finish reasons of a request that ran to its end (vLLM 0.26 and 0.32 also count abort/error here).
COMPLETED_REASONS = ("length", "stop", "repetition")

RERUN = "then re-run the point"
CLIENT_FIX = ("Fix: give the load generator its own cores (STUDYC_CLIENT_CPUS), run fewer jobs on the machine "
              "at once, " + RERUN)
OTHER_CLIENT_FIX = ("Fix: measure a server no other client uses, with nothing retrying between it and studyc, "
                    + RERUN)


@dataclass(frozen=True)
class LatencyBound:
    """The allowed mean per-request differences between the client's latencies and the server's.

    `floor_s`: the least TTFT and e2e excess (client - server); the client's interval contains the
    server's, so only clock noise goes below 0.
    `stream_abs_s + stream_rel * server span`: the largest |e2e excess - TTFT excess|. Seen: at most
    3.3 ms per request on the H200 (vLLM 0.26, c1 to c100, 8 to 400 requests, mean front-end delay
    up to 45 ms at c64: the fixture in tests/runner/test_reconcile.py); on the 2-core CPU shared with
    other work (load average ~10), -15 to +2 ms in windows whose tokens were not bunched, and -28 to
    -37 ms in windows whose client read a request's 32 tokens within 4 ms (starved). 20 ms, plus 1%
    of the server's first-token-to-end span for long requests.
    `abs_s + rel * server mean`: the largest |decode span excess| (both ends transport-delayed;
    seen: 4.5 ms at most on the H200).
    """

    abs_s: float = 0.020
    rel: float = 0.05
    floor_s: float = -0.001
    stream_abs_s: float = 0.020
    stream_rel: float = 0.01

    def high(self, server_mean_s: float) -> float:
        return self.abs_s + self.rel * max(server_mean_s, 0.0)

    def stream_high(self, server_span_s: float) -> float:
        return self.stream_abs_s + self.stream_rel * max(server_span_s, 0.0)

    def describe(self) -> str:
        return f"mean client-server excess >= {self.floor_s * 1e3:g} ms"

    def describe_stream(self) -> str:
        return (f"|client - server first-token-to-end span| <= {self.stream_abs_s * 1e3:g} ms + "
                f"{self.stream_rel:.0%}")

    def describe_decode(self) -> str:
        return f"|client - server decode span| <= {self.abs_s * 1e3:g} ms + {self.rel:.0%}"


@dataclass(frozen=True)
class Item:
    """One comparison between the two instruments."""

    name: str
    status: Status
    client: float | None
    server: float | None
    bound: str  # "exact" or one of LatencyBound's descriptions
    message: str
    beyond_bound: bool = False  # passed beyond its bound: the server's output path, which the message says


@dataclass(frozen=True)
class Reconciliation:
    items: tuple[Item, ...]
    frontend_delay_s: float | None = None  # mean TTFT excess: front end and transport before the engine
    # (None unless the ttft item passes: below the floor the excess is another client's time, no delay)

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
            return "nothing to reconcile: no server counters. Fix: scrape /metrics at the window's edges, " + RERUN
        parts = [] if bad else [f"server counters agree with the client's records ({len(self.items)} comparisons)"]
        # a pass beyond the bound (the server's output path) is said, never hidden behind "agree"
        parts += [f"{i.name}: {i.message}" for i in bad + [i for i in self.items if i.beyond_bound]]
        head = "; ".join(parts)
        if self.frontend_delay_s is None:
            return head
        return (f"{head}; front-end and transport delay before the engine saw the request: "
                f"{self.frontend_delay_s * 1e3:.2f} ms mean (reported, not judged)")

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


def missing(what: str) -> str:
    return (f"the server does not export {what}: cannot verify. Fix: a vLLM that exports it (0.26 or later), "
            "started without --disable-log-stats, with nothing filtering /metrics")


def _exact(name: str, client: float, server: float | None, what: str) -> Item:
    if server is None:
        return Item(name, "unverified", client, None, "exact", missing(what))
    if server == client:
        return Item(name, "pass", client, server, "exact", "equal")
    if server > client:
        why = ("more on the server: another client on the same server, or a proxy that retries or duplicates "
               "requests. " + OTHER_CLIENT_FIX)
    else:
        why = ("fewer on the server: a request answered without reaching the server (a proxy or cache in "
               "between). Fix: point studyc at the server itself, " + RERUN)
    return Item(name, "fail", client, server, "exact", f"server counted {server:g}, client {client:g} ({why})")


def _floor(name: str, client_sum: float | None, server_sum: float | None, n: int, bound: LatencyBound,
           why_missing: str) -> Item:
    """The client's latency sum is at least the server's (it cannot see a request sooner)."""
    if client_sum is None or server_sum is None:
        return Item(name, "unverified", client_sum, server_sum, bound.describe(), why_missing)
    if n == 0:
        return Item(name, "unverified", client_sum, server_sum, bound.describe(), "no completed requests")
    excess = (client_sum - server_sum) / n
    text = f"mean client-server excess {excess * 1e3:.2f} ms per request (at least {bound.floor_s * 1e3:g} ms)"
    if excess >= bound.floor_s:
        return Item(name, "pass", client_sum, server_sum, bound.describe(), text)
    return Item(name, "fail", client_sum, server_sum, bound.describe(),
                f"{text}: the server counted more time than the client saw, so its sums include requests the "
                "client did not send (another client on the same server). " + OTHER_CLIENT_FIX)


def _first_to_end(e2e: tuple[float, float | None], ttft: tuple[float | None, float | None], n: int,
                  bound: LatencyBound, stall_s: float | None = None) -> Item:
    """e2e excess - TTFT excess: the front-end delay common to both cancels; a client that lags
    while streaming does not. A difference the client's own longest loop stall (`stall_s`, measured
    in the window) bounds the client's share (`client_share`); beyond the bound, a client whose
    stall is within it read on time and the item says the server's output path made the difference."""
    name, text_bound = "first_to_end", bound.describe_stream()
    (e2e_c, e2e_s), (ttft_c, ttft_s) = e2e, ttft
    if e2e_s is None or ttft_c is None or ttft_s is None:
        return Item(name, "unverified", None, None, text_bound,
                    "needs the e2e and TTFT sums of both instruments (see the e2e and ttft items)")
    if n == 0:
        return Item(name, "unverified", None, None, text_bound, "no completed requests")
    client, server = e2e_c - ttft_c, e2e_s - ttft_s
    diff = (client - server) / n
    hi = bound.stream_high(server / n)
    text = (f"first token to end: client {client / n * 1e3:.2f} ms, server {server / n * 1e3:.2f} ms per request, "
            f"difference {diff * 1e3:+.2f} ms (allowed +-{hi * 1e3:.1f})")
    if abs(diff) <= hi:
        return Item(name, "pass", client, server, text_bound, text)
    if client_share(diff, stall_s) <= hi:
        where = "its first tokens" if diff < 0 else "the ends of its requests"
        return Item(name, "pass", client, server, text_bound, _servers(text, stall_s, where), beyond_bound=True)
    stall = _stall(stall_s)
    why = ("the client saw requests end later after their first token than the server made them: the client "
           "lagged while streaming (starved of CPU, a GC pause), so its e2e, TPOT and ITL are inflated"
           if diff > 0 else
           "the client saw the first token later, relative to the end, than the server made it: the client was "
           "slow to read the first token, so its TTFT is inflated (the client, or on a shared CPU the API "
           "server's writer, starved of CPU; the itl_trusted check shows whether tokens came bunched)")
    return Item(name, "fail", client, server, text_bound,
                f"{text}: {why} (the load generator's longest loop stall: {stall}). {CLIENT_FIX}")


def client_share(diff: float, stall_s: float | None) -> float:
    """How much of a latency difference the client can be blamed for: all of it without a measured
    stall; with one, at most its longest loop stall (it read no chunk later than that). Never
    decreases as |diff| grows, so a larger difference never passes where a smaller one fails."""
    return abs(diff) if stall_s is None else min(abs(diff), stall_s)


def _stall(stall_s: float | None) -> str:
    return "not measured" if stall_s is None else f"{stall_s * 1e3:.2f} ms"


def _servers(text: str, stall_s: float | None, where: str) -> str:
    return (f"{text}; the load generator's longest loop stall was {_stall(stall_s)}, within the bound, so the "
            f"client read every chunk within the bound of its arrival: the rest is the server's output path (its API "
            f"process) sending {where} late after its engine made them, which the client's latencies rightly include")


def _histogram_sum(name: str, metric: str, n: int, before: Snapshot, after: Snapshot
                   ) -> tuple[Item, float | None, str]:
    """The histogram's count item, its sum over the window (None: not comparable) and why not."""
    count = _delta(before, after, metric + "_count")
    item = _exact(f"{name}_count", float(n), count, metric + "_count")
    if count is not None and count != n:
        return item, None, f"its histogram count disagrees (see {name}_count)"
    return item, _delta(before, after, metric + "_sum"), missing(metric + "_sum")


# ------------------------------------------------------------------------------------ public
def reconcile(
    before: Snapshot,
    after: Snapshot,
    records: Sequence[RequestRecord],
    bound: LatencyBound | None = None,
    *,
    client_stall_s: float | None = None,
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
                          f"{len(late)} warmup requests ended after the window opened, so the counters include "
                          "warmup work. Fix: take the opening scrape after the last warmup response, " + RERUN))
    outside = [r for r in measured if r.sent_s < before.t_s or r.end_s > after.t_s]
    if outside:
        items.append(Item("window", "fail", float(len(outside)), None, "exact",
                          f"{len(outside)} measured requests fall outside the counter snapshots, so the counters "
                          "miss part of their work. Fix: take the closing scrape after the last measured response, "
                          + RERUN))

    done = [r for r in measured if r.ok]
    failed = len(measured) - len(done)
    reasons = finished_by_reason(before, after)
    completed = None if reasons is None else sum(reasons.get(k, 0.0) for k in COMPLETED_REASONS)
    items.append(_exact("requests", float(len(done)), completed, REQUEST_SUCCESS))
    if reasons is not None and not failed:
        ended_early = sum(v for k, v in reasons.items() if k not in COMPLETED_REASONS)
        if ended_early:
            items.append(Item("requests_aborted", "fail", 0.0, ended_early, "exact",
                              f"the server aborted or failed {ended_early:g} requests the client did not see fail: "
                              "requests of another client, or a proxy that gave up on them. " + OTHER_CLIENT_FIX))

    if failed:
        why = (f"{failed} requests failed on the client, and the server's counts include their partial work: "
               "cannot verify. Fix: remove the cause of the failures (see the errors check), " + RERUN)
        for name in ("prompt_tokens", "generation_tokens", "e2e", "ttft", "first_to_end", "decode"):
            items.append(Item(name, "unverified", None, None, "exact", why))
        return Reconciliation(tuple(items))

    items.append(_exact("prompt_tokens", float(sum(r.prompt_tokens for r in done)),
                        _delta(before, after, PROMPT_TOKENS), PROMPT_TOKENS))
    items.append(_exact("generation_tokens", float(sum(r.output_tokens for r in done)),
                        _delta(before, after, GENERATION_TOKENS), GENERATION_TOKENS))

    n = len(done)
    e2e_client = sum(r.end_s - r.sent_s for r in done)
    count_item, e2e_server, e2e_why = _histogram_sum("e2e", E2E, n, before, after)
    items += [count_item, _floor("e2e", e2e_client, e2e_server, n, bound, e2e_why)]
    firsts = [r.first_token_s - r.sent_s for r in done if r.first_token_s is not None]
    ttft_client: float | None = None
    ttft_server: float | None = None
    if len(firsts) == n:
        ttft_client = sum(firsts)
        count_item, ttft_server, ttft_why = _histogram_sum("ttft", TTFT, n, before, after)
        items.append(count_item)
    else:
        ttft_why = (f"{n - len(firsts)} completed requests have no first-token time (no content chunk): cannot "
                    "verify. Fix: output_len of at least 1 token with content, " + RERUN)
    ttft_item = _floor("ttft", ttft_client, ttft_server, n, bound, ttft_why)
    front = None
    if ttft_item.status == "pass" and ttft_client is not None and ttft_server is not None:
        front = (ttft_client - ttft_server) / n
        ttft_item = Item(ttft_item.name, ttft_item.status, ttft_item.client, ttft_item.server, ttft_item.bound,
                         f"{ttft_item.message}; this is the front-end and transport delay before the engine saw "
                         "the request")
    items += [ttft_item, _first_to_end((e2e_client, e2e_server), (ttft_client, ttft_server), n, bound,
                                       client_stall_s)]
    items.extend(_decode(done, before, after, bound, client_stall_s))
    return Reconciliation(tuple(items), front)


def _decode(done: Sequence[RequestRecord], before: Snapshot, after: Snapshot,
            bound: LatencyBound, stall_s: float | None = None) -> Iterable[Item]:
    """The server's inter-token histogram has one entry per generated token after the first.

    Its count is exact; its sum (first to last token, per request) is compared with the client's
    first-to-last chunk span, which holds only when each request's tokens came in at least two chunks.
    Both ends of the span are transport-delayed, so its excess can have either sign.
    """
    expected = float(sum(max(r.output_tokens - 1, 0) for r in done))
    count = _delta(before, after, ITL + "_count")
    yield _exact("decode_count", expected, count, ITL + "_count")
    text_bound = bound.describe_decode()
    spans = [r.token_times_s[-1] - r.token_times_s[0] for r in done if len(r.token_times_s) >= 2]
    if len(spans) != len(done):
        yield Item("decode", "unverified", None, None, text_bound,
                   f"{len(done) - len(spans)} requests came in fewer than two chunks: no decode span to compare. "
                   "Fix: output_len of at least 2, " + RERUN)
        return
    if count is not None and count != expected:
        yield Item("decode", "unverified", sum(spans), None, text_bound,
                   "the inter-token histogram count disagrees (see decode_count)")
        return
    server = _delta(before, after, ITL + "_sum")
    if server is None or not spans:
        yield Item("decode", "unverified", sum(spans), server, text_bound,
                   missing(ITL + "_sum") if server is None else "no completed requests")
        return
    client, n = sum(spans), len(spans)
    excess = (client - server) / n
    hi = bound.high(server / n)
    text = f"mean client-server decode span excess {excess * 1e3:+.2f} ms per request (allowed +-{hi * 1e3:.1f})"
    if abs(excess) <= hi:
        yield Item("decode", "pass", client, server, text_bound, text)
        return
    if client_share(excess, stall_s) <= hi:  # the counts are exact here: no other client's tokens either
        where = "its first tokens" if excess < 0 else "its last tokens"
        yield Item("decode", "pass", client, server, text_bound, _servers(text, stall_s, where), beyond_bound=True)
        return
    why = ("the client's first-to-last token span is longer than the server's: the client lagged while streaming "
           "(starved of CPU, a GC pause)" if excess > 0 else
           "the client's first-to-last token span is shorter than the server's: the client read the first token "
           "late (starved of CPU), or the server's sums include requests the client did not send (another "
           "client on the same server)")
    tail = CLIENT_FIX if excess > 0 else CLIENT_FIX + "; and measure a server no other client uses"
    yield Item("decode", "fail", client, server, text_bound,
               f"{text}: {why} (the load generator's longest loop stall: {_stall(stall_s)}). {tail}")


def server_step_s(before: Snapshot, after: Snapshot) -> float | None:
    """The server's mean inter-token time over the window (its decode step as a request sees it)."""
    count = _delta(before, after, ITL + "_count")
    total = _delta(before, after, ITL + "_sum")
    if not count or total is None or count <= 0:
        return None
    return total / count
