"""Per-point statistics computed from request records and telemetry samples alone, so any can be
recomputed from the DB.

Pure functions: records in, numbers out (SI units: seconds, tokens/s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from compiler.slo import Slo
from runner.store.records import PointSummary, RequestRecord, TelemetrySample


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; None for no values."""
    return _at(sorted(values), q)


def _at(data: Sequence[float], q: float) -> float | None:
    """`percentile` of values already sorted."""
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def distribution(values: Sequence[float]) -> tuple[float | None, ...]:
    """(mean, p50, p90, p95, p99) of the values; all None for none."""
    data = sorted(values)
    return (mean(values), *(_at(data, q) for q in (50, 90, 95, 99)))


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


def window(records: Sequence[RequestRecord]) -> Window | None:
    """The whole measured window: first send to last end."""
    measured = [r for r in records if not r.warmup]
    if not measured:
        return None
    return Window(min(r.sent_s for r in measured), max(r.end_s for r in measured))


def steady_phase(records: Sequence[RequestRecord], concurrency: int) -> Window | None:
    """Closed loop: the phase where every slot is busy, from the C-th send to the last send (the
    client refills a slot the moment it frees, so in between C requests are in flight; before is
    the ramp, after is the drain). None for a single wave (no send after the first C).
    Multi-turn, a slot holds a conversation: the sends that count are the first turns'."""
    sends = sorted(r.sent_s for r in records if not r.warmup and r.turn == 0)
    if len(sends) <= concurrency:
        return None
    start, end = sends[concurrency - 1], sends[-1]
    return Window(start, end) if end > start else None


def thinking(records: Sequence[RequestRecord]) -> list[tuple[float, float]]:
    """Multi-turn: the think spans, from a turn's end to when the next turn was due (its scheduled
    time), after every turn that succeeded (a failed turn ends its conversation)."""
    ends = {(r.conversation, r.turn): r for r in records if r.conversation >= 0 and not r.warmup}
    out = []
    for r in ends.values():
        prev = ends.get((r.conversation, r.turn - 1)) if r.turn else None
        if prev is not None and prev.ok:
            out.append((prev.end_s, r.scheduled_s))
    return out


def steady_requests(records: Sequence[RequestRecord], phase: Window) -> list[RequestRecord]:
    """The completed measured requests that ran wholly inside the phase (no ramp, no drain)."""
    return [r for r in records if not r.warmup and r.ok and r.sent_s >= phase.start_s and r.end_s <= phase.end_s]


def _tokens_in(r: RequestRecord, win: Window) -> float:
    """Output tokens of one request that arrived inside the window (a chunk counts its share of
    the request's tokens: output_tokens / chunks)."""
    times = r.token_times_s
    if not times:
        return 0.0
    inside = sum(1 for t in times if win.start_s <= t <= win.end_s)
    return inside * r.output_tokens / len(times)


def meets_slo(r: RequestRecord, slo: Slo | None) -> bool:
    """Whether one request meets every objective, as `vllm bench serve --goodput` judges it: a completed
    request whose TTFT, TPOT ((end - first token) / (output tokens - 1), 0 for one token) and end-to-end
    latency are each at most its limit, all from the send; ITL, which the bench does not judge, as every gap
    between two of its chunks at most the limit. A failed request meets none; no SLO: every completed one."""
    if not r.ok:
        return False
    if slo is None:
        return True
    if r.first_token_s is None:
        return False  # completed without a token: no TTFT to meet
    tpot = (r.end_s - r.first_token_s) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
    values = {"ttft": r.first_token_s - r.sent_s, "tpot": tpot, "e2el": r.end_s - r.sent_s,
              "itl": max(gaps([r]), default=0.0)}
    return all(values[k] <= limit for k, limit in slo.limits_s().items())


def _phase(measured: Sequence[RequestRecord], concurrency: int | None, burst: bool) -> Window | None:
    return steady_phase(measured, concurrency) if concurrency and not burst else None


