"""Validity checks of one point. A failed check marks the point invalid; a warning flags it.
Both are stored and shown, never hidden; neither stops the run.

Each check is a pure function of typed inputs returning one `CheckResult`. A check that cannot
verify (its input is missing) does not pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from compiler.plan import PointStep
from compiler.study import Checks
from runner.cache import CacheState
from runner.records import CheckResult, PointSummary


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def within(value: float | None, tolerance: float) -> bool:
    """value <= tolerance; a missing value is not within anything."""
    return value is not None and value <= tolerance


def littles_law(point: PointStep, summary: PointSummary, tolerance: float) -> CheckResult:
    ll = summary.littles_law_error
    return CheckResult(
        point.id, "littles_law", within(ll, tolerance), "fail", ll, tolerance,
        f"L = {summary.mean_in_flight or 0:.3f} in flight vs lambda*W; error {_pct(ll)} (tolerance {_pct(tolerance)})",
    )


def concurrency_held(point: PointStep, summary: PointSummary, tolerance: float) -> CheckResult | None:
    """Closed loop only (None for an open-loop point)."""
    if point.concurrency is None:
        return None
    ce = summary.concurrency_error
    return CheckResult(
        point.id, "concurrency_held", within(ce, tolerance), "fail", ce, tolerance,
        f"in flight while sending vs configured {min(point.concurrency, point.requests)}: error {_pct(ce)}",
    )


def cache_cold(point: PointStep, cache: CacheState, max_hit_rate: float) -> CheckResult:
    """`cache = "reset"`: fail-level, cold only when verified (see `CacheState.cold`).
    `cache = "keep"`: a warning that always fires, since the point is not a cold measurement."""
    rate = cache.hit_rate
    if point.cache == "reset":
        cold, why = cache.cold(max_hit_rate)
        return CheckResult(point.id, "cache_cold", cold, "fail", rate, max_hit_rate, f"reset + verify: {why}")
    return CheckResult(
        point.id, "cache_cold", False, "warn", rate, None,
        f"prefix cache kept between points: hit rate {_pct(rate)}; this is not a cold measurement",
    )


def output_exact(point: PointStep, output_lengths: Sequence[int]) -> CheckResult:
    wrong = [n for n in output_lengths if n != point.output_len]
    return CheckResult(
        point.id, "output_exact", not wrong and bool(output_lengths), "fail", float(len(wrong)), 0.0,
        f"{len(output_lengths) - len(wrong)}/{len(output_lengths)} requests returned exactly {point.output_len} tokens",
    )


def errors(point: PointStep, summary: PointSummary) -> CheckResult:
    failed = summary.requests_failed
    return CheckResult(
        point.id, "errors", failed == 0 and summary.requests_ok == point.requests, "fail", float(failed), 0.0,
        f"{summary.requests_ok}/{point.requests} requests ok, {failed} failed",
    )


def warmup_sufficient(point: PointStep, halves_gap: float | None, tolerance: float) -> CheckResult:
    return CheckResult(
        point.id, "warmup_sufficient", within(halves_gap, tolerance), "warn", halves_gap, tolerance,
        f"time per output token: the first half of the window was {_pct(halves_gap)} slower than the second",
    )


def client_headroom(
    point: PointStep, summary: PointSummary, ceiling_chunks_per_s: float | None, fraction: float
) -> CheckResult | None:
    """Only when the client's own ceiling was measured (None otherwise). No chunk rate: not passed."""
    if not ceiling_chunks_per_s or ceiling_chunks_per_s <= 0:
        return None
    chunks = summary.chunk_throughput
    ratio = None if chunks is None else chunks / ceiling_chunks_per_s
    return CheckResult(
        point.id, "client_headroom", within(ratio, fraction), "warn", ratio, fraction,
        f"{chunks or 0:,.0f} chunks/s = {_pct(ratio)} of the client's measured ceiling",
    )


def evaluate(
    point: PointStep,
    summary: PointSummary,
    *,
    thresholds: Checks,
    cache: CacheState,
    output_lengths: Sequence[int],
    halves_gap: float | None,
    client_ceiling_chunks_per_s: float | None,
) -> list[CheckResult]:
    """Every check of one point, in a fixed order."""
    tol = thresholds.littles_law_tolerance
    found = [
        littles_law(point, summary, tol),
        concurrency_held(point, summary, tol),
        cache_cold(point, cache, thresholds.max_cold_hit_rate),
        output_exact(point, output_lengths),
        errors(point, summary),
        warmup_sufficient(point, halves_gap, thresholds.warmup_tolerance),
        client_headroom(point, summary, client_ceiling_chunks_per_s, thresholds.client_ceiling_fraction),
    ]
    return [c for c in found if c is not None]


def verdict(checks: Sequence[CheckResult]) -> tuple[bool, bool]:
    """(valid, flagged): invalid if any fail-level check failed; flagged if any warning fired."""
    valid = all(c.passed for c in checks if c.severity == "fail")
    flagged = any(not c.passed for c in checks if c.severity == "warn")
    return valid, flagged
