"""Server counters at a window's edges, made to agree with given client records (for pure tests of
the judge): what a real vLLM server reports over a window, minus a few ms of transport per request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runner.measure import prometheus

LABELS = 'engine="0",model_name="m"'


def _text(values: dict[str, float]) -> str:
    lines = [f'vllm:request_success_total{{{LABELS},finished_reason="length"}} {values["n"]}']
    for name, key in (("vllm:prompt_tokens_total", "prompt"), ("vllm:generation_tokens_total", "gen"),
                      ("vllm:e2e_request_latency_seconds_sum", "e2e"),
                      ("vllm:e2e_request_latency_seconds_count", "n"),
                      ("vllm:time_to_first_token_seconds_sum", "ttft"),
                      ("vllm:time_to_first_token_seconds_count", "n"),
                      ("vllm:inter_token_latency_seconds_sum", "itl"),
                      ("vllm:inter_token_latency_seconds_count", "itl_n"),
                      ("vllm:prefix_cache_queries_total", "queries"), ("vllm:prefix_cache_hits_total", "hits")):
        lines.append(f"{name}{{{LABELS}}} {values[key]}")
    return "\n".join(lines) + "\n"


def edges(records: Sequence[Any], *, transport_s: float = 0.002, extra_requests: int = 0,
          queries: float = 100.0, hits: float = 0.0) -> tuple[prometheus.Snapshot, prometheus.Snapshot]:
    """(before, after) snapshots bracketing the measured records, agreeing with them: each request's
    server e2e and TTFT are the client's minus `transport_s`; `extra_requests` adds requests of
    another client (counted by the server, unseen by the client)."""
    done = [r for r in records if not r.warmup and r.ok]
    measured = [r for r in records if not r.warmup]
    n = len(done) + extra_requests
    out = sum(r.output_tokens for r in done)
    values = {
        "n": n, "prompt": sum(r.prompt_tokens for r in done) * n / max(len(done), 1),
        "gen": out * n / max(len(done), 1),
        "e2e": sum(r.end_s - r.sent_s - transport_s for r in done),
        "ttft": sum((r.first_token_s or r.sent_s) - r.sent_s - transport_s for r in done),
        "itl": sum(r.token_times_s[-1] - r.token_times_s[0] for r in done if r.token_times_s),
        "itl_n": sum(max(r.output_tokens - 1, 0) for r in done) * n / max(len(done), 1),
        "queries": queries, "hits": hits,
    }
    zero = dict.fromkeys(values, 0.0)
    t0 = min(r.sent_s for r in measured) - 0.01
    t1 = max(r.end_s for r in measured) + 0.01
    return prometheus.parse(_text(zero), t_s=t0), prometheus.parse(_text(values), t_s=t1)
