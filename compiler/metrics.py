"""The catalogue of metrics a hypothesis may name: what each means, its unit, and its level.

Point metrics are stored per point and repeat by the runner; server metrics once per server; a search metric
once per launch, recomputed from its capacity search's probe points (compiler.capacity).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    level: Literal["point", "server", "search"]
    description: str
    higher_is_better: bool = True


def _latency(stem: str, what: str) -> list[Metric]:
    return [
        Metric(f"{stem}_{stat}_s", "s", "point", f"{what}, {label}", higher_is_better=False)
        for stat, label in (
            ("mean", "mean"),
            ("p50", "median"),
            ("p90", "90th percentile"),
            ("p95", "95th percentile"),
            ("p99", "99th percentile"),
        )
    ]


METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric("output_throughput", "tok/s", "point", "Output tokens per second over the measurement window"),
        Metric("total_throughput", "tok/s", "point", "Prompt + output tokens per second"),
        Metric("request_throughput", "req/s", "point", "Completed requests per second"),
        Metric("chunk_throughput", "chunks/s", "point", "Streamed SSE chunks per second seen by the client"),
        Metric("goodput", "req/s", "point",
               "Requests per second over the window that met every objective of [slo] (without one: every "
               "completed request)"),
        Metric("slo_attainment", "ratio", "point",
               "Share of the measured requests that met every objective of [slo] (a failed one met none)"),
        *_latency("ttft", "Time to first token"),
        *_latency("itl", "Inter-token (inter-chunk) latency"),
        *_latency("tpot", "Time per output token after the first"),
        *_latency("e2e", "End-to-end request latency"),
        Metric("prefix_hit_rate", "ratio", "point", "Prefix-cache hits / queries over the point", False),
        Metric("kv_cache_usage_peak", "ratio", "point", "Peak KV-cache usage during the point", False),
        Metric("littles_law_error", "ratio", "point", "Relative error of L = lambda * W", False),
        Metric("mean_in_flight", "requests", "point", "Time-averaged requests in flight"),
        Metric("power_mean_w", "W", "point", "Mean GPU power during the point", False),
        Metric("energy_per_token_j", "J/tok", "point", "GPU energy per output token", False),
        Metric("sm_clock_mean_mhz", "MHz", "point", "Mean SM clock during the point"),
        Metric("kv_capacity_tokens", "tokens", "server", "KV-cache capacity the server reports"),
        Metric("startup_s", "s", "server", "Server start to /health", False),
        Metric("capacity", "load", "search",
               "Highest concurrency (or rate) of a capacity search whose slo_attainment held [slo].attainment"),
    ]
}
