"""One point on a running server: warmup, verified cache reset, measured load with telemetry,
summary and checks. Self-contained: a point step and a server address in, an outcome out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from compiler.plan import PointStep
from compiler.study import Checks
from runner import checks as checks_mod
from runner import metrics
from runner.engine import reset_prefix_cache
from runner.loadgen import RequestRecord, RequestSpec, make_prompts, run_load
from runner.nvml import NvmlSampler
from runner.summary import halves_gap, summarize, telemetry_summary

RESET_ATTEMPTS = 5


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    api_key: str | None
    model: str


@dataclass(frozen=True)
class PointContext:
    thresholds: Checks
    client_ceiling_chunks_per_s: float | None
    gpu_index: int
    clock_origin_s: float  # time.monotonic() at run start: telemetry times are stored relative to it
    client_cpus: tuple[int, ...] | None = None  # pin the load generator's workers here


@dataclass
class PointOutcome:
    point: PointStep
    status: str
    error: str | None
    started_at: datetime
    summary: dict[str, Any] = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list)
    checks: list[checks_mod.Check] = field(default_factory=list)
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    reset_ok: bool | None = None
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return self.status == "ok" and checks_mod.verdict(self.checks)[0]

    @property
    def flagged(self) -> bool:
        return checks_mod.verdict(self.checks)[1]


def _requests(point: PointStep, count: int, salt: str) -> list[RequestSpec]:
    prompts = make_prompts(
        count, point.input_len, vocab_lo=point.vocab_lo, vocab_hi=point.vocab_hi,
        seed=point.prompt_seed, prefix_len=point.prefix_len, salt=salt,
    )
    return [RequestSpec(prompt_ids=p, max_tokens=point.output_len) for p in prompts]


def _reset(endpoint: Endpoint) -> bool:
    for attempt in range(RESET_ATTEMPTS):
        if reset_prefix_cache(endpoint.base_url, endpoint.api_key).ok:
            return True
        time.sleep(0.2 * (attempt + 1))  # blocks still held by finishing requests
    return False


def _load(
    endpoint: Endpoint, point: PointStep, specs: list[RequestSpec], cpus: tuple[int, ...] | None,
    warmup: list[RequestSpec] | None = None,
) -> Any:
    """Measured requests, or (with `warmup`) warmup requests alone, which the load generator flags."""
    return run_load(
        endpoint.base_url, endpoint.model, specs, warmup=warmup or (), api_key=endpoint.api_key,
        concurrency=point.concurrency, rate_rps=point.rate_rps, arrival=point.arrival,
        burstiness=point.burstiness, seed=point.prompt_seed, request_timeout_s=point.request_timeout_s,
        point_timeout_s=point.point_timeout_s, cpus=cpus,
    )


def run_point(point: PointStep, endpoint: Endpoint, ctx: PointContext) -> PointOutcome:
    """Carry out one point. Never raises for engine trouble: the outcome says what failed."""
    out = PointOutcome(point=point, status="ok", error=None, started_at=datetime.now(UTC))
    phase_start = time.monotonic()

    def phase(name: str) -> None:
        nonlocal phase_start
        now = time.monotonic()
        out.phases[name] = round(now - phase_start, 4)
        phase_start = now

    try:
        warm: list[RequestRecord] = []
        if point.warmup:
            warmup = _requests(point, point.warmup, "warmup")
            warm = list(_load(endpoint, point, [], ctx.client_cpus, warmup=warmup).records)
        phase("warmup")
        if point.cache == "reset":
            out.reset_ok = _reset(endpoint)
        phase("reset")
        before = metrics.scrape(endpoint.base_url, endpoint.api_key)
        phase("scrape_before")
        nvml = NvmlSampler(ctx.gpu_index)
        poller = metrics.MetricsPoller(endpoint.base_url, endpoint.api_key, interval_s=0.25)
        with nvml, poller:
            result = _load(endpoint, point, _requests(point, point.requests, "measured"), ctx.client_cpus)
        phase("measure")
        after = metrics.scrape(endpoint.base_url, endpoint.api_key)
        phase("scrape_after")
    except Exception as exc:  # a dead server or a refused connection fails the point, not the run
        out.status, out.error = "failed", f"{type(exc).__name__}: {exc}"
        return out

    records = list(result.records)
    out.records = warm + records
    summary = summarize(records, point.concurrency)
    hits = metrics.delta(before, after, "vllm:prefix_cache_hits")
    queries = metrics.delta(before, after, "vllm:prefix_cache_queries")
    hit_rate = metrics.prefix_hit_rate(before, after)
    usage = [s.kv_cache_usage_perc for s in poller.samples if s.kv_cache_usage_perc is not None]
    summary |= {
        "prefix_hits": hits, "prefix_queries": queries, "prefix_hit_rate": hit_rate,
        "kv_cache_usage_peak": max(usage, default=None),
        "preemptions": metrics.delta(before, after, "vllm:num_preemptions"),
    }
    samples = nvml.samples
    nvml_rows = [
        {"source": "nvml", "t_s": s.t_s - ctx.clock_origin_s, "sm_clock_mhz": _mhz(s.sm_clock_hz),
         "mem_clock_mhz": _mhz(s.mem_clock_hz), "power_w": s.power_w, "temp_c": s.temperature_c,
         "mem_used_bytes": s.memory_used_bytes, "gpu_util": s.gpu_util_frac}
        for s in samples
    ]
    energy = [s.energy_j for s in samples if s.energy_j is not None]
    summary |= telemetry_summary(nvml_rows, energy, summary.get("output_tokens", 0))
    out.summary = summary
    out.telemetry = nvml_rows + [
        {"source": "metrics", "t_s": s.t_s - ctx.clock_origin_s, "kv_cache_usage": s.kv_cache_usage_perc,
         "running": s.num_requests_running, "waiting": s.num_requests_waiting}
        for s in poller.samples
    ]
    out.checks = checks_mod.evaluate(
        point, summary, thresholds=ctx.thresholds, reset_ok=out.reset_ok, hit_rate=hit_rate,
        output_lengths=[r.output_tokens for r in records if r.ok],
        halves_gap=halves_gap(records), client_ceiling_chunks_per_s=ctx.client_ceiling_chunks_per_s,
    )
    if result.timed_out:
        out.status, out.error = "failed", f"point timed out after {point.point_timeout_s} s"
    elif not any(r.ok for r in records):
        errors = sorted({r.error or "" for r in records})
        out.status, out.error = "failed", "every request failed: " + "; ".join(errors)[:500]
    return out


def _mhz(hz: float | None) -> float | None:
    return None if hz is None else hz / 1e6

