"""The study file's schema: pydantic models, every field described, unknown keys refused.

`load.py` turns a TOML file into a `Study`; `plan.py` compiles a `Study` into a `Plan`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from compiler.slo import Search, Slo
from compiler.workload import Workload

SLUG = r"^[a-z0-9][a-z0-9_-]*$"
RESERVED_ARM_KEYS = ("description", "env", "cache", "warmup", "replicas", "balance", "launches", "model",
                     "expect_log")
# Launches per arm and repeats per launch. On an H200 two launches of one configuration differed by
# 0.6% while repeats on one launch spread ~0.1%: launches carry the variance, repeats barely shrink it.
# A paired ratio over n blocks then has a 95% half-width of about t(n-1) * 0.65% / sqrt(n):
# 1.6% at n = 3 (t = 4.30), 0.8% at n = 5 (t = 2.78); only the latter leaves room to decide a +-2% band.
DEFAULT_LAUNCHES = 5
DEFAULT_REPEATS = 2


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StudyMeta(Strict):
    id: str = Field(pattern=SLUG, description="Stable slug of the study; prefixes every step id.")
    title: str = Field(description="One-line title, shown on the site.")
    question: str = Field(description="The question the study answers.")
    hardware: str = Field(
        default="h200",
        description="Hardware table entry whose spec sheet the predictions are also scored against "
        "(h100-sxm, h200, a100-80gb, l40s, b200, cpu).",
    )
    source: str = Field(default="", description="Where the claims come from (a seed study, a post, an issue).")
    notes: str = Field(default="", description="Free text shown on the study page.")


class ModelSpec(Strict):
    path: str | None = Field(
        default=None,
        description="Local model folder holding config.json (and a tokenizer), relative to the study file.",
    )
    name: str | None = Field(
        default=None, description="Hub id or served name; served as --served-model-name when path is set."
    )
    load_format: str = Field(
        default="dummy", description="vLLM --load-format; `dummy` = random weights, same shapes, same speed."
    )
    dtype: str = Field(default="auto", description="vLLM --dtype of weights and activations.")
    tokenizer: str | None = Field(
        default=None, description="Tokenizer folder relative to the study file; default: the model folder."
    )

    @model_validator(mode="after")
    def _path_or_name(self) -> ModelSpec:
        if self.path is None and self.name is None:
            raise ValueError("give `path` (a local folder with config.json) or `name`")
        return self


class Arm(Strict):
    """One server configuration: the knob under study, as `vllm serve` options on top of [engine]."""

    description: str = Field(default="", description="What this arm changes, in words.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for this arm's server.")
    cache: Literal["reset", "keep"] | None = Field(
        default=None, description="Overrides load.cache for this arm (to study warm-cache effects)."
    )
    warmup: int | None = Field(
        default=None, ge=0, strict=True,
        description="Overrides load.warmup for this arm's points: warmup requests before each point (0: the "
        "first measured requests are the server's first, to study an under-warmed server).",
    )
    replicas: int = Field(
        default=1, ge=1, le=64, strict=True,
        description="Independent servers per launch of this arm, behind the client's balancer; each needs "
        "tensor_parallel_size x pipeline_parallel_size x data_parallel_size GPUs.",
    )
    balance: Literal["least_outstanding", "round_robin"] = Field(
        default="least_outstanding",
        description="How the client spreads requests over replicas: to the one with the fewest requests in "
        "flight (ties to the lowest index), or in turn.",
    )
    launches: int | None = Field(
        default=None, ge=1, le=100, strict=True,
        description="Server instances of this arm (overrides load.launches; refused with design.budget).",
    )
    model: str | None = Field(default=None, description="Another model folder for this arm (relative path).")
    expect_log: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="Text each of this arm's servers must have logged by the time it is ready (a backend's "
        "'Using ...' line, a feature's warning): a server whose log lacks one fails its launch, naming it, "
        "and nothing is measured on it.",
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="`vllm serve` options of this arm, named like the CLI options."
    )

    @model_validator(mode="before")
    @classmethod
    def _split_args(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        args = dict(data.pop("args", {}) or {})
        for key in list(data):
            if key not in RESERVED_ARM_KEYS:
                args[key] = data.pop(key)
        data["args"] = args
        return data


PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


@dataclass(frozen=True)
class Rung:
    """One rung of the load ladder: a closed-loop `concurrency` or an open-loop `rate_rps`, the other None."""

    concurrency: int | None = None
    rate_rps: float | None = None

    @property
    def label(self) -> str:
        """The rung's number as selectors and pages print it: `4`, `2.5`."""
        return f"{self.concurrency:g}" if self.concurrency is not None else f"{self.rate_rps:g}"

    @property
    def id_label(self) -> str:
        """The rung's part of a point id: `c4`, `rate2.5`."""
        return f"c{self.concurrency}" if self.concurrency is not None else f"rate{self.rate_rps:g}"


