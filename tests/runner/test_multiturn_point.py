"""A multi-turn workload through the whole point path on the real CPU server: the shape's conversations
(runner.load.shapes) sent turn by turn by the load generator, think time kept, every check valid, and the
later turns hitting the prefix cache on the previous turn's prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compiler.study import Checks
from compiler.workload import Shape
from runner.execute.point import Endpoint, PointContext, run_point
from tests.conftest import vllm_missing
from tests.runner.steps import step

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]

THINK_S = 0.2


def test_multiturn_point_is_valid_and_turns_wait_for_their_predecessor(vllm_server: Any, tiny_model_dir: Path) -> None:
    shape = Shape.model_validate({"input": 64, "output": 16, "turns": 3, "think_s": THINK_S, "max_len": 2048,
                                  "block_tokens": 32})
    point = step(id="shapes/a/conversation/c2/r1", concurrency=2, rate_rps=None, requests=12, warmup=2,
                 input_len=160, output_len=16, vocab_lo=16, vocab_hi=4000, prompt_seed=5, shape=shape)
    ctx = PointContext(thresholds=Checks(), client_ceiling_chunks_per_s=None, gpu_index=0, clock_origin_s=0.0,
                       client_cpus=(1,))
    out = run_point(point, Endpoint(vllm_server.base_url, vllm_server.api_key, str(tiny_model_dir)), ctx)
    assert out.status == "ok" and out.judgement is not None, out.error
    checks = {c.name: c for c in out.judgement.checks}
    assert out.valid, {n: (c.status, c.detail) for n, c in checks.items()}
    measured = sorted((r for r in out.records if not r.warmup), key=lambda r: (r.conversation, r.turn))
    assert [(r.conversation, r.turn) for r in measured] == [(c, t) for c in range(4) for t in range(3)]
    for before, after in zip(measured, measured[1:], strict=False):
        if after.conversation == before.conversation:  # each later turn waits its predecessor's end + think
            assert after.sent_s >= before.end_s + THINK_S - 1e-3
            assert after.prompt_tokens > before.prompt_tokens  # the context grows turn by turn
    summary = out.judgement.summary
    assert summary.prefix_hit_rate is not None and summary.prefix_hit_rate > 0.3  # later turns hit
