"""Validity checks of one point. A failed check marks the point invalid; a warning flags it.
Both are stored and shown, never hidden; neither stops the run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from compiler.plan import PointStep
from compiler.study import Checks


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    severity: Literal["fail", "warn"]
    value: float | None
    threshold: float | None
    detail: str

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def evaluate(
    point: PointStep,
    summary: dict[str, Any],
    *,
    thresholds: Checks,
    reset_ok: bool | None,
    hit_rate: float | None,
    output_lengths: list[int],
    halves_gap: float | None,
    client_ceiling_chunks_per_s: float | None,
) -> list[Check]:
    out: list[Check] = []
    tol = thresholds.littles_law_tolerance
    ll = summary.get("littles_law_error")
    out.append(Check(
        "littles_law", ll is not None and ll <= tol, "fail", ll, tol,
        f"L = {summary.get('mean_in_flight', 0) or 0:.3f} in flight vs lambda*W; error {_pct(ll)} (tolerance {_pct(tol)})",
    ))
    if point.concurrency is not None:
        ce = summary.get("concurrency_error")
        out.append(Check(
            "concurrency_held", ce is not None and ce <= tol, "fail", ce, tol,
            f"in flight while sending vs configured {min(point.concurrency, point.requests)}: error {_pct(ce)}",
        ))
    if point.cache == "reset":
        limit = thresholds.max_cold_hit_rate
        cold = reset_ok is True and (hit_rate is None or hit_rate <= limit)
        why = "reset refused" if reset_ok is not True else f"hit rate {_pct(hit_rate)} (max {_pct(limit)})"
        out.append(Check("cache_cold", cold, "fail", hit_rate, limit, f"reset + verify: {why}"))
    else:
        out.append(Check(
            "cache_cold", False, "warn", hit_rate, None,
            f"prefix cache kept between points: hit rate {_pct(hit_rate)}; this is not a cold measurement",
        ))
    wrong = [n for n in output_lengths if n != point.output_len]
    out.append(Check(
        "output_exact", not wrong and bool(output_lengths), "fail", float(len(wrong)), 0.0,
        f"{len(output_lengths) - len(wrong)}/{len(output_lengths)} requests returned exactly {point.output_len} tokens",
    ))
    failed = summary.get("requests_failed", 0)
    out.append(Check(
        "errors", failed == 0 and summary.get("requests_ok", 0) == point.requests, "fail", float(failed), 0.0,
        f"{summary.get('requests_ok', 0)}/{point.requests} requests ok, {failed} failed",
    ))
    wt = thresholds.warmup_tolerance
    out.append(Check(
        "warmup_sufficient", halves_gap is not None and halves_gap <= wt, "warn", halves_gap, wt,
        f"time per output token: the first half of the window was {_pct(halves_gap)} slower than the second",
    ))
    chunks = summary.get("chunk_throughput")
    if client_ceiling_chunks_per_s:
        limit = thresholds.client_ceiling_fraction * client_ceiling_chunks_per_s
        ratio = (chunks or 0.0) / client_ceiling_chunks_per_s
        out.append(Check(
            "client_headroom", (chunks or 0.0) <= limit, "warn", ratio, thresholds.client_ceiling_fraction,
            f"{chunks or 0:,.0f} chunks/s = {_pct(ratio)} of the client's measured ceiling",
        ))
    return out


def verdict(checks: list[Check]) -> tuple[bool, bool]:
    """(valid, flagged): invalid if any fail-level check failed; flagged if any warning fired."""
    valid = all(c.passed for c in checks if c.severity == "fail")
    flagged = any(not c.passed for c in checks if c.severity == "warn")
    return valid, flagged
