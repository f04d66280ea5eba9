"""A calibrated step-time model of a vLLM server: measured terms, few coefficients, point predictions.

Pure. One engine step costs
    step_s + seq_s * sequences + mem * bytes / bandwidth + flop * flops / flop_rate
where bytes are the weights the step streams (routed experts by their expected union over the step's
tokens) plus the KV cache its sequences read, and flops are 2 per matmul parameter per token plus
attention, both from `compiler.modelmath`, against the card's calibrated bandwidth and FLOP/s. A
request adds `request_s` before its first token (HTTP, tokenizing, admission). A point of a plan is
predicted by replaying its closed loop through vLLM's scheduler (token budget, chunked prefill,
prefix-cache hits) step by step. The replay's step composition does not depend on the coefficients,
so every predicted TPOT, TTFT and window is a linear function of them, and `fit` is a small
non-negative least squares.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields

from compiler.modelmath import ModelShape

# vLLM's defaults for `vllm serve` on a datacenter GPU (its log: "Chunked prefill is enabled with
# max_num_batched_tokens=8192"); a server's argv overrides them.
DEFAULT_BUDGET_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 256
BLOCK_TOKENS = 16  # prefix-cache hits come in whole KV blocks

# Features of one step, one request or one point, in the order of `Coefficients`' fields.
Terms = tuple[float, float, float, float, float]
_ZERO: Terms = (0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Coefficients:
    """Fitted constants of one (gpu, vLLM version, model family, engine options) key.

    step_s: fixed cost of every engine step (scheduling, launches; large when eager).
    seq_s: cost per sequence in a step (sampling, bookkeeping, per-sequence kernels).
    mem: time per byte streamed, in units of 1 / calibrated bandwidth (1.0 = at the ceiling).
    flop: time per FLOP, in units of 1 / calibrated FLOP/s (1.0 = at the ceiling).
    request_s: per-request latency before the first token that no step accounts for.
    """

    step_s: float
    seq_s: float
    mem: float
    flop: float
    request_s: float

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"coefficient {f.name} must be a finite number >= 0, got {value!r}")

    def as_terms(self) -> Terms:
        return (self.step_s, self.seq_s, self.mem, self.flop, self.request_s)


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

    @classmethod
    def from_argv(cls, argv: Sequence[str], kv_cache_dtype: str = "auto") -> EngineShape:
        def value(flag: str) -> str | None:
            for i, arg in enumerate(argv):
                if arg == flag and i + 1 < len(argv):
                    return argv[i + 1]
                if arg.startswith(flag + "="):
                    return arg.split("=", 1)[1]
            return None

        budget = value("--max-num-batched-tokens")
        seqs = value("--max-num-seqs")
        dtype = value("--dtype")
        return cls(
            budget_tokens=int(budget) if budget else DEFAULT_BUDGET_TOKENS,
            max_num_seqs=int(seqs) if seqs else DEFAULT_MAX_NUM_SEQS,
            dtype="bf16" if dtype in (None, "auto") else str(dtype),
            kv_cache_dtype=kv_cache_dtype,
            enforce_eager="--enforce-eager" in argv,
            prefix_caching="--no-enable-prefix-caching" not in argv,
        )


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
    """A replayed point: the features of its mean TPOT, mean TTFT and measured window."""

    tpot: Terms
    ttft: Terms
    window: Terms
    output_tokens: int
    steps: int


@dataclass(frozen=True)
class Prediction:
    tpot_s: float | None  # None when every request has a single output token
    ttft_s: float
    output_throughput: float
    window_s: float


def step_terms(
    shape: ModelShape,
    engine: EngineShape,
    chunks: Sequence[tuple[int, int, bool]],
) -> Terms:
    """Features of one step. `chunks`: (new tokens, tokens already in the KV cache, samples a token)
    for each scheduled sequence. The time of the step is `dot(terms, coefficients)` with the byte and
    FLOP features divided by the card's ceilings (see `scale`)."""
    if not chunks:
        return _ZERO
    tokens = sum(n for n, _, _ in chunks)
    if tokens < 1:
        raise ValueError("a step schedules at least one token")
    sampled = sum(1 for _, _, s in chunks if s)
    kv_per_token = shape.kv_bytes_per_token(engine.kv_cache_dtype)
    kv_read = sum(context + n for n, context, _ in chunks) * kv_per_token
    weights = shape.decode_weight_bytes(tokens, engine.dtype)
    lm_head = shape.embedding_params  # vocab x hidden, applied only to sampled positions
    body = shape.active_params - lm_head
    attention = sum(n * shape.attention_flops_per_token(context + (n + 1) / 2) for n, context, _ in chunks)
    flops = 2.0 * body * tokens + 2.0 * lm_head * sampled + attention
    return (1.0, float(len(chunks)), weights + kv_read, flops, 0.0)


