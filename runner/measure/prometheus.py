"""The engine's Prometheus `/metrics`: scraped at the measured window's edges only.

A point scrapes once after warmup and any cache reset (before its first measured request) and once
right after its last measured request ended; nothing scrapes inside the window, since a scrape
costs the server's API process time that shows up in the measured token gaps. `MetricsPoller`
remains for benchmarks that measure exactly that disturbance (benchmarks/telemetry_disturbance.py).

Text is read with `prometheus_client`'s parser; a Snapshot keeps every raw sample and a
per-sample-name sum over label sets (one engine: the value itself).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Self

from prometheus_client.parser import text_string_to_metric_families

from runner.server.http import open_url

PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached_total"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
CACHE_CONFIG_INFO = "vllm:cache_config_info"

# Labels that index a distribution, not a series: summing across them is meaningless.
_DISTRIBUTION_LABELS = frozenset({"le", "quantile"})


class MetricsError(Exception):
    """/metrics could not be fetched or parsed (the caller records it; it is not fatal here)."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, eq=False)
class Snapshot(Mapping[str, float]):
    """One scrape. As a mapping: sample name -> value summed over label sets.

    Lookups accept a counter's name with or without `_total` (`vllm:prompt_tokens` finds
    `vllm:prompt_tokens_total`). Histogram buckets and summary quantiles are left out of the
    sums; read them from `samples` or `buckets()`.
    """

    t_s: float  # time.monotonic() when the answer arrived
    samples: tuple[Sample, ...]
    types: Mapping[str, str]  # family name (as the parser names it) -> type
    sums: Mapping[str, float] = field(repr=False)  # sample name -> sum over label sets

    def _key(self, name: str) -> str | None:
        if name in self.sums:
            return name
        if name + "_total" in self.sums:
            return name + "_total"
        if name.endswith("_total") and name[: -len("_total")] in self.sums:
            return name[: -len("_total")]
        return None

    def __getitem__(self, name: str) -> float:
        key = self._key(name)
        if key is None:
            raise KeyError(name)
        return self.sums[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.sums)

    def __len__(self) -> int:
        return len(self.sums)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._key(name) is not None

    def series(self, name: str) -> list[Sample]:
        """Raw samples of one sample name (with or without `_total`)."""
        key = self._key(name) or name
        return [s for s in self.samples if s.name == key]

    def mean(self, name: str) -> float | None:
        """Mean over label sets: the right reduction for fractions like kv_cache_usage_perc."""
        rows = self.series(name)
        return sum(s.value for s in rows) / len(rows) if rows else None

    def buckets(self, name: str) -> list[tuple[float, float]]:
        """Cumulative histogram `(le, count)` pairs of `name` (without `_bucket`), summed over
        the other labels, sorted by `le`."""
        acc: dict[float, float] = {}
        for s in self.samples:
            if s.name == name + "_bucket" and "le" in s.labels:
                le = float(s.labels["le"])
                acc[le] = acc.get(le, 0.0) + s.value
        return sorted(acc.items())

    # Named accessors: None when this engine does not expose the metric.
    @property
    def kv_cache_usage_perc(self) -> float | None:
        """Fraction 0..1 despite the name; averaged over engines."""
        return self.mean(KV_CACHE_USAGE)

    @property
    def num_requests_running(self) -> float | None:
        return self.get(REQUESTS_RUNNING)

    @property
    def num_requests_waiting(self) -> float | None:
        return self.get(REQUESTS_WAITING)

    @property
    def prompt_tokens(self) -> float | None:
        return self.get(PROMPT_TOKENS)

    @property
    def generation_tokens(self) -> float | None:
        return self.get(GENERATION_TOKENS)

    @property
    def cache_config_info(self) -> dict[str, str] | None:
        """Labels of `vllm:cache_config_info` (first engine): block_size, num_gpu_blocks, ..."""
        rows = self.series(CACHE_CONFIG_INFO)
        return dict(rows[0].labels) if rows else None

    def cache_config_infos(self) -> list[dict[str, str]]:
        """Labels of `vllm:cache_config_info` for every engine (data parallel: one each)."""
        return [dict(s.labels) for s in self.series(CACHE_CONFIG_INFO)]


