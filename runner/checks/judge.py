"""The judge: one point's summary, checks and verdict, from what was observed.

Used by the point runner right after a point ran and by `studyc recheck` on stored records, so a
point is judged the same way wherever it is judged. Pure: no I/O.

What the request records cannot tell (the server's counters at the window's edges, the prefix-cache
reset, GPU telemetry) comes in as a `ServerSide`: `observe` makes it from the scrapes and samples of a
live point; `ServerSide.stored` reads it back from a stored point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from compiler.plan import PointStep
from compiler.slo import Slo
from compiler.study import Checks
from runner.checks import checks as checks_mod
from runner.checks.cache import CacheState
from runner.checks.fidelity import WITHHELD_METRICS, check_fidelity
from runner.checks.reconcile import E2E, reconcile, server_step_s
from runner.checks.stats import (
    GpuStats,
    gaps,
    gpu_stats,
    halves_gap,
    latency_requests,
    occupancy,
    open_loop_allowance,
    summarize,
    ttfts,
)
from runner.checks.tails import TAILS, Cliff, cliff
from runner.measure import prometheus
from runner.store.records import CheckResult, PointRecord, PointSummary, RequestRecord, TelemetrySample


@dataclass(frozen=True)
class ServerSide:
    """What the server and the GPU said about a point's measured window: the counters at its two
    edges (None where they were not recorded, as in points stored before they were), the cache
    state and preemptions read from them, and the GPU statistics of the NVML samples."""

    cache: CacheState
    preemptions: float | None = None
    kv_cache_usage_peak: float | None = None  # kept as stored for old points; no longer measured
    gpu: GpuStats = field(default_factory=GpuStats)
    before: prometheus.Snapshot | None = None
    after: prometheus.Snapshot | None = None

    @classmethod
    def stored(cls, point: PointRecord) -> ServerSide:
        s = point.summary
        before = after = None
        if point.counters_before_json and point.counters_after_json:
            before = prometheus.edge_from_json(point.counters_before_json)
            after = prometheus.edge_from_json(point.counters_after_json)
        return cls(
            cache=CacheState(reset_ok=point.reset_ok, queries=s.prefix_queries, hits=s.prefix_hits),
            preemptions=s.preemptions,
            kv_cache_usage_peak=s.kv_cache_usage_peak,
            gpu=GpuStats(power_mean_w=s.power_mean_w, sm_clock_mean_mhz=s.sm_clock_mean_mhz,
                         mem_clock_mean_mhz=s.mem_clock_mean_mhz, temp_max_c=s.temp_max_c, energy_j=s.energy_j),
            before=before,
            after=after,
        )


def observe(
    reset_ok: bool | None,
    before: prometheus.Snapshot,
    after: prometheus.Snapshot,
    telemetry: Sequence[TelemetrySample],
) -> ServerSide:
    """The server side of a live point: counter deltas between the scrapes that bracket the window
    and the GPU statistics of the NVML samples. Nothing is read from /metrics inside the window."""
    return ServerSide(
        cache=CacheState(
            reset_ok=reset_ok,
            queries=prometheus.delta(before, after, prometheus.PREFIX_CACHE_QUERIES),
            hits=prometheus.delta(before, after, prometheus.PREFIX_CACHE_HITS),
        ),
        preemptions=prometheus.delta(before, after, prometheus.PREEMPTIONS),
        gpu=gpu_stats(telemetry),
        before=before,
        after=after,
    )


@dataclass(frozen=True)
class Judgement:
    summary: PointSummary
    checks: tuple[CheckResult, ...]
    valid: bool
    flagged: bool
    reason: str = "valid"  # checks.verdict_reason


def judge(
    step: PointStep,
    records: Sequence[RequestRecord],
    server: ServerSide,
    *,
    thresholds: Checks,
    client_ceiling_chunks_per_s: float | None,
    client_stall_s: float | None = None,
    expected: checks_mod.Expectation | None = None,
    slo: Slo | None = None,
    prefix_caching: bool = True,
) -> Judgement:
    """Summary and checks of one point. `records` may include warmup requests: they are left out of
    the statistics, and reconciliation checks that they ended before the window opened.
    `client_stall_s`: the load generator's longest loop stall in the window (None: not measured).
    `expected`: each measured request's max_tokens and the hit rate the workload's shared prefixes allow
    (None: output_len for every request and no shared prefix, the classic workload). `slo`: the study's
    [slo], which goodput and SLO attainment are read by. `prefix_caching`: False where the engine runs with
--no-enable-prefix-caching (`cache_cold` then verifies no lookups and no hits)."""
    measured = [r for r in records if not r.warmup]
    burst = checks_mod.is_burst(step)
    client = summarize(measured, step.concurrency, burst=burst, slo=slo)
    before, after = server.before, server.after
    rec, step_s, in_server = None, None, None
    if before is not None and after is not None:
        rec = reconcile(before, after, records, client_stall_s=client_stall_s)
        step_s = server_step_s(before, after)
        in_server = occupancy(prometheus.delta(before, after, E2E + "_sum"), measured)
    fidelity = check_fidelity(measured, step_s)
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
        server_in_flight=in_server,
        itl_bunched_share=fidelity.bunched_share,
        frontend_delay_s=None if rec is None else rec.frontend_delay_s,
        client_stall_max_s=client_stall_s,
    )
    if fidelity.status == "fail":  # bunched gaps: ITL percentiles would describe the client
        withheld: dict[str, Any] = dict.fromkeys(WITHHELD_METRICS)
        summary = replace(summary, **withheld)
    steady = latency_requests(measured, step.concurrency, burst=burst)  # the requests the latencies describe
    evidence = checks_mod.Evidence(
        cache=server.cache,
        outputs=[checks_mod.Output(r.output_tokens, r.chunks, _asked(expected, r.index)) for r in measured if r.ok],
        halves_gap=halves_gap(steady),
        client_ceiling_chunks_per_s=client_ceiling_chunks_per_s,
        reconciliation=rec,
        fidelity=fidelity,
        open_allowance=open_loop_allowance(measured) if step.concurrency is None else None,
        expected_hit_rate=expected.hit_rate if expected is not None else 0.0,
        prefix_caching=prefix_caching,
        tails=tail_cliffs(steady),
    )
    found = checks_mod.evaluate(step, summary, thresholds=thresholds, evidence=evidence)
    valid, flagged = checks_mod.verdict(found)
    return Judgement(summary=summary, checks=tuple(found), valid=valid, flagged=flagged,
                     reason=checks_mod.verdict_reason(found))


def tail_cliffs(latency: Sequence[RequestRecord]) -> dict[str, Cliff]:
    """Each tail metric's percentile with its neighbours, over the requests its distribution is read over."""
    values = {"ttft": ttfts(latency), "itl": gaps(latency)}
    return {metric: cliff(values[family], q) for metric, (family, q) in TAILS.items()}


def _asked(expected: checks_mod.Expectation | None, index: int) -> int | None:
    if expected is None or not 0 <= index < len(expected.output_tokens):
        return None
    return expected.output_tokens[index]
