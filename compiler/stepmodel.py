"""A calibrated step-time model of a vLLM server: measured terms, few coefficients, point predictions.

Pure. One engine step costs
    step_s + seq_s * sequences + join(weight bytes, matmul FLOPs) + join(KV bytes, attention FLOPs)
with join(bytes, flops) the p-norm of mem * bytes / bandwidth and flop * flops / flop_rate (see
`overlap_terms`): the matmuls stream the weights (routed experts by their expected union over the
step's tokens) and compute 2 FLOPs per parameter and token; the attention kernel, which runs after
them, streams the KV cache its sequences read and computes attention. Bytes and FLOPs come from
`compiler.modelmath`, against the card's calibrated bandwidth and FLOP/s. Two
front-end terms sit outside the steps: `admit_s`, the work the API server does per request before the
engine sees it, one request at a time (a queue: a burst of N requests reaches the engine over
N * admit_s), and `request_s`, a token's trip from the engine to the client.

A point of a plan is predicted by replaying its closed loop in time through the front-end queue and
vLLM's scheduler (token budget, chunked prefill, prefix-cache hits). For a fixed step composition
every predicted TPOT, TTFT and window is linear in the coefficients; the composition itself depends
on them (which step a request is admitted before), so `fit` alternates replay and an exact
non-negative least squares until the coefficients stop moving.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields, replace

from compiler.modelmath import ModelShape

# vLLM's defaults for `vllm serve` on a datacenter GPU (its log: "Chunked prefill is enabled with
# max_num_batched_tokens=8192"); a server's argv overrides them.
DEFAULT_BUDGET_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 256
BLOCK_TOKENS = 16  # prefix-cache hits come in whole KV blocks

# Features of one step, one request or one point, in the order of `Coefficients`' fields.
Terms = tuple[float, float, float, float, float, float]
_ZERO: Terms = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Coefficients:
    """Fitted constants of one (gpu, vLLM version, model family, engine options) key.

    step_s: fixed cost of every engine step (scheduling, launches; large when eager).
    seq_s: cost per sequence in a step (sampling, bookkeeping, per-sequence kernels).
    mem: time per byte streamed, in units of 1 / calibrated bandwidth (1.0 = at the ceiling).
    flop: time per FLOP, in units of 1 / calibrated FLOP/s (1.0 = at the ceiling).
    request_s: latency of a token from the engine to the client (HTTP, detokenizing, streaming).
    admit_s: front-end work per request before the engine sees it (HTTP parse, tokenizing,
        admission), done one request at a time: a burst of N requests reaches the engine over N * admit_s.
    overlap: p of the p-norm that joins a kernel's streaming time and compute time, which the GPU
        overlaps: (memory^p + compute^p)^(1/p), for the matmuls and for attention, each on its own
        (they run one after the other). 1 adds them; large p tends to the slower of the two.
        Not a linear term: `fit` chooses it from a short list by the residual on the training data.
    """

    step_s: float
    seq_s: float
    mem: float
    flop: float
    request_s: float
    admit_s: float
    overlap: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"coefficient {f.name} must be a finite number >= 0, got {value!r}")
        if self.overlap < 1.0:
            raise ValueError(f"coefficient overlap must be at least 1 (1: no overlap), got {self.overlap!r}")

    def as_terms(self) -> Terms:
        return (self.step_s, self.seq_s, self.mem, self.flop, self.request_s, self.admit_s)


COEFFICIENT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Coefficients))


@dataclass(frozen=True)
class ModelKey:
    """What coefficients are fitted for: they do not carry across these."""

    gpu: str
    vllm_version: str
    family: str
    enforce_eager: bool
    kv_cache_dtype: str

    def label(self) -> str:
        mode = "eager" if self.enforce_eager else "graphs"
        return f"{self.gpu} / vLLM {self.vllm_version} / {self.family} / {mode} / kv {self.kv_cache_dtype}"


@dataclass(frozen=True)
class Card:
    """The calibrated ceilings the terms are measured against."""

    bandwidth_Bps: float
    flops_per_s: float

    def __post_init__(self) -> None:
        for name in ("bandwidth_Bps", "flops_per_s"):
            value = getattr(self, name)
            if value is None or not value > 0:
                raise ValueError(f"card {name} must be positive, got {value!r}")


@dataclass(frozen=True)
class EngineShape:
    """The scheduler settings that shape the steps, read from the server's argv."""

    budget_tokens: int = DEFAULT_BUDGET_TOKENS
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    dtype: str = "bf16"
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    prefix_caching: bool = True
    chunked_prefill: bool = True  # off: a prompt is scheduled only whole, when it fits the step's budget