def latency_requests(records: Sequence[RequestRecord], concurrency: int | None, *,
                     burst: bool = False) -> list[RequestRecord]:
    """The requests `summarize` reads the latency distributions over: closed loop with a steady phase,
    those that ran wholly inside it; else every completed measured one."""
    measured = [r for r in records if not r.warmup]
    phase = _phase(measured, concurrency, burst)
    return steady_requests(measured, phase) if phase is not None else [r for r in measured if r.ok]


def ttfts(records: Sequence[RequestRecord]) -> list[float]:
    """Each request's time to first token, from its send (those with a first token)."""
    return [r.first_token_s - r.sent_s for r in records if r.first_token_s is not None]


def gaps(records: Sequence[RequestRecord]) -> list[float]:
    """Every gap between two consecutive chunks of each request."""
    return [b - a for r in records for a, b in zip(r.token_times_s, r.token_times_s[1:], strict=False)]


def summarize(records: Sequence[RequestRecord], concurrency: int | None, *, burst: bool = False,
              slo: Slo | None = None) -> PointSummary:
    """Throughput, latency distributions and Little's Law terms of one point's measured requests
    (the server-side fields of the summary are left None: the judge fills them).

    Closed loop (not a burst): rates over the steady phase, latency distributions over the requests
    that ran wholly inside it; without a steady phase (one wave) over the whole window, and
    `steady_requests` is 0 so the `steady_state` check fails. Open loop and bursts: the whole window.
    Goodput counts the requests completed in that window that meet `slo` (`meets_slo`); SLO attainment is
    the share of all measured requests that do (a failed one does not), as the bench counts them.
    """
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    whole = window(records)
    inputs, outputs, chunks = (sum(r.prompt_tokens for r in ok), sum(r.output_tokens for r in ok),
                               sum(r.chunks for r in ok))
    base = PointSummary(requests_ok=len(ok), requests_failed=len(measured) - len(ok), input_tokens=inputs,
                        output_tokens=outputs, chunks=chunks)
    if whole is None:
        return base
    closed = concurrency is not None
    phase = _phase(measured, concurrency, burst)
    if phase is not None:
        win, sel = phase, steady_requests(measured, phase)
        out_tok = sum(_tokens_in(r, win) for r in ok)
        chunk_n = sum(1 for r in ok for t in r.token_times_s if win.start_s <= t <= win.end_s)
        done = [r for r in ok if win.start_s < r.end_s <= win.end_s]
        in_tok = sum(r.prompt_tokens for r in ok
                     if r.first_token_s is not None and win.start_s < r.first_token_s <= win.end_s)
    else:
        win, sel, out_tok, chunk_n, done, in_tok = whole, ok, float(outputs), chunks, ok, inputs
    span = win.duration_s
    t = distribution(ttfts(sel))
    e = distribution([r.end_s - r.sent_s for r in sel])
    p = distribution([(r.end_s - r.first_token_s) / (r.output_tokens - 1)
                      for r in sel if r.first_token_s is not None and r.output_tokens > 1])
    i = distribution(gaps(sel))
    ts = distribution([r.first_token_s - r.scheduled_s for r in ok if r.first_token_s is not None])
    es = distribution([r.end_s - r.scheduled_s for r in ok])
    lag = [r.sent_s - r.scheduled_s for r in measured]

    spans = [(r.sent_s, r.end_s) for r in measured]
    in_flight = in_flight_integral(spans, win.start_s, win.end_s) / span
    lam_w: float | None
    expected: float | None
    if closed and (burst or phase is None):  # a burst, or one wave: no phase in which L = C must hold
        lam_w, expected = None, None
    elif closed:
        # lambda * W in its exact finite-window form: each request's time inside the phase, summed,
        # over the phase's length (completions/s times the mean latency carries a boundary error of
        # about W / T, tens of percent over a few waves). Multi-turn, a slot holds a conversation, so
        # its think time counts too: a thinking conversation is not a request in flight, but an idle
        # client is neither, and only the latter must make lambda * W fall short of C.
        think = thinking(measured)
        lam_w = in_flight + in_flight_integral(think, win.start_s, win.end_s) / span if think else in_flight
        expected = float(concurrency or 0)
    else:
        lam_w, expected = open_loop_little(measured, ok)
    return replace(
        base,
        window_s=span,
        output_throughput=out_tok / span,
        total_throughput=(out_tok + in_tok) / span,
        request_throughput=len(done) / span,
        goodput=sum(1 for r in done if meets_slo(r, slo)) / span,
        slo_attainment=sum(1 for r in measured if meets_slo(r, slo)) / len(measured) if slo is not None else None,
        chunk_throughput=chunk_n / span,
        ttft_mean_s=t[0], ttft_p50_s=t[1], ttft_p90_s=t[2], ttft_p95_s=t[3], ttft_p99_s=t[4],
        itl_mean_s=i[0], itl_p50_s=i[1], itl_p90_s=i[2], itl_p95_s=i[3], itl_p99_s=i[4],
        tpot_mean_s=p[0], tpot_p50_s=p[1], tpot_p90_s=p[2], tpot_p95_s=p[3], tpot_p99_s=p[4],
        e2e_mean_s=e[0], e2e_p50_s=e[1], e2e_p90_s=e[2], e2e_p95_s=e[3], e2e_p99_s=e[4],
        ttft_sched_mean_s=ts[0], ttft_sched_p50_s=ts[1], ttft_sched_p99_s=ts[4],
        e2e_sched_mean_s=es[0], e2e_sched_p50_s=es[1], e2e_sched_p99_s=es[4],
        client_lag_mean_s=mean(lag), client_lag_p99_s=percentile(lag, 99), client_lag_max_s=max(lag, default=None),
        mean_in_flight=in_flight,
        steady_requests=len(sel) if phase is not None else (0 if closed and not burst else None),
        little_lambda_w=lam_w,
        littles_law_error=abs(lam_w - expected) / expected if lam_w is not None and expected else None,
        client_in_flight=in_flight_integral(spans, whole.start_s, whole.end_s) / whole.duration_s,
    )


