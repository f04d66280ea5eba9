"""Per-point statistics computed from request records alone, so any can be recomputed from the DB.

Pure functions: records in, numbers out (SI units: seconds, tokens/s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Record(Protocol):
    """What summaries read from a request record; read-only, so frozen dataclasses satisfy it."""

    @property
    def warmup(self) -> bool: ...

    @property
    def scheduled_s(self) -> float: ...

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
    def chunks(self) -> int: ...

    @property
    def ok(self) -> bool: ...


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; None for no values."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _stats(stem: str, values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"{stem}_mean_s": mean(values)}
    for q in (50, 90, 95, 99):
        out[f"{stem}_p{q}_s"] = percentile(values, q)
    return out


def in_flight_integral(spans: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Integral over [start, end] of the number of spans in flight (request-seconds)."""
    total = 0.0
    for a, b in spans:
        lo, hi = max(a, start), min(b, end)
        if hi > lo:
            total += hi - lo
    return total


@dataclass(frozen=True)
class Window:
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return max(self.end_s - self.start_s, 1e-9)


def window(records: Sequence[Record]) -> Window | None:
    measured = [r for r in records if not r.warmup]
    if not measured:
        return None
    return Window(min(r.sent_s for r in measured), max(r.end_s for r in measured))


def summarize(records: Sequence[Record], concurrency: int | None) -> dict[str, Any]:
    """Throughput, latency distributions and Little's Law terms of one point's measured requests."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    win = window(records)
    out: dict[str, Any] = {
        "requests_ok": len(ok),
        "requests_failed": len(measured) - len(ok),
        "input_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens": sum(r.output_tokens for r in ok),
        "chunks": sum(r.chunks for r in ok),
    }
    if win is None:
        return out
    span = win.duration_s
    out["window_s"] = span
    out["output_throughput"] = out["output_tokens"] / span
    out["total_throughput"] = (out["output_tokens"] + out["input_tokens"]) / span
    out["request_throughput"] = len(ok) / span
    out["goodput"] = len(ok) / span
    out["chunk_throughput"] = out["chunks"] / span
    ttft = [r.first_token_s - r.sent_s for r in ok if r.first_token_s is not None]
    e2e = [r.end_s - r.sent_s for r in ok]
    tpot = [
        (r.end_s - r.first_token_s) / (r.output_tokens - 1)
        for r in ok
        if r.first_token_s is not None and r.output_tokens > 1
    ]
    itl = [b - a for r in ok for a, b in zip(r.token_times_s, r.token_times_s[1:], strict=False)]
    out |= _stats("ttft", ttft) | _stats("e2e", e2e) | _stats("tpot", tpot) | _stats("itl", itl)

    # Little's Law: L (time-averaged in flight, from every measured request's span) against
    # lambda * W (completed requests per second times their mean time in the system since scheduled).
    spans = [(r.sent_s, r.end_s) for r in measured]
    in_flight = in_flight_integral(spans, win.start_s, win.end_s) / span
    lam = len(ok) / span
    w = mean([r.end_s - r.scheduled_s for r in ok]) or 0.0
    out["mean_in_flight"] = in_flight
    out["littles_law_error"] = abs(in_flight - lam * w) / in_flight if in_flight > 0 else None
    if concurrency is not None:
        out["concurrency_error"] = concurrency_error(measured, concurrency)
    return out


def concurrency_error(measured: Sequence[Record], concurrency: int) -> float | None:
    """Relative gap between the configured concurrency and the in-flight average while the client
    was still sending (closed loop: the client must refill a slot as soon as one frees)."""
    if not measured:
        return None
    target = min(concurrency, len(measured))
    sends = sorted(r.sent_s for r in measured)
    # Steady phase: from the moment every slot was first filled (the target-th send) to the last
    # send, after which in-flight drains by design. One wave (no send after the ramp): until the
    # first request ends.
    start = sends[target - 1]
    end = sends[-1]
    if end <= start:
        end = min(r.end_s for r in measured)
    if end <= start:
        return None
    level = in_flight_integral([(r.sent_s, r.end_s) for r in measured], start, end) / (end - start)
    return abs(level - target) / target


def halves_gap(records: Sequence[Record]) -> float | None:
    """How much slower (relative) the first half of the measured requests, by send time, produced
    tokens than the second half. An under-warmed engine (CUDA graphs still being captured, caches
    cold) is slow early; a first half that is *faster* is not a warmup problem, so the gap is signed."""
    ok = sorted((r for r in records if r.ok and not r.warmup), key=lambda r: r.sent_s)
    tpots = [
        (r.end_s - r.first_token_s) / (r.output_tokens - 1)
        for r in ok
        if r.first_token_s is not None and r.output_tokens > 1
    ]
    if len(tpots) < 2:
        return None
    half = len(tpots) // 2
    first, second = mean(tpots[:half]), mean(tpots[half:])
    if not first or not second:
        return None
    return (first - second) / second


def telemetry_summary(
    samples: Sequence[dict[str, Any]], energy_j: Sequence[float], output_tokens: int
) -> dict[str, Any]:
    """Means and totals of NVML telemetry rows over a point (empty without a GPU); `energy_j` is
    NVML's total-energy counter at each sample."""
    def col(name: str) -> list[float]:
        return [s[name] for s in samples if s.get(name) is not None]

    out: dict[str, Any] = {
        "power_mean_w": mean(col("power_w")),
        "sm_clock_mean_mhz": mean(col("sm_clock_mhz")),
        "mem_clock_mean_mhz": mean(col("mem_clock_mhz")),
        "temp_max_c": max(col("temp_c"), default=None),
    }
    out["energy_j"] = energy_j[-1] - energy_j[0] if len(energy_j) >= 2 else None
    out["energy_per_token_j"] = (
        out["energy_j"] / output_tokens if out["energy_j"] is not None and output_tokens else None
    )
    return out
