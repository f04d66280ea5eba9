"""The judge: one point's summary, checks and verdict, from what was observed.

Used by the point runner right after a point ran and by `studyc recheck` on stored records, so a
point is judged the same way wherever it is judged. Pure: no I/O.

What the request records cannot tell (the prefix-cache counters and reset, preemptions, KV usage,
GPU telemetry) comes in as a `ServerSide`: `observe` makes it from the scrapes and samples of a
live point; `ServerSide.stored` reads it back from a stored point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from compiler.plan import PointStep
from compiler.study import Checks
from runner import checks as checks_mod
from runner import metrics
from runner.cache import CacheState
from runner.records import CheckResult, PointRecord, PointSummary, RequestRecord, TelemetrySample
from runner.stats import GpuStats, gpu_stats, halves_gap, peak, summarize


@dataclass(frozen=True)
class ServerSide:
    """What the server and the GPU said about a point's measured window."""

    cache: CacheState
    preemptions: float | None = None
    kv_cache_usage_peak: float | None = None
    gpu: GpuStats = field(default_factory=GpuStats)

    @classmethod
    def stored(cls, point: PointRecord) -> ServerSide:
        s = point.summary
        return cls(
            cache=CacheState(reset_ok=point.reset_ok, queries=s.prefix_queries, hits=s.prefix_hits),
            preemptions=s.preemptions,
            kv_cache_usage_peak=s.kv_cache_usage_peak,
            gpu=GpuStats(power_mean_w=s.power_mean_w, sm_clock_mean_mhz=s.sm_clock_mean_mhz,
                         mem_clock_mean_mhz=s.mem_clock_mean_mhz, temp_max_c=s.temp_max_c, energy_j=s.energy_j),
        )


def observe(
    reset_ok: bool | None,
    before: metrics.Snapshot,
    after: metrics.Snapshot,
    telemetry: Sequence[TelemetrySample],
) -> ServerSide:
    """The server side of a live point: counter deltas between the scrapes that bracket the window,
    the peak KV usage the poller saw, and the GPU statistics of the NVML samples."""
    return ServerSide(
        cache=CacheState(
            reset_ok=reset_ok,
            queries=metrics.delta(before, after, metrics.PREFIX_CACHE_QUERIES),
            hits=metrics.delta(before, after, metrics.PREFIX_CACHE_HITS),
        ),
        preemptions=metrics.delta(before, after, metrics.PREEMPTIONS),
        kv_cache_usage_peak=peak(telemetry, "kv_cache_usage"),
        gpu=gpu_stats(telemetry),
    )


@dataclass(frozen=True)
class Judgement:
    summary: PointSummary
    checks: tuple[CheckResult, ...]
    valid: bool
    flagged: bool


def judge(
    step: PointStep,
    records: Sequence[RequestRecord],
    server: ServerSide,
    *,
    thresholds: Checks,
    client_ceiling_chunks_per_s: float | None,
) -> Judgement:
    """Summary and checks of one point. `records` may include warmup requests (they are left out)."""
    measured = [r for r in records if not r.warmup]
    client = summarize(measured, step.concurrency)
    summary = replace(
        client,
        prefix_queries=server.cache.queries,
        prefix_hits=server.cache.hits,
        prefix_hit_rate=server.cache.hit_rate,
        preemptions=server.preemptions,
        kv_cache_usage_peak=server.kv_cache_usage_peak,
        power_mean_w=server.gpu.power_mean_w,
        sm_clock_mean_mhz=server.gpu.sm_clock_mean_mhz,
        mem_clock_mean_mhz=server.gpu.mem_clock_mean_mhz,
        temp_max_c=server.gpu.temp_max_c,
        energy_j=server.gpu.energy_j,
        energy_per_token_j=server.gpu.energy_per_token_j(client.output_tokens),
    )
    found = checks_mod.evaluate(
        step, summary, thresholds=thresholds, cache=server.cache,
        output_lengths=[r.output_tokens for r in measured if r.ok],
        halves_gap=halves_gap(measured), client_ceiling_chunks_per_s=client_ceiling_chunks_per_s,
    )
    valid, flagged = checks_mod.verdict(found)
    return Judgement(summary=summary, checks=tuple(found), valid=valid, flagged=flagged)
