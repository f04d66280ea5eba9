"""A study's workloads: request lengths (fixed or drawn from a distribution), shared structure (a system
prompt, few-shot templates, multi-turn conversations) or a replayed trace; and `Shape`, what a plan point
carries of them (None for the classic fixed-length workload, whose fingerprints stay as they were).

Schema only: `compiler.workload_check` reads the files a workload names and checks lengths against the
model; `runner.load.shapes` turns a shape into token-exact, seeded requests.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Uniform(_Strict):
    dist: Literal["uniform"] = Field(description="Every length in [min, max] equally likely.")
    min: int = Field(ge=1, description="Shortest length (tokens).")
    max: int = Field(ge=1, description="Longest length (tokens).")

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) exceeds max ({self.max})")
        return self


class _Bounded(_Strict):
    min: int | None = Field(default=None, ge=1, description="Draws below are clipped up to this (default 1).")
    max: int | None = Field(default=None, ge=1, description="Draws above are clipped down to this.")

    @model_validator(mode="after")
    def _ordered(self) -> _Bounded:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) exceeds max ({self.max})")
        return self


class Normal(_Bounded):
    dist: Literal["normal"] = Field(description="Normal lengths, rounded, clipped to [min, max].")
    mean: float = Field(gt=0, description="Mean length (tokens).")
    sd: float = Field(ge=0, description="Standard deviation (tokens).")


class LogNormal(_Bounded):
    dist: Literal["lognormal"] = Field(description="Log-normal lengths, rounded, clipped to [min, max].")
    mean: float = Field(gt=0, description="Mean of the lengths themselves (tokens), not of their log.")
    sd: float = Field(gt=0, description="Standard deviation of the lengths themselves (tokens).")

    @property
    def log_params(self) -> tuple[float, float]:
        """(mu, sigma) of the underlying normal whose exp has this mean and sd."""
        sigma2 = math.log1p((self.sd / self.mean) ** 2)
        return math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2)


class Histogram(_Strict):
    dist: Literal["histogram"] = Field(description="Lengths drawn with the given weights.")
    file: str | None = Field(default=None, description="CSV with columns length,weight, relative to the study file.")
    values: tuple[int, ...] | None = Field(default=None, description="Lengths (inline; instead of `file`).")
    weights: tuple[float, ...] | None = Field(default=None, description="Their weights (inline), one per value.")

    @model_validator(mode="after")
    def _one_source(self) -> Histogram:
        if (self.file is None) == (self.values is None):
            raise ValueError("give `file` (a length,weight CSV) or inline `values` and `weights`")
        if self.values is not None:
            if self.weights is None or len(self.weights) != len(self.values):
                raise ValueError("`weights` needs one weight per entry of `values`")
            if any(v < 1 for v in self.values) or any(not w >= 0 for w in self.weights):
                raise ValueError("values should be >= 1 and weights >= 0")
            if sum(self.weights) <= 0:
                raise ValueError("at least one weight must be positive")
        elif self.weights is not None:
            raise ValueError("`weights` goes with inline `values`, not with `file`")
        return self


Distribution = Annotated[Uniform | Normal | LogNormal | Histogram, Field(discriminator="dist")]
Length = int | Distribution


def length_mean(length: Length) -> float:
    """The distribution's mean before clipping (the histogram's weighted mean)."""
    if isinstance(length, int):
        return float(length)
    if isinstance(length, Uniform):
        return (length.min + length.max) / 2
    if isinstance(length, Histogram):
        values, weights = length.values or (), length.weights or ()
        return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)
    return length.mean


def length_text(length: Length | None) -> str:
    """A length as the study page shows it: `128`, `uniform 64-256`, `normal 300 sd 50`, `histogram (4 lengths)`."""
    if length is None:
        return "from the trace"
    if isinstance(length, int):
        return f"{length:,}"
    if isinstance(length, Uniform):
        return f"uniform {length.min:,}-{length.max:,}"
    if isinstance(length, Histogram):
        return f"histogram ({len(length.values)} lengths)" if length.values else f"histogram ({length.file})"
    return f"{length.dist} {length.mean:g} sd {length.sd:g}"


def length_floor(length: Length) -> int:
    """The shortest length a draw can have."""
    if isinstance(length, int):
        return length
    if isinstance(length, Histogram):
        return min(v for v, w in zip(length.values or (), length.weights or (), strict=True) if w > 0)
    return length.min or 1


class Workload(_Strict):
    input_len: Length | None = Field(
        default=None,
        description="Prompt tokens per request (exact: token-id prompts): a number or a distribution table "
        "{ dist = \"uniform\" | \"normal\" | \"lognormal\" | \"histogram\", ... }. Not with `trace`.",
    )
    output_len: Length | None = Field(
        default=None,
        description="Output tokens per request (exact: ignore_eos + max_tokens): a number or a distribution. "
        "Not with `trace`.",
    )
    prefix_len: int = Field(
        default=0, ge=0, description="Leading prompt tokens shared by every request: a system prompt."
    )
    templates: int | None = Field(
        default=None, ge=1, le=100_000, strict=True,
        description="K few-shot templates: each request's first prefix_len tokens are one of K seeded prefixes, "
        "chosen in turn (needs prefix_len).",
    )
    turns: int = Field(
        default=1, ge=1, le=1000, strict=True,
        description="Turns per conversation: turn k's prompt is turn k-1's prompt, then output_len synthetic "
        "(seeded, not the model's) assistant tokens, then a new user message of input_len tokens.",
    )
    think_s: float = Field(default=0.0, ge=0, description="Seconds between a turn's end and the next turn's send.")
    trace: str | None = Field(
        default=None,
        description="A Mooncake-format trace (JSON lines: timestamp ms, input_length, output_length, hash_ids "
        "of 512-token blocks) to replay, relative to the study file.",
    )
    seed: int = Field(default=0, ge=0, description="Seed of the token-id prompts and of the drawn lengths.")

    @model_validator(mode="after")
    def _consistent(self) -> Workload:
        if self.trace is not None:
            given = [k for k in ("input_len", "output_len") if getattr(self, k) is not None]
            given += [k for k in ("prefix_len", "templates") if getattr(self, k)]
            given += ["turns"] if self.turns > 1 else []
            if given:
                raise ValueError(f"a trace gives its own lengths and shared blocks: drop {', '.join(given)}")
            return self
        if self.input_len is None or self.output_len is None:
            raise ValueError("give `input_len` and `output_len` (numbers or distributions), or a `trace`")
        if self.templates is not None and self.prefix_len == 0:
            raise ValueError("`templates` needs a prefix_len: the templates are the first prefix_len tokens")
        if self.think_s > 0 and self.turns == 1:
            raise ValueError("`think_s` is the pause between turns: it needs turns > 1")
        if isinstance(self.input_len, int):
            if self.prefix_len > self.input_len:
                raise ValueError(f"prefix_len ({self.prefix_len}) exceeds input_len ({self.input_len})")
        elif self.prefix_len and explicit_floor(self.input_len) and self.prefix_len >= length_floor(self.input_len):
            raise ValueError(f"prefix_len ({self.prefix_len}) must be below the shortest input_len "
                             f"({length_floor(self.input_len)}): every prompt has a part of its own")
        return self

    @property
    def mean_lengths(self) -> tuple[float, float] | None:
        """(mean prompt, mean output) of one request before clipping; None for a trace (read from its file)."""
        if self.input_len is None or self.output_len is None:
            return None
        inp, out, t = length_mean(self.input_len), length_mean(self.output_len), self.turns
        # A conversation's prompts grow turn by turn: turn k holds k+1 user messages and k assistant replies.
        return inp * (t + 1) / 2 + out * (t - 1) / 2, out

    @property
    def classic(self) -> bool:
        """Fixed lengths, one shared prefix at most, single turns, no trace: today's workload."""
        return (isinstance(self.input_len, int) and isinstance(self.output_len, int) and self.templates is None
                and self.turns == 1 and self.trace is None)


