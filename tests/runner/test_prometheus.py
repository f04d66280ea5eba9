"""/metrics parsing against the real CPU server, and prefix-cache control seen through it."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.checks.cache import reset_prefix_cache
from runner.measure import prometheus
from runner.measure.prometheus import (
    PREEMPTIONS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    MetricsPoller,
    Snapshot,
    delta,
    parse,
    prefix_hit_rate,
    scrape,
)
from runner.server.engine import VllmServer

VLLM_SAMPLES = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:cache_config_info",
)


def _prompt(seed: int, n: int) -> list[int]:
    """Token ids no other test sends (ids 4.. are ordinary words of the tiny vocab)."""
    rng = random.Random(seed)
    return [rng.randrange(4, 4096) for _ in range(n)]


@contextlib.contextmanager
def _held_request(server: VllmServer, model_dir: Path, seed: int) -> Iterator[None]:
    """A streaming request that runs (and holds KV blocks) until the block ends and we hang up."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {"model": str(model_dir), "prompt": _prompt(seed, 16), "max_tokens": 1900, "ignore_eos": True,
            "temperature": 0, "stream": True}  # fmt: skip
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"})  # fmt: skip
    try:
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.readline().startswith(b"data: ")  # first token out: the request is running
        yield
    finally:
        conn.close()  # vLLM aborts a request whose client went away
    deadline = time.monotonic() + 30
    while (scrape(server.base_url, server.api_key).num_requests_running or 0) > 0:
        assert time.monotonic() < deadline, "the held request was not aborted"
        time.sleep(0.05)


def _scrape_after(server: VllmServer, before: Snapshot, prompt_tokens: float) -> Snapshot:
    """Scrape until the engine has booked `prompt_tokens` more prompt tokens (stats lag a step)."""
    deadline = time.monotonic() + 10
    while True:
        snap = scrape(server.base_url, server.api_key)
        if (delta(before, snap, prometheus.PROMPT_TOKENS) or 0) >= prompt_tokens or time.monotonic() > deadline:
            return snap
        time.sleep(0.05)


@pytest.mark.vllm
def test_scrape_real_server(vllm_server: VllmServer) -> None:
    snap = scrape(vllm_server.base_url, vllm_server.api_key)
    for name in VLLM_SAMPLES:
        assert name in snap, name
    # Counters are families without `_total` in the parser, samples with it; both names work.
    assert snap.types["vllm:prefix_cache_queries"] == "counter"
    assert snap["vllm:prefix_cache_queries"] == snap["vllm:prefix_cache_queries_total"]
    assert snap.types["vllm:kv_cache_usage_perc"] == "gauge"
    assert snap.types["vllm:time_to_first_token_seconds"] == "histogram"
    for value in (snap.get(PREFIX_CACHE_QUERIES), snap.get(PREFIX_CACHE_HITS), snap.get(PREEMPTIONS), snap.prompt_tokens,
                  snap.generation_tokens, snap.num_requests_running, snap.num_requests_waiting):  # fmt: skip
        assert value is not None and value >= 0
    assert snap.kv_cache_usage_perc is not None and 0 <= snap.kv_cache_usage_perc <= 1
    info = snap.cache_config_info
    assert info is not None
    assert info["block_size"] == "32"
    assert info["enable_prefix_caching"] == "True"
    assert int(info["num_gpu_blocks"]) * 32 == int(info["kv_cache_size_tokens"]) == 262_144
    # Buckets are raw samples, not summed into a meaningless total.
    buckets = snap.buckets("vllm:time_to_first_token_seconds")
    assert buckets and buckets[-1][0] == float("inf")
    assert "vllm:time_to_first_token_seconds_bucket" not in snap.sums
    assert any(s.name == "vllm:time_to_first_token_seconds_bucket" for s in snap.samples)


@pytest.mark.vllm
def test_counters_move_with_a_request(vllm_server: VllmServer, complete: Callable[..., Any]) -> None:
    before = scrape(vllm_server.base_url, vllm_server.api_key)
    out = complete(_prompt(1, 40), max_tokens=8)
    assert (out["usage"]["prompt_tokens"], out["usage"]["completion_tokens"]) == (40, 8)
    after = _scrape_after(vllm_server, before, 40)
    assert delta(before, after, "vllm:prompt_tokens_total") == 40
    assert delta(before, after, "vllm:generation_tokens") == 8
    assert delta(before, after, "vllm:no_such_metric") is None
    assert after.t_s > before.t_s


