"""The plan's types: the immutable, serializable design the runner carries out, and the reading of a stored one.

Launches (server instances) are the outer level: arms interleaved across launches in randomised blocks
(block b holds launch b of every arm, in an order drawn from a seeded RNG), points inside a launch,
repeats interleaved inside the launch. Every step has a stable readable id and a fingerprint of its
resolved parameters, and every launch carries its full `vllm serve` argv and its engine settings, so
nothing downstream re-parses the study or the argv. The field descriptions below are the contract.
`compiler.plan_compile` builds a plan from a study; `Plan.from_stored` reads one a run stored (schema v1
plans upgraded here).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from compiler.engine_options import PARALLEL_OPTIONS
from compiler.model_value import ModelValue
from compiler.slo import Slo
from compiler.study import Budget, Checks, Prediction, Rung
from compiler.workload import Shape

SCHEMA_VERSION = 2


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PointStep(Frozen):
    id: str = Field(description="study/arm[/L<launch>]/workload/<level>/r<repeat>; the launch part only when "
                    "the arm has more than one launch.")
    arm: str
    launch: int = Field(default=1, description="1-based launch of the arm this point runs on.")
    block: int = Field(default=1, description="1-based block of that launch.")
    workload: str
    concurrency: int | None
    rate_rps: float | None
    repeat: int = Field(description="1-based repeat inside the launch.")
    requests: int
    warmup: int
    cache: Literal["reset", "keep"]
    input_len: int
    output_len: int
    prefix_len: int
    prompt_seed: int
    vocab_lo: int
    vocab_hi: int
    arrival: Literal["poisson", "gamma", "constant", "trace"]
    burstiness: float
    request_timeout_s: float
    point_timeout_s: float | None
    exchangeable: bool = Field(
        default=True, description="False when this repeat differs from its siblings by construction."
    )
    not_exchangeable_because: str = Field(default="", description="Why not, when exchangeable is false.")
    estimated_s: float
    fingerprint: str
    burst: bool = False  # closed loop measured as one wave on purpose (load.burst); not in the fingerprint
    shape: Shape | None = Field(
        default=None, description="Drawn lengths, templates, turns or a trace; None: the classic fixed-length "
        "workload (input_len and output_len exact; its fingerprint as before shapes existed). With a shape, "
        "input_len and output_len are the mean prompt and output lengths, rounded.")

    @model_serializer(mode="wrap")
    def _classic_as_before(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A classic point serializes without `shape`, so its plan JSON is byte-identical to before."""
        data = handler(self)
        if self.shape is None and isinstance(data, dict):
            data.pop("shape", None)
        return data

    @property
    def shape_key(self) -> str | None:
        """The shape as a comparable string (the trace by content); None for a classic point."""
        return None if self.shape is None else json.dumps(self.shape.fingerprint_payload(), sort_keys=True)

    @property
    def rung(self) -> Rung:
        """The point's rung of the load ladder: its `concurrency` (closed loop) or its `rate_rps`."""
        return Rung(self.concurrency, self.rate_rps)