@dataclass(frozen=True)
class Load:
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
class Prediction:
    tpot_s: float | None  # None when every request has a single output token
    ttft_s: float
    output_throughput: float
    window_s: float


class _Costs:
    """The model's per-step constants for one engine, computed once (weights by token count memoized)."""

    def __init__(self, shape: ModelShape, engine: EngineShape) -> None:
        self.shape, self.dtype = shape, engine.dtype
        self.kv = shape.kv_bytes_per_token(engine.kv_cache_dtype)
        self.lm_head = shape.embedding_params  # vocab x hidden, applied only to sampled positions
        self.body = shape.active_params - self.lm_head
        self.per_position = shape.attention_flops_per_token(1.0)  # attention FLOPs are linear in it
        self._weights: dict[int, float] = {}

    def weights(self, tokens: int) -> float:
        if tokens not in self._weights:
            self._weights[tokens] = self.shape.decode_weight_bytes(tokens, self.dtype)
        return self._weights[tokens]


# What one step does, by kernel: (1, sequences, weight bytes, matmul FLOPs, KV bytes, attention FLOPs).
# The matmuls stream the weights and the attention kernel streams the KV cache: two kernels, one after
# the other, each overlapping its own streaming with its own compute.
Work = tuple[float, float, float, float, float, float]


def step_work(
    shape: ModelShape,
    engine: EngineShape,
    chunks: Sequence[tuple[int, int, bool]],
    costs: _Costs | None = None,
) -> Work:
    """What one step streams and computes, by kernel. `chunks`: (new tokens, tokens already in the KV
    cache, samples a token) for each scheduled sequence. `costs`: the engine's constants, when the
    caller has them."""
    if not chunks:
        return _ZERO
    tokens = sampled = read = 0
    positions = 0.0  # sum over new tokens of the positions each attends to
    for n, context, samples in chunks:
        tokens += n
        sampled += samples
        read += context + n
        positions += n * (context + (n + 1) / 2)
    if tokens < 1:
        raise ValueError("a step schedules at least one token")
    return _work(costs or _Costs(shape, engine), len(chunks), tokens, sampled, read, positions)


def _work(c: _Costs, seqs: int, tokens: int, sampled: int, read: int, positions: float) -> Work:
    """A step's work from its sums: sequences scheduled, new tokens, tokens sampled, KV tokens read and
    attended positions (`step_work` sums them per chunk; the replay keeps them for its decoding batch)."""
    matmul = 2.0 * c.body * tokens + 2.0 * c.lm_head * sampled
    return (1.0, float(seqs), c.weights(tokens), matmul, read * c.kv, c.per_position * positions)


def _joined(nbytes: float, flops: float, card: Card, coef: Coefficients) -> tuple[float, float]:
    """One kernel's byte and FLOP features weighted by the partial derivatives (m/T)^(p-1), (f/T)^(p-1)
    of its time T = (m^p + f^p)^(1/p), m = mem * bytes / bandwidth, f = flop * FLOPs / FLOP/s."""
    p = coef.overlap
    m = coef.mem * nbytes / card.bandwidth_Bps
    f = coef.flop * flops / card.flops_per_s
    if p == 1.0 or m <= 0 or f <= 0:
        return nbytes, flops
    joined = (m**p + f**p) ** (1.0 / p)
    return nbytes * (m / joined) ** (p - 1), flops * (f / joined) ** (p - 1)


