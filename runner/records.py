"""Typed records that cross studyc's stage boundaries after the Plan.

The load generator makes `RequestRecord`s; the judge turns a point's records into a summary and
check results; the store declares its tables from these dataclasses and maps them to rows and back.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestRecord"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request. Times are `time.monotonic()` seconds.

    `token_times_s` holds the arrival time of each content-bearing SSE chunk (a chunk can carry
    several tokens); chunks that arrived in the same socket read share one timestamp, which is the
    earliest moment the client could know of them. Token counts come from the final `usage` event.
    """

    index: int
    warmup: bool
    scheduled_s: float
    sent_s: float
    first_token_s: float | None
    end_s: float
    token_times_s: tuple[float, ...]
    prompt_tokens: int
    output_tokens: int
    chunks: int
    ok: bool
    error: str | None
    status: int | None
