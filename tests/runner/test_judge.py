"""The judge: one point's summary, checks and verdict from records and the server side; the
metric catalogue and the summary's fields kept in step."""

from __future__ import annotations

import dataclasses

import pytest

from compiler.metrics import METRICS
from compiler.study import Checks
from runner import metrics
from runner.cache import CacheState
from runner.judge import ServerSide, judge, observe
from runner.records import (
    SUMMARY_FIELDS,
    PointRecord,
    PointSummary,
    RequestRecord,
    ServerRecord,
    TelemetrySample,
)
from runner.stats import GpuStats
from tests.runner.steps import step


def rec(i: int, sent: float, end: float, *, warmup: bool = False, ok: bool = True, out: int = 8) -> RequestRecord:
    times = tuple(sent + 0.1 + k * (end - sent - 0.1) / max(out - 1, 1) for k in range(out))
    return RequestRecord(i, warmup, sent, sent, sent + 0.1, end, times, 16, out, out, ok, None if ok else "x", 200)


def closed_loop() -> list[RequestRecord]:
    """c4, two waves of 1 s requests, plus two warmup requests long before."""
    out = [rec(100 + i, -10.0, -9.0, warmup=True) for i in range(2)]
    out += [rec(slot * 2 + wave, float(wave), wave + 1.0) for slot in range(4) for wave in range(2)]
    return out


COLD = ServerSide(cache=CacheState(True, 100.0, 0.0))


def test_every_metric_a_hypothesis_can_name_is_stored() -> None:
    point = {m.name for m in METRICS.values() if m.level == "point"}
    assert point <= SUMMARY_FIELDS, sorted(point - SUMMARY_FIELDS)
    server = ServerRecord("r", "s", kv_capacity_tokens=5, startup_s=2.0)
    for m in METRICS.values():
        if m.level == "server":
            assert server.metric(m.name) is not None


def test_clean_closed_loop_point_is_valid() -> None:
    j = judge(step(), closed_loop(), COLD, thresholds=Checks(), client_ceiling_chunks_per_s=None)
    assert j.valid and not j.flagged
    s = j.summary
    assert (s.requests_ok, s.requests_failed, s.output_tokens) == (8, 0, 64)  # warmup left out
    assert s.window_s == pytest.approx(2.0) and s.output_throughput == pytest.approx(32.0)
    assert s.littles_law_error == pytest.approx(0.0, abs=1e-9) and s.concurrency_error == pytest.approx(0.0, abs=1e-9)
    assert (s.prefix_queries, s.prefix_hits, s.prefix_hit_rate) == (100.0, 0.0, 0.0)
    assert {c.name for c in j.checks} == {"littles_law", "concurrency_held", "cache_cold", "output_exact", "errors",
                                          "warmup_sufficient"}
    assert all(c.point_id == step().id for c in j.checks)


def test_server_side_and_gpu_fill_the_summary() -> None:
    gpu = GpuStats(power_mean_w=300.0, sm_clock_mean_mhz=1980.0, mem_clock_mean_mhz=3200.0, temp_max_c=60.0,
                   energy_j=640.0)
    side = ServerSide(cache=CacheState(True, 100.0, 1.0), preemptions=2.0, kv_cache_usage_peak=0.4, gpu=gpu)
    s = judge(step(), closed_loop(), side, thresholds=Checks(), client_ceiling_chunks_per_s=None).summary
    assert (s.preemptions, s.kv_cache_usage_peak, s.power_mean_w, s.temp_max_c) == (2.0, 0.4, 300.0, 60.0)
    assert (s.sm_clock_mean_mhz, s.mem_clock_mean_mhz, s.energy_j) == (1980.0, 3200.0, 640.0)
    assert s.energy_per_token_j == pytest.approx(10.0) and s.prefix_hit_rate == pytest.approx(0.01)


def test_each_fault_makes_the_point_invalid() -> None:
    base = closed_loop()
    refused = ServerSide(cache=CacheState(False, 100.0, 0.0))
    assert not judge(step(), base, refused, thresholds=Checks(), client_ceiling_chunks_per_s=None).valid
    hidden = ServerSide(cache=CacheState(True, None, None))
    assert not judge(step(), base, hidden, thresholds=Checks(), client_ceiling_chunks_per_s=None).valid
    failed = [*base[:-1], dataclasses.replace(base[-1], ok=False)]
    assert not judge(step(), failed, COLD, thresholds=Checks(), client_ceiling_chunks_per_s=None).valid
    short = [*base[:-1], dataclasses.replace(base[-1], output_tokens=7)]
    assert not judge(step(), short, COLD, thresholds=Checks(), client_ceiling_chunks_per_s=None).valid


def test_warnings_flag_but_do_not_invalidate() -> None:
    j = judge(step(cache="keep"), closed_loop(), ServerSide(cache=CacheState(None, 100.0, 90.0)),
              thresholds=Checks(), client_ceiling_chunks_per_s=None)
    assert j.valid and j.flagged
    busy = judge(step(), closed_loop(), COLD, thresholds=Checks(), client_ceiling_chunks_per_s=10.0)
    assert busy.valid and busy.flagged


def test_observe_reads_counter_deltas_and_samples() -> None:
    before = metrics.parse("vllm:prefix_cache_queries_total 10\nvllm:prefix_cache_hits_total 1\n"
                           "vllm:num_preemptions_total 3\n")
    after = metrics.parse("vllm:prefix_cache_queries_total 110\nvllm:prefix_cache_hits_total 2\n"
                          "vllm:num_preemptions_total 5\n")
    samples = [TelemetrySample("p", "metrics", 0.0, kv_cache_usage=0.3),
               TelemetrySample("p", "metrics", 0.1, kv_cache_usage=0.6),
               TelemetrySample("p", "nvml", 0.0, power_w=100.0, energy_j=5.0),
               TelemetrySample("p", "nvml", 0.1, power_w=200.0, energy_j=7.0)]
    side = observe(True, before, after, samples)
    assert side.cache == CacheState(True, 100.0, 1.0)
    assert side.preemptions == 2.0 and side.kv_cache_usage_peak == 0.6
    assert side.gpu.power_mean_w == 150.0 and side.gpu.energy_j == 2.0
    empty = observe(None, metrics.parse(""), metrics.parse(""), [])
    assert empty.cache == CacheState(None, None, None) and empty.preemptions is None


def test_stored_server_side_judges_the_same_again() -> None:
    side = ServerSide(cache=CacheState(True, 100.0, 1.0), preemptions=2.0, kv_cache_usage_peak=0.4,
                      gpu=GpuStats(power_mean_w=300.0, energy_j=64.0))
    first = judge(step(), closed_loop(), side, thresholds=Checks(), client_ceiling_chunks_per_s=100.0)
    point = PointRecord("r", step().id, reset_ok=True, summary=first.summary)
    again = judge(step(), closed_loop(), ServerSide.stored(point), thresholds=Checks(), client_ceiling_chunks_per_s=100.0)
    assert again == first


def test_no_measured_request_is_invalid() -> None:
    warm_only = [rec(0, 0.0, 1.0, warmup=True)]
    j = judge(step(), warm_only, COLD, thresholds=Checks(), client_ceiling_chunks_per_s=1000.0)
    assert not j.valid and j.summary == dataclasses.replace(PointSummary(), prefix_queries=100.0, prefix_hits=0.0,
                                                           prefix_hit_rate=0.0)
