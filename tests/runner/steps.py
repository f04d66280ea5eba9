"""Small plan steps for the runner's unit tests."""

from __future__ import annotations

from typing import Any

from compiler.plan import PointStep


def step(**over: Any) -> PointStep:
    """A closed-loop point: c4, 8 requests of 16 in / 8 out, cache reset."""
    fields: dict[str, Any] = dict(
        id="s/a/w/c4/r1", arm="a", workload="w", concurrency=4, rate_rps=None, repeat=1, requests=8, warmup=2,
        cache="reset", input_len=16, output_len=8, prefix_len=0, prompt_seed=1, vocab_lo=10, vocab_hi=1000,
        arrival="poisson", burstiness=1.0, request_timeout_s=60.0, point_timeout_s=None, estimated_s=1.0,
        fingerprint="f" * 16,
    )
    return PointStep(**(fields | over))