class Load(Strict):
    concurrency: list[PositiveInt] | None = Field(
        default=None, description="Closed-loop ladder: requests in flight at once, one point per level."
    )
    rate: list[PositiveFloat] | None = Field(
        default=None, description="Open-loop ladder: request arrival rates in requests/s."
    )
    search: Search | None = Field(
        default=None,
        description="Capacity search instead of a ladder: per launch and workload, the highest load whose "
        "SLO attainment holds [slo].attainment (needs [slo]; runs once per launch, load.repeats aside).",
    )
    arrival: Literal["poisson", "gamma", "constant", "trace"] = Field(
        default="poisson",
        description="Open-loop arrival process: poisson, gamma (shape `burstiness`), constant (equal gaps), or "
        "`trace`: the timestamps of each workload's trace, rescaled so their mean rate is the rung's rate.",
    )
    burstiness: float = Field(default=1.0, gt=0, description="Gamma shape (1.0 = Poisson).")
    requests: PositiveInt | list[PositiveInt] = Field(
        default=64, description="Measured requests per point: one number, or one per ladder level."
    )
    warmup: int = Field(default=8, ge=0, description="Warmup requests before each point (no shared prefix).")
    launches: int = Field(
        default=DEFAULT_LAUNCHES, ge=1, le=100, strict=True,
        description="Server instances per arm: the level intervals are computed at. Arms are interleaved "
        "across launches in randomised blocks (block b holds launch b of every arm).",
    )
    repeats: int = Field(
        default=DEFAULT_REPEATS, ge=1, le=100, strict=True,
        description="Repeats of every point inside one launch, interleaved.",
    )
    cache: Literal["reset", "keep"] = Field(
        default="reset", description="`reset`: flush + verify the prefix cache before every point; `keep`: don't."
    )
    server: Literal["per-arm", "per-point"] = Field(
        default="per-arm", description="One server per arm, or a fresh server for every point."
    )
    request_timeout_s: float = Field(default=600.0, gt=0, description="A request running longer is failed.")
    point_timeout_s: float | None = Field(default=None, gt=0, description="Bound on one point's wall time.")
    burst: bool = Field(
        default=False,
        description="Closed loop with requests <= concurrency is one wave, not a steady state: validation "
        "warns unless this is true (measure a single burst on purpose).",
    )

    @field_validator("repeats", mode="before")
    @classmethod
    def _no_auto_repeats(cls, value: Any) -> Any:
        if value == "auto":
            raise ValueError(
                "repeats counts repeats inside one launch; to add blocks of launches until every hypothesis "
                "is decided give [design] budget = { blocks = N, minutes = M }"
            )
        return value

    @model_validator(mode="after")
    def _one_ladder(self) -> Load:
        given = [k for k in ("concurrency", "rate", "search") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of `concurrency` (closed loop), `rate` (open loop) or `search` "
                             "(capacity search)" + (f", not {' and '.join(given)}" if given else ""))
        if self.search is not None and isinstance(self.requests, list):
            raise ValueError("a capacity search takes one number of `requests` per probe, not a list")
        if self.search is not None and self.search.waves is not None and "requests" in self.model_fields_set:
            raise ValueError("give one of load.requests or load.search.waves: with waves every probe sends "
                             "waves x its concurrency")
        if self.arrival == "trace" and self.rate is None:
            raise ValueError("arrival = \"trace\" replays a trace's timestamps at a `rate`: give `rate`, not "
                             "`concurrency` or `search`")
        rungs = len(self.ladder)
        if isinstance(self.requests, list) and len(self.requests) != rungs:
            raise ValueError(f"`requests` has {len(self.requests)} entries for {rungs} ladder levels")
        return self

    @property
    def ladder(self) -> list[Rung]:
        """One rung per point of the ladder, in the file's order."""
        if self.concurrency is not None:
            return [Rung(concurrency=c) for c in self.concurrency]
        return [Rung(rate_rps=float(r)) for r in self.rate or []]

    def requests_at(self, index: int) -> int:
        return self.requests[index] if isinstance(self.requests, list) else self.requests


class Checks(Strict):
    littles_law_tolerance: float = Field(
        default=0.03, gt=0, le=1, description="Allowed relative error of L = lambda * W."
    )
    max_cold_hit_rate: float = Field(
        default=0.01, ge=0, le=1, description="Highest prefix-cache hit rate a `reset` point may show."
    )
    warmup_tolerance: float = Field(
        default=0.10, gt=0, le=1,
        description="Allowed excess of the slower half's time per output token over the faster half's, either way.",
    )
    client_ceiling_fraction: float = Field(
        default=0.5, gt=0, le=1, description="Flag points whose chunk rate exceeds this share of the client ceiling."
    )


