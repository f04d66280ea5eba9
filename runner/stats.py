"""Per-point statistics computed from request records and telemetry samples alone, so any can be
recomputed from the DB.

Pure functions: records in, numbers out (SI units: seconds, tokens/s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from runner.records import PointSummary, TelemetrySample


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


def distribution(values: Sequence[float]) -> tuple[float | None, ...]:
    """(mean, p50, p90, p95, p99) of the values; all None for none."""
    return (mean(values), *(percentile(values, q) for q in (50, 90, 95, 99)))


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


def summarize(records: Sequence[Record], concurrency: int | None) -> PointSummary:
    """Throughput, latency distributions and Little's Law terms of one point's measured requests
    (the server-side fields of the summary are left None: the judge fills them)."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    win = window(records)
    inputs, outputs, chunks = (sum(r.prompt_tokens for r in ok), sum(r.output_tokens for r in ok),
                               sum(r.chunks for r in ok))
    base = PointSummary(requests_ok=len(ok), requests_failed=len(measured) - len(ok), input_tokens=inputs,
                        output_tokens=outputs, chunks=chunks)
    if win is None:
        return base
    span = win.duration_s
    ttft = [r.first_token_s - r.sent_s for r in ok if r.first_token_s is not None]
    e2e = [r.end_s - r.sent_s for r in ok]
    tpot = [
        (r.end_s - r.first_token_s) / (r.output_tokens - 1)
        for r in ok
        if r.first_token_s is not None and r.output_tokens > 1
    ]
    itl = [b - a for r in ok for a, b in zip(r.token_times_s, r.token_times_s[1:], strict=False)]
    t = distribution(ttft)
    i = distribution(itl)
    p = distribution(tpot)
    e = distribution(e2e)

    # Little's Law: L (time-averaged in flight, from every measured request's span) against
    # lambda * W (completed requests per second times their mean time in the system since scheduled).
    spans = [(r.sent_s, r.end_s) for r in measured]
    in_flight = in_flight_integral(spans, win.start_s, win.end_s) / span
    lam = len(ok) / span
    w = mean([r.end_s - r.scheduled_s for r in ok]) or 0.0
    return replace(
        base,
        window_s=span,
        output_throughput=outputs / span,
        total_throughput=(outputs + inputs) / span,
        request_throughput=len(ok) / span,
        goodput=len(ok) / span,
        chunk_throughput=chunks / span,
        ttft_mean_s=t[0], ttft_p50_s=t[1], ttft_p90_s=t[2], ttft_p95_s=t[3], ttft_p99_s=t[4],
        itl_mean_s=i[0], itl_p50_s=i[1], itl_p90_s=i[2], itl_p95_s=i[3], itl_p99_s=i[4],
        tpot_mean_s=p[0], tpot_p50_s=p[1], tpot_p90_s=p[2], tpot_p95_s=p[3], tpot_p99_s=p[4],
        e2e_mean_s=e[0], e2e_p50_s=e[1], e2e_p90_s=e[2], e2e_p95_s=e[3], e2e_p99_s=e[4],
        mean_in_flight=in_flight,
        littles_law_error=abs(in_flight - lam * w) / in_flight if in_flight > 0 else None,
        concurrency_error=concurrency_error(measured, concurrency) if concurrency is not None else None,
    )


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


@dataclass(frozen=True)
class GpuStats:
    """Means and totals of a point's NVML samples (all None without a GPU)."""

    power_mean_w: float | None = None
    sm_clock_mean_mhz: float | None = None
    mem_clock_mean_mhz: float | None = None
    temp_max_c: float | None = None
    energy_j: float | None = None  # the energy counter's last sample minus its first

    def energy_per_token_j(self, output_tokens: int) -> float | None:
        return self.energy_j / output_tokens if self.energy_j is not None and output_tokens > 0 else None


def gpu_stats(samples: Sequence[TelemetrySample]) -> GpuStats:
    """GPU statistics of the `nvml` samples of one point (other sources are ignored)."""
    rows = [s for s in samples if s.source == "nvml"]

    def col(name: str) -> list[float]:
        return [v for v in (getattr(s, name) for s in rows) if v is not None]

    energy = col("energy_j")
    return GpuStats(
        power_mean_w=mean(col("power_w")),
        sm_clock_mean_mhz=mean(col("sm_clock_mhz")),
        mem_clock_mean_mhz=mean(col("mem_clock_mhz")),
        temp_max_c=max(col("temp_c"), default=None),
        energy_j=energy[-1] - energy[0] if len(energy) >= 2 else None,
    )


def peak(samples: Sequence[TelemetrySample], name: str, source: str = "metrics") -> float | None:
    """The largest value of one field over the samples of one source; None when none has it."""
    values = [v for v in (getattr(s, name) for s in samples if s.source == source) if v is not None]
    return max(values, default=None)