def overlap_terms(work: Work, card: Card | None, coef: Coefficients | None) -> Terms:
    """A step's features: the matmuls' time joins weight streaming and matmul compute by the p-norm
    T = (m^p + f^p)^(1/p), p = `coef.overlap`, and so does the attention kernel's for KV streaming and
    attention compute; the two kernels add. Each byte and FLOP feature is weighted by T's partial
    derivatives at `coef`. T is homogeneous of degree 1, so the weighted features give exactly the
    step's time at `coef` (Euler) and are its gradient in `mem` and `flop`: a linear fit on them is a
    Gauss-Newton step of the non-linear fit. Without `coef` (or at p = 1) everything adds."""
    if coef is None or card is None or coef.overlap == 1.0:
        return (work[0], work[1], work[2] + work[4], work[3] + work[5], 0.0, 0.0)
    weights, matmul = _joined(work[2], work[3], card, coef)
    kv, attention = _joined(work[4], work[5], card, coef)
    return (work[0], work[1], weights + kv, matmul + attention, 0.0, 0.0)


def _add(a: Terms, b: Terms, k: float = 1.0) -> Terms:
    if k == 1.0:
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4], a[5] + b[5])
    return tuple(x + k * y for x, y in zip(a, b, strict=True))  # type: ignore[return-value]


_REQUEST: Terms = (0.0, 0.0, 0.0, 0.0, 1.0, 0.0)  # one request_s
_ADMIT: Terms = (0.0, 0.0, 0.0, 0.0, 0.0, 1.0)  # one admit_s


@dataclass(frozen=True)
class _Time:
    """A moment of the replay: its features (linear in the coefficients) and its value in seconds."""

    terms: Terms
    value: float

    def plus(self, terms: Terms, value: float) -> _Time:
        return _Time(_add(self.terms, terms), self.value + value)


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


def replay(shape: ModelShape, load: Load, engine: EngineShape, card: Card, coef: Coefficients) -> PointTerms:
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
    costs = _Costs(shape, engine)
    out_len, budget_tokens, max_seqs = load.output_len, engine.budget_tokens, engine.max_num_seqs
    zero = _Time(_ZERO, 0.0)
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
    now_v, now_t = 0.0, _ZERO
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
        terms = overlap_terms(_work(costs, decoding + len(scheduled), tokens, sampled, read, positions), card, coef)
        now_v += terms[0] * c0 + terms[1] * c1 + terms[2] / bw * c2 + terms[3] / fl * c3
        now_t = _add(now_t, terms)
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
    k = len(_ZERO)
    to_first, to_end = [0.0] * k, [0.0] * k  # summed over requests: first - sent, end - first
    for r in done:
        assert r.first is not None and r.end is not None
        first, end, sent = delivered(r.first).terms, delivered(r.end).terms, r.sent.terms
        for j in range(k):
            to_first[j] += first[j] - sent[j]
            to_end[j] += end[j] - first[j]
    ttft = _add(tuple(x / n for x in to_first), _REQUEST)  # type: ignore[arg-type]
    tpot = tuple(x / ((out_len - 1) * n) for x in to_end) if out_len > 1 else _ZERO
    last_first = max((delivered(r.first) for r in burst if r.first is not None), key=lambda t: t.value)
    burst_terms = _add(last_first.terms, _REQUEST) if len(burst) > 1 else _ZERO
    window = _add(delivered(_Time(now_t, now_v)).terms, _REQUEST)
    return PointTerms(tpot=tpot, ttft=ttft, window=window, burst=burst_terms,  # type: ignore[arg-type]
                      output_tokens=n * out_len, steps=steps)


