"""A point's requests from its workload shape: token-exact prompts, seeded lengths, conversations, trace rows,
and the arrival offsets of a replayed trace; plus what the checks expect of them (each request's output
length, the prefix-cache hit rate the workload's own structure allows).

Pure: the same point, count, salt and trace rows give the same bytes on every call. The salt separates
warmup from measured requests (independent random streams: they share no prefix).

- Lengths are drawn per request from a random stream seeded by (seed, salt): input first, then output;
  normal and lognormal draws are rounded, then clipped to [min, max]; everything is clipped to the arm's
  max_model_len where the plan knows it (the prompt to at most max_model_len - 1, the output to the room left).
- Templates: request i (conversation i for multi-turn) opens with template i mod K, prefix_len tokens
  drawn from (seed, salt, template).
- Multi-turn: `count` is rounded up to whole conversations of `turns` requests. Turn 0's prompt is
  input_len tokens; turn k's is turn k-1's prompt, then output_len(k-1) synthetic assistant tokens (seeded,
  not the model's reply, so the bytes are reproducible), then a new user message of input_len(k) tokens.
  With a max_model_len the whole conversation (every prompt part and every output) is kept within it.
- Trace: request i replays row i mod rows (the rows cycle when the point asks for more); block h of a
  row is 512 tokens drawn from (seed, salt, h), the last block cut to the row's input_length, so equal
  hash ids give equal token blocks and shared prefixes hit the cache.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.plan import PointStep
from compiler.trace import BLOCK_TOKENS, TraceRow
from compiler.workload import Histogram, Length, LogNormal, Normal, Shape, Uniform
from compiler.workload_check import conversation_requests
from runner.load.workload import RequestSpec, make_prompts


@dataclass(frozen=True)
class Requests:
    """What a point sends: the specs in order and, for a trace replayed at its own timestamps, the
    arrival offsets (seconds, the first 0); None: the load's own arrivals."""

    specs: list[RequestSpec]
    offsets: list[float] | None = None


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(str(p) for p in ("studyc-shapes", *parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))


def draw_length(length: Length, rng: random.Random) -> int:
    """One length from the distribution (before clipping to the model)."""
    if isinstance(length, int):
        return length
    if isinstance(length, Uniform):
        return rng.randint(length.min, length.max)
    if isinstance(length, Histogram):
        return rng.choices(length.values or (), weights=length.weights or ())[0]
    if isinstance(length, Normal):
        raw = rng.gauss(length.mean, length.sd)
    else:
        assert isinstance(length, LogNormal)
        mu, sigma = length.log_params
        raw = rng.lognormvariate(mu, sigma)
    low = length.min or 1
    high = length.max if length.max is not None else math.inf
    return int(min(max(round(raw), low), high))


def point_requests(point: PointStep, count: int, salt: str, *,
                   trace_rows: Sequence[TraceRow] | None = None) -> Requests:
    """The point's `count` requests (rounded up to whole conversations); for a classic point exactly the
    token-exact prompts of `make_prompts` with `output_len` each."""
    shape = point.shape
    if shape is None:
        prompts = make_prompts(count, point.input_len, vocab_lo=point.vocab_lo, vocab_hi=point.vocab_hi,
                               seed=point.prompt_seed, prefix_len=point.prefix_len, salt=salt)
        return Requests([RequestSpec(prompt_ids=p, max_tokens=point.output_len) for p in prompts])
    if shape.trace is not None:
        if not trace_rows:
            raise ValueError(f"{point.id} replays a trace: give its rows")
        return _trace_requests(point, shape, count, salt, trace_rows)
    return Requests(_drawn(point, shape, count, salt))


