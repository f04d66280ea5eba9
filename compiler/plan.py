"""Study -> Plan: the immutable, serializable design the runner carries out.

Pure. Launches (server instances) are the outer level: arms interleaved across launches in
randomised blocks (block b holds launch b of every arm, in an order drawn from a seeded RNG),
points inside a launch, repeats interleaved inside the launch. Every step has a stable readable id
and a fingerprint of its resolved parameters, and every launch carries its full `vllm serve` argv,
so nothing downstream re-parses the study. The field descriptions below are the contract.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from compiler.engine_options import PARALLEL_OPTIONS, parallel_gpus
from compiler.load import LoadedStudy
from compiler.study import Budget, Checks, Prediction, Study

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
    arrival: Literal["poisson", "gamma"]
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

    @property
    def level(self) -> float:
        return float(self.concurrency if self.concurrency is not None else self.rate_rps or 0.0)

    @property
    def level_label(self) -> str:
        return f"c{self.concurrency}" if self.concurrency is not None else f"rate{self.rate_rps:g}"


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
    model_dir: str
    served_model_name: str
    kv_cache_dtype: str
    estimated_start_s: float
    fingerprint: str = Field(description="Of the argv and env: equal for every launch of an arm.")
    points: tuple[PointStep, ...]


ServerStep = Launch  # the name the runner used when every arm had one server


class Block(Frozen):
    index: int
    launches: tuple[str, ...] = Field(description="Launch ids in run order.")
    required: bool = Field(description="False: a sequential block, run only while a hypothesis is undecided.")


class Design(Frozen):
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
    points: tuple[str, ...] = Field(description="Point ids, every launch and repeat; empty for a server metric.")
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
    level: Literal["point", "server"]
    source: str
    prediction: Prediction
    points: tuple[str, ...] = Field(description="Every point id the measurement rests on (both sides).")
    numerator: HypothesisSide
    denominator: HypothesisSide | None


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
    design: Design
    launches: tuple[Launch, ...] = Field(description="In run order: block by block, each block in its order.")
    estimated_s: float = Field(description="Required blocks, one launch at a time.")
    estimated_max_s: float = Field(description="Every block the budget allows, one launch at a time.")
    estimate_basis: str
    hypotheses: tuple[HypothesisStep, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """Plans stored by schema v1 (one server per arm, `servers`) read as one block of single launches."""
        if isinstance(data, dict) and data.get("schema_version") == 1 and "servers" in data:
            return upgrade_v1(data)
        return data

    @property
    def servers(self) -> tuple[Launch, ...]:
        """The launches, under the name of schema v1."""
        return self.launches

    @property
    def points(self) -> list[PointStep]:
        return [p for s in self.launches for p in s.points]

    @property
    def server_starts(self) -> int:
        """Servers started by the required blocks (replicas counted)."""
        return sum(s.replicas for s in self.launches if s.required)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    data = dict(data)
    launches = []
    for order, server in enumerate(data.pop("servers"), start=1):
        gpus = _gpus_from_argv(server.get("argv", ()))
        launches.append({**server, "launch": 1, "block": 1, "order": order, "gpus_per_server": gpus,
                         "gpus": gpus, "server_ids": [server["id"]]})
    arms = list(dict.fromkeys(s["arm"] for s in launches))
    repeats = max((p["repeat"] for s in launches for p in s["points"]), default=1)
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


def fingerprint(payload: Any) -> str:
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cli_args(options: dict[str, Any]) -> list[str]:
    """`vllm serve` options table -> argv: true -> --flag, false -> --no-flag, tables -> JSON."""
    argv: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + flag[2:])
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif isinstance(value, list):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def compile_study(loaded: LoadedStudy) -> Plan:
    """Compile a validated study. Pure: same file in, byte-identical plan out."""
    from compiler.hardware import get_hardware
    from compiler.modelconfig import load_model

    study = loaded.study
    hardware = get_hardware(study.study.hardware)
    # Paths in the plan are absolute, so the plan means the same from any working directory;
    # fingerprints use them relative to the study file, so they don't depend on the checkout's place.
    study_path = os.path.normpath(os.path.abspath(loaded.path))
    directory = os.path.dirname(study_path)
    start_s = 25.0 if hardware.name == "cpu" else 120.0
    arms: dict[str, dict[str, Any]] = {}
    for arm_name, arm in study.arms.items():
        model_rel = arm.model or study.model.path
        model_dir = os.path.normpath(os.path.join(directory, model_rel)) if model_rel else None
        options = {**study.engine, **arm.args}
        served = _served_name(study, arm.model, model_dir)
        portable = _serve_argv(study, ".", model_dir and os.path.relpath(model_dir, directory), served, options)
        env = {**study.env, **arm.env}
        per_server = parallel_gpus(options)
        kv_dtype = str(options.get("kv_cache_dtype", options.get("kv-cache-dtype", "auto")))
        arms[arm_name] = {
            "argv": tuple(_serve_argv(study, directory, model_dir, served, options)), "env": env,
            "model_dir": model_dir or served, "served_model_name": served, "kv_cache_dtype": kv_dtype,
            "estimated_start_s": start_s, "fingerprint": fingerprint({"argv": portable, "env": env}),
            "replicas": arm.replicas, "balance": arm.balance, "gpus_per_server": per_server,
            "gpus": arm.replicas * per_server,
            "shape": load_model(model_dir) if model_dir else None,
        }
    design = plan_design(study)
    launches: list[Launch] = []
    for block in design.blocks:
        for order, launch_id in enumerate(block.launches, start=1):
            arm_name, index = _launch_key(launch_id, study.study.id)
            launches += _launch_steps(study, arm_name, index, block, order, launch_id, arms[arm_name], hardware)
    required = [s for s in launches if s.required]
    total = sum(_launch_s(s) for s in required)
    most = sum(_launch_s(s) for s in launches)
    return Plan(
        study_id=study.study.id,
        title=study.study.title,
        study_path=study_path,
        study_sha256=loaded.sha256,
        hardware=hardware.name,
        checks=study.checks,
        design=design.model_copy(update={"max_launch_gpus": max(s.gpus for s in launches)}),
        launches=tuple(launches),
        estimated_s=round(total, 1),
        estimated_max_s=round(most, 1),
        estimate_basis=(
            f"{len(required)} launch(es) one at a time, each starting its servers in {start_s:.0f} s; decode at "
            f"75% of the {hardware.name} spec-sheet bandwidth roofline, with a per-step floor; prefill ignored"
        ),
        hypotheses=tuple(_hypotheses(study, launches)),
    )


def design_seed(study: Study) -> tuple[int, Literal["study", "study id"]]:
    """The study's design.seed, else 32 bits of sha256 of the study id."""
    if study.design.seed is not None:
        return study.design.seed, "study"
    digest = hashlib.sha256(f"studyc-design|{study.study.id}".encode()).digest()
    return int.from_bytes(digest[:4], "big"), "study id"


