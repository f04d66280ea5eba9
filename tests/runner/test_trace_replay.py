"""A replayed Mooncake trace on the real CPU server: the shipped trace's shared blocks and burst shape,
every check of the point valid, and the prefix hits within what the trace's own structure allows."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from compiler.study import Checks
from compiler.trace import parse_trace
from compiler.workload import Shape, TraceRef
from runner.execute.point import Endpoint, PointContext, run_point
from tests.conftest import REPO, vllm_missing
from tests.runner.steps import step

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]

TRACE = REPO / "studies" / "traces" / "mini_mooncake.jsonl"


def test_trace_replay_point_is_valid(vllm_server: Any, tiny_model_dir: Path) -> None:
    ref = TraceRef(path=str(TRACE), sha256=hashlib.sha256(TRACE.read_bytes()).hexdigest(), rows=200)
    point = step(id="shapes/a/replay/rate4/r1", concurrency=None, rate_rps=4.0, arrival="trace", requests=16,
                 warmup=2, input_len=1040, output_len=19, vocab_lo=16, vocab_hi=4000, prompt_seed=33,
                 shape=Shape(trace=ref, trace_arrivals=True, max_len=2048, block_tokens=32))
    ctx = PointContext(thresholds=Checks(), client_ceiling_chunks_per_s=None, gpu_index=0, clock_origin_s=0.0,
                       client_cpus=(1,))
    out = run_point(point, Endpoint(vllm_server.base_url, vllm_server.api_key, str(tiny_model_dir)), ctx)
    assert out.status == "ok" and out.judgement is not None, out.error
    checks = {c.name: c for c in out.judgement.checks}
    assert out.valid, {n: (c.status, c.detail) for n, c in checks.items()}
    cache = checks["cache_cold"]
    assert "expected from the workload's shared prefixes" in cache.detail
    summary = out.judgement.summary
    assert summary.prefix_hit_rate is not None and summary.prefix_hit_rate > 0.2  # shared system prompts hit
    measured = sorted((r for r in out.records if not r.warmup), key=lambda r: r.index)
    rows = parse_trace(TRACE.read_text())
    assert [r.prompt_tokens for r in measured] == [row.input_length for row in rows[:16]]  # token-exact
