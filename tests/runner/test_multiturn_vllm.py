"""Multi-turn closed-loop load against the real CPU vLLM server: the turns of each conversation go in
order, each its think time after the previous one ended, and a later turn's prompt (the conversation
so far) hits the prefix cache its earlier turn filled, as the server's own counters say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runner.checks.stats import summarize
from runner.load.loadgen import RequestSpec, make_prompts, run_load
from runner.measure import prometheus

BLOCK = 32  # --block-size of the test server (tests.conftest.TINY_SERVE_FLAGS)


def conversation_specs(n: int, turns: int, think_s: float) -> list[RequestSpec]:
    """Turn k's prompt is turn k-1's plus 64 new ids (the conversation so far), 128 ids at turn 0."""
    full = make_prompts(n, 128 + 64 * (turns - 1), vocab_lo=4, vocab_hi=4096, seed=11, salt="multiturn-vllm")
    return [RequestSpec(p[: 128 + 64 * k], 8, conversation=c, turn=k, think_s=think_s if k else 0.0)
            for c, p in enumerate(full) for k in range(turns)]


@pytest.mark.vllm
def test_multi_turn_closed_loop_on_the_real_server(vllm_server: Any, tiny_model_dir: Path) -> None:
    think = 0.2
    specs = conversation_specs(4, 3, think)
    before = prometheus.scrape(vllm_server.base_url, vllm_server.api_key)
    res = run_load(vllm_server.base_url, str(tiny_model_dir), specs, api_key=vllm_server.api_key, concurrency=2,
                   workers=2, cpus=(1,))
    after = prometheus.scrape(vllm_server.base_url, vllm_server.api_key)
    assert all(r.ok for r in res.records), [r.error for r in res.records if not r.ok]
    assert [r.prompt_tokens for r in res.records] == [len(s.prompt_ids) for s in specs]
    for prev, r in zip(res.records, res.records[1:], strict=False):
        if r.conversation == prev.conversation:
            assert r.turn == prev.turn + 1
            assert r.scheduled_s == prev.end_s + think and r.sent_s >= prev.end_s + think
    # Conversations in flight never exceed the concurrency: a slot holds one from its first send to its last end.
    spans = sorted((min(r.sent_s for r in res.records if r.conversation == c),
                    max(r.end_s for r in res.records if r.conversation == c)) for c in range(4))
    assert all(sum(1 for a, b in spans if a <= t < b) <= 2 for t, _ in spans)
    # Each later turn finds the previous turn's prompt in the cache (its full blocks; the prompts of
    # different conversations share nothing, and turn 0 finds nothing).
    queries = prometheus.delta(before, after, prometheus.PREFIX_CACHE_QUERIES)
    hits = prometheus.delta(before, after, prometheus.PREFIX_CACHE_HITS)
    expected = sum(len(specs[i - 1].prompt_ids) // BLOCK * BLOCK for i, s in enumerate(specs) if s.turn)
    assert queries == sum(len(s.prompt_ids) for s in specs)
    assert hits == expected == 4 * (128 + 192)
    # Little's Law over the steady phase counts the think time: 2 conversations held, not 2 requests in flight.
    summary = summarize(res.records, 2)
    assert summary.mean_in_flight is not None and summary.little_lambda_w is not None
    assert summary.little_lambda_w > summary.mean_in_flight