def launch_counts(study: Study) -> dict[str, int]:
    """Required launches per arm: the arm's own `launches`, else load.launches."""
    return {name: arm.launches or study.load.launches for name, arm in study.arms.items()}


def launch_id(study_id: str, arm: str, launch: int, multi: bool) -> str:
    """study/arm for an arm with one launch (the ids of schema v1), else study/arm/L<launch>."""
    return f"{study_id}/{arm}/L{launch}" if multi else f"{study_id}/{arm}"


def block_orders(arms: list[list[str]], seed: int) -> list[list[str]]:
    """One run order per block: `arms[b]` are the arms of block b+1 (in study order).

    Each order is a random permutation drawn from random.Random(seed), one shuffle per block in
    block order, redrawn while it equals the previous block's order (two arms alternate)."""
    rng = random.Random(seed)
    orders: list[list[str]] = []
    for present in arms:
        order = list(present)
        rng.shuffle(order)
        while orders and len(set(order)) > 1 and order == orders[-1]:
            rng.shuffle(order)
        orders.append(order)
    return orders


def plan_design(study: Study) -> Design:
    """Blocks and their launch ids in run order (required blocks, then the budget's sequential ones)."""
    seed, source = design_seed(study)
    counts = launch_counts(study)
    budget = study.design.budget
    total = max(budget.blocks if budget else 0, *counts.values())
    multi = {a: budget is not None or n > 1 for a, n in counts.items()}
    present = [[a for a in study.arms if b <= counts[a] or (budget is not None and b > max(counts.values()))]
               for b in range(1, total + 1)]
    blocks = []
    for index, order in enumerate(block_orders(present, seed), start=1):
        blocks.append(Block(
            index=index, launches=tuple(launch_id(study.study.id, a, index, multi[a]) for a in order),
            required=index <= max(counts.values()),
        ))
    return Design(
        seed=seed, seed_from=source, launches=counts, repeats=study.load.repeats, blocks=tuple(blocks),
        budget=budget, gpus=study.design.gpus,
    )


