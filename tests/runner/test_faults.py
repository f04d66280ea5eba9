"""The fault makers work, and reconciliation catches what they do, against the real CPU server."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest

from runner.checks.cache import reset_prefix_cache
from runner.measure import prometheus
from tests.runner.faults import FaultProxy, Faults
from tests.runner.test_reconcile import measure_window

pytestmark = pytest.mark.vllm


def _window(server: Any, model: Path, faults: Faults, salt: str, scrape_via_proxy: bool = False) -> Any:
    with FaultProxy(server.base_url, faults) as proxy:
        scrape_url = proxy.base_url if scrape_via_proxy else server.base_url
        result = measure_window(proxy.base_url, scrape_url, server.api_key, str(model), 8, 2, salt)
    return result, proxy.log


def test_proxy_without_faults_passes(vllm_server: Any, tiny_model_dir: Path) -> None:
    result, log = _window(vllm_server, tiny_model_dir, Faults(), "proxy-clean")
    assert log.completions == 10  # 2 warmup + 8 measured, all through the proxy
    # Every count agrees. The proxy's own delay (up to ~30 ms of TTFT on two shared cores) comes at
    # both ends of a request, like the server's front end: it shows as frontend_delay_s; whether its
    # chunk forwarding also skews first-token-to-end on a busy machine is not asserted here.
    counts = [i for i in result.items if i.bound == "exact"]
    assert len(counts) >= 6 and all(i.status == "pass" for i in counts), result.message


def test_dropped_request_fails(vllm_server: Any, tiny_model_dir: Path) -> None:
    result, log = _window(vllm_server, tiny_model_dir, Faults(drop=(5,)), "proxy-drop")
    assert log.dropped == [5]
    assert result.status == "fail"
    assert result.item("requests").status == "fail", result.message
    assert result.item("requests").server == 7


def test_duplicated_request_fails(vllm_server: Any, tiny_model_dir: Path) -> None:
    result, log = _window(vllm_server, tiny_model_dir, Faults(duplicate=(4,)), "proxy-dup")
    assert log.duplicated == [4]
    assert result.status == "fail"
    assert result.item("generation_tokens").status == "fail", result.message


def test_hidden_counters_are_unverified(vllm_server: Any, tiny_model_dir: Path) -> None:
    hidden = Faults(hide_metrics=("vllm:request_success", "vllm:generation_tokens"))
    result, _ = _window(vllm_server, tiny_model_dir, hidden, "proxy-hide", scrape_via_proxy=True)
    assert result.item("requests").status == "unverified"
    assert result.item("generation_tokens").status == "unverified"
    assert result.status != "pass", result.message


def test_reset_answered_false(vllm_server: Any) -> None:
    with FaultProxy(vllm_server.base_url, Faults(reset="false")) as proxy:
        answer = reset_prefix_cache(proxy.base_url, vllm_server.api_key)
    assert answer.status == 200 and not answer.ok
    assert proxy.log.resets_forwarded == 0


def test_reset_answered_true_but_not_done(vllm_server: Any, complete: Any) -> None:
    """The fake reset says success; the server's counters show the cache was kept."""
    prompt = [random.Random(41).randrange(4, 4096) for _ in range(100)]
    complete(prompt)
    with FaultProxy(vllm_server.base_url, Faults(reset="fake")) as proxy:
        assert reset_prefix_cache(proxy.base_url, vllm_server.api_key).ok
    before = prometheus.scrape(vllm_server.base_url, vllm_server.api_key)
    complete(prompt)
    after = prometheus.scrape(vllm_server.base_url, vllm_server.api_key)
    assert proxy.log.resets_seen == 1 and proxy.log.resets_forwarded == 0
    assert prometheus.delta(before, after, "vllm:prefix_cache_hits") == 96  # 3 whole blocks of 32 hit


def test_client_that_lags_while_streaming_fails_on_the_real_server(vllm_server: Any, tiny_model_dir: Path) -> None:
    """Real counters and records of a clean window; the fault made on demand: the client reads each
    measured request's end 150 ms late (as a client starved of CPU while streaming does)."""
    from runner.checks.reconcile import reconcile
    from runner.load.loadgen import run_load
    from tests.runner.test_reconcile import _specs

    model, url, key = str(tiny_model_dir), vllm_server.base_url, vllm_server.api_key
    run_load(url, model, [], warmup=_specs(2, "lag-warm"), api_key=key, concurrency=2, cpus=(1,))
    before = prometheus.scrape(url, key)
    records = list(run_load(url, model, _specs(8, "lag"), api_key=key, concurrency=2, cpus=(1,)).records)
    after = prometheus.scrape(url, key)
    # 150 ms: on this shared 2-core box a clean window's own difference reached -37 ms (first token read
    # late by a starved client), so a smaller lag could cancel against it.
    lagged = [dataclasses.replace(r, end_s=r.end_s + 0.150) for r in records]
    result = reconcile(before, dataclasses.replace(after, t_s=after.t_s + 1.0), lagged)
    item = result.item("first_to_end")
    assert item.status == "fail" and "lagged while streaming" in item.message, result.message
    assert all(i.status == "pass" for i in result.items if i.bound == "exact")


# ------------------------------------------------------ whole points through the judge, real server
def _point(server: Any, model: Path, faults: Faults, salt: int) -> Any:
    from compiler.study import Checks
    from runner.execute.point import Endpoint, PointContext, run_point
    from tests.runner.steps import step

    point = step(id=f"faults/a/w/c2/r{salt}", concurrency=2, requests=8, warmup=2, input_len=64, output_len=16,
                 prompt_seed=salt, vocab_lo=16, vocab_hi=4000)
    with FaultProxy(server.base_url, faults) as proxy:
        endpoint = Endpoint(proxy.base_url, server.api_key, str(model))
        ctx = PointContext(thresholds=Checks(), client_ceiling_chunks_per_s=None, gpu_index=0, clock_origin_s=0.0,
                           client_cpus=(1,))
        return run_point(point, endpoint, ctx)


@pytest.mark.parametrize(("faults", "check", "text"), [
    # warmup requests are completions 0-1: completion 4 is the 3rd measured request
    (Faults(drop=(4,)), "reconciliation", "requests: server counted 7, client 8"),
    (Faults(duplicate=(5,)), "reconciliation", "generation_tokens: server counted"),
    (Faults(hide_metrics=("vllm:request_success",)), "reconciliation", "does not export vllm:request_success"),
    (Faults(reset="false"), "cache_cold", "reset refused"),
    (Faults(hide_metrics=("vllm:prefix_cache",)), "cache_cold", "counters missing: cannot verify"),
])
def test_fault_makes_the_point_not_valid(vllm_server: Any, tiny_model_dir: Path, faults: Faults, check: str,
                                         text: str) -> None:
    """A point run through the fault proxy (counts judged there; latency sums against the proxy's own
    delay are not asserted here: the hop adds up to ~30 ms of TTFT on two shared cores)."""
    out = _point(vllm_server, tiny_model_dir, faults, salt=sum(map(ord, text)) % 1000 + 1)
    assert out.status == "ok" and out.judgement is not None
    got = {c.name: c for c in out.judgement.checks}
    assert got[check].status != "pass" and text in got[check].detail, got[check].detail
    if "cannot verify" in text:
        assert got[check].status == "unverified"
    assert not out.valid and out.judgement.reason.startswith(("invalid", "unverified"))
