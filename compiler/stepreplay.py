"""Replay one closed-loop point in time through vLLM's front end and scheduler, and predict it.

Pure. A point of a plan is predicted by replaying its closed loop in time through the front-end queue
and vLLM's scheduler (token budget, chunked prefill, prefix-cache hits), each step priced by
`compiler.stepcost`. For a fixed step composition every predicted TPOT, TTFT and window is linear in
the coefficients; the composition itself depends on them (which step a request is admitted before),
so `compiler.stepfit` alternates replay and an exact non-negative least squares.
"""

from __future__ import annotations

import bisect
import heapq
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
    together. `cached_tokens[i]` is how much of request i's prompt the prefix cache already holds, and
    `input_lens[i]` its prompt's length where they differ (else every prompt is `input_len`).

    Conversations (`turns` > 1): requests `c * turns` to `c * turns + turns - 1` are the turns of
    conversation c; a slot sends one conversation's turns in order, turn k + 1 `think_s` after turn k's
    last token reached the client, then the next conversation not yet started."""

    concurrency: int
    requests: int
    input_len: int
    output_len: int
    cached_tokens: tuple[int, ...] = ()
    input_lens: tuple[int, ...] = ()
    turns: int = 1
    think_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("concurrency", "requests", "input_len", "output_len", "turns"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"load {name} must be at least 1, got {getattr(self, name)!r}")
        for name in ("cached_tokens", "input_lens"):
            given = getattr(self, name)
            if given and len(given) != self.requests:
                raise ValueError(f"{name} has {len(given)} entries for {self.requests} requests")
        if self.input_lens and min(self.input_lens) < 1:
            raise ValueError(f"input_lens must be at least 1, got {min(self.input_lens)}")
        if self.requests % self.turns:
            raise ValueError(f"{self.requests} requests are not whole conversations of {self.turns} turns")
        if not 0.0 <= self.think_s < math.inf:
            raise ValueError(f"think_s must be >= 0 and finite, got {self.think_s!r}")

    def cached(self, index: int) -> int:
        return self.cached_tokens[index] if self.cached_tokens else 0

    def prompt(self, index: int) -> int:
        return self.input_lens[index] if self.input_lens else self.input_len


def cache_hit_tokens(input_len: int) -> int:
    """Prompt tokens a warm prefix cache serves: whole blocks, never the last token."""
    return (max(input_len - 1, 0) // BLOCK_TOKENS) * BLOCK_TOKENS


@dataclass(frozen=True)
class PointTerms:
    """A replayed point: the features of its mean TPOT, mean TTFT, measured window, and the last first
    token of its opening burst (zero for a single slot), each with its fixed seconds."""

    tpot: Terms
    ttft: Terms
    window: Terms
    burst: Terms
    output_tokens: int
    steps: int
    # Seconds outside the coefficients (conversations' think time) in each of them: a prediction is
    # dot(features, coefficients) + fixed
    tpot_fixed: float = 0.0
    ttft_fixed: float = 0.0
    window_fixed: float = 0.0
    burst_fixed: float = 0.0


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
    """A moment of the replay: its features (linear in the coefficients), the seconds outside them (think
    time), and its value in seconds: dot(terms, coefficients) + fixed."""

    terms: Terms
    value: float
    fixed: float = 0.0

    def plus(self, terms: Terms, value: float) -> _Time:
        return _Time(add_terms(self.terms, terms), self.value + value, self.fixed)

    def wait(self, seconds: float) -> _Time:
        return _Time(self.terms, self.value + seconds, self.fixed + seconds)


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
    the first step that starts after its admission (under `engine.async_scheduling`, vLLM's default on
    GPUs, the first step *scheduled* after it: while the engine runs, step k + 1 is scheduled when step k
    starts, so a request admitted during step k waits for step k + 2), and the opening burst (one request per slot, sent
    at once) at the first step after the last of it is admitted. Each step schedules running sequences
    first (one decode token, or the next prefill chunk), then admitted requests in arrival order, within
    the token budget, and lasts `dot(terms, coef)`. A finished request's slot sends the next one when its
    last token reaches the client (`request_s` later). The engine idles only when nothing is admitted.
    The front end streams no token while it is admitting (one event loop does both): tokens made
    during a run of back-to-back admissions reach the client when the run ends.

    Decoding sequences are kept as a count and a context sum (every one of them makes a token each
    step: `max_num_seqs` <= the budget), so a step costs the same at batch 1 and 256; a request's last
    decode step is known when its prefill ends.

    Step composition depends on `coef` (when requests are admitted relative to steps); for the
    composition replayed, every returned feature is linear in the coefficients."""
    hits = [min(load.cached(i), cache_hit_tokens(load.prompt(i))) if engine.prefix_caching else 0
            for i in range(load.requests)]
    c0, c1, c2, c3, request_value, admit_value = coef.as_terms()
    bw, fl = card.bandwidth_Bps, card.flops_per_s
    costs = StepCosts(shape, engine)
    out_len, budget_tokens, max_seqs = load.output_len, engine.budget_tokens, engine.max_num_seqs
    zero = _Time(ZERO_TERMS, 0.0)
    frontend_free = zero
    turns = load.turns
    units = load.requests // turns  # conversations (single requests when turns is 1)
    started = 0  # units a slot has taken
    pending: deque[_Request] = deque()
    busy: list[list[_Time]] = []  # the front end's busy periods: [start, end] of back-to-back admissions
    due: list[tuple[float, int, _Time]] = []  # turns a thinking slot sends later: (when, index, at)

    def send(at: _Time, i: int) -> None:
        nonlocal frontend_free
        start = _later(at, frontend_free)
        admitted = start.plus(_ADMIT, admit_value)
        if busy and start.value <= busy[-1][1].value + 1e-15:
            busy[-1][1] = admitted
        else:
            busy.append([start, admitted])
        frontend_free = admitted
        pending.append(_Request(i, load.prompt(i) - hits[i], hits[i], at, admitted))

    def release(until: float) -> None:
        """The thinking slots' next turns due by `until`, to the front end in time order."""
        while due and due[0][0] <= until + 1e-15:
            _, i, at = heapq.heappop(due)
            send(at, i)

    while started < min(load.concurrency, units):
        send(zero, started * turns)
        started += 1
    burst = list(pending)
    # The opening burst reaches the engine together, once the front end has admitted all of it (the stored
    # requests: arrivals within one step are admitted in the same step); handed over one at a time, its
    # first requests ran small prefill steps and the ledger's TTFT error was larger (docs/predictions.md).
    for r in burst:
        r.admitted = frontend_free
    now_v, now_t, now_f = 0.0, ZERO_TERMS, 0.0
    waiting: deque[_Request] = deque()
    prefilling: list[_Request] = []  # running, prompt not yet computed, in running order
    decoding = 0  # running sequences past their prefill: one token each per step
    contexts = 0  # their tokens in the KV cache, summed
    tick = 0  # decode steps so far (every step decodes every decoding sequence)
    last_step: dict[int, list[_Request]] = {}  # tick of a request's last decode step -> requests, in running order
    done: list[_Request] = []
    steps = 0
    scheduled_at = 0.0  # when the step about to run was scheduled: the last step's start while the engine runs
    while pending or waiting or prefilling or decoding or due:
        release(now_v)
        while pending and pending[0].admitted.value <= (scheduled_at if engine.async_scheduling else now_v) + 1e-15:
            waiting.append(pending.popleft())
        if not decoding and not prefilling and not waiting:
            if not pending:
                release(due[0][0])  # every slot is thinking: the engine idles until the next turn
            idle = pending[0].admitted  # the engine idles
            now_v, now_t, now_f = idle.value, idle.terms, idle.fixed
            scheduled_at = now_v
            continue
        if not waiting and not prefilling:
            # A run of pure decode steps: every running sequence makes one token per step until the
            # first of them finishes or the front end admits a request. Done in bulk (same steps).
            left = min(last_step) - tick - 1
            if left > 0:
                admit_at = min(pending[0].admitted.value if pending else math.inf, due[0][0] if due else math.inf)
                at, done_steps, last_start = _decode_run(costs, card, coef, decoding, contexts, left,
                                                         _Time(now_t, now_v, now_f), admit_at, engine.async_scheduling)
                now_v, now_t = at.value, at.terms
                scheduled_at = last_start
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
        scheduled_at = now_v
        now_v += terms[0] * c0 + terms[1] * c1 + terms[2] / bw * c2 + terms[3] / fl * c3
        now_t = add_terms(now_t, terms)
        now = _Time(now_t, now_v, now_f)
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
            back = now.plus(_REQUEST, request_value)  # its last token reached the client: the slot is free
            if (r.index + 1) % turns:  # the conversation's next turn, after the user's think time
                if load.think_s > 0:
                    heapq.heappush(due, (back.value + load.think_s, r.index + 1, back.wait(load.think_s)))
                else:
                    send(back, r.index + 1)
            elif started < units:
                send(back, started * turns)
                started += 1

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
    fixed_first = fixed_end = 0.0
    for r in done:
        assert r.first is not None and r.end is not None
        first, end, sent = delivered(r.first), delivered(r.end), r.sent
        for j in range(k):
            to_first[j] += first.terms[j] - sent.terms[j]
            to_end[j] += end.terms[j] - first.terms[j]
        fixed_first += first.fixed - sent.fixed
        fixed_end += end.fixed - first.fixed
    ttft = add_terms(tuple(x / n for x in to_first), _REQUEST)  # type: ignore[arg-type]
    tpot = tuple(x / ((out_len - 1) * n) for x in to_end) if out_len > 1 else ZERO_TERMS
    last_first = max((delivered(r.first) for r in burst if r.first is not None), key=lambda t: t.value)
    burst_terms = add_terms(last_first.terms, _REQUEST) if len(burst) > 1 else ZERO_TERMS
    last = delivered(_Time(now_t, now_v, now_f))
    window = add_terms(last.terms, _REQUEST)
    return PointTerms(tpot=tpot, ttft=ttft, window=window, burst=burst_terms,  # type: ignore[arg-type]
                      output_tokens=n * out_len, steps=steps,
                      tpot_fixed=fixed_end / ((out_len - 1) * n) if out_len > 1 else 0.0,
                      ttft_fixed=fixed_first / n, window_fixed=last.fixed,
                      burst_fixed=last_first.fixed if len(burst) > 1 else 0.0)


