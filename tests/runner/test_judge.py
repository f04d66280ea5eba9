"""The judge: one point's summary, checks and verdict from records and the server side; the
metric catalogue and the summary's fields kept in step."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from compiler.metrics import METRICS
from compiler.study import Checks
from runner.checks.cache import CacheState
from runner.checks.judge import ServerSide, judge, observe
from runner.checks.stats import GpuStats
from runner.measure import prometheus
from runner.store.records import (
    SUMMARY_FIELDS,
    PointRecord,
    RequestRecord,
    ServerRecord,
    TelemetrySample,
)
from tests.runner.counters import edges
from tests.runner.steps import step


def rec(i: int, sent: float, end: float, *, warmup: bool = False, ok: bool = True, out: int = 8) -> RequestRecord:
    times = tuple(sent + 0.1 + k * (end - sent - 0.1) / max(out - 1, 1) for k in range(out))
    return RequestRecord(i, warmup, sent, sent, sent + 0.1, end, times, 16, out, out, ok, None if ok else "x", 200)


def closed_loop() -> list[RequestRecord]:
    """c4, two waves of 1 s requests, plus two warmup requests long before."""
    out = [rec(100 + i, -10.0, -9.0, warmup=True) for i in range(2)]
    out += [rec(slot * 2 + wave, float(wave), wave + 1.0) for slot in range(4) for wave in range(2)]
    return out


def side(records: list[RequestRecord], **over: object) -> ServerSide:
    """A cold, verified server side whose edge counters agree with the records."""
    before, after = edges(records, **{k: v for k, v in over.items() if k == "extra_requests"})  # type: ignore[arg-type]
    fields: dict[str, object] = dict(cache=CacheState(True, 100.0, 0.0), before=before, after=after)
    return ServerSide(**(fields | {k: v for k, v in over.items() if k != "extra_requests"}))  # type: ignore[arg-type]


COLD = side(closed_loop())


def test_every_metric_a_hypothesis_can_name_is_stored() -> None:
    point = {m.name for m in METRICS.values() if m.level == "point"}
    assert point <= SUMMARY_FIELDS, sorted(point - SUMMARY_FIELDS)
    server = ServerRecord("r", "s", kv_capacity_tokens=5, startup_s=2.0, machine_flops=6.5e14, machine_bandwidth=4.2e12)
    for m in METRICS.values():
        if m.level == "server":
            assert server.metric(m.name) is not None


def test_clean_closed_loop_point_is_valid() -> None:
    j = judge(step(), closed_loop(), COLD, thresholds=Checks(), client_ceiling_chunks_per_s=None)
    assert j.valid and not j.flagged
    s = j.summary
    assert (s.requests_ok, s.requests_failed, s.output_tokens) == (8, 0, 64)  # warmup left out
    assert s.window_s == pytest.approx(1.0) and s.output_throughput == pytest.approx(32.0)  # the steady phase
    assert s.littles_law_error == pytest.approx(0.0, abs=1e-9) and s.steady_requests == 4
    assert (s.prefix_queries, s.prefix_hits, s.prefix_hit_rate) == (100.0, 0.0, 0.0)
    assert s.server_in_flight == pytest.approx(4 * (2 * 1.0 - 2 * 0.002) / 2.0)
    assert s.itl_bunched_share == 0.0 and s.itl_p50_s is not None
    assert {c.name for c in j.checks} == {"steady_state", "littles_law", "reconciliation", "cache_cold",
                                          "output_exact", "errors", "warmup_sufficient", "itl_trusted",
                                          "itl_p95_stable", "itl_p99_stable", "ttft_p95_stable", "ttft_p99_stable"}
    assert all(c.point_id == step().id and c.status == "pass" for c in j.checks)
    assert j.reason == "valid"


def test_server_side_and_gpu_fill_the_summary() -> None:
    gpu = GpuStats(power_mean_w=300.0, sm_clock_mean_mhz=1980.0, mem_clock_mean_mhz=3200.0, temp_max_c=60.0,
                   energy_j=640.0)
    server = side(closed_loop(), cache=CacheState(True, 100.0, 1.0), preemptions=2.0, kv_cache_usage_peak=0.4, gpu=gpu)
    s = judge(step(), closed_loop(), server, thresholds=Checks(), client_ceiling_chunks_per_s=None).summary
    assert (s.preemptions, s.kv_cache_usage_peak, s.power_mean_w, s.temp_max_c) == (2.0, 0.4, 300.0, 60.0)
    assert (s.sm_clock_mean_mhz, s.mem_clock_mean_mhz, s.energy_j) == (1980.0, 3200.0, 640.0)
    assert s.energy_per_token_j == pytest.approx(10.0) and s.prefix_hit_rate == pytest.approx(0.01)


def _judge(records: list[RequestRecord], server: ServerSide, **over: object) -> Any:
    return judge(over.pop("point", step()), records, server, thresholds=Checks(),  # type: ignore[arg-type]
                 client_ceiling_chunks_per_s=None)


def _status(j: Any, name: str) -> str:
    return next(c.status for c in j.checks if c.name == name)


def test_each_fault_makes_the_point_invalid() -> None:
    base = closed_loop()
    refused = _judge(base, side(base, cache=CacheState(False, 100.0, 0.0)))
    assert not refused.valid and _status(refused, "cache_cold") == "fail"
    hidden = _judge(base, side(base, cache=CacheState(True, None, None)))
    assert not hidden.valid and _status(hidden, "cache_cold") == "unverified" and hidden.reason.startswith("unverified")
    failed = [*base[:-1], dataclasses.replace(base[-1], ok=False)]
    assert not _judge(failed, side(failed)).valid
    short = [*base[:-1], dataclasses.replace(base[-1], output_tokens=7)]
    assert not _judge(short, side(base)).valid
    other = _judge(base, side(base, extra_requests=2))
    assert not other.valid and _status(other, "reconciliation") == "fail" and other.reason.startswith("invalid")
    no_counters = _judge(base, ServerSide(cache=CacheState(True, 100.0, 0.0)))
    assert not no_counters.valid and no_counters.reason == "unverified: reconciliation"


def test_a_client_that_idles_between_requests_fails_littles_law() -> None:
    idle = [r if r.warmup or r.sent_s == 0.0 else dataclasses.replace(
        r, sent_s=r.sent_s + 0.3, scheduled_s=r.sent_s + 0.3, first_token_s=(r.first_token_s or 0) + 0.3,
        end_s=r.end_s + 0.3, token_times_s=tuple(t + 0.3 for t in r.token_times_s)) for r in closed_loop()]
    j = _judge(idle, side(idle))
    assert _status(j, "littles_law") == "fail" and not j.valid


def test_single_wave_needs_burst() -> None:
    wave = [rec(i, 0.0, 1.0) for i in range(4)]
    one = _judge(wave, side(wave), point=step(requests=4))
    assert not one.valid and _status(one, "steady_state") == "fail"
    burst = _judge(wave, side(wave), point=step(requests=4, burst=True))
    assert burst.valid and {c.name for c in burst.checks}.isdisjoint({"steady_state", "littles_law",
                                                                      "warmup_sufficient"})


def test_bunched_tokens_withhold_itl_percentiles() -> None:
    def bunch(r: RequestRecord) -> RequestRecord:
        t = r.token_times_s
        return dataclasses.replace(r, token_times_s=tuple(t[i - i % 4 + 3] if i % 4 < 3 else t[i]
                                                          for i in range(len(t))))
    bunched = [bunch(r) for r in closed_loop()]
    j = _judge(bunched, side(bunched))
    assert _status(j, "itl_trusted") == "fail" and j.flagged and j.valid
    assert j.summary.itl_p50_s is None and j.summary.itl_mean_s is not None and j.summary.tpot_p50_s is not None
    assert j.summary.itl_bunched_share == pytest.approx(0.75 * 7 / 7, rel=0.5)


def test_warnings_flag_but_do_not_invalidate() -> None:
    j = judge(step(cache="keep"), closed_loop(), side(closed_loop(), cache=CacheState(None, 100.0, 90.0)),
              thresholds=Checks(), client_ceiling_chunks_per_s=None)
    assert j.valid and j.flagged
    busy = judge(step(), closed_loop(), COLD, thresholds=Checks(), client_ceiling_chunks_per_s=10.0)
    assert busy.valid and busy.flagged


def test_observe_reads_counter_deltas_and_samples() -> None:
    before = prometheus.parse("vllm:prefix_cache_queries_total 10\nvllm:prefix_cache_hits_total 1\n"
                           "vllm:num_preemptions_total 3\n")
    after = prometheus.parse("vllm:prefix_cache_queries_total 110\nvllm:prefix_cache_hits_total 2\n"
                          "vllm:num_preemptions_total 5\n")
    samples = [TelemetrySample("p", "nvml", 0.0, power_w=100.0, energy_j=5.0),
               TelemetrySample("p", "nvml", 0.1, power_w=200.0, energy_j=7.0)]
    side = observe(True, before, after, samples)
    assert side.cache == CacheState(True, 100.0, 1.0)
    assert side.preemptions == 2.0 and side.kv_cache_usage_peak is None  # /metrics is not sampled in the window
    assert side.gpu.power_mean_w == 150.0 and side.gpu.energy_j == 2.0
    assert side.before is before and side.after is after
    empty = observe(None, prometheus.parse(""), prometheus.parse(""), [])
    assert empty.cache == CacheState(None, None, None) and empty.preemptions is None


def test_stored_server_side_judges_the_same_again() -> None:
    server = side(closed_loop(), cache=CacheState(True, 100.0, 1.0), preemptions=2.0, kv_cache_usage_peak=0.4,
                  gpu=GpuStats(power_mean_w=300.0, energy_j=64.0))
    first = judge(step(), closed_loop(), server, thresholds=Checks(), client_ceiling_chunks_per_s=100.0)
    assert server.before is not None and server.after is not None
    point = PointRecord("r", step().id, reset_ok=True, summary=first.summary,
                        counters_before_json=prometheus.edge_json(server.before),
                        counters_after_json=prometheus.edge_json(server.after))
    again = judge(step(), closed_loop(), ServerSide.stored(point), thresholds=Checks(), client_ceiling_chunks_per_s=100.0)
    assert again == first
    # A point stored without edge counters (before schema 3) cannot be reconciled again.
    old = judge(step(), closed_loop(), ServerSide.stored(dataclasses.replace(point, counters_before_json=None)),
                thresholds=Checks(), client_ceiling_chunks_per_s=100.0)
    assert not old.valid and old.reason == "unverified: reconciliation"


def test_no_measured_request_is_invalid() -> None:
    warm_only = [rec(0, 0.0, 1.0, warmup=True)]
    j = judge(step(), warm_only, COLD, thresholds=Checks(), client_ceiling_chunks_per_s=1000.0)
    assert not j.valid and j.summary.requests_ok == 0 and j.summary.window_s is None


def test_front_end_delay_is_measured_and_stored_not_judged() -> None:
    """The client's TTFT excess over the server's is the point's front-end delay: in the summary and
    the reconciliation's detail, and no fault however large when both ends carry it."""
    j = judge(step(), closed_loop(), COLD, thresholds=Checks(), client_ceiling_chunks_per_s=None)
    assert j.summary.frontend_delay_s == pytest.approx(0.002)  # the fixture's transport
    base = closed_loop()
    before, after = edges(base, transport_s=0.080)  # 80 ms at both ends: a busy API server's admission queue
    slow = judge(step(), base, ServerSide(cache=CacheState(True, 100.0, 0.0), before=before, after=after),
                 thresholds=Checks(), client_ceiling_chunks_per_s=None)
    rec = next(c for c in slow.checks if c.name == "reconciliation")
    assert slow.valid and rec.status == "pass" and slow.summary.frontend_delay_s == pytest.approx(0.080)
    assert "front-end and transport delay before the engine saw the request: 80.00 ms mean" in rec.detail