def _drawn(point: PointStep, shape: Shape, count: int, salt: str) -> list[RequestSpec]:
    seed, lo, hi = point.prompt_seed, point.vocab_lo, point.vocab_hi
    vocab = hi - lo
    lengths = _rng("lengths", seed, salt)
    tokens = _rng("tokens", seed, salt)
    first = list(range(lo, hi))
    tokens.shuffle(first)  # the first token after the prefix: distinct across the first `vocab` conversations
    templates = [tuple(lo + r.randrange(vocab) for _ in range(point.prefix_len))
                 for r in (_rng("template", seed, salt, t) for t in range(shape.templates))]
    turns = shape.turns
    limit = shape.max_len
    assert shape.input is not None and shape.output is not None
    floor_in = point.prefix_len + 1 if point.prefix_len else 1
    specs: list[RequestSpec] = []
    for c in range(conversation_requests(count, turns) // turns):
        context: list[int] = []
        used = 0  # tokens the conversation has spent: prompt parts and outputs
        for k in range(turns):
            want_in = max(draw_length(shape.input, lengths), floor_in if k == 0 else 1)
            want_out = max(draw_length(shape.output, lengths), 1)
            if limit is not None:  # leave each later turn a 1-token message and a 1-token reply
                room = limit - used - 2 * (turns - 1 - k)
                want_in = max(min(want_in, room - 1), floor_in if k == 0 else 1)
                want_out = max(min(want_out, room - want_in), 1)
            if k == 0:
                user = list(templates[c % shape.templates])
                if want_in > len(user):
                    user.append(first[c % vocab])
                user += [lo + tokens.randrange(vocab) for _ in range(want_in - len(user))]
            else:
                previous = specs[-1]
                reply = [lo + tokens.randrange(vocab) for _ in range(previous.max_tokens)]
                context = list(previous.prompt_ids) + reply
                user = [lo + tokens.randrange(vocab) for _ in range(want_in)]
            used += want_in + want_out
            prompt = tuple(context + user)
            specs.append(RequestSpec(prompt_ids=prompt, max_tokens=want_out,
                                     conversation=c if turns > 1 else -1, turn=k,
                                     think_s=shape.think_s if k > 0 else 0.0))
    return specs


def _trace_requests(point: PointStep, shape: Shape, count: int, salt: str,
                    rows: Sequence[TraceRow]) -> Requests:
    seed, lo, hi = point.prompt_seed, point.vocab_lo, point.vocab_hi
    blocks: dict[int, tuple[int, ...]] = {}

    def block(h: int) -> tuple[int, ...]:
        if h not in blocks:
            rng = _rng("block", seed, salt, h)
            blocks[h] = tuple(lo + rng.randrange(hi - lo) for _ in range(BLOCK_TOKENS))
        return blocks[h]

    limit = shape.max_len
    specs: list[RequestSpec] = []
    picked = [rows[i % len(rows)] for i in range(count)]
    for row in picked:
        n_in = row.input_length if limit is None else min(row.input_length, limit - 1)
        n_out = row.output_length if limit is None else max(min(row.output_length, limit - n_in), 1)
        prompt = tuple(t for h in row.hash_ids for t in block(h))[:n_in]
        specs.append(RequestSpec(prompt_ids=prompt, max_tokens=n_out))
    offsets = None
    if shape.trace_arrivals and point.rate_rps is not None:
        offsets = trace_offsets(rows, count, point.rate_rps)
    return Requests(specs, offsets)


def trace_offsets(rows: Sequence[TraceRow], count: int, rate_rps: float) -> list[float]:
    """Arrival offsets of the first `count` rows (cycling, each cycle one mean gap after the last row),
    rescaled so the mean rate over the point is `rate_rps`: (count - 1) gaps span (count - 1) / rate."""
    stamps = [r.timestamp_ms for r in rows]
    span = stamps[-1] - stamps[0]
    gap = span / (len(stamps) - 1) if len(stamps) > 1 else 0.0
    raw = [stamps[i % len(stamps)] - stamps[0] + (i // len(stamps)) * (span + gap) for i in range(count)]
    if count < 2 or raw[-1] <= 0:
        return [i / rate_rps for i in range(count)]  # no shape to keep: even spacing at the rate
    scale = (count - 1) / rate_rps / raw[-1]
    return [t * scale for t in raw]


def expected_hit_rate(specs: Sequence[RequestSpec], block_tokens: int) -> float:
    """The prefix-cache hit rate the requests' own shared prefixes allow: replay them in order through an
    unbounded cache of `block_tokens`-token blocks. A request hits its leading blocks already cached, at
    most (len - 1) // block_tokens of them (vLLM computes the last prompt token), then caches its full
    blocks. An upper bound: under concurrency a request can miss blocks another in flight is computing."""
    cached: set[int] = set()
    hits = queries = 0
    for spec in specs:
        ids = spec.prompt_ids
        n = len(ids)
        queries += n
        key = 0
        matching = True
        for j in range(n // block_tokens):
            key = hash((key, ids[j * block_tokens:(j + 1) * block_tokens]))
            if matching and j < (n - 1) // block_tokens and key in cached:
                hits += block_tokens
            else:
                matching = False
            cached.add(key)
    return hits / queries if queries else 0.0