class SearchStep(Frozen):
    """A capacity search on one launch and workload. Its probes cannot be listed in advance (each depends on
    the last one's attainment, `compiler.capacity`); each is its template point at the probed load, with the
    id <search id>/c<level>/r1 (or rate<level>) and all of a point's checks."""

    id: str = Field(description="study/arm[/L<launch>]/workload/search.")
    arm: str
    workload: str
    over: Literal["concurrency", "rate"]
    lo: float
    hi: float
    probes: int = Field(description="Most probes: hi, lo, then bisection.")
    attainment: float = Field(description="A probe holds when its slo_attainment is at least this.")
    template: PointStep = Field(description="The probe point at `hi`; every probe is a copy at its own load.")
    estimated_s: float = Field(description="The probes' estimate: hi, lo, then the rest at the middle of the range.")
    waves: int | None = Field(default=None, description=(
        "Every probe sends this many waves of its concurrency: waves x level requests (multi-turn, "
        "conversations); None: every probe sends the template's requests."))

    @model_serializer(mode="wrap")
    def _no_waves_as_before(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A search without waves serializes without `waves`, so its plan JSON is byte-identical to before."""
        data = handler(self)
        if self.waves is None and isinstance(data, dict):
            data.pop("waves", None)
        return data


class Engine(Frozen):
    """The engine settings of a launch, read once from its serve argv so that no reader re-parses it."""

    max_num_batched_tokens: int | None = Field(description="--max-num-batched-tokens; None: vLLM's default.")
    max_num_seqs: int | None = Field(description="--max-num-seqs; None: vLLM's default.")
    dtype: str | None = Field(description="--dtype as given; None when the argv has none.")
    enforce_eager: bool = Field(description="--enforce-eager: no CUDA graphs.")
    prefix_caching: bool = Field(description="False only with --no-enable-prefix-caching.")
    chunked_prefill: bool = Field(description="False only with --no-enable-chunked-prefill.")
    async_scheduling: bool = Field(default=True, description=(
        "False only with --no-async-scheduling (vLLM's default on GPUs is on); plans stored before the field "
        "read True."))
    configuration: tuple[str, ...] = Field(description=(
        "The argv that makes two launches the same configuration: the served name, a default "
        "--kv-cache-dtype and --enable-prefix-caching left out, the model by its folder name."))

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> Engine:
        """The settings of a `vllm serve` argv (['serve', MODEL, ...])."""
        def value(flag: str) -> str | None:
            for i, arg in enumerate(argv):
                if arg == flag and i + 1 < len(argv):
                    return argv[i + 1]
                if arg.startswith(flag + "="):
                    return arg.split("=", 1)[1]
            return None

        budget, seqs = value("--max-num-batched-tokens"), value("--max-num-seqs")
        return cls(
            max_num_batched_tokens=int(budget) if budget else None, max_num_seqs=int(seqs) if seqs else None,
            dtype=value("--dtype"), enforce_eager="--enforce-eager" in argv,
            prefix_caching="--no-enable-prefix-caching" not in argv,
            chunked_prefill="--no-enable-chunked-prefill" not in argv,
            async_scheduling="--no-async-scheduling" not in argv, configuration=_configuration(argv),
        )


def _configuration(argv: Sequence[str]) -> tuple[str, ...]:
    args = list(argv)
    if "--served-model-name" in args[:-1]:
        i = args.index("--served-model-name")
        del args[i:i + 2]
    # Options whose spelled-out default leaves the server as it is (vLLM 0.2x: prefix caching is on by default).
    for flag, default in (("--kv-cache-dtype", "auto"),):  # spelled out or left out: the same server
        if flag in args[:-1] and args[args.index(flag) + 1] == default:
            i = args.index(flag)
            del args[i:i + 2]
    if "--enable-prefix-caching" in args:
        args.remove("--enable-prefix-caching")
    if len(args) > 1:
        args[1] = Path(str(args[1])).name  # the model folder, wherever it lies
    return tuple(args)


class Launch(Frozen):
    """One launch of an arm: `replicas` servers started together with the same argv, its points, then stopped."""

    id: str = Field(description="study/arm when the arm has one launch, else study/arm/L<launch>; per-point "
                    "servers append /workload/<level>/r<repeat>.")
    arm: str
    launch: int = Field(description="1-based launch of the arm.")
    block: int = Field(description="1-based block this launch belongs to.")
    order: int = Field(description="1-based position of this launch in its block's run order.")
    required: bool = Field(
        default=True, description="False: a sequential block, run only while a hypothesis is undecided."
    )
    replicas: int = Field(default=1, description="Servers of this launch, behind the client's balancer.")
    balance: Literal["least_outstanding", "round_robin"] = "least_outstanding"
    gpus_per_server: int = Field(
        default=1, description="tensor_parallel_size x pipeline_parallel_size x data_parallel_size."
    )
    gpus: int = Field(default=1, description="GPUs the launch holds: replicas x gpus_per_server.")
    server_ids: tuple[str, ...] = Field(
        default=(), description="One id per replica: the launch id alone, else <launch id>/s<k>."
    )
    argv: tuple[str, ...] = Field(description="Everything after the engine command: ['serve', MODEL, ...].")
    env: dict[str, str]
    expect_log: tuple[str, ...] = Field(default=(), description="Text each server must have logged by ready "
                                        "(its arm's expect_log).")
    model_dir: str
    served_model_name: str
    kv_cache_dtype: str
    engine: Engine = Field(description="Its settings, from the argv (filled in for plans stored without them).")
    estimated_start_s: float
    fingerprint: str = Field(description="Of the argv and env: equal for every launch of an arm.")
    points: tuple[PointStep, ...]
    searches: tuple[SearchStep, ...] = Field(default=(), description="Capacity searches, run after the points.")

    @property
    def estimated_s(self) -> float:
        """Its start, points and searches, by the plan's estimate."""
        return self.estimated_start_s + sum(p.estimated_s for p in self.points) + sum(
            s.estimated_s for s in self.searches)

    @model_validator(mode="before")
    @classmethod
    def _engine(cls, data: Any) -> Any:
        """A launch stored before `engine` existed reads it from its argv."""
        if isinstance(data, dict) and "engine" not in data and "argv" in data:
            return {**data, "engine": Engine.from_argv(data["argv"])}
        return data


class Block(Frozen):
    index: int
    launches: tuple[str, ...] = Field(description="Launch ids in run order.")
    required: bool = Field(description="False: a sequential block, run only while a hypothesis is undecided.")


class BlockDesign(Frozen):
    """The design as resolved: block orders, launches and repeats per arm, the budget and the GPUs."""

    seed: int = Field(description="Seed of the block orders (the study's design.seed, else from study.id).")
    seed_from: Literal["study", "study id", "none"] = "study id"
    launches: dict[str, int] = Field(description="Required launches per arm (blocks before any budget).")
    repeats: int = Field(description="Repeats of every point inside one launch.")
    blocks: tuple[Block, ...]
    budget: Budget | None = Field(default=None, description="Sequential budget; None: a fixed design.")
    gpus: int | None = Field(default=None, description="GPUs the study may use at once (design.gpus).")
    max_launch_gpus: int = Field(default=1, description="GPUs the largest launch holds.")
    order_rule: str = Field(
        default="each block's order is a random permutation of its arms (Python random.Random(seed), "
        "one shuffle per block in block order), redrawn while it equals the previous block's order",
    )


class HypothesisSide(Frozen):
    """The points (or, for a server metric, the servers) one side of a prediction is measured on."""

    arm: str
    workload: str | None
    concurrency: int | None
    rate_rps: float | None
    points: tuple[str, ...] = Field(description="Point ids, every launch and repeat; empty for a server metric; "
                                    "the search ids for a search metric.")
    launches: tuple[str, ...] = Field(default=(), description="Launch ids the points run on (or the metric "
                                      "is read from).")
    servers: tuple[str, ...] = Field(description="Server ids of those launches (one per replica).")


class HypothesisStep(Frozen):
    """A hypothesis resolved against the plan: the report scores it from these ids, never re-matching levels.

    Measured: metric over `numerator`, divided by metric over `denominator` when the prediction is a ratio.
    """

    id: str
    claim: str
    metric: str
    unit: str
    level: Literal["point", "server", "search"]
    source: str
    prediction: Prediction
    points: tuple[str, ...] = Field(description="Every point id the measurement rests on (both sides).")
    numerator: HypothesisSide
    denominator: HypothesisSide | None
    model: ModelValue | None = Field(default=None, description=(
        'A `value = "model"` prediction\'s number, frozen at compile time (compiler.model_value); left out of the '
        "JSON when none is."))


def budget_points(launch: Launch, undecided: Sequence[HypothesisStep],
                  points: Sequence[PointStep] | None = None) -> tuple[PointStep, ...]:
    """The points (of `points`, default all of the launch's) a budget block's launch measures while only
    `undecided` are inconclusive: every one where an undecided server metric is read from this launch's
    start; else the points those hypotheses rest on (none: it is not needed), and where the launch keeps
    its prefix cache between points, every point before the last of those too (the points before a point
    are part of its measurement; those after it are not)."""
    points = tuple(launch.points if points is None else points)
    sides = [s for h in undecided if h.level == "server" for s in (h.numerator, h.denominator) if s is not None]
    if any(launch.id in s.launches for s in sides):
        return points
    need = {p for h in undecided for p in h.points}
    if any(p.cache == "keep" for p in launch.points):
        last = max((i for i, p in enumerate(points) if p.id in need), default=-1)
        return points[:last + 1]
    return tuple(p for p in points if p.id in need)


class Plan(Frozen):
    schema_version: int = SCHEMA_VERSION
    study_id: str
    title: str
    study_path: str
    study_sha256: str
    hardware: str
    checks: Checks
    design: BlockDesign
    launches: tuple[Launch, ...] = Field(description="In run order: block by block, each block in its order.")
    estimated_s: float = Field(description="Required blocks, one launch at a time.")
    estimated_max_s: float = Field(description="Every block the budget allows, one launch at a time.")
    estimate_basis: str
    hypotheses: tuple[HypothesisStep, ...] = ()
    slo: Slo | None = Field(default=None, description="The study's [slo]: goodput and slo_attainment are read by it.")
    calibrate_launches: bool = Field(default=False, description=(
        "Calibrate the GPU once per launch, just before its servers start (a hypothesis names a machine "
        "metric: machine_flops, machine_bandwidth, ridge_point); left out of the JSON when false."))
    prime_s: float = Field(default=0.0, description=(
        "Seconds of the unmeasured prime starts, one per configuration (a GPU host's run primes: "
        "runner.execute.prime), in estimated_s; left out of the JSON when 0."))

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """Plans stored by schema v1 (one server per arm, `servers`) read as one block of single launches."""
        if isinstance(data, dict) and data.get("schema_version") == 1 and "servers" in data:
            return upgrade_v1(data)
        return data

    @property
    def points(self) -> list[PointStep]:
        return [p for s in self.launches for p in s.points]

    @property
    def server_starts(self) -> int:
        """Servers started by the required blocks (replicas counted)."""
        return sum(s.replicas for s in self.launches if s.required)

    def to_json(self) -> str:
        # Fields a plan without an SLO or a search leaves at their defaults are left out: its bytes, as before them.
        drop: dict[str, Any] = {} if self.slo is not None else {"slo": True}
        if not any(s.searches for s in self.launches):
            drop["launches"] = {"__all__": {"searches"}}
        if not self.calibrate_launches:
            drop["calibrate_launches"] = True
        if not self.prime_s:
            drop["prime_s"] = True
        if unfrozen := {i: {"model"} for i, h in enumerate(self.hypotheses) if h.model is None}:
            drop["hypotheses"] = unfrozen
        return self.model_dump_json(indent=2, exclude=drop or None)

    @classmethod
    def from_stored(cls, text: str | None) -> Plan | None:
        """The plan a run stored (its JSON, any schema), upgraded to this one: the one reader of a stored
        plan. None when there is none or it does not read."""
        if not text:
            return None
        try:
            return cls.model_validate(json.loads(text))
        except ValueError:  # not JSON, or not a plan (pydantic's ValidationError is a ValueError)
            return None


def upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A schema v1 plan (one server per arm, `servers`) as one block of single launches; its points are
    marked exchangeable or not by the kept-cache rule (`kept_prompts`), as the compiler marks them."""
    data = dict(data)
    launches = []
    for order, server in enumerate(data.pop("servers"), start=1):
        gpus = _gpus_from_argv(server.get("argv", ()))
        points = mark_cold([PointStep.model_validate(p) for p in server.get("points", ())])
        launches.append({**server, "launch": 1, "block": 1, "order": order, "gpus_per_server": gpus,
                         "gpus": gpus, "server_ids": [server["id"]], "points": points})
    arms = list(dict.fromkeys(s["arm"] for s in launches))
    repeats = max((p.repeat for s in launches for p in s["points"]), default=1)
    data["launches"] = launches
    data["design"] = {
        "seed": 0, "seed_from": "none", "launches": dict.fromkeys(arms, 1), "repeats": repeats,
        "blocks": [{"index": 1, "launches": [s["id"] for s in launches], "required": True}],
        "max_launch_gpus": max((s["gpus"] for s in launches), default=1),
        "order_rule": "schema v1: arms one after another in the study file's order",
    }
    data.setdefault("estimated_max_s", data.get("estimated_s", 0.0))
    hypotheses = []
    for hyp in data.get("hypotheses", ()):
        hyp = dict(hyp)
        for key in ("numerator", "denominator"):
            if hyp.get(key):
                hyp[key] = {**hyp[key], "launches": hyp[key].get("servers", [])}
        hypotheses.append(hyp)
    data["hypotheses"] = hypotheses
    return data


def _gpus_from_argv(argv: Any) -> int:
    argv = list(argv)
    gpus = 1
    for name in PARALLEL_OPTIONS:
        flag = "--" + name.replace("_", "-")
        if flag in argv[:-1]:
            try:
                gpus *= int(argv[argv.index(flag) + 1])
            except ValueError:
                pass
    return gpus


def kept_prompts(points: Sequence[PointStep]) -> dict[str, int]:
    """The kept-cache rule, for the points of one launch in run order: point id -> how many of its prompts
    an earlier point of the launch already sent, so that a kept prefix cache holds them (0 under cache =
    reset). A prompt set is its input and prefix lengths, seed, vocabulary and shape; prompt i of a set is the
    same on every point that sends it."""
    sent: dict[tuple[object, ...], int] = {}  # prompt set -> most prompts of it sent on this launch so far
    out: dict[str, int] = {}
    for p in points:
        if p.cache != "keep":
            out[p.id] = 0
            continue
        prompts = (p.input_len, p.prefix_len, p.prompt_seed, p.vocab_lo, p.vocab_hi, p.shape_key)
        before = sent.get(prompts, 0)
        out[p.id] = min(before, p.requests)
        sent[prompts] = max(before, p.requests)
    return out


def mark_cold(points: Sequence[PointStep]) -> tuple[PointStep, ...]:
    """The points of one launch, each not exchangeable where the kept-cache rule has it run (partly) cold:
    the first point of the launch to send some of its prompts."""
    warm = kept_prompts(points)
    out = []
    for p in points:
        why = ""
        if p.cache == "keep" and p.requests > warm[p.id]:
            why = (f"cache = keep: the first point of this launch to send {p.requests - warm[p.id]} of its "
                   f"{p.requests} prompts, so it runs (partly) cold where its other repeats run warm")
        out.append(p.model_copy(update={"exchangeable": not why, "not_exchangeable_because": why}))
    return tuple(out)


