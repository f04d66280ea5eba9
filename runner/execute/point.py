"""One point on a running server: warmup, verified cache reset, the before-scrape of the server's
counters, the measured load, the after-scrape, then the judge. Self-contained: a point step and a
server address in, an outcome out.

Nothing reads /metrics inside the measured window: the counters are scraped at its two edges only.
NVML is sampled at 10 Hz on its own thread (GPU hosts only); that it does not disturb the measured
token gaps is what benchmarks/telemetry_disturbance.py measures (`NVML_NOTE`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from compiler.plan import PointStep
from compiler.slo import Slo
from compiler.study import Checks
from compiler.trace import TraceRow
from runner.checks import cache
from runner.checks.expect import expectation
from runner.checks.judge import Judgement, judge, observe
from runner.execute import replicas
from runner.load.loadgen import RequestSpec, run_load
from runner.load.shapes import Requests, point_requests
from runner.load.trace_file import trace_rows
from runner.measure import prometheus
from runner.measure.nvml import NvmlSample, NvmlSampler
from runner.store.records import RequestRecord, TelemetrySample

NVML_NOTE = ("NVML sampled at 10 Hz on its own thread inside measured windows; that this does not disturb "
             "the measured token gaps on the GPU is established by benchmarks/telemetry_disturbance.py; "
             "/metrics is scraped at the window's edges only")


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    api_key: str | None
    model: str
    log_path: Path | None = None  # the server's log: its WARNING lines during a point are kept
    replicas: tuple[str, ...] = ()  # base URLs of every server of the launch when it has several
    server_ids: tuple[str, ...] = ()  # ... and their server ids, in the same order
    balance: str = "least_outstanding"
    prefix_caching: bool = True  # False: the server runs with --no-enable-prefix-caching

    @property
    def urls(self) -> tuple[str, ...]:
        return self.replicas or (self.base_url,)


@dataclass(frozen=True)
class PointContext:
    thresholds: Checks
    client_ceiling_chunks_per_s: float | None
    gpu_index: int
    clock_origin_s: float  # time.monotonic() at run start: telemetry times are stored relative to it
    client_cpus: tuple[int, ...] | None = None  # pin the load generator's workers here
    slo: Slo | None = None  # the study's [slo]: goodput and SLO attainment are read by it


@dataclass
class PointOutcome:
    point: PointStep
    status: str
    error: str | None
    started_at: datetime
    judgement: Judgement | None = None
    records: list[RequestRecord] = field(default_factory=list)
    telemetry: list[TelemetrySample] = field(default_factory=list)
    reset: cache.ResetOutcome | None = None
    phases: dict[str, float] = field(default_factory=dict)
    server_warnings: tuple[str, ...] = ()
    counters_before_json: str | None = None  # prometheus.edge_json of the scrape that opens the window
    counters_after_json: str | None = None  # ... and of the one that closes it
    replicas_json: str | None = None  # replicas only: per server, requests sent and counter deltas

    @property
    def valid(self) -> bool:
        return self.status == "ok" and self.judgement is not None and self.judgement.valid

    @property
    def flagged(self) -> bool:
        return self.judgement is not None and self.judgement.flagged

    @property
    def window_s(self) -> float:
        return (self.judgement.summary.window_s or 0.0) if self.judgement else 0.0


def _requests(point: PointStep, count: int, salt: str, rows: list[TraceRow] | None = None) -> Requests:
    return point_requests(point, count, salt, trace_rows=rows)


def _load(
    endpoint: Endpoint, point: PointStep, requests: Requests, cpus: tuple[int, ...] | None,
    warmup: list[RequestSpec] | None = None,
) -> Any:
    """Measured requests, or (with `warmup`) warmup requests alone, which the load generator flags.
    A trace replayed at its own timestamps brings its arrival offsets."""
    arrival = "poisson" if point.arrival == "trace" else point.arrival  # unused when offsets are given
    return run_load(
        endpoint.urls, endpoint.model, requests.specs, balance=endpoint.balance, warmup=warmup or (),
        api_key=endpoint.api_key, concurrency=point.concurrency, rate_rps=point.rate_rps, arrival=arrival,
        burstiness=point.burstiness, seed=point.prompt_seed, request_timeout_s=point.request_timeout_s,
        point_timeout_s=point.point_timeout_s, cpus=cpus, offsets=requests.offsets,
    )


def log_size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def log_since(path: Path | None, start: int = 0) -> str | None:
    """What a server log gained after byte `start`; None when there is no log to read."""
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


def log_warnings(path: Path | None, start: int = 0, limit: int = 50) -> tuple[str, ...]:
    """The distinct WARNING (and ERROR) lines a server log gained after byte `start`, in order, at
    most `limit` of them (vLLM writes e.g. that the model's generation_config overrides sampling)."""
    text = log_since(path, start)
    if text is None:
        return ()
    seen: dict[str, None] = {}
    for line in text.splitlines():
        if (" WARNING " in line or " ERROR " in line) and len(seen) < limit:
            seen.setdefault(line.strip()[:500], None)
    return tuple(seen)


def run_point(point: PointStep, endpoint: Endpoint, ctx: PointContext) -> PointOutcome:
    """Carry out one point. Never raises for engine trouble: the outcome says what failed."""
    out = PointOutcome(point=point, status="ok", error=None, started_at=datetime.now(UTC))
    log_start = log_size(endpoint.log_path)
    phase_start = time.monotonic()

    def phase(name: str) -> None:
        nonlocal phase_start
        now = time.monotonic()
        out.phases[name] = round(now - phase_start, 4)
        phase_start = now

    try:
        trace = trace_rows(point)
        warm: list[RequestRecord] = []
        if point.warmup:
            warmup = _requests(point, point.warmup, "warmup", trace).specs
            warm = list(_load(endpoint, point, Requests([]), ctx.client_cpus, warmup=warmup).records)
        phase("warmup")
        if point.cache == "reset":
            out.reset = cache.reset_all(endpoint.urls, endpoint.api_key)  # every replica's own cache
        phase("reset")
        befores = replicas.scrape_all(endpoint.urls, endpoint.api_key)
        before = replicas.merge(befores, edge="before")
        phase("scrape_before")
        nvml = NvmlSampler(ctx.gpu_index)
        with nvml:
            measured = _requests(point, point.requests, "measured", trace)
            result = _load(endpoint, point, measured, ctx.client_cpus)
            afters = replicas.scrape_all(endpoint.urls, endpoint.api_key)  # right after the last request ended
            after = replicas.merge(afters, edge="after")
        phase("measure")
    except Exception as exc:  # a dead server or a refused connection fails the point, not the run
        out.status, out.error = "failed", f"{type(exc).__name__}: {exc}"
        out.server_warnings = log_warnings(endpoint.log_path, log_start)
        return out

    records = list(result.records)
    out.records = warm + records
    origin = ctx.clock_origin_s
    out.telemetry = [_nvml_sample(point.id, s, origin) for s in nvml.samples]
    out.counters_before_json, out.counters_after_json = prometheus.edge_json(before), prometheus.edge_json(after)
    server = observe(out.reset.ok if out.reset else None, before, after, out.telemetry)
    out.judgement = judge(point, warm + records, server, thresholds=ctx.thresholds,
                          client_ceiling_chunks_per_s=ctx.client_ceiling_chunks_per_s, client_stall_s=result.stall_s,
                          expected=expectation(point, measured.specs), slo=ctx.slo,
                          prefix_caching=endpoint.prefix_caching)
    if endpoint.replicas:
        rows = replicas.replica_rows(endpoint.server_ids, befores, afters, records,
                                     result.replicas[-len(records):] if records else ())
        out.replicas_json = replicas.replicas_json(rows)
        out.judgement = replicas.with_check(out.judgement, replicas.replica_check(point.id, rows))
    out.server_warnings = log_warnings(endpoint.log_path, log_start)
    if result.timed_out:
        out.status, out.error = "failed", f"point timed out after {point.point_timeout_s} s"
    elif not any(r.ok for r in records):
        errors = sorted({r.error or "" for r in records})
        out.status, out.error = "failed", "every request failed: " + "; ".join(errors)[:500]
    phase("judge")
    return out


def _nvml_sample(point_id: str, s: NvmlSample, origin: float) -> TelemetrySample:
    return TelemetrySample(
        point_id, "nvml", s.t_s - origin, sm_clock_mhz=_mhz(s.sm_clock_hz), mem_clock_mhz=_mhz(s.mem_clock_hz),
        power_w=s.power_w, temp_c=s.temperature_c,
        mem_used_bytes=None if s.memory_used_bytes is None else float(s.memory_used_bytes),
        gpu_util=s.gpu_util_frac, energy_j=s.energy_j,
    )


def _mhz(hz: float | None) -> float | None:
    return None if hz is None else hz / 1e6