def _launch_key(launch: str, study_id: str) -> tuple[str, int]:
    parts = launch[len(study_id) + 1:].split("/")
    return parts[0], int(parts[1][1:]) if len(parts) > 1 else 1


def _launch_s(step: Launch) -> float:
    return step.estimated_start_s + sum(p.estimated_s for p in step.points)


def _launch_steps(
    study: Study, arm_name: str, index: int, block: Block, order: int, lid: str, built: dict[str, Any],
    hardware: Any,
) -> list[Launch]:
    arm = study.arms[arm_name]
    vocab_hi = built["shape"].vocab_size if built["shape"] else 32000
    multi = lid.endswith(f"/L{index}")
    points = _points(study, arm_name, lid, index if multi else None, block.index, arm.cache or study.load.cache,
                     vocab_hi, built["shape"], hardware, built["kv_cache_dtype"])
    common = {k: v for k, v in built.items() if k != "shape"}
    common.update(arm=arm_name, launch=index, block=block.index, order=order, required=block.required)
    if study.load.server == "per-point":
        fresh = [p.model_copy(update={"exchangeable": True, "not_exchangeable_because": ""}) for p in points]
        return [Launch(id=p.id, server_ids=_server_ids(p.id, arm.replicas), points=(p,), **common) for p in fresh]
    return [Launch(id=lid, server_ids=_server_ids(lid, arm.replicas), points=tuple(points), **common)]


def _server_ids(lid: str, replicas: int) -> tuple[str, ...]:
    return (lid,) if replicas == 1 else tuple(f"{lid}/s{k}" for k in range(1, replicas + 1))


def _served_name(study: Study, arm_model: str | None, model_dir: str | None) -> str:
    """The study's `model.name` serves the study's model; an arm's own model folder serves under its own name."""
    if arm_model is not None:
        return os.path.basename(os.path.normpath(arm_model))
    return study.model.name or os.path.basename(model_dir or "model")


def _serve_argv(
    study: Study, directory: str, model_dir: str | None, served: str, options: dict[str, Any]
) -> list[str]:
    spec = study.model
    argv = ["serve", model_dir or served, "--served-model-name", served, "--load-format", spec.load_format]
    argv += ["--dtype", spec.dtype]
    if spec.tokenizer is not None:
        argv += ["--tokenizer", os.path.normpath(os.path.join(directory, spec.tokenizer))]
    return argv + cli_args(options)


def _hypotheses(study: Study, launches: list[Launch]) -> list[HypothesisStep]:
    from compiler.metrics import METRICS
    from compiler.select import Target, sides

    def side(target: Target, level: str) -> HypothesisSide:
        on = [s for s in launches if s.arm == target.arm]
        points = [
            p.id for s in on for p in s.points
            if level == "point" and p.workload == target.workload and p.level == target.level
        ]
        hosts = [s for s in on if level == "server" or any(p.id in points for p in s.points)]
        closed = study.load.concurrency is not None
        return HypothesisSide(
            arm=target.arm, workload=target.workload,
            concurrency=int(target.level) if closed and target.level is not None else None,
            rate_rps=None if closed or target.level is None else float(target.level),
            points=tuple(points), launches=tuple(s.id for s in hosts),
            servers=tuple(i for s in hosts for i in s.server_ids),
        )

    out: list[HypothesisStep] = []
    for hyp in study.hypothesis:
        metric = METRICS[hyp.metric]
        top, bottom = sides(study, hyp)
        numerator = side(top, metric.level)
        denominator = side(bottom, metric.level) if bottom is not None else None
        out.append(HypothesisStep(
            id=hyp.id, claim=hyp.claim, metric=hyp.metric, unit=metric.unit, level=metric.level,
            source=hyp.source, prediction=hyp.predict,
            points=numerator.points + (denominator.points if denominator else ()),
            numerator=numerator, denominator=denominator,
        ))
    return out