@pytest.mark.vllm
def test_reset_prefix_cache_really_empties_the_cache(
    vllm_server: VllmServer, complete: Callable[..., Any]
) -> None:
    url, key = vllm_server.base_url, vllm_server.api_key
    prompt = _prompt(2, 100)  # 3 whole blocks of 32 can hit; the last 4 tokens never do

    first = reset_prefix_cache(url, key)
    assert first.ok and first.status == 200 and '"success":true' in first.body.replace(" ", "")

    s0 = scrape(url, key)
    complete(prompt)
    s1 = _scrape_after(vllm_server, s0, 100)
    assert delta(s0, s1, prometheus.PREFIX_CACHE_HITS) == 0  # cold

    complete(prompt)  # same prompt, no reset: warm
    s2 = _scrape_after(vllm_server, s1, 100)
    assert delta(s1, s2, prometheus.PREFIX_CACHE_QUERIES) == 100
    assert delta(s1, s2, prometheus.PREFIX_CACHE_HITS) == 96
    assert prefix_hit_rate(s1, s2) == pytest.approx(0.96)

    assert reset_prefix_cache(url, key).ok
    complete(prompt)  # same prompt after a reset: cold again
    s3 = _scrape_after(vllm_server, s2, 100)
    assert delta(s2, s3, prometheus.PREFIX_CACHE_QUERIES) == 100
    assert delta(s2, s3, prometheus.PREFIX_CACHE_HITS) == 0
    assert prefix_hit_rate(s2, s3) == 0


@pytest.mark.vllm
def test_reset_refused_while_a_request_holds_blocks(vllm_server: VllmServer, tiny_model_dir: Path) -> None:
    url, key = vllm_server.base_url, vllm_server.api_key
    with _held_request(vllm_server, tiny_model_dir, seed=3):
        refused = reset_prefix_cache(url, key)
        running = scrape(url, key).num_requests_running
        forced = reset_prefix_cache(url, key, reset_running_requests=True)  # preempts, then resets
    assert running == 1
    # HTTP 200 and still not ok: only an explicit {"success": true} counts.
    assert refused.status == 200 and not refused.ok
    assert '"success":false' in refused.body.replace(" ", "")
    assert forced.ok
    assert scrape(url, key).num_requests_running == 0  # the abort went through


@pytest.mark.vllm
def test_poller_sees_a_running_request(vllm_server: VllmServer, tiny_model_dir: Path) -> None:
    with MetricsPoller(vllm_server.base_url, vllm_server.api_key, interval_s=0.1) as poller:
        time.sleep(0.3)
        with _held_request(vllm_server, tiny_model_dir, seed=4):
            time.sleep(1.5)  # several scrapes while it runs, even on a loaded machine
        time.sleep(0.3)
    rows = poller.samples
    assert len(rows) >= 5
    assert all(b.t_s > a.t_s for a, b in itertools.pairwise(rows))
    assert all(r.kv_cache_usage_perc is not None and r.num_requests_waiting is not None for r in rows)
    assert rows[0].num_requests_running == 0 and rows[-1].num_requests_running == 0
    assert any(r.num_requests_running == 1 and (r.kv_cache_usage_perc or 0) > 0 for r in rows)
    assert poller.errors == 0 and poller.warnings == []


def test_poller_records_failures_without_raising() -> None:
    from runner.server.engine import free_port

    with MetricsPoller(f"http://127.0.0.1:{free_port()}", interval_s=0.05, timeout_s=0.5) as poller:
        time.sleep(0.3)
    assert poller.samples == []
    assert poller.errors >= 2 and poller.warnings and "metrics" in poller.warnings[0]


def test_parse_sums_label_sets_and_accepts_total_either_way() -> None:
    text = """\
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits{engine="0"} 10
vllm:prefix_cache_hits{engine="1"} 5
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0"} 20
vllm:prefix_cache_queries_total{engine="1"} 20
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.25
vllm:kv_cache_usage_perc{engine="1"} 0.75
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0"} 3
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf"} 4
vllm:e2e_request_latency_seconds_bucket{engine="1",le="1.0"} 1
vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf"} 1
vllm:e2e_request_latency_seconds_count{engine="0"} 4
vllm:e2e_request_latency_seconds_count{engine="1"} 1
vllm:e2e_request_latency_seconds_sum{engine="0"} 2.5
vllm:e2e_request_latency_seconds_sum{engine="1"} 0.5
"""
    snap = parse(text, t_s=1.0)
    # Sample names as written; lookups accept either spelling.
    assert snap.get(PREFIX_CACHE_HITS) == 15 == snap["vllm:prefix_cache_hits_total"]
    assert snap.get(PREFIX_CACHE_QUERIES) == 40 == snap["vllm:prefix_cache_queries"]
    assert snap.kv_cache_usage_perc == 0.5  # a fraction: averaged, not summed
    assert snap["vllm:kv_cache_usage_perc"] == 1.0  # the mapping itself always sums
    assert snap["vllm:e2e_request_latency_seconds_count"] == 5
    assert snap.buckets("vllm:e2e_request_latency_seconds") == [(1.0, 4.0), (float("inf"), 5.0)]
    assert len(snap.series("vllm:prefix_cache_hits")) == 2
    assert snap.num_requests_running is None and snap.cache_config_info is None
    later = parse(text.replace("} 10", "} 13"), t_s=2.0)
    assert delta(snap, later, "vllm:prefix_cache_hits") == 3
    assert prefix_hit_rate(snap, later) is None  # no queries between the two


def test_parse_rejects_garbage() -> None:
    with pytest.raises(prometheus.MetricsError):
        parse("this is { not prometheus\n")