def _add(a: Terms, b: Terms, k: float = 1.0) -> Terms:
    return (a[0] + k * b[0], a[1] + k * b[1], a[2] + k * b[2], a[3] + k * b[3], a[4] + k * b[4])


@dataclass
class _Request:
    index: int
    prompt: int  # tokens to compute (input minus cache hits)
    cached: int
    arrival: int  # step it is first schedulable in
    computed: int = 0
    generated: int = 0
    first: int = -1
    end: int = -1


def replay(shape: ModelShape, load: Load, engine: EngineShape) -> PointTerms:
    """Run the point's closed loop through vLLM's scheduler, step by step: running sequences first
    (one decode token, or the next prefill chunk), then waiting requests in arrival order, within
    the token budget. A finished request's slot sends the next one, schedulable the next step."""
    hits = [min(load.cached(i), cache_hit_tokens(load.input_len)) if engine.prefix_caching else 0
            for i in range(load.requests)]
    sent = min(load.concurrency, load.requests)
    waiting = [_Request(i, load.input_len - hits[i], hits[i], 0) for i in range(sent)]
    running: list[_Request] = []
    done: list[_Request] = []
    steps: list[Terms] = []
    gaps = 1  # the first requests arrive at an idle engine
    step = 0
    while waiting or running:
        budget = engine.budget_tokens
        chunks: list[tuple[int, int, bool]] = []
        scheduled: list[tuple[_Request, int]] = []
        for r in running:
            if budget <= 0:
                break
            left = r.prompt - r.computed
            n = min(left, budget) if left > 0 else 1
            scheduled.append((r, n))
            budget -= n
        while waiting and budget > 0 and len(running) < engine.max_num_seqs and waiting[0].arrival <= step:
            r = waiting.pop(0)
            running.append(r)
            n = min(r.prompt, budget)
            scheduled.append((r, n))
            budget -= n
        for r, n in scheduled:
            left = r.prompt - r.computed
            context = r.cached + r.computed + (r.generated if left <= 0 else 0)
            chunks.append((n, context, left <= 0 or n >= left))
        steps.append(step_terms(shape, engine, chunks))
        finished: list[_Request] = []
        for r, n in scheduled:
            if r.computed < r.prompt:
                r.computed += n
                if r.computed >= r.prompt:
                    r.generated, r.first = 1, step
            else:
                r.generated += 1
            if r.generated >= load.output_len:
                r.end = step
                finished.append(r)
        for r in finished:
            running.remove(r)
            done.append(r)
            if sent < load.requests:
                waiting.append(_Request(sent, load.input_len - hits[sent], hits[sent], step + 1))
                sent += 1
        step += 1
        if not running and waiting:
            gaps += 1  # the engine waits for the next request to arrive
    prefix: list[Terms] = [_ZERO]
    for s in steps:
        prefix.append(_add(prefix[-1], s))
    n = len(done)
    tpot, ttft = _ZERO, _ZERO
    multi = [r for r in done if load.output_len > 1]
    for r in done:
        ttft = _add(ttft, _add(_add(prefix[r.first + 1], prefix[r.arrival], -1.0), (0, 0, 0, 0, 1.0)), 1.0 / n)
    for r in multi:
        span = _add(prefix[r.end + 1], prefix[r.first + 1], -1.0)
        tpot = _add(tpot, span, 1.0 / ((load.output_len - 1) * len(multi)))
    window = _add(prefix[-1], (0, 0, 0, 0, float(gaps)))
    return PointTerms(tpot=tpot, ttft=ttft, window=window, output_tokens=n * load.output_len, steps=len(steps))