def _points(
    study: Study, arm: str, lid: str, launch: int | None, block: int, cache: Literal["reset", "keep"], vocab: int,
    shape: Any, hardware: Any, kv_dtype: str,
) -> list[PointStep]:
    """The points of one launch, repeats interleaved. `launch` is None for an arm's only launch: its ids and
    fingerprints are those of schema v1, so stored runs still resume."""
    load = study.load
    vocab_lo, vocab_hi = 16, max(32, int(vocab * 0.9))
    sent: dict[tuple[int, ...], int] = {}  # prompt set -> most prompts of it sent on this launch so far
    out: list[PointStep] = []
    for repeat in range(1, load.repeats + 1):
        for wname, work in study.workloads.items():
            for index, level in enumerate(load.levels):
                closed = load.concurrency is not None
                requests = load.requests_at(index)
                label = f"c{int(level)}" if closed else f"rate{level:g}"
                params = {
                    "arm": arm, "workload": wname, "concurrency": int(level) if closed else None,
                    "rate_rps": None if closed else float(level), "repeat": repeat, "requests": requests,
                    "warmup": load.warmup, "cache": cache, "input_len": work.input_len,
                    "output_len": work.output_len, "prefix_len": work.prefix_len, "prompt_seed": work.seed,
                    "vocab_lo": vocab_lo, "vocab_hi": vocab_hi, "arrival": load.arrival,
                    "burstiness": load.burstiness, "request_timeout_s": load.request_timeout_s,
                    "point_timeout_s": load.point_timeout_s,
                }
                why = ""
                if cache == "keep":
                    prompts = (work.input_len, work.prefix_len, work.seed, vocab_lo, vocab_hi)
                    before = sent.get(prompts, 0)
                    if requests > before:
                        why = (f"cache = keep: the first point of this launch to send {requests - before} of its "
                               f"{requests} prompts, so it runs (partly) cold where its other repeats run warm")
                        sent[prompts] = requests
                estimate = _estimate_point_s(params, shape, hardware, kv_dtype)
                keyed = params if launch is None else {**params, "launch": launch}
                out.append(
                    PointStep.model_validate({
                        "id": f"{lid}/{wname}/{label}/r{repeat}",
                        "launch": launch or 1, "block": block,
                        "exchangeable": not why, "not_exchangeable_because": why,
                        "burst": load.burst and closed,
                        "estimated_s": estimate,
                        "fingerprint": fingerprint(keyed),
                        **params,
                    })
                )
    return out


def _estimate_point_s(params: dict[str, Any], shape: Any, hardware: Any, kv_dtype: str) -> float:
    """A rough wall time: waves of requests, each output_len decode steps at a roofline pace."""
    out_len, in_len = params["output_len"], params["input_len"]
    floor = 0.0035 if hardware.name == "cpu" else 0.002
    def step_s(batch: int) -> float:
        if shape is None:
            return floor
        roof = shape.decode_step_s(batch, in_len + out_len // 2, hardware.bandwidth_Bps, kv_dtype=_kv(kv_dtype))
        return max(roof / 0.75, floor)

    total = 0.0
    for count in (params["warmup"], params["requests"]):
        if count == 0:
            continue
        if params["concurrency"] is not None:
            batch = min(params["concurrency"], count)
            waves = math.ceil(count / batch)
            total += waves * out_len * step_s(batch)
        else:
            total += count / params["rate_rps"] + out_len * step_s(1)
    return round(total + 1.0, 1)


def _kv(kv_dtype: str) -> str:
    return "fp8" if kv_dtype.startswith("fp8") else "auto"