def _decode_run(
    costs: _Costs, card: Card, coef: Coefficients, n: int, contexts: int, limit: int, now: _Time, admit_at: float,
) -> tuple[_Time, int]:
    """Up to `limit` decode steps of the same `n` sequences (their contexts summing to `contexts` before
    the first), each a step of `step_work`, stopping before a step that would start at or after
    `admit_at` (the scheduler would see a new request). Returns the time after them and how many ran.
    Both kernels' byte and FLOP features scale together (the matmuls' are fixed for `n` tokens, the
    attention kernel's are proportional to the tokens read), so the p-norm weights are the same for
    every step of the run: its features are sums of an affine sequence, and each step costs one
    multiply-add of its time."""
    weights, matmul = costs.weights(n), 2.0 * costs.body * n + 2.0 * costs.lm_head * n
    w_bytes, w_flops = _joined(weights, matmul, card, coef)
    k_bytes, k_flops = _joined(costs.kv, costs.per_position, card, coef)  # per token read
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
    return _Time(_add(now.terms, total), value), done


def scale(terms: Terms, card: Card) -> Terms:
    """Features in seconds per unit coefficient: bytes over bandwidth, FLOPs over FLOP/s."""
    return (terms[0], terms[1], terms[2] / card.bandwidth_Bps, terms[3] / card.flops_per_s, terms[4], terms[5])


def _dot(terms: Terms, coef: Coefficients) -> float:
    return sum(t * c for t, c in zip(terms, coef.as_terms(), strict=True))


def predict(shape: ModelShape, load: Load, engine: EngineShape, card: Card, coef: Coefficients) -> Prediction:
    """TPOT, TTFT and output throughput of a point, replayed with fitted coefficients."""
    return evaluate(replay(shape, load, engine, card, coef), card, coef)


def evaluate(point: PointTerms, card: Card, coef: Coefficients) -> Prediction:
    """The prediction of a point replayed with `coef` (a replay is valid only for its own coefficients)."""
    window = _dot(scale(point.window, card), coef)
    if not window > 0:
        raise ValueError("coefficients predict a zero-length window; fit them first")
    has_tpot = any(point.tpot)
    return Prediction(
        tpot_s=_dot(scale(point.tpot, card), coef) if has_tpot else None,
        ttft_s=_dot(scale(point.ttft, card), coef),
        output_throughput=point.output_tokens / window,
        window_s=window,
    )


# ---- fitting ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Observation:
    """One measured point and what replays it: the fit's unit of data. `burst_s` is the last first
    token of the opening burst, from the first send (the requests table's per-request times)."""

    shape: ModelShape
    load: Load
    engine: EngineShape
    card: Card
    tpot_s: float | None
    ttft_s: float | None
    window_s: float | None
    burst_s: float | None = None


# Relative weights of the measured quantities, and the pull of `mem` and `flop` toward 1.0 (the
# calibrated ceilings) so that a few studies that cannot separate them still fit physically.
FIT_WEIGHTS = {"tpot": 1.0, "window": 1.0, "burst": 1.0, "ttft": 0.3}
PRIOR_WEIGHT = 0.05
# Where the fixed-point fit starts: graphs-mode constants of a datacenter GPU, the ceilings, a few
# milliseconds of front end. The fit converges to the same point from any reasonable start.
START = Coefficients(step_s=2e-3, seq_s=0.0, mem=1.0, flop=1.0, request_s=0.01, admit_s=0.003)
MAX_ITERATIONS = 40
# The overlap p values `fit` tries (1: streaming and compute add; 4: within 19% of the slower one).
OVERLAPS = (1.0, 2.0, 4.0)
# The front-end costs per request `fit` tries for admit_s (seconds). On the H200 a burst of 128 requests
# of 1,024 prompt tokens reached the engine over ~0.28 s (~2.2 ms each); slower hosts and eager mode
# spend more.
ADMITS = (1e-3, 2e-3, 3e-3, 4e-3, 6e-3)
# Converged when no coefficient moves by more than 0.1% (relative; absolute below 1e-6). The step
# composition is discrete (a request admitted one step earlier or later), so the iteration can end in
# a cycle between two compositions whose coefficients differ by a few 0.01%: that is converged.
TOLERANCE = 1e-3
# Full fixed-point steps first. After a cycle too wide to pick from (or UNDAMPED_ITERATIONS), steps go
# half way, and a step after which the change did not shrink is halved again (down to MIN_DAMPING):
# the composition can make the full step overshoot back and forth between two compositions.
UNDAMPED_ITERATIONS = 8
MIN_DAMPING = 0.125
# At the shortest steps the iteration can still jump between compositions (the map from coefficients to
# composition is discontinuous; typically `admit_s` moves a request to the step before or after). Once
# the change has shrunk by less than a fifth over SETTLE_ITERATIONS iterations and their iterates span less than
# SETTLE_SPREAD of every coefficient, the fit is the one among them with the least residual on its own
# replay.
SETTLE_ITERATIONS = 6
SETTLE_SPREAD = 0.25
CYCLE_SPREAD = 0.05


