"""Replay one closed-loop point in time through vLLM's front end and scheduler, and predict it.

Pure. A point of a plan is predicted by replaying its closed loop in time through the front-end queue
and vLLM's scheduler (token budget, chunked prefill, prefix-cache hits), each step priced by
`compiler.stepcost`. For a fixed step composition every predicted TPOT, TTFT and window is linear in
the coefficients; the composition itself depends on them (which step a request is admitted before),
so `compiler.stepfit` alternates replay and an exact non-negative least squares.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

from compiler.modelmath import ModelShape
from compiler.stepcost import (
    ZERO_TERMS,
    Card,
    Coefficients,
    EngineShape,
    StepCosts,
    Terms,
    add_terms,
    dot,
    joined_features,
    overlap_terms,
    scale,
    work_from_sums,
)

BLOCK_TOKENS = 16  # prefix-cache hits come in whole KV blocks


@dataclass(frozen=True)
class StepLoad:
    """One closed-loop point: `requests` measured requests through `concurrency` slots, started
    together. `cached_tokens[i]` is how much of request i's prompt the prefix cache already holds."""

    concurrency: int
    requests: int
    input_len: int
    output_len: int
    cached_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("concurrency", "requests", "input_len", "output_len"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"load {name} must be at least 1, got {getattr(self, name)!r}")
        if self.cached_tokens and len(self.cached_tokens) != self.requests:
            raise ValueError(f"cached_tokens has {len(self.cached_tokens)} entries for {self.requests} requests")

    def cached(self, index: int) -> int:
        return self.cached_tokens[index] if self.cached_tokens else 0


