"""What a point's own workload makes expected, for the checks: each measured request's max_tokens and the
prefix-cache hit rate its shared prefixes allow from a cold start. Made from the same seeded requests the
point sends (`runner.load.shapes`), live or when a stored point is judged again."""

from __future__ import annotations

from collections.abc import Sequence

from compiler.plan import PointStep
from compiler.trace import TraceRow
from compiler.workload_check import DEFAULT_BLOCK_TOKENS
from runner.checks.checks import Expectation
from runner.load.shapes import expected_hit_rate, point_requests
from runner.load.workload import RequestSpec


def expectation(point: PointStep, specs: Sequence[RequestSpec]) -> Expectation:
    """From the point's measured specs (in request-index order)."""
    blocks = point.shape.block_tokens if point.shape is not None else DEFAULT_BLOCK_TOKENS
    return Expectation(tuple(s.max_tokens for s in specs), expected_hit_rate(specs, blocks))


def point_expectation(point: PointStep, trace_rows: Sequence[TraceRow] | None = None) -> Expectation:
    """From the point step alone (and its trace's rows, where it replays one)."""
    return expectation(point, point_requests(point, point.requests, "measured", trace_rows=trace_rows).specs)