def parse(text: str, t_s: float | None = None) -> Snapshot:
    """Prometheus text exposition -> Snapshot. Raises MetricsError on text the parser rejects."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            types[family.name] = family.type
            for s in family.samples:
                labels = MappingProxyType(dict(s.labels))
                samples.append(Sample(s.name, labels, float(s.value)))
                if _DISTRIBUTION_LABELS.isdisjoint(s.labels):
                    values[s.name] = values.get(s.name, 0.0) + float(s.value)
    except ValueError as exc:
        raise MetricsError(f"unparseable /metrics text: {exc}") from exc
    return Snapshot(
        t_s=time.monotonic() if t_s is None else t_s,
        samples=tuple(samples),
        types=MappingProxyType(types),
        sums=MappingProxyType(values),
    )


def fetch_text(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> str:
    try:
        with open_url("GET", url, api_key, timeout_s) as resp:
            return str(resp.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        raise MetricsError(f"GET {url}: HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise MetricsError(f"GET {url}: {exc}") from exc


def scrape(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> Snapshot:
    """GET {base_url}/metrics and parse it. Raises MetricsError."""
    text = fetch_text(base_url.rstrip("/") + "/metrics", api_key, timeout_s)
    return parse(text, t_s=time.monotonic())


def delta(before: Snapshot, after: Snapshot, name: str) -> float | None:
    """after - before for one (counter) metric; None when either scrape lacks it."""
    a, b = after.get(name), before.get(name)
    if a is None or b is None:
        return None
    return a - b


def prefix_hit_rate(before: Snapshot, after: Snapshot) -> float | None:
    """Prefix-cache hits / queries between two scrapes (tokens); None without queries."""
    q = delta(before, after, PREFIX_CACHE_QUERIES)
    h = delta(before, after, PREFIX_CACHE_HITS)
    if q is None or h is None or q <= 0:
        return None
    return h / q


# What a point keeps of each edge scrape: the counters that reconciliation, the cache check and
# Little's Law read (histogram sums and counts, not their buckets).
EDGE_SERIES = (
    "vllm:request_success_total", PROMPT_TOKENS, GENERATION_TOKENS,
    "vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count",
    "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count",
    PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS, PROMPT_TOKENS_CACHED, PREEMPTIONS,
)  # fmt: skip


def edge_json(snap: Snapshot) -> str:
    """The edge series of one scrape, with its time, as JSON (`edge_from_json` reads it back)."""
    rows = [[s.name, dict(s.labels), s.value] for s in snap.samples if s.name in EDGE_SERIES]
    return json.dumps({"t_s": snap.t_s, "samples": rows}, separators=(",", ":"))


def edge_from_json(text: str) -> Snapshot:
    """A Snapshot of the stored edge series (types are not kept)."""
    doc = json.loads(text)
    samples = tuple(Sample(n, MappingProxyType(dict(lb)), float(v)) for n, lb, v in doc["samples"])
    sums: dict[str, float] = {}
    for s in samples:
        if _DISTRIBUTION_LABELS.isdisjoint(s.labels):
            sums[s.name] = sums.get(s.name, 0.0) + s.value
    return Snapshot(t_s=float(doc["t_s"]), samples=samples, types=MappingProxyType({}),
                    sums=MappingProxyType(sums))


@dataclass(frozen=True)
class PollSample:
    t_s: float  # time.monotonic()
    kv_cache_usage_perc: float | None
    num_requests_running: float | None
    num_requests_waiting: float | None


class MetricsPoller:
    """Scrapes every `interval_s` on a daemon thread while a point runs; a context manager.

    Failed scrapes are counted and their first messages kept in `warnings`, never raised.
    """

    def __init__(
        self, base_url: str, api_key: str | None = None, *, interval_s: float = 0.5, timeout_s: float = 2.0
    ) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.errors = 0
        self.warnings: list[str] = []
        self._samples: list[PollSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="studyc-metrics-poller", daemon=True)
        self._thread.start()

    def stop(self) -> list[PollSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5.0)
        return self.samples

    @property
    def samples(self) -> list[PollSample]:
        with self._lock:
            return list(self._samples)

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                snap = scrape(self.base_url, self.api_key, self.timeout_s)
                row = PollSample(
                    snap.t_s, snap.kv_cache_usage_perc, snap.num_requests_running, snap.num_requests_waiting
                )
                with self._lock:
                    self._samples.append(row)
            except MetricsError as exc:
                self.errors += 1
                if len(self.warnings) < 5:
                    self.warnings.append(str(exc))
            # Fixed schedule, not fixed sleep: a slow scrape does not stretch the period.
            next_t += self.interval_s
            now = time.monotonic()
            next_t = max(next_t, now)
            self._stop.wait(next_t - now)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
