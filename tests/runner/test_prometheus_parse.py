"""/metrics text and Snapshots at their edges, and the fetch path against a small local HTTP server.

Parsing: counter names with and without `_total`, gauges, label sums, distributions left out,
missing counters (None, never 0), the hit rate (hits / queries, not misses), the stored edge JSON
round trip. Fetching: a real HTTP server on 127.0.0.1 that checks the bearer key and can fail.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType

import pytest

from runner.measure import prometheus
from runner.measure.prometheus import (
    EDGE_SERIES,
    PREEMPTIONS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    MetricsError,
    MetricsPoller,
    Snapshot,
    delta,
    edge_from_json,
    edge_json,
    fetch_text,
    parse,
    prefix_hit_rate,
    scrape,
)

TEXT = """\
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0"} 100
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0"} 30
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 2
vllm:num_requests_running{engine="1"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 4
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.25
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0"} 0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0"} 640
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0"} 80
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="90"} 1
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0"} 2
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf"} 3
vllm:iteration_tokens_total_count{engine="0"} 3
vllm:iteration_tokens_total_sum{engine="0"} 7
# TYPE vllm:request_latency summary
vllm:request_latency{quantile="0.5"} 0.2
vllm:request_latency_count 4
vllm:request_latency_sum 1.5
# TYPE vllm:foo gauge
vllm:foo 2
"""


@pytest.fixture()
def snap() -> Snapshot:
    return parse(TEXT, t_s=5.0)


# ---- parse and Snapshot --------------------------------------------------------------------------
def test_named_accessors(snap: Snapshot) -> None:
    assert snap.t_s == 5.0
    assert (snap.get(PREFIX_CACHE_QUERIES), snap.get(PREFIX_CACHE_HITS)) == (100, 30)
    assert (snap.num_requests_running, snap.num_requests_waiting, snap.get(PREEMPTIONS)) == (3, 4, 0)
    assert (snap.prompt_tokens, snap.generation_tokens, snap.kv_cache_usage_perc) == (640, 80, 0.25)
    assert snap.cache_config_info == {"block_size": "16", "engine": "0", "num_gpu_blocks": "100"}
    assert [c["num_gpu_blocks"] for c in snap.cache_config_infos()] == ["100", "90"]


def test_types_are_kept_per_family(snap: Snapshot) -> None:
    assert snap.types["vllm:prefix_cache_hits"] == "counter"
    assert snap.types["vllm:kv_cache_usage_perc"] == "gauge"
    assert snap.types["vllm:iteration_tokens_total"] == "histogram"
    assert snap.types["vllm:request_latency"] == "summary"


def test_distribution_samples_are_kept_but_not_summed(snap: Snapshot) -> None:
    assert "vllm:iteration_tokens_total_bucket" not in snap  # le-labelled only
    assert snap["vllm:iteration_tokens_total_count"] == 3
    assert "vllm:request_latency" not in snap  # quantile-labelled only
    assert snap["vllm:request_latency_sum"] == 1.5
    assert snap.buckets("vllm:iteration_tokens_total") == [(1.0, 2.0), (float("inf"), 3.0)]
    assert snap.buckets("vllm:request_latency") == []  # quantiles are not buckets
    assert len(snap.series("vllm:request_latency")) == 1


def test_counter_names_with_and_without_total(snap: Snapshot) -> None:
    # The parser names counter samples `..._total`; a gauge keeps its name, and `_total` finds it too.
    assert snap["vllm:prompt_tokens"] == snap["vllm:prompt_tokens_total"] == 640
    assert snap["vllm:foo"] == snap["vllm:foo_total"] == 2
    assert "vllm:foo_total" in snap and "vllm:prompt_tokens" in snap
    assert [s.value for s in snap.series("vllm:prompt_tokens")] == [640.0]


def test_a_longer_name_is_another_metric(snap: Snapshot) -> None:
    # "vllm:foo_bytes" is not "vllm:foo" even though both are six characters apart.
    assert "vllm:foo_bytes" not in snap
    assert snap.get("vllm:foo_bytes") is None
    with pytest.raises(KeyError) as err:
        snap["vllm:bar_total"]
    assert err.value.args == ("vllm:bar_total",)
    assert "vllm:bar" not in snap and 3 not in snap


def test_mapping_protocol(snap: Snapshot) -> None:
    assert set(snap) == set(snap.sums) and len(snap) == len(snap.sums)
    assert "vllm:prompt_tokens_total" in list(snap)
    assert dict(snap)["vllm:num_requests_running"] == 3


def test_missing_metrics_are_none_not_zero() -> None:
    empty = parse("# TYPE other gauge\nother 1\n", t_s=0.0)
    assert empty.get(PREFIX_CACHE_HITS) is None and empty.prompt_tokens is None
    assert empty.kv_cache_usage_perc is None and empty.mean("vllm:kv_cache_usage_perc") is None
    assert empty.cache_config_info is None and empty.cache_config_infos() == []
    assert empty.buckets("vllm:iteration_tokens_total") == []


def test_parse_stamps_monotonic_time_when_not_given() -> None:
    before = time.monotonic()
    snap = parse("x 1\n")
    assert before <= snap.t_s <= time.monotonic()
    assert parse("x 1\n", t_s=0.0).t_s == 0.0


def test_parse_error_message() -> None:
    with pytest.raises(MetricsError, match=r"^unparseable /metrics text: "):
        parse("this is { not prometheus\n")


# ---- delta and hit rate ----------------------------------------------------------------------------
def test_delta_of_a_counter_missing_from_either_scrape_is_none(snap: Snapshot) -> None:
    without = parse("# TYPE other gauge\nother 1\n", t_s=6.0)
    assert delta(snap, without, prometheus.PROMPT_TOKENS) is None
    assert delta(without, snap, prometheus.PROMPT_TOKENS) is None
    assert delta(without, without, prometheus.PROMPT_TOKENS) is None
    later = parse(TEXT.replace("} 640", "} 700"), t_s=6.0)
    assert delta(snap, later, prometheus.PROMPT_TOKENS) == 60
    assert delta(later, snap, prometheus.PROMPT_TOKENS) == -60


def test_hit_rate_is_hits_over_queries() -> None:
    before = parse(TEXT, t_s=1.0)
    after = parse(TEXT.replace("} 100", "} 140").replace("} 30", "} 60"), t_s=2.0)
    assert prefix_hit_rate(before, after) == 30 / 40  # not the miss rate 10 / 40
    assert prefix_hit_rate(before, before) is None  # no queries between the two
    one = parse(TEXT.replace("} 100", "} 101").replace("} 30", "} 31"), t_s=2.0)
    assert prefix_hit_rate(before, one) == 1.0  # one query, one hit: a rate, not "too few"


def test_hit_rate_needs_both_counters_in_both_scrapes() -> None:
    full = parse(TEXT, t_s=1.0)
    no_hits = parse(TEXT.replace("vllm:prefix_cache_hits_total", "x_total"), t_s=2.0)
    no_queries = parse(TEXT.replace("vllm:prefix_cache_queries_total", "y_total"), t_s=2.0)
    assert prefix_hit_rate(full, no_hits) is None
    assert prefix_hit_rate(no_queries, full) is None
    assert prefix_hit_rate(no_hits, no_queries) is None


# ---- stored JSON ---------------------------------------------------------------------------------
def test_edge_json_keeps_only_edge_series_and_reads_back(snap: Snapshot) -> None:
    text = edge_json(snap)
    doc = json.loads(text)
    assert set(doc) == {"t_s", "samples"} and doc["t_s"] == 5.0
    assert " " not in text  # compact
    assert {row[0] for row in doc["samples"]} <= set(EDGE_SERIES)
    assert ["vllm:prompt_tokens_total", {"engine": "0"}, 640.0] in doc["samples"]
    back = edge_from_json(text)
    assert back.t_s == 5.0 and dict(back.types) == {}
    assert back.prompt_tokens == 640 and back.get(PREFIX_CACHE_HITS) == 30 and back.get(PREEMPTIONS) == 0
    assert back.num_requests_running is None  # a gauge, not an edge series
    assert [(s.name, dict(s.labels), s.value) for s in back.series("vllm:prompt_tokens")] == [
        ("vllm:prompt_tokens_total", {"engine": "0"}, 640.0)]


def test_edge_from_json_sums_label_sets_and_skips_buckets() -> None:
    doc = {"t_s": 3, "samples": [
        ["vllm:request_success_total", {"engine": "0"}, 2],
        ["vllm:request_success_total", {"engine": "1"}, 3],
        ["vllm:e2e_request_latency_seconds_bucket", {"le": "1.0"}, 9],
        ["vllm:generation_tokens", {}, 7],
    ]}  # fmt: skip
    snap = edge_from_json(json.dumps(doc))
    assert snap.t_s == 3.0 and isinstance(snap.t_s, float)
    assert snap["vllm:request_success_total"] == 5.0
    assert "vllm:e2e_request_latency_seconds_bucket" not in snap
    assert snap.buckets("vllm:e2e_request_latency_seconds") == [(1.0, 9.0)]
    assert snap.generation_tokens == 7.0  # stored without `_total`: found with it
    assert [dict(s.labels) for s in snap.series("vllm:request_success_total")] == [{"engine": "0"}, {"engine": "1"}]
    assert all(isinstance(s.value, float) for s in snap.samples)
    assert isinstance(snap.sums, MappingProxyType)


# ---- fetching from a real local HTTP server -------------------------------------------------------
class _Metrics(BaseHTTPRequestHandler):
    body = TEXT.encode() + b"# HELP weird caf\xe9\n"
    fail = False

    def do_GET(self) -> None:
        # The request line as sent: http.server itself folds a leading "//" into "/".
        if self.requestline.split()[1] != "/metrics" or type(self).fail:
            self.send_error(503 if type(self).fail else 404)
            return
        if self.headers.get("Authorization") != "Bearer k3y":
            self.send_error(401)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        _Metrics.fail = False
        httpd.shutdown()
        httpd.server_close()


def test_fetch_sends_the_key_and_replaces_bad_utf8(server: str) -> None:
    text = fetch_text(server + "/metrics", "k3y")
    assert text.endswith("# HELP weird caf\ufffd\n")
    with pytest.raises(MetricsError) as err:
        fetch_text(server + "/metrics")
    assert str(err.value) == f"GET {server}/metrics: HTTP 401"
    with pytest.raises(MetricsError, match=r"HTTP 401$"):
        fetch_text(server + "/metrics", "")  # an empty key sends no header


def test_fetch_connection_refused_is_a_metrics_error() -> None:
    from runner.server.engine import free_port

    url = f"http://127.0.0.1:{free_port()}/metrics"
    with pytest.raises(MetricsError, match=rf"^GET {url}: "):
        fetch_text(url, timeout_s=2)


def test_scrape_joins_the_path_and_stamps_the_time(server: str) -> None:
    before = time.monotonic()
    snap = scrape(server + "/", "k3y", timeout_s=5)
    assert before <= snap.t_s <= time.monotonic()
    assert snap.prompt_tokens == 640
    assert scrape(server, "k3y").get(PREFIX_CACHE_HITS) == 30


def test_a_server_that_never_answers_times_out() -> None:
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # connections are queued, never answered
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(MetricsError, match="timed out"):
            scrape(url, timeout_s=0.3)
        with MetricsPoller(url, interval_s=60, timeout_s=0.3) as poller:
            while poller.errors == 0 and time.monotonic() - start < 5:
                time.sleep(0.01)
        assert poller.errors == 1 and "timed out" in poller.warnings[0]
        assert time.monotonic() - start < 3


def test_poller_samples_the_gauges(server: str) -> None:
    poller = MetricsPoller(server, "k3y", interval_s=0.02, timeout_s=2)
    assert poller.stop() == []  # stopping a poller never started is fine
    with MetricsPoller(server, "k3y", interval_s=0.02, timeout_s=2) as poller:
        deadline = time.monotonic() + 5
        while len(poller.samples) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert poller._thread is not None and poller._thread.daemon
    assert poller._thread is not None and not poller._thread.is_alive()
    rows = poller.samples
    assert len(rows) >= 2 and poller.errors == 0 and poller.warnings == []
    first = rows[0]
    assert (first.kv_cache_usage_perc, first.num_requests_running, first.num_requests_waiting) == (0.25, 3, 4)
    assert rows[0].t_s < rows[1].t_s


def test_poller_counts_each_failure_and_keeps_five_messages(server: str) -> None:
    _Metrics.fail = True
    with MetricsPoller(server, "k3y", interval_s=60, timeout_s=2) as slow:
        deadline = time.monotonic() + 5
        while slow.errors == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
    assert slow.errors == 1  # one scrape at start, the next one a minute away
    assert slow.warnings == [f"GET {server}/metrics: HTTP 503"]
    with MetricsPoller(server, "k3y", interval_s=0.01, timeout_s=2) as fast:
        deadline = time.monotonic() + 5
        while fast.errors < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert fast.errors >= 7 and len(fast.warnings) == 5 and fast.samples == []
