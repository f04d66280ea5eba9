"""The host's speed at a front end's work: a fixed, deterministic CPU-bound Python workload timed beside each
GPU calibration (`studyc calibrate`, `studyc run`), so that the step-time model's host terms (`step_s`,
`admit_s`, `request_s`: CPU time, not GPU time) can one day be fitted against it (docs/predictions.md).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

WORKLOAD = "chat-request-v1"  # a new workload gets a new name: medians of two workloads do not compare
REQUESTS = 40  # chat requests per timed repeat (about 1 ms each on a 2020s server core)
TOKENS = 64  # streamed tokens framed per request
REPEATS = 15


@dataclass(frozen=True)
class HostProbe:
    """The workload's median seconds per request over `repeats` timed repeats (each `requests` requests),
    with the fastest and slowest repeat's, and the Python that ran it."""

    workload: str
    per_request_s: float
    fastest_s: float
    slowest_s: float
    repeats: int
    requests: int
    python: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _chat_request(i: int) -> dict[str, Any]:
    """A chat completion request as a client sends it: the same text every time, numbered."""
    turns = [{"role": "system", "content": "You are a helpful assistant. Answer briefly and cite sources."}]
    for t in range(4):
        turns.append({"role": "user", "content": f"Question {i}.{t}: " + "why is the sky blue at noon? " * 6})
        turns.append({"role": "assistant", "content": f"Answer {i}.{t}: " + "Rayleigh scattering of sunlight. " * 8})
    return {"model": "served-model", "messages": turns, "max_tokens": TOKENS, "stream": True,
            "temperature": 0.0, "stream_options": {"include_usage": True}}


def one_request(i: int) -> int:
    """A front end's work for one request: decode the request body, walk its messages into a prompt,
    split it into words (a stand-in for the tokenizer's bookkeeping), then frame each streamed token as a
    server-sent event. Returns the bytes framed (so the work cannot be skipped)."""
    body = json.loads(json.dumps(_chat_request(i)))
    prompt = "\n".join(f"<|{m['role']}|>{m['content']}" for m in body["messages"])
    counts: dict[str, int] = {}
    for word in prompt.lower().split():
        counts[word.strip(".,:?")] = counts.get(word.strip(".,:?"), 0) + 1
    framed = 0
    for t in range(body["max_tokens"]):
        chunk = {"id": f"chatcmpl-{i}", "object": "chat.completion.chunk", "model": body["model"],
                 "choices": [{"index": 0, "delta": {"content": f" tok{t % len(counts)}"}, "finish_reason": None}]}
        framed += len(f"data: {json.dumps(chunk)}\n\n")
    return framed


def host_probe(repeats: int = REPEATS, requests: int = REQUESTS,
               clock: Callable[[], float] = time.perf_counter) -> HostProbe:
    """Time the workload: one untimed repeat (imports, caches), then `repeats` timed ones."""
    for i in range(requests):
        one_request(i)
    per_request = []
    for _ in range(repeats):
        start = clock()
        for i in range(requests):
            one_request(i)
        per_request.append((clock() - start) / requests)
    return HostProbe(WORKLOAD, statistics.median(per_request), min(per_request), max(per_request), repeats,
                     requests, f"{platform.python_implementation()} {platform.python_version()}")