class Budget(Strict):
    """The most a sequential study may spend: blocks (every arm once each) and wall minutes."""

    blocks: int = Field(ge=2, le=100, strict=True, description="Most blocks in all, the first load.launches included.")
    minutes: float | None = Field(
        default=None, gt=0, description="Wall minutes after which no further block is started."
    )


class Design(Strict):
    """How launches are ordered and how far a sequential study may go."""

    seed: int | None = Field(
        default=None, ge=0, strict=True,
        description="Seed of the block orders; default: derived from study.id, so plans are reproducible.",
    )
    budget: Budget | None = Field(
        default=None,
        description="Sequential decisions: the runner adds blocks past load.launches, up to the budget, until "
        "every hypothesis is decided.",
    )
    gpus: int | None = Field(
        default=None, ge=1, le=4096, strict=True,
        description="GPUs the study may use at once; every launch must fit in them.",
    )


class Where(Strict):
    arm: str | None = Field(default=None, description="Arm name.")
    workload: str | None = Field(default=None, description="Workload name.")
    concurrency: PositiveInt | None = Field(default=None, description="Ladder level (closed loop).")
    rate: PositiveFloat | None = Field(default=None, description="Ladder level (open loop).")


Number = float | str


class Prediction(Strict):
    """A predicted value (number or expression) with a relative tolerance, a range, or a relation.

    With `ratio`, the measured quantity is metric(numerator) / metric(denominator); each side is an
    arm name or a selector table that overrides the hypothesis' `where`.
    """

    value: Number | None = Field(default=None, description=(
        'Predicted value: a number, an expression, or "model": the calibrated step-time model\'s prediction, '
        "frozen into the plan at compile time from --db (needs a stated `tolerance`)."))
    tolerance: float | None = Field(
        default=None, ge=0, description="Relative tolerance around `value` (default 0.05)."
    )
    range: tuple[Number, Number] | None = Field(default=None, description="Measured value within [low, high].")
    relation: Literal[">", "<", ">=", "<="] | None = Field(
        default=None, description="Measured value compared with `value`."
    )
    ratio: tuple[str | Where, str | Where] | None = Field(
        default=None, description="[numerator, denominator]: arm names or selector tables."
    )

    @model_validator(mode="after")
    def _one_form(self) -> Prediction:
        if self.range is not None:
            if self.value is not None or self.relation is not None or self.tolerance is not None:
                raise ValueError("`range` stands alone: drop `value`, `relation` and `tolerance`")
        elif self.value is None:
            raise ValueError("give `value` (with `tolerance` or `relation`) or `range`")
        elif self.relation is not None and self.tolerance is not None:
            raise ValueError("a `relation` takes no `tolerance`")
        return self

    @property
    def kind(self) -> Literal["value", "range", "relation"]:
        if self.range is not None:
            return "range"
        return "relation" if self.relation is not None else "value"

    @property
    def band(self) -> float:
        return 0.05 if self.tolerance is None else self.tolerance


class Hypothesis(Strict):
    id: str = Field(pattern=SLUG, description="Stable id within the study.")
    claim: str = Field(description="The claim in words.")
    metric: str = Field(description="What is measured (see `studyc metrics`).")
    where: Where = Field(default_factory=Where, description="Which points the measurement rests on.")
    predict: Prediction = Field(description="The prediction.")
    source: str = Field(default="", description="The seed's own figure or words, for 'against the seed'.")
    requires: list[str] = Field(
        default_factory=list,
        description="Premises: ids of other hypotheses of this study that must be confirmed for this claim to be "
        "measurable here. One refuted: this one reads 'not measurable here'; one unsettled: at most inconclusive.",
    )
    claims: list[str] = Field(
        default_factory=list,
        description="Ids of the claims this hypothesis tests, from a sources/<document>.toml file (see `studyc "
        "claims`).",
    )


class Study(Strict):
    study: StudyMeta = Field(description="What the study is.")
    model: ModelSpec = Field(description="The model served by every arm.")
    engine: dict[str, Any] = Field(
        default_factory=dict, description="`vllm serve` options shared by every arm, named like the CLI options."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for every server.")
    arms: dict[str, Arm] = Field(min_length=1, description="Server configurations, by name.")
    workloads: dict[str, Workload] = Field(min_length=1, description="Request shapes, by name.")
    load: Load = Field(description="How load is applied at every point.")
    checks: Checks = Field(default_factory=Checks, description="Validity thresholds.")
    design: Design = Field(default_factory=Design, description="Block order seed, sequential budget, GPUs.")
    hypothesis: list[Hypothesis] = Field(default_factory=list, description="Predictions to score.")
    slo: Slo | None = Field(
        default=None, description="Per-request objectives: goodput counts the requests that meet them all."
    )

    @field_validator("arms", "workloads")
    @classmethod
    def _slug_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not re.match(SLUG, name):
                raise ValueError(f"name {name!r} must be a slug: lowercase letters, digits, '-' or '_'")
        return value