@dataclass(frozen=True)
class Fit:
    coefficients: Coefficients
    iterations: int
    changes: tuple[float, ...]  # the largest relative coefficient change after each iteration
    cycle: int = 0  # length of the cycle it ended in (0: a fixed point)
    spread: float = 0.0  # the cycle's largest relative coefficient difference


def fit(observations: Sequence[Observation], prior: float = PRIOR_WEIGHT, start: Coefficients = START,
        overlaps: Sequence[float] = OVERLAPS, admits: Sequence[float] = ADMITS) -> Fit:
    """The fit (see `fit_at`) at each overlap p in `overlaps` and each front-end cost `admit_s` in
    `admits`, held fixed there; the one with the least residual on `observations`, each on its own
    replay, wins; then `admit_s` is freed, starting from that fit, and the result kept if it explains
    the data better. `admit_s` decides which step a request joins, so the fixed-point iteration moves
    it in jumps and, started far off, can settle far from the best fit. Replays are shared between
    them (the residuals replay coefficients the iteration already replayed)."""
    best: tuple[float, Fit] | None = None
    memo: _Memo = {}
    failures: list[str] = []
    for p in overlaps:
        for admit in admits:
            try:
                result = fit_at(observations, prior, replace(start, overlap=p, admit_s=admit), memo, admit_s=admit)
            except ValueError as exc:
                failures.append(f"overlap {p:g}, admit {1e3 * admit:g} ms: {exc}")
                continue
            residual = _residual(observations, result.coefficients, prior, memo)
            if best is None or residual < best[0]:
                best = (residual, result)
    if best is None:
        raise ValueError("; ".join(failures))
    # Then admit_s free, from the best of the grid: kept where it explains the data better.
    try:
        free = fit_at(observations, prior, best[1].coefficients, memo)
    except ValueError:
        return best[1]
    return free if _residual(observations, free.coefficients, prior, memo) < best[0] else best[1]


