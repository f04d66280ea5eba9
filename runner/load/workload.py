"""What a load point sends and when: token-id prompts of exact length and seeded arrival schedules.

Pure functions of their arguments (no clock, no I/O); the load generator (`runner.load.loadgen`) sends
what they describe.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["ARRIVALS", "Arrival", "RequestSpec", "arrival_times", "make_prompts", "schedule", "share"]

ARRIVALS: tuple[str, ...] = ("poisson", "gamma", "constant")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request: a token-id prompt (exact input length) and the number of tokens to generate.

    Multi-turn: the turns of one conversation are consecutive requests with the same `conversation`
    (>= 0) and `turn` 0, 1, ...; turn k > 0 is sent `think_s` seconds after turn k - 1 ended. A
    single request has `conversation` -1.
    """

    prompt_ids: tuple[int, ...]
    max_tokens: int
    conversation: int = -1
    turn: int = 0
    think_s: float = 0.0


class Arrival(NamedTuple):
    """A measured request's index and when it is due, in seconds after the point's start."""

    request_index: int
    offset_s: float


def make_prompts(
    n: int,
    input_len: int,
    *,
    vocab_lo: int,
    vocab_hi: int,
    seed: int,
    prefix_len: int = 0,
    salt: str = "",
) -> list[tuple[int, ...]]:
    """Deterministic token-id prompts of exactly `input_len` ids in [vocab_lo, vocab_hi).

    All prompts share their first `prefix_len` ids (drawn from seed and salt); after that, each
    prompt differs from every other one at position `prefix_len` (and `prefix_len + 1` once `n`
    exceeds the vocabulary), so no two share a leading block beyond the prefix. Prompts made with
    different salts come from independent random streams: the chance that two of them share their
    first 16 ids is about V**-16, i.e. none.
    """
    if not 0 <= prefix_len <= input_len:
        raise ValueError(f"prefix_len {prefix_len} must be within [0, input_len={input_len}]")
    vocab = vocab_hi - vocab_lo
    if vocab < 2:
        raise ValueError(f"vocabulary [{vocab_lo}, {vocab_hi}) too small")
    free = input_len - prefix_len
    if n > 1 and (free == 0 or (free == 1 and n > vocab) or n > vocab * vocab):
        raise ValueError(f"cannot make {n} distinct prompts with {free} ids after the prefix")
    digest = hashlib.sha256(f"studyc-prompts|{seed}|{salt}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:16], "big"))
    lo = vocab_lo
    prefix = [lo + rng.randrange(vocab) for _ in range(prefix_len)]
    first = list(range(lo, vocab_hi))
    rng.shuffle(first)
    second = list(range(lo, vocab_hi))
    rng.shuffle(second)
    out: list[tuple[int, ...]] = []
    rand = rng.randrange
    for i in range(n):
        ids = prefix.copy()
        if free:
            ids.append(first[i % vocab])
            if free > 1:
                ids.append(second[(i // vocab) % vocab] if n > vocab else lo + rand(vocab))
                ids.extend([lo + rand(vocab) for _ in range(free - 2)])
        out.append(tuple(ids))
    return out


def arrival_times(n: int, rate_rps: float, *, arrival: str = "poisson", burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Seeded arrival offsets (seconds from the start; the first request at 0).

    `poisson`: exponential gaps; `gamma`: gamma gaps with shape `burstiness` (< 1 burstier, > 1 more
    regular) and the same mean 1/rate, as `vllm bench serve` draws them; `constant`: equal gaps.
    """
    if not rate_rps > 0 or math.isinf(rate_rps):
        raise ValueError(f"rate_rps must be a positive finite number, got {rate_rps}")
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival must be poisson, gamma or constant, got {arrival!r}")
    if arrival == "gamma" and not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    rng = random.Random(seed)
    scale = 1.0 / (rate_rps * burstiness)
    t = 0.0
    out = []
    for _ in range(n):
        out.append(t)
        if arrival == "poisson":
            t += rng.expovariate(rate_rps)
        elif arrival == "gamma":
            t += rng.gammavariate(burstiness, scale)
        else:
            t += 1.0 / rate_rps
    return out


def schedule(offsets: list[float], worker: int, workers: int) -> tuple[Arrival, ...]:
    """One worker's share of an open-loop schedule: every `workers`-th arrival, in time order."""
    return tuple(Arrival(i, offsets[i]) for i in range(worker, len(offsets), workers))


def share(total: int, worker: int, workers: int) -> int:
    """Worker `worker`'s part of `total` slots split as evenly as possible over `workers`."""
    return total // workers + (1 if worker < total % workers else 0)