def explicit_floor(length: Length) -> bool:
    """Whether the file states the shortest length (a histogram read from a file is checked once read)."""
    if isinstance(length, int | Uniform):
        return True
    if isinstance(length, Histogram):
        return length.values is not None
    return length.min is not None


class TraceRef(_Strict):
    """A replayed trace as the plan holds it: where it is, its sha256 (the runner refuses a changed file)."""

    path: str = Field(description="Absolute path of the trace file (not in the fingerprint; the sha256 is).")
    sha256: str = Field(description="sha256 of the file's bytes when the plan was compiled.")
    rows: int = Field(description="Rows in the trace; a point with more requests cycles through them.")


class Shape(_Strict):
    """What a point sends beyond the classic fixed lengths. Histogram files are inlined here; a trace is
    referenced by path and hash. `max_len` is the arm's max_model_len where known: lengths are clipped to it."""

    input: Length | None = Field(default=None, description="Prompt length (None: from the trace).")
    output: Length | None = Field(default=None, description="Output length (None: from the trace).")
    templates: int = Field(default=1, description="Distinct shared prefixes, used in turn.")
    turns: int = Field(default=1, description="Turns per conversation.")
    think_s: float = Field(default=0.0, description="Pause between a turn's end and the next send.")
    trace: TraceRef | None = Field(default=None, description="The replayed trace, if any.")
    trace_arrivals: bool = Field(default=False, description="Arrivals from the trace's timestamps, rescaled.")
    max_len: int | None = Field(default=None, description="max_model_len of the arm, where known.")
    block_tokens: int = Field(default=16, description="The server's KV block size (expected prefix hits).")

    def fingerprint_payload(self) -> dict[str, object]:
        """The shape as it enters a point's fingerprint: the trace by content, not by where it lies."""
        return self.model_dump(mode="json", exclude={"trace": {"path"}})
