"""The cost of one engine step: its byte and FLOP terms, and the coefficients and card that price them.

Pure. One engine step costs
    step_s + seq_s * sequences + join(weight bytes, matmul FLOPs) + join(KV bytes, attention FLOPs)
with join(bytes, flops) the p-norm of mem * bytes / bandwidth and flop * flops / flop_rate (see
`overlap_terms`): the matmuls stream the weights (routed experts by their expected union over the
step's tokens) and compute 2 FLOPs per parameter and token; the attention kernel, which runs after
them, streams the KV cache its sequences read and computes attention. Bytes and FLOPs come from
`compiler.modelmath`, against the card's calibrated bandwidth and FLOP/s. Two
front-end terms sit outside the steps: `admit_s`, the work the API server does per request before the
engine sees it, one request at a time (a queue: a burst of N requests reaches the engine over
N * admit_s), and `request_s`, a token's trip from the engine to the client (`compiler.stepreplay`
replays them; `compiler.stepfit` fits the coefficients).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields

from compiler.modelmath import ModelShape

# vLLM's defaults for `vllm serve` on a datacenter GPU (its log: "Chunked prefill is enabled with
# max_num_batched_tokens=8192"); a server's argv overrides them.
DEFAULT_BUDGET_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 256

# Features of one step, one request or one point, in the order of `Coefficients`' fields.
Terms = tuple[float, float, float, float, float, float]
ZERO_TERMS: Terms = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Coefficients:
    """Fitted constants of one (gpu, vLLM version, model family, engine options) key.

    step_s: fixed cost of every engine step (scheduling, launches; large when eager).
    seq_s: cost per sequence in a step (sampling, bookkeeping, per-sequence kernels).
    mem: time per byte streamed, in units of 1 / calibrated bandwidth (1.0 = at the peak).
    flop: time per FLOP, in units of 1 / calibrated FLOP/s (1.0 = at the peak).
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
class Card:
    """The card's calibrated peak bandwidth and FLOP/s, which the terms are measured against."""

    bandwidth_Bps: float
    flops_per_s: float

    def __post_init__(self) -> None:
        for name in ("bandwidth_Bps", "flops_per_s"):
            value = getattr(self, name)
            if value is None or not value > 0:
                raise ValueError(f"card {name} must be positive, got {value!r}")


@dataclass(frozen=True)
class EngineShape:
    """The scheduler settings that shape the steps (from a launch's typed engine settings)."""

    budget_tokens: int = DEFAULT_BUDGET_TOKENS
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    dtype: str = "bf16"
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    prefix_caching: bool = True
    chunked_prefill: bool = True  # off: a prompt is scheduled only whole, when it fits the step's budget
    # on: step k + 1 is scheduled when step k starts (vLLM's default on GPUs: the runs' server logs say
    # "Asynchronous scheduling is enabled"), so a request the engine receives mid-step waits one step more
    async_scheduling: bool = True


class StepCosts:
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
    costs: StepCosts | None = None,
) -> Work:
    """What one step streams and computes, by kernel. `chunks`: (new tokens, tokens already in the KV
    cache, samples a token) for each scheduled sequence. `costs`: the engine's constants, when the
    caller has them."""
    if not chunks:
        return ZERO_TERMS
    tokens = sampled = read = 0
    positions = 0.0  # sum over new tokens of the positions each attends to
    for n, context, samples in chunks:
        tokens += n
        sampled += samples
        read += context + n
        positions += n * (context + (n + 1) / 2)
    if tokens < 1:
        raise ValueError("a step schedules at least one token")
    return work_from_sums(costs or StepCosts(shape, engine), len(chunks), tokens, sampled, read, positions)


def work_from_sums(c: StepCosts, seqs: int, tokens: int, sampled: int, read: int, positions: float) -> Work:
    """A step's work from its sums: sequences scheduled, new tokens, tokens sampled, KV tokens read and
    attended positions (`step_work` sums them per chunk; the replay keeps them for its decoding batch)."""
    matmul = 2.0 * c.body * tokens + 2.0 * c.lm_head * sampled
    return (1.0, float(seqs), c.weights(tokens), matmul, read * c.kv, c.per_position * positions)


def joined_features(nbytes: float, flops: float, card: Card, coef: Coefficients) -> tuple[float, float]:
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
    weights, matmul = joined_features(work[2], work[3], card, coef)
    kv, attention = joined_features(work[4], work[5], card, coef)
    return (work[0], work[1], weights + kv, matmul + attention, 0.0, 0.0)


def add_terms(a: Terms, b: Terms, k: float = 1.0) -> Terms:
    if k == 1.0:
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4], a[5] + b[5])
    return tuple(x + k * y for x, y in zip(a, b, strict=True))  # type: ignore[return-value]


def scale(terms: Terms, card: Card) -> Terms:
    """Features in seconds per unit coefficient: bytes over bandwidth, FLOPs over FLOP/s."""
    return (terms[0], terms[1], terms[2] / card.bandwidth_Bps, terms[3] / card.flops_per_s, terms[4], terms[5])


def dot(terms: Terms, coef: Coefficients) -> float:
    return sum(t * c for t, c in zip(terms, coef.as_terms(), strict=True))


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
    return dot(scale(overlap_terms(work, card, coef), card), coef)