def cache_hit_tokens(input_len: int) -> int:
    """Prompt tokens a warm prefix cache serves: whole blocks, never the last token."""
    return (max(input_len - 1, 0) // BLOCK_TOKENS) * BLOCK_TOKENS


@dataclass(frozen=True)
class PointTerms:
    """A replayed point: the features of its mean TPOT, mean TTFT, measured window, and the last first
    token of its opening burst (zero for a single slot)."""

    tpot: Terms
    ttft: Terms
    window: Terms
    burst: Terms
    output_tokens: int
    steps: int


@dataclass(frozen=True)
class StepPrediction:
    tpot_s: float | None  # None when every request has a single output token
    ttft_s: float
    output_throughput: float
    window_s: float

_REQUEST: Terms = (0.0, 0.0, 0.0, 0.0, 1.0, 0.0)  # one request_s
_ADMIT: Terms = (0.0, 0.0, 0.0, 0.0, 0.0, 1.0)  # one admit_s


@dataclass(frozen=True)
class _Time:
    """A moment of the replay: its features (linear in the coefficients) and its value in seconds."""

    terms: Terms
    value: float

    def plus(self, terms: Terms, value: float) -> _Time:
        return _Time(add_terms(self.terms, terms), self.value + value)


def _later(a: _Time, b: _Time) -> _Time:
    return a if a.value >= b.value else b


@dataclass
class _Request:
    index: int
    prompt: int  # tokens to compute (input minus cache hits)
    cached: int
    sent: _Time
    admitted: _Time  # the front end has handed it to the engine: schedulable from the next step
    computed: int = 0
    generated: int = 0
    first: _Time | None = None
    end: _Time | None = None


def replay(shape: ModelShape, load: StepLoad, engine: EngineShape, card: Card, coef: Coefficients) -> PointTerms:
    """Run the point's closed loop through vLLM's front end and scheduler in time. The front end admits
    requests one at a time, `admit_s` each, in the order they were sent; a request is schedulable at
    the first step that starts after its admission. Each step schedules running sequences first (one
    decode token, or the next prefill chunk), then admitted requests in arrival order, within the
    token budget, and lasts `dot(terms, coef)`. A finished request's slot sends the next one when its
    last token reaches the client (`request_s` later). The engine idles only when nothing is admitted.
    The front end streams no token while it is admitting (one event loop does both): tokens made
    during a run of back-to-back admissions reach the client when the run ends.

    Decoding sequences are kept as a count and a context sum (every one of them makes a token each
    step: `max_num_seqs` <= the budget), so a step costs the same at batch 1 and 256; a request's last
    decode step is known when its prefill ends.

    Step composition depends on `coef` (when requests are admitted relative to steps); for the
    composition replayed, every returned feature is linear in the coefficients."""
    hits = [min(load.cached(i), cache_hit_tokens(load.input_len)) if engine.prefix_caching else 0
            for i in range(load.requests)]
    c0, c1, c2, c3, request_value, admit_value = coef.as_terms()
    bw, fl = card.bandwidth_Bps, card.flops_per_s
    costs = StepCosts(shape, engine)
    out_len, budget_tokens, max_seqs = load.output_len, engine.budget_tokens, engine.max_num_seqs
    zero = _Time(ZERO_TERMS, 0.0)
    frontend_free = zero
    sent_count = 0
    pending: deque[_Request] = deque()
    busy: list[list[_Time]] = []  # the front end's busy periods: [start, end] of back-to-back admissions

    def send(at: _Time) -> None:
        nonlocal frontend_free, sent_count
        start = _later(at, frontend_free)
        admitted = start.plus(_ADMIT, admit_value)
        if busy and start.value <= busy[-1][1].value + 1e-15:
            busy[-1][1] = admitted
        else:
            busy.append([start, admitted])
        frontend_free = admitted
        i = sent_count
        pending.append(_Request(i, load.input_len - hits[i], hits[i], at, admitted))
        sent_count += 1

    for _ in range(min(load.concurrency, load.requests)):
        send(zero)
    burst = list(pending)
    now_v, now_t = 0.0, ZERO_TERMS
    waiting: deque[_Request] = deque()
    prefilling: list[_Request] = []  # running, prompt not yet computed, in running order
    decoding = 0  # running sequences past their prefill: one token each per step
    contexts = 0  # their tokens in the KV cache, summed
    tick = 0  # decode steps so far (every step decodes every decoding sequence)
    last_step: dict[int, list[_Request]] = {}  # tick of a request's last decode step -> requests, in running order
    done: list[_Request] = []
    steps = 0
    while pending or waiting or prefilling or decoding:
        while pending and pending[0].admitted.value <= now_v + 1e-15:
            waiting.append(pending.popleft())
        if not decoding and not prefilling and not waiting:
            now_v, now_t = pending[0].admitted.value, pending[0].admitted.terms  # the engine idles
            continue
        if not waiting and not prefilling:
            # A run of pure decode steps: every running sequence makes one token per step until the
            # first of them finishes or the front end admits a request. Done in bulk (same steps).
            left = min(last_step) - tick - 1
            if left > 0:
                admit_at = pending[0].admitted.value if pending else math.inf
                at, done_steps = _decode_run(costs, card, coef, decoding, contexts, left, _Time(now_t, now_v), admit_at)
                now_v, now_t = at.value, at.terms
                tick += done_steps
                contexts += decoding * done_steps
                steps += done_steps
                continue
        budget = budget_tokens - decoding
        scheduled: list[tuple[_Request, int]] = []
        for r in prefilling:
            if budget <= 0:
                break
            n = min(r.prompt - r.computed, budget)
            scheduled.append((r, n))
            budget -= n
        while waiting and budget > 0 and decoding + len(prefilling) < max_seqs:
            if not engine.chunked_prefill and waiting[0].prompt > budget:
                break  # a whole prompt or nothing: it waits for a step with room
            r = waiting.popleft()
            prefilling.append(r)
            n = min(r.prompt, budget)
            scheduled.append((r, n))
            budget -= n
        if not decoding and not scheduled:
            raise ValueError(f"a prompt of {waiting[0].prompt} tokens never fits the budget of {budget_tokens}")
        tokens = sampled = decoding
        read = contexts + decoding  # a decoding sequence reads its context and its new token
        positions: float = read
        for r, n in scheduled:
            context = r.cached + r.computed
            tokens += n
            sampled += n >= r.prompt - r.computed
            read += context + n
            positions += n * (context + (n + 1) / 2)
        terms = overlap_terms(work_from_sums(costs, decoding + len(scheduled), tokens, sampled, read, positions), card, coef)
        now_v += terms[0] * c0 + terms[1] * c1 + terms[2] / bw * c2 + terms[3] / fl * c3
        now_t = add_terms(now_t, terms)
        now = _Time(now_t, now_v)
        steps += 1
        finished: list[_Request] = []
        if decoding:
            tick += 1
            contexts += decoding
            for r in last_step.pop(tick, ()):
                r.end = now
                finished.append(r)
                decoding -= 1
                contexts -= r.cached + r.prompt + out_len
        for r, n in scheduled:
            r.computed += n
            if r.computed >= r.prompt:
                r.first = now
                if out_len <= 1:
                    r.end = now
                    finished.append(r)
                else:  # decodes from the next step; its last decode step is out_len - 1 steps on
                    decoding += 1
                    contexts += r.cached + r.prompt + 1
                    last_step.setdefault(tick + out_len - 1, []).append(r)
        if any(r.computed >= r.prompt for r, _ in scheduled):
            prefilling = [r for r in prefilling if r.computed < r.prompt]
        for r in finished:
            done.append(r)
            if sent_count < load.requests:
                send(now.plus(_REQUEST, request_value))

    starts = [start.value for start, _ in busy]

    def delivered(t: _Time) -> _Time:
        """The front end streams nothing while it is admitting: a token made during a busy period
        leaves when the period ends."""
        i = bisect.bisect_left(starts, t.value) - 1  # the last period that starts before t
        if i >= 0 and t.value < busy[i][1].value:
            return busy[i][1]
        return t

    n = len(done)
    k = len(ZERO_TERMS)
    to_first, to_end = [0.0] * k, [0.0] * k  # summed over requests: first - sent, end - first
    for r in done:
        assert r.first is not None and r.end is not None
        first, end, sent = delivered(r.first).terms, delivered(r.end).terms, r.sent.terms
        for j in range(k):
            to_first[j] += first[j] - sent[j]
            to_end[j] += end[j] - first[j]
    ttft = add_terms(tuple(x / n for x in to_first), _REQUEST)  # type: ignore[arg-type]
    tpot = tuple(x / ((out_len - 1) * n) for x in to_end) if out_len > 1 else ZERO_TERMS
    last_first = max((delivered(r.first) for r in burst if r.first is not None), key=lambda t: t.value)
    burst_terms = add_terms(last_first.terms, _REQUEST) if len(burst) > 1 else ZERO_TERMS
    window = add_terms(delivered(_Time(now_t, now_v)).terms, _REQUEST)
    return PointTerms(tpot=tpot, ttft=ttft, window=window, burst=burst_terms,  # type: ignore[arg-type]
                      output_tokens=n * out_len, steps=steps)


def _decode_run(
    costs: StepCosts, card: Card, coef: Coefficients, n: int, contexts: int, limit: int, now: _Time, admit_at: float,
) -> tuple[_Time, int]:
    """Up to `limit` decode steps of the same `n` sequences (their contexts summing to `contexts` before
    the first), each a step of `step_work`, stopping before a step that would start at or after
    `admit_at` (the scheduler would see a new request). Returns the time after them and how many ran.
    Both kernels' byte and FLOP features scale together (the matmuls' are fixed for `n` tokens, the
    attention kernel's are proportional to the tokens read), so the p-norm weights are the same for
    every step of the run: its features are sums of an affine sequence, and each step costs one
    multiply-add of its time."""
    weights, matmul = costs.weights(n), 2.0 * costs.body * n + 2.0 * costs.lm_head * n
    w_bytes, w_flops = joined_features(weights, matmul, card, coef)
    k_bytes, k_flops = joined_features(costs.kv, costs.per_position, card, coef)  # per token read
    step_s, seq_s, mem, flop = coef.step_s, coef.seq_s, coef.mem, coef.flop
    bw, fl = card.bandwidth_Bps, card.flops_per_s
    fixed = step_s + seq_s * n + w_bytes / bw * mem + w_flops / fl * flop
    per_read = k_bytes / bw * mem + k_flops / fl * flop
    value = now.value
    done = read_sum = 0
    while done < limit and (done == 0 or value < admit_at - 1e-15):
        read = contexts + n * (done + 1)  # each sequence reads its context plus its new token
        value += fixed + per_read * read
        read_sum += read
        done += 1
    total = (float(done), float(n * done), done * w_bytes + read_sum * k_bytes, done * w_flops + read_sum * k_flops,
             0.0, 0.0)
    return _Time(add_terms(now.terms, total), value), done


def predict(
    shape: ModelShape, load: StepLoad, engine: EngineShape, card: Card, coef: Coefficients
) -> StepPrediction:
    """TPOT, TTFT and output throughput of a point, replayed with fitted coefficients."""
    return evaluate(replay(shape, load, engine, card, coef), card, coef)


def evaluate(point: PointTerms, card: Card, coef: Coefficients) -> StepPrediction:
    """The prediction of a point replayed with `coef` (a replay is valid only for its own coefficients)."""
    window = dot(scale(point.window, card), coef)
    if not window > 0:
        raise ValueError("coefficients predict a zero-length window; fit them first")
    has_tpot = any(point.tpot)
    return StepPrediction(
        tpot_s=dot(scale(point.tpot, card), coef) if has_tpot else None,
        ttft_s=dot(scale(point.ttft, card), coef),
        output_throughput=point.output_tokens / window,
        window_s=window,
    )