def fit_at(observations: Sequence[Observation], prior: float = PRIOR_WEIGHT, start: Coefficients = START,
           memo: _Memo | None = None, admit_s: float | None = None) -> Fit:
    """Replay every observation with the current coefficients, fit the coefficients by exact
    non-negative least squares on the replayed features (linear for a fixed step composition), and
    repeat until no coefficient moves by more than TOLERANCE. The composition is discrete, so the
    iteration may instead return to an earlier iterate (a cycle of compositions, one request admitted a
    step earlier or later); then the fit is the cycle's member that explains the data best on its own
    replay, provided the cycle spans less than CYCLE_SPREAD of every coefficient. A wider cycle, or no
    convergence in UNDAMPED_ITERATIONS, switches to damped steps, which settle as described at
    SETTLE_SPREAD. Fails otherwise. With `admit_s`, that coefficient is held at it."""
    if not observations:
        raise ValueError("nothing to fit: no point with a measured TPOT, TTFT or window")
    coef = start
    seen: list[Coefficients] = []
    changes: list[float] = []
    damping = 1.0  # full steps until a cycle too wide to pick from, or UNDAMPED_ITERATIONS pass
    for iteration in range(1, MAX_ITERATIONS + 1):
        points = replay_all(observations, coef, memo)
        new = replace(fit_linear(observations, points, prior, admit_s), overlap=coef.overlap)
        change = _change(new, coef)
        changes.append(change)
        if change <= TOLERANCE:
            return Fit(new, iteration, tuple(changes))
        if damping == 1.0 and iteration > UNDAMPED_ITERATIONS:
            damping = 0.5
        elif damping < 1.0 and change >= changes[-2]:
            damping = max(damping / 2, MIN_DAMPING)  # not contracting: take shorter steps
        step = _toward(coef, new, damping)
        repeat = next((i for i, old in enumerate(seen) if _change(step, old) <= 1e-9), None)
        seen.append(coef)
        if repeat is not None and damping == 1.0:
            cycle = seen[repeat:]
            spread = max(_change(a, b) for a in cycle for b in cycle)
            if spread <= CYCLE_SPREAD:
                best = min(cycle, key=lambda c: _residual(observations, c, prior, memo))
                return Fit(best, iteration, tuple(changes), cycle=len(cycle), spread=spread)
            damping = 0.5
            step = _toward(coef, new, damping)
        coef = step
        recent = [*seen[-SETTLE_ITERATIONS + 1:], coef]
        stalled = len(changes) >= SETTLE_ITERATIONS and changes[-1] >= 0.8 * changes[-SETTLE_ITERATIONS]
        if damping <= MIN_DAMPING and stalled:
            spread = max(_change(a, b) for a in recent for b in recent)
            if spread <= SETTLE_SPREAD:  # shortest steps still jump between compositions: settled
                best = min(recent, key=lambda c: _residual(observations, c, prior, memo))
                return Fit(best, iteration, tuple(changes), cycle=len(recent), spread=spread)
    raise ValueError(f"fit did not converge in {len(changes)} iterations (last changes {changes[-3:]})")


def _toward(a: Coefficients, b: Coefficients, fraction: float) -> Coefficients:
    """The coefficients `fraction` of the way from `a` to `b` (a damped fixed-point step)."""
    if fraction >= 1.0:
        return b
    moved = [x + fraction * (y - x) for x, y in zip(a.as_terms(), b.as_terms(), strict=True)]
    return replace(a, **dict(zip(COEFFICIENT_NAMES, moved, strict=False)))


# Replays already made, by (model shape, load, engine, card, coefficients): a replay is a pure function of them.
_Memo = dict[tuple[int, Load, EngineShape, Card, Coefficients], PointTerms]


def replay_all(observations: Sequence[Observation], coef: Coefficients, memo: _Memo | None = None) -> list[PointTerms]:
    """`replay` of every observation; observations with the same inputs (repeats of one config) share one,
    and so do calls that pass the same `memo`."""
    done: _Memo = {} if memo is None else memo
    out = []
    for ob in observations:
        key = (id(ob.shape), ob.load, ob.engine, ob.card, coef)
        if key not in done:
            done[key] = replay(ob.shape, ob.load, ob.engine, ob.card, coef)
        out.append(done[key])
    return out


def _change(a: Coefficients, b: Coefficients) -> float:
    return max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a.as_terms(), b.as_terms(), strict=True))


def _residual(observations: Sequence[Observation], coef: Coefficients, prior: float, memo: _Memo | None = None) -> float:
    points = replay_all(observations, coef, memo)
    c = coef.as_terms()
    return sum((sum(a * b for a, b in zip(r, c, strict=True)) - y) ** 2
               for r, y in _rows(observations, points, prior))