def open_loop_little(measured: Sequence[RequestRecord], ok: Sequence[RequestRecord]) -> tuple[float | None, float | None]:
    """Open loop: (lambda * W from the records, what it must equal by the offered load).

    lambda = completions per second (first to last completion), W = mean time from the scheduled
    send to the end; it must equal the offered rate (from the schedule, first to last scheduled
    send) times the same W, so the error is that of completions/s against the offered rate (a
    server or client that does not keep up makes it smaller). Closed loop, the summary compares the
    steady phase's lambda * W (time-average in flight) with the configured concurrency: a client
    that idles between a completion and its next send makes it smaller.
    """
    if len(ok) < 2:
        return None, None
    w_sched = mean([r.end_s - r.scheduled_s for r in ok]) or 0.0
    ends = sorted(r.end_s for r in ok)
    sched = sorted(r.scheduled_s for r in measured)
    if ends[-1] <= ends[0] or sched[-1] <= sched[0]:
        return None, None
    completions = (len(ok) - 1) / (ends[-1] - ends[0])
    offered = (len(measured) - 1) / (sched[-1] - sched[0])
    return completions * w_sched, offered * w_sched


def open_loop_allowance(records: Sequence[RequestRecord]) -> float | None:
    """Open loop: the error the span estimate of the completion rate carries by itself. The first
    and last completions lag their scheduled sends by a request's time in the system, so over a
    schedule of length T the rates differ by about 2 * median(W) / T even when the server keeps up."""
    ok = [r for r in records if not r.warmup and r.ok]
    if len(ok) < 2:
        return None
    sched = sorted(r.scheduled_s for r in records if not r.warmup)
    if sched[-1] <= sched[0]:
        return None
    w = percentile([r.end_s - r.scheduled_s for r in ok], 50) or 0.0
    return 2 * w / (sched[-1] - sched[0])


def occupancy(server_e2e_sum_s: float | None, records: Sequence[RequestRecord]) -> float | None:
    """The server's own mean occupancy over the client's whole window: the sum of its e2e latency
    histogram over the window divided by the window's length (None without the counter)."""
    whole = window(records)
    if server_e2e_sum_s is None or whole is None:
        return None
    return server_e2e_sum_s / whole.duration_s


def halves_gap(records: Sequence[RequestRecord]) -> float | None:
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