def _decode_run(
    costs: StepCosts, card: Card, coef: Coefficients, n: int, contexts: int, limit: int, now: _Time, admit_at: float,
    async_scheduling: bool,
) -> tuple[_Time, int, float]:
    """Up to `limit` decode steps of the same `n` sequences (their contexts summing to `contexts` before
    the first), each a step of `step_work`, stopping before a step that would start at or after
    `admit_at` (the scheduler would see a new request); under `async_scheduling`, before a step that would
    be scheduled at or after it (one step later: a step is scheduled when the one before it starts).
    Returns the time after them, how many ran, and when the last of them started.
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
    value = start = now.value
    done = read_sum = 0
    while done < limit and (done == 0 or (start if async_scheduling else value) < admit_at - 1e-15):
        read = contexts + n * (done + 1)  # each sequence reads its context plus its new token
        start = value
        value += fixed + per_read * read
        read_sum += read
        done += 1
    total = (float(done), float(n * done), done * w_bytes + read_sum * k_bytes, done * w_flops + read_sum * k_flops,
             0.0, 0.0)
    return _Time(add_terms(now.terms, total), value, now.fixed), done, start


def predict(
    shape: ModelShape, load: StepLoad, engine: EngineShape, card: Card, coef: Coefficients
) -> StepPrediction:
    """TPOT, TTFT and output throughput of a point, replayed with fitted coefficients."""
    return evaluate(replay(shape, load, engine, card, coef), card, coef)


def evaluate(point: PointTerms, card: Card, coef: Coefficients) -> StepPrediction:
    """The prediction of a point replayed with `coef` (a replay is valid only for its own coefficients)."""
    window = dot(scale(point.window, card), coef) + point.window_fixed
    if not window > 0:
        raise ValueError("coefficients predict a zero-length window; fit them first")
    has_tpot = any(point.tpot)
    return StepPrediction(
        tpot_s=dot(scale(point.tpot, card), coef) + point.tpot_fixed if has_tpot else None,
        ttft_s=dot(scale(point.ttft, card), coef) + point.ttft_fixed,
        output_throughput=point.output_tokens / window,
        window_s=window,
    )