def fit_linear(observations: Sequence[Observation], points: Sequence[PointTerms], prior: float = PRIOR_WEIGHT,
               admit_s: float | None = None) -> Coefficients:
    """Non-negative least squares on relative errors of TPOT, window, burst and TTFT for replayed
    points, with `mem` and `flop` pulled toward 1.0 by `prior`. Exact: every subset of coefficients
    held at zero is tried. With `admit_s`, that coefficient is held at it and the others fitted."""
    rows = _rows(observations, points, prior)
    if admit_s is not None:
        held = len(_ZERO) - 1  # admit_s is the last term
        rows = [(r[:held], y - r[held] * admit_s) for r, y in rows]  # type: ignore[misc]
    k = len(rows[0][0])
    gram = [[sum(r[i] * r[j] for r, _ in rows) for j in range(k)] for i in range(k)]
    moment = [sum(r[i] * y for r, y in rows) for i in range(k)]
    total = sum(y * y for _, y in rows)
    best: tuple[float, list[float]] | None = None
    for active in itertools.product((True, False), repeat=k):
        idx = [i for i in range(k) if active[i]]
        if not idx:
            continue
        x = _solve([[gram[i][j] for j in idx] for i in idx], [moment[i] for i in idx])
        if x is None or any(v < 0 for v in x):
            continue
        full = [0.0] * k
        for i, v in zip(idx, x, strict=True):
            full[i] = v
        # |A x - y|^2 from the normal equations' sums
        err = (sum(full[i] * gram[i][j] * full[j] for i in idx for j in idx)
               - 2 * sum(full[i] * moment[i] for i in idx) + total)
        if best is None or err < best[0] - 1e-12:
            best = (err, full)
    if best is None:
        raise ValueError("no non-negative fit exists")
    values = best[1] if admit_s is None else [*best[1], admit_s]
    return Coefficients(*values)  # overlap 1: the caller sets the one it replayed with


def _rows(
    observations: Sequence[Observation], points: Sequence[PointTerms], prior: float
) -> list[tuple[Terms, float]]:
    """The least-squares rows: weighted relative errors, then the pull of mem and flop to 1.0."""
    k = len(_ZERO)
    rows: list[tuple[Terms, float]] = []
    for ob, pt in zip(observations, points, strict=True):
        for name, features, measured in (
            ("tpot", pt.tpot, ob.tpot_s),
            ("window", pt.window, ob.window_s),
            ("burst", pt.burst, ob.burst_s),
            ("ttft", pt.ttft, ob.ttft_s),
        ):
            if measured is None or not measured > 0 or not any(features):
                continue
            w = FIT_WEIGHTS[name] / measured
            rows.append((tuple(f * w for f in scale(features, ob.card)), FIT_WEIGHTS[name]))  # type: ignore[arg-type]
    if not rows:
        raise ValueError("nothing to fit: no point with a measured TPOT, TTFT or window")
    prior = prior * math.sqrt(len(rows))
    for i in (2, 3):  # mem, flop
        rows.append((tuple(prior if j == i else 0.0 for j in range(k)), prior))  # type: ignore[arg-type]
    return rows


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """The normal equations a x = b (Gaussian elimination with pivoting, columns scaled); None if singular."""
    k = len(b)
    scales = [math.sqrt(a[i][i]) or 1.0 for i in range(k)]
    a = [[a[i][j] / (scales[i] * scales[j]) for j in range(k)] for i in range(k)]
    b = [b[i] / scales[i] for i in range(k)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for r in range(k):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
                b[r] -= factor * b[col]
    return [b[i] / a[i][i] / scales[i] for i in range(k)]


def coefficients_dict(coef: Coefficients) -> dict[str, float]:
    return dict(zip(COEFFICIENT_NAMES, astuple(coef), strict=True))


def decode_step_s(
    shape: ModelShape, engine: EngineShape, card: Card, coef: Coefficients, batch: int, context: float
) -> float:
    """One steady decode step of `batch` sequences, each `context` tokens deep (no prefill mixed in)."""
    if not batch >= 1:
        raise ValueError(f"batch must be at least 1, got {batch!r}")
    if not context >= 0:
        raise ValueError(f"context must be zero or more tokens, got {context!r}")
    work = step_work(shape, engine, [(1, int(round(context)), True)] * int(batch))
    return _dot(scale(overlap_terms(work, card, coef), card), coef)


def decode_tokens_per_s(
    shape: ModelShape, engine: EngineShape, card: Card, coef: Coefficients, batch: int, context: float
) -> float:
    """Output tokens per second of a steady decode batch: batch / decode_step_s."""
    return batch / decode_step_s(shape, engine, card, coef, batch, context)