def scale(terms: Terms, card: Card) -> Terms:
    """Features in seconds per unit coefficient: bytes over bandwidth, FLOPs over FLOP/s."""
    return (terms[0], terms[1], terms[2] / card.bandwidth_Bps, terms[3] / card.flops_per_s, terms[4])


def _dot(terms: Terms, coef: Coefficients) -> float:
    return sum(t * c for t, c in zip(terms, coef.as_terms(), strict=True))


def predict(point: PointTerms, card: Card, coef: Coefficients) -> Prediction:
    """TPOT, TTFT and output throughput of a replayed point for fitted coefficients."""
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
    """One measured point with its replayed terms: the fit's unit of data."""

    terms: PointTerms
    card: Card
    tpot_s: float | None
    ttft_s: float | None
    window_s: float | None


# Relative weights of the three measured quantities, and the pull of `mem` and `flop` toward 1.0
# (the calibrated ceilings) so that a few studies that cannot separate them still fit physically.
FIT_WEIGHTS = {"tpot": 1.0, "window": 1.0, "ttft": 0.3}
PRIOR_WEIGHT = 0.05


def fit(observations: Sequence[Observation], prior: float = PRIOR_WEIGHT) -> Coefficients:
    """Non-negative least squares on relative errors of TPOT, window and TTFT, all linear in the
    coefficients, with `mem` and `flop` pulled toward 1.0 by `prior`. Exact: every subset of
    coefficients held at zero is tried (five coefficients)."""
    rows: list[tuple[Terms, float]] = []
    for ob in observations:
        for name, features, measured in (
            ("tpot", ob.terms.tpot, ob.tpot_s),
            ("window", ob.terms.window, ob.window_s),
            ("ttft", ob.terms.ttft, ob.ttft_s),
        ):
            if measured is None or not measured > 0 or not any(features):
                continue
            w = FIT_WEIGHTS[name] / measured
            f = scale(features, ob.card)
            rows.append(((f[0] * w, f[1] * w, f[2] * w, f[3] * w, f[4] * w), FIT_WEIGHTS[name]))
    if not rows:
        raise ValueError("nothing to fit: no point with a measured TPOT, TTFT or window")
    n_obs = len(rows)
    prior = prior * math.sqrt(n_obs)
    rows.append(((0.0, 0.0, prior, 0.0, 0.0), prior))
    rows.append(((0.0, 0.0, 0.0, prior, 0.0), prior))
    best: tuple[float, list[float]] | None = None
    for active in itertools.product((True, False), repeat=5):
        idx = [i for i in range(5) if active[i]]
        if not idx:
            continue
        x = _solve(rows, idx)
        if x is None or any(v < 0 for v in x):
            continue
        full = [0.0] * 5
        for i, v in zip(idx, x, strict=True):
            full[i] = v
        err = sum((sum(a * b for a, b in zip(r, full, strict=True)) - y) ** 2 for r, y in rows)
        if best is None or err < best[0] - 1e-15:
            best = (err, full)
    if best is None:
        raise ValueError("no non-negative fit exists")
    return Coefficients(*best[1])


def _solve(rows: Sequence[tuple[Terms, float]], idx: Sequence[int]) -> list[float] | None:
    """Least squares on the columns `idx` through the normal equations (Gaussian elimination)."""
    k = len(idx)
    a = [[sum(r[i] * r[j] for r, _ in rows) for j in idx] for i in idx]
    b = [sum(r[i] * y for r, y in rows) for i in idx]
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
    terms = step_terms(shape, engine, [(1, int(round(context)), True)] * int(batch))
    return _dot(scale(terms, card), coef)


def decode_tokens_per_s(
    shape: ModelShape, engine: EngineShape, card: Card, coef: Coefficients, batch: int, context: float
) -> float:
    """Output tokens per second of a steady decode batch: batch / decode_step_s."""
    return batch / decode_step_s(shape, engine, card, coef, batch, context)
