"""Validity checks of one point. A `fail` check that does not pass makes the point invalid; a `warn`
check that does not pass flags it. Both are stored and shown, never hidden; neither stops the run.

Each check is a pure function of typed inputs returning one `CheckResult` (or None where it does
not apply to the point, e.g. Little's Law against the concurrency for a burst). A check that cannot
verify (its input is missing) has status `unverified` and does not pass: it fails closed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from compiler.capacity import wave_requests
from compiler.plan import PointStep
from compiler.study import Checks
from runner.checks.cache import CacheState
from runner.checks.fidelity import MAX_BUNCHED_SHARE, Fidelity
from runner.checks.reconcile import Reconciliation
from runner.checks.tails import CLIFF_RATIO, Cliff, check_name, neighbours
from runner.store.records import CheckResult, CheckStatus, PointSummary


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def within(value: float | None, tolerance: float) -> bool:
    """value <= tolerance; a missing value is not within anything."""
    return value is not None and value <= tolerance


def _result(point: PointStep, name: str, status: CheckStatus, severity: str, value: float | None,
            threshold: float | None, detail: str) -> CheckResult:
    return CheckResult(point.id, name, status == "pass", severity, value, threshold, detail, status)  # type: ignore[arg-type]


def _judged(value: float | None, ok: bool) -> CheckStatus:
    return "unverified" if value is None else "pass" if ok else "fail"


def is_burst(point: PointStep) -> bool:
    """A closed-loop point measured as one wave on purpose (`load.burst = true`)."""
    return point.concurrency is not None and point.burst


def steady_state(point: PointStep, summary: PointSummary) -> CheckResult | None:
    """Closed loop, not a burst: at least one wave's worth (C) of requests ran wholly inside the
    steady phase (every slot busy). A single wave has none: its number is one batch with its
    prefill burst, not a steady state."""
    if point.concurrency is None or is_burst(point):
        return None
    n, c = summary.steady_requests, point.concurrency
    status = _judged(None if n is None else float(n), n is not None and n >= c)
    return _result(
        point, "steady_state", status, "fail", None if n is None else float(n), float(c),
        f"{n if n is not None else 'n/a'} of {point.requests} requests ran wholly in the steady phase "
        f"(every one of {c} slots busy), need at least {c}"
        + ("" if status == "pass" else
           "; cannot verify: no request completed, so there is no steady phase. Fix: make the requests complete "
           "(see the errors check), then re-run the point" if n is None else
           f"; too few waves for a steady phase. Fix: give {three_waves(point)}, or set "
           "load.burst = true to measure one wave on purpose"),
    )


def three_waves(point: PointStep) -> str:
    """What a closed-loop point with too few waves needs: 3 waves of its concurrency in requests (multi-turn,
    3 x concurrency conversations of all their turns), or for a search probe load.search.waves = 3."""
    c = point.concurrency or 0
    turns = point.shape.turns if point.shape is not None else 1
    fix = f"at least {wave_requests(3, c, 1)} requests (3 waves)" if turns == 1 else \
        f"at least {wave_requests(3, c, turns)} requests (3 waves: {3 * c} conversations of {turns} turns)"
    return fix + (", or set load.search.waves = 3" if "/search/" in point.id else "")


def littles_law(
    point: PointStep, summary: PointSummary, tolerance: float, open_allowance: float | None = None
) -> CheckResult | None:
    """lambda * W from the records against the load the study configured (not derived from them):
    closed loop, the concurrency over the steady phase; open loop, completions/s against the
    offered rate, with `open_allowance` added for the span estimate's own boundary error.
    Not for a burst (one wave has no phase in which L = C must hold)."""
    if is_burst(point):
        return None
    err = summary.littles_law_error
    occupancy = ""
    if summary.server_in_flight is not None and summary.client_in_flight is not None:
        occupancy = (f"; whole window in flight: client {summary.client_in_flight:.3f}, "
                     f"server {summary.server_in_flight:.3f} (judged by reconciliation)")
    if point.concurrency is not None:
        ok = within(err, tolerance)
        detail = (f"lambda*W = {_num(summary.little_lambda_w)} vs configured concurrency {point.concurrency} "
                  f"over the steady phase: error {_pct(err)} (tolerance {_pct(tolerance)})")
        if err is None:
            detail += ("; cannot verify: no steady-phase requests to compute lambda*W from. Fix: "
                       f"{three_waves(point)}, then re-run the point")
        elif not ok:
            detail += ("; the client could not keep the slots full: it held fewer requests in flight than "
                       "configured, idling between a completion and the next send (likely CPU contention on the "
                       "client's cores, or a GC pause). Fix: run fewer jobs on the machine at once, give the load "
                       "generator its own cores (STUDYC_CLIENT_CPUS), or more requests so a stall weighs less; "
                       "then re-run the point")
        return _result(point, "littles_law", _judged(err, ok), "fail", err, tolerance, detail + occupancy)
    allowed = tolerance + (open_allowance or 0.0)
    ok = within(err, allowed)
    detail = (f"completions/s vs the offered rate: error {_pct(err)} (allowed {_pct(allowed)}: tolerance "
              f"{_pct(tolerance)} + span boundary {_pct(open_allowance)}); client lag p99 "
              f"{_ms(summary.client_lag_p99_s)}")
    if err is None:
        detail += "; cannot verify: no completed requests to count. Fix: make the requests complete, then re-run"
    elif not ok:
        detail += ("; completions fell behind the offered rate: the server saturated (its queue grew) or the "
                   "client sent late (see the client lag). Fix: a lower rate, or give the load generator its own "
                   "cores (STUDYC_CLIENT_CPUS) and run fewer jobs at once; then re-run the point")
    return _result(point, "littles_law", _judged(err, ok), "fail", err, allowed, detail + occupancy)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{1e3 * x:.1f} ms"


def reconciliation(point: PointStep, rec: Reconciliation | None) -> CheckResult:
    """The server's counters over the window against the client's records (`runner.checks.reconcile`):
    counts exact, latency sums within the stated bound. No edge counters stored: unverified."""
    if rec is None:
        return _result(point, "reconciliation", "unverified", "fail", None, None,
                       "no server counters at the window's edges were recorded (a point stored before they "
                       "were, or /metrics could not be scraped): cannot verify. Fix: re-run the point on a "
                       "server whose /metrics answers")
    bad = sum(1 for i in rec.items if i.status != "pass")
    return _result(point, "reconciliation", rec.status, "fail", float(bad), 0.0, rec.message)


def cache_cold(point: PointStep, cache: CacheState, max_hit_rate: float, expected: float = 0.0,
               caching: bool = True) -> CheckResult:
    """`cache = "reset"`: fail-level, cold at the point's start only when verified (see `CacheState.cold`):
    a refused or missing reset fails; missing counters or no queries are unverified. Where the workload
    shares prefixes, hits inside the point are expected: the allowed rate is `expected` (its own structure
    replayed from an empty cache, an upper bound) plus `max_hit_rate`.
    `cache = "keep"`: a warning that always fires, since the point is not a cold measurement. `caching`
    False: the engine has prefix caching off (`CacheState.cold`)."""
    rate = cache.hit_rate
    if point.cache == "reset":
        cold, why = cache.cold(expected + max_hit_rate, caching)
        if expected > 0 and caching:
            why += f"; {100 * expected:.2f}% expected from the workload's shared prefixes"
        status: CheckStatus = "pass" if cold else "unverified" if "cannot verify" in why else "fail"
        return _result(point, "cache_cold", status, "fail", rate, expected + max_hit_rate, f"reset + verify: {why}"
                       + ("" if cold else _cache_fix(why)))
    return CheckResult(
        point.id, "cache_cold", False, "warn", rate, None,
        f"prefix cache kept between points: hit rate {_pct(rate)}; this is not a cold measurement",
    )


def _cache_fix(why: str) -> str:
    if why.startswith(("reset refused", "no reset")):
        return ("; the prefix cache may hold earlier points' prompts. Fix: start the server with "
                "VLLM_SERVER_DEV_MODE=1 so POST /reset_prefix_cache works, and nothing in between that answers "
                "for it; then re-run the point")
    if "counters missing" in why:
        return ("; the engine does not export vllm:prefix_cache_queries/hits. Fix: enable prefix caching and "
                "metrics (no --disable-log-stats), or set cache = \"keep\" to measure a warm cache on purpose")
    if "no prefix-cache queries" in why:
        return ("; the engine counted no prefix-cache lookups. Fix: enable prefix caching "
                "(--enable-prefix-caching), or set cache = \"keep\" when it is off on purpose")
    return ("; the window's prompts hit a cache the reset should have emptied: the reset was not done (a proxy "
            "answered it) or the prompts repeat within the point. Fix: reset the server itself, give distinct "
            "prompts (prompt_seed), then re-run the point")


@dataclass(frozen=True)
class Output:
    """One completed request's token count (from the final `usage` event), its content chunks, and the
    count it asked for (its max_tokens; None: the point's output_len)."""

    tokens: int
    chunks: int
    expected: int | None = None


@dataclass(frozen=True)
class Expectation:
    """What a point's own workload makes expected: each measured request's max_tokens (by request index)
    and the prefix-cache hit rate its shared prefixes allow from a cold start (`runner.load.shapes`)."""

    output_tokens: tuple[int, ...] = ()
    hit_rate: float = 0.0


def output_exact(point: PointStep, outputs: Sequence[Output]) -> CheckResult:
    """Every completed request returned exactly the tokens it asked for (output_len, or its own drawn
    length). A request that streamed chunks but reported no usage (0 tokens) cannot be counted: unverified."""
    no_usage = sum(1 for o in outputs if o.tokens == 0 and o.chunks > 0)
    wrong = [o.tokens for o in outputs
             if o.tokens != (point.output_len if o.expected is None else o.expected) and not (o.tokens == 0 and o.chunks > 0)]
    status: CheckStatus = "fail" if wrong else "unverified" if no_usage or not outputs else "pass"
    asked = "the tokens they asked for" if point.shape is not None else f"{point.output_len} tokens"
    detail = f"{len(outputs) - len(wrong) - no_usage}/{len(outputs)} requests returned exactly {asked}"
    if wrong:
        detail += ("; the server ended requests early or late (max_model_len reached, a stop condition, or "
                   "max_tokens not honoured). Fix: max_model_len of at least input_len + output_len, and a server "
                   "that honours ignore_eos and max_tokens; then re-run the point")
    if no_usage:
        detail += (f"; {no_usage} reported no usage: cannot count their tokens. Fix: a server that sends the "
                   "final usage event (stream_options.include_usage), then re-run the point")
    elif not outputs:
        detail += "; no request completed: nothing to count. Fix: see the errors check, then re-run the point"
    return _result(point, "output_exact", status, "fail", float(len(wrong)), 0.0, detail)


def errors(point: PointStep, summary: PointSummary) -> CheckResult:
    failed = summary.requests_failed
    ok = failed == 0 and summary.requests_ok == point.requests
    detail = f"{summary.requests_ok}/{point.requests} requests ok, {failed} failed"
    if not ok:
        detail += ("; the server refused, dropped or timed out requests (their errors are in the requests table, "
                   "the server's in its log). Fix: the cause the errors name, e.g. a longer request_timeout_s, "
                   "a lower load, or a larger max_model_len; then re-run the point")
    return CheckResult(point.id, "errors", ok, "fail", float(failed), 0.0, detail)


def halves_slowdown(halves_gap: float) -> float:
    """The slower half's time per output token over the faster half's, signed by which half was slower
    (+ the first, - the second): `halves_gap` is (first - second) / second, so where the second half was
    slower its excess over the first is -gap / (1 + gap). Either way judged against the same tolerance."""
    return halves_gap if halves_gap >= 0 else halves_gap / (1 + halves_gap)


def warmup_sufficient(point: PointStep, halves_gap: float | None, tolerance: float) -> CheckResult | None:
    """TPOT of the first half of the steady requests against the second half, both ways: a slow first
    half is a server still warming up, a slow second half one that slowed during the window. A point with
    no warmup requests is flagged whatever the halves show (the warm-up trap). Not for a burst."""
    if is_burst(point):
        return None
    slowdown = None if halves_gap is None else halves_slowdown(halves_gap)
    status = _judged(slowdown, slowdown is not None and abs(slowdown) <= tolerance)
    first, second = ("first", "second") if slowdown is None or slowdown >= 0 else ("second", "first")
    detail = (f"time per output token: the {first} half of the steady requests was "
              f"{_pct(None if slowdown is None else abs(slowdown))} slower than the {second} "
              f"(tolerance {_pct(tolerance)} either way)")
    if status == "fail" and first == "first":
        detail += ("; the server was still warming up (compiling, filling caches) or the machine got busier "
                   "early in the window. Fix: more warmup requests (load.warmup), run fewer jobs on the machine "
                   "at once; then re-run the point")
    elif status == "fail":
        detail += ("; the server slowed during the window (clocks throttled, the KV cache filled and it "
                   "preempted, or the machine got busier late in the window). Fix: check the GPU's clocks and "
                   "temperature in the point's telemetry, run fewer jobs on the machine at once; then re-run "
                   "the point")
    elif status == "unverified":
        detail += "; cannot verify: too few steady requests to split in halves. Fix: more requests"
    if point.warmup == 0:  # flagged whatever the halves show, as a kept cache is: not a warmed measurement
        return _result(point, "warmup_sufficient", "fail", "warn", slowdown, tolerance,
                       "no warmup requests (warmup = 0): the point's first measured requests were the first the "
                       "server saw after the one before it, or after its start; this is not a warmed measurement; "
                       + detail)
    return _result(point, "warmup_sufficient", status, "warn", slowdown, tolerance, detail)


def client_headroom(
    point: PointStep, summary: PointSummary, ceiling_chunks_per_s: float | None, fraction: float
) -> CheckResult | None:
    """Only when the client's own ceiling was measured (None otherwise). No chunk rate: not passed."""
    if not ceiling_chunks_per_s or ceiling_chunks_per_s <= 0:
        return None
    chunks = summary.chunk_throughput
    ratio = None if chunks is None else chunks / ceiling_chunks_per_s
    status = _judged(ratio, within(ratio, fraction))
    detail = f"{chunks or 0:,.0f} chunks/s = {_pct(ratio)} of the client's measured ceiling (max {_pct(fraction)})"
    if status == "fail":
        detail += ("; the load generator ran near its own limit, so its timings may describe the client. Fix: "
                   "give it more cores (STUDYC_CLIENT_CPUS), run fewer jobs on the machine at once; then re-run")
    elif status == "unverified":
        detail += "; cannot verify: no chunk rate measured (no completed request). Fix: see the errors check"
    return _result(point, "client_headroom", status, "warn", ratio, fraction, detail)


def itl_trusted(point: PointStep, fidelity: Fidelity) -> CheckResult:
    """The client's token gaps are real (`runner.checks.fidelity`): warn-level, and the point's ITL
    percentiles are withheld when it fails (TPOT and throughput stand)."""
    detail = fidelity.message
    if fidelity.status == "unverified":
        detail += ": cannot verify. Fix: output_len of at least 2 tokens streamed in separate chunks"
    return _result(point, "itl_trusted", fidelity.status, "warn", fidelity.bunched_share, MAX_BUNCHED_SHARE,
                   detail)


def tail_stable(point: PointStep, metric: str, found: Cliff) -> CheckResult | None:
    """A tail percentile is not on a cliff (`runner.checks.tails`): its neighbours (p94 and p96 for p95)
    differ by less than CLIFF_RATIO. Warn-level: the value stands, but a hypothesis on the metric is not
    decided where it fails (report.scoring.sides). None where the point has none of the values (the metric is
    missing and said so); unverified with one value, or a low neighbour of 0."""
    if found.n == 0:
        return None
    lo_q, hi_q = neighbours(found.q)
    ratio = found.ratio
    status = _judged(ratio, ratio is not None and ratio < CLIFF_RATIO)
    what = ("gap" if metric.startswith("itl") else "request") + ("" if found.n == 1 else "s")
    q = f"p{found.q:g}"
    detail = (f"p{lo_q:g} {_ms(found.low)}, {q} {_ms(found.at)}, p{hi_q:g} {_ms(found.high)} over {found.n:,} "
              f"{what}: " + (f"{ratio:.2f}x apart (on a cliff from {CLIFF_RATIO:g}x)" if ratio is not None else
                             "no ratio"))
    if status == "fail":
        detail += (f"; the {q} reads whether the share of slow {what} is over or under {100 - found.q:g}%, not how "
                   f"slow they are, so a hypothesis on {metric} is not decided by this point. Fix: state it on a "
                   "percentile off the cliff, or on a mean")
    elif status == "unverified":
        detail += "; cannot verify: " + ("one value" if found.n < 2 else f"p{lo_q:g} is 0")
    return _result(point, check_name(metric), status, "warn", ratio, CLIFF_RATIO, detail)


@dataclass(frozen=True)
class Evidence:
    """Everything the checks read besides the summary."""

    cache: CacheState
    outputs: Sequence[Output]
    halves_gap: float | None
    client_ceiling_chunks_per_s: float | None
    reconciliation: Reconciliation | None
    fidelity: Fidelity
    open_allowance: float | None = None
    expected_hit_rate: float = 0.0
    prefix_caching: bool = True  # False: the engine runs with --no-enable-prefix-caching
    tails: Mapping[str, Cliff] = field(default_factory=dict)  # tail metric -> its percentile and neighbours


def evaluate(point: PointStep, summary: PointSummary, *, thresholds: Checks, evidence: Evidence) -> list[CheckResult]:
    """Every check of one point, in a fixed order."""
    e = evidence
    found = [
        steady_state(point, summary),
        littles_law(point, summary, thresholds.littles_law_tolerance, e.open_allowance),
        reconciliation(point, e.reconciliation),
        cache_cold(point, e.cache, thresholds.max_cold_hit_rate, e.expected_hit_rate, e.prefix_caching),
        output_exact(point, e.outputs),
        errors(point, summary),
        warmup_sufficient(point, e.halves_gap, thresholds.warmup_tolerance),
        client_headroom(point, summary, e.client_ceiling_chunks_per_s, thresholds.client_ceiling_fraction),
        itl_trusted(point, e.fidelity),
        *(tail_stable(point, metric, found) for metric, found in e.tails.items()),
    ]
    return [c for c in found if c is not None]


def verdict(checks: Sequence[CheckResult]) -> tuple[bool, bool]:
    """(valid, flagged): invalid if any fail-level check did not pass (failed or unverified);
    flagged if any warning fired."""
    valid = all(c.passed for c in checks if c.severity == "fail")
    flagged = any(not c.passed for c in checks if c.severity == "warn")
    return valid, flagged


def verdict_reason(checks: Sequence[CheckResult]) -> str:
    """"valid", "invalid: a, b" (a fail-level check measured a fault) or "unverified: a" (none
    failed, but one could not verify). An unverified point is not valid either."""
    failed = [c.name for c in checks if c.severity == "fail" and c.status == "fail"]
    unverified = [c.name for c in checks if c.severity == "fail" and c.status == "unverified"]
    if failed:
        return "invalid: " + ", ".join(failed) + (f" (unverified: {', '.join(unverified)})" if unverified else "")
    if unverified:
        return "unverified: " + ", ".join(unverified)
    return "valid"
