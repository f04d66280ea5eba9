"""Service-level objectives (`[slo]`) and the capacity search of `[load] search`: what a request must meet to
count toward goodput, and the load bracket a capacity search probes. Schema only; the search's choice of the
next probe is `compiler.capacity`, the per-request test is `runner.checks.stats.meets_slo`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_PROBES = 12


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Slo(_Strict):
    """Per-request objectives, as `vllm bench serve --goodput ttft:MS tpot:MS e2el:MS` reads them: a completed
    request meets one when its own value is at most the limit (a failed request meets none)."""

    ttft_ms: float | None = Field(default=None, gt=0, description="Time to first token, ms (bench's `ttft`).")
    itl_ms: float | None = Field(
        default=None, gt=0,
        description="Every gap between two of the request's streamed chunks, ms (bench's --goodput has no ITL key).",
    )
    tpot_ms: float | None = Field(
        default=None, gt=0,
        description="(end - first token) / (output tokens - 1), ms; 0 for a one-token reply (bench's `tpot`).",
    )
    e2el_ms: float | None = Field(default=None, gt=0, description="End-to-end latency, ms (bench's `e2el`).")
    attainment: float = Field(
        default=0.95, gt=0, le=1,
        description="A load level holds when at least this share of its measured requests meet every objective.",
    )

    @model_validator(mode="after")
    def _some_objective(self) -> Slo:
        if not self.limits_s():
            raise ValueError("give at least one objective: ttft_ms, itl_ms, tpot_ms or e2el_ms")
        return self

    def limits_s(self) -> dict[str, float]:
        """Objective -> limit in seconds, for those given (`ttft`, `itl`, `tpot`, `e2el`)."""
        given = {"ttft": self.ttft_ms, "itl": self.itl_ms, "tpot": self.tpot_ms, "e2el": self.e2el_ms}
        return {k: v / 1000.0 for k, v in given.items() if v is not None}

    def bench_goodput(self) -> str:
        """The equivalent `vllm bench serve --goodput` value (ITL has none: left out)."""
        given = (("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("e2el", self.e2el_ms))
        return " ".join(f"{k}:{v:g}" for k, v in given if v is not None)


PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class Search(_Strict):
    """A capacity search instead of a ladder: per launch of each arm, the highest load that holds the SLO."""

    concurrency: tuple[PositiveInt, PositiveInt] | None = Field(
        default=None, description="[lo, hi] closed-loop concurrency (integers) to search between."
    )
    rate: tuple[PositiveFloat, PositiveFloat] | None = Field(
        default=None, description="[lo, hi] open-loop arrival rate (requests/s) to search between."
    )
    probes: int = Field(
        default=6, ge=2, le=MAX_PROBES, strict=True,
        description="Most probe points per search: hi first, then lo, then bisection of the bracket.",
    )
    waves: int | None = Field(
        default=None, ge=2, le=100, strict=True,
        description="Concurrency search only: every probe sends this many waves of its own concurrency "
        "(waves x level requests; multi-turn, waves x level conversations) instead of a fixed load.requests.",
    )

    @model_validator(mode="after")
    def _one_bracket(self) -> Search:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of `concurrency = [lo, hi]` or `rate = [lo, hi]`")
        if self.lo >= self.hi:
            raise ValueError(f"the bracket's low end ({self.lo:g}) must be below its high end ({self.hi:g})")
        if self.waves is not None and self.rate is not None:
            raise ValueError("`waves` sizes a probe by its concurrency: an open-loop `rate` search has no waves; "
                             "give load.requests instead")
        return self

    @property
    def over(self) -> Literal["concurrency", "rate"]:
        return "concurrency" if self.concurrency is not None else "rate"

    @property
    def lo(self) -> float:
        return float((self.concurrency or self.rate or (0, 0))[0])

    @property
    def hi(self) -> float:
        return float((self.concurrency or self.rate or (0, 0))[1])
