"""The catalogue of metrics a hypothesis may name: what each means, its unit, and its level.

Point metrics are stored per point and repeat by the runner; server metrics once per server; a search metric
once per launch, recomputed from its capacity search's probe points (compiler.capacity). The machine metrics
(MACHINE_METRICS) are server metrics of the GPU itself: the runner calibrates it once per launch, just before the
launch's servers start, only in a study whose hypotheses name one (`Plan.calibrate_launches`).
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
        Metric("machine_flops", "FLOP/s", "server",
               "Dense bf16 matmul rate of the launch's GPU, measured just before its server starts (the "
               "calibration probe: 8192x8192 bf16 matmuls)"),
        Metric("machine_bandwidth", "B/s", "server",
               "HBM copy bandwidth of the launch's GPU (bytes read + written per second, device-to-device copy), "
               "measured just before its server starts"),
        Metric("ridge_point", "FLOP/byte", "server",
               "machine_flops / machine_bandwidth of the launch: the arithmetic intensity where its roofline turns"),
        Metric("capacity", "load", "search",
               "Highest concurrency (or rate) of a capacity search whose slo_attainment held [slo].attainment"),
    ]
}


# The metrics stored once per server, in catalogue order (`ServerRecord.metric` reads each).
SERVER_METRICS: tuple[str, ...] = tuple(name for name, m in METRICS.items() if m.level == "server")
# Server metrics of the GPU itself, read from the launch's own calibration (not from the server).
MACHINE_METRICS: tuple[str, ...] = ("machine_flops", "machine_bandwidth", "ridge_point")


def ridge_point(flops: float | None, bandwidth: float | None) -> float | None:
    """FLOP per byte where the roofline turns: flops / bandwidth; None when either is missing or the
    bandwidth is not positive."""
    if flops is None or bandwidth is None or bandwidth <= 0:
        return None
    return flops / bandwidth
