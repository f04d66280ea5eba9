"""Study -> Plan: the immutable, serializable list of servers and points the runner carries out.

Pure: servers are the outer loop (restarts are expensive), points inside, repeats interleaved.
Every step has a stable readable id and a fingerprint of its resolved parameters, and every
server carries its full `vllm serve` argv, so nothing downstream re-parses the study.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from compiler.load import LoadedStudy
from compiler.study import Checks, Prediction, Study
from studyc.errors import PlanError

SCHEMA_VERSION = 1


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PointStep(Frozen):
    id: str
    arm: str
    workload: str
    concurrency: int | None
    rate_rps: float | None
    repeat: int
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
    estimated_s: float
    fingerprint: str

    @property
    def level(self) -> float:
        return float(self.concurrency if self.concurrency is not None else self.rate_rps or 0.0)

    @property
    def level_label(self) -> str:
        return f"c{self.concurrency}" if self.concurrency is not None else f"rate{self.rate_rps:g}"


class ServerStep(Frozen):
    id: str
    arm: str
    argv: tuple[str, ...] = Field(description="Everything after the engine command: ['serve', MODEL, ...].")
    env: dict[str, str]
    model_dir: str
    served_model_name: str
    kv_cache_dtype: str
    estimated_start_s: float
    fingerprint: str
    points: tuple[PointStep, ...]


class HypothesisSide(Frozen):
    """The points (or, for a server metric, the servers) one side of a prediction is measured on."""

    arm: str
    workload: str | None
    concurrency: int | None
    rate_rps: float | None
    points: tuple[str, ...] = Field(description="Point ids, every repeat; empty for a server metric.")
    servers: tuple[str, ...] = Field(description="Server ids the points run on (or the metric is read from).")


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


class Plan(Frozen):
    schema_version: int = SCHEMA_VERSION
    study_id: str
    title: str
    study_path: str
    study_sha256: str
    hardware: str
    checks: Checks
    servers: tuple[ServerStep, ...]
    estimated_s: float
    estimate_basis: str
    hypotheses: tuple[HypothesisStep, ...] = ()

    @property
    def points(self) -> list[PointStep]:
        return [p for s in self.servers for p in s.points]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


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
    from compiler.modelmath import load_model

    study = loaded.study
    hardware = get_hardware(study.study.hardware)
    # Paths in the plan are absolute, so the plan means the same from any working directory;
    # fingerprints use them relative to the study file, so they don't depend on the checkout's place.
    study_path = os.path.normpath(os.path.abspath(loaded.path))
    directory = os.path.dirname(study_path)
    servers: list[ServerStep] = []
    for arm_name, arm in study.arms.items():
        if arm.replicas != 1:
            raise PlanError(f"{loaded.path}: arms.{arm_name}.replicas: several replicas per arm are not supported yet")
        model_rel = arm.model or study.model.path
        model_dir = os.path.normpath(os.path.join(directory, model_rel)) if model_rel else None
        shape = load_model(model_dir) if model_dir else None
        options = {**study.engine, **arm.args}
        kv_dtype = str(options.get("kv_cache_dtype", options.get("kv-cache-dtype", "auto")))
        served = _served_name(study, arm.model, model_dir)
        argv = _serve_argv(study, directory, model_dir, served, options)
        portable = _serve_argv(study, ".", model_dir and os.path.relpath(model_dir, directory), served, options)
        env = {**study.env, **arm.env}
        vocab_hi = shape.vocab_size if shape else 32000
        points = _points(study, arm_name, arm.cache or study.load.cache, vocab_hi, shape, hardware, kv_dtype)
        start_s = 25.0 if hardware.name == "cpu" else 90.0
        server_fp = fingerprint({"argv": portable, "env": env})
        if study.load.server == "per-point":
            for point in points:
                tail = point.id.split("/", 2)[2]
                servers.append(
                    ServerStep(
                        id=f"{study.study.id}/{arm_name}/{tail}", arm=arm_name, argv=tuple(argv), env=env,
                        model_dir=model_dir or served, served_model_name=served, kv_cache_dtype=kv_dtype,
                        estimated_start_s=start_s, fingerprint=server_fp, points=(point,),
                    )
                )
        else:
            servers.append(
                ServerStep(
                    id=f"{study.study.id}/{arm_name}", arm=arm_name, argv=tuple(argv), env=env,
                    model_dir=model_dir or served, served_model_name=served, kv_cache_dtype=kv_dtype,
                    estimated_start_s=start_s, fingerprint=server_fp, points=tuple(points),
                )
            )
    total = sum(s.estimated_start_s + sum(p.estimated_s for p in s.points) for s in servers)
    return Plan(
        study_id=study.study.id,
        title=study.study.title,
        study_path=study_path,
        study_sha256=loaded.sha256,
        hardware=hardware.name,
        checks=study.checks,
        servers=tuple(servers),
        estimated_s=round(total, 1),
        estimate_basis=(
            f"server start {servers[0].estimated_start_s:.0f} s; decode at 75% of the {hardware.name} "
            "spec-sheet bandwidth roofline, with a per-step floor; prefill ignored"
        ),
        hypotheses=tuple(_hypotheses(study, servers)),
    )


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


def _hypotheses(study: Study, servers: list[ServerStep]) -> list[HypothesisStep]:
    from compiler.metrics import METRICS
    from compiler.select import Target, sides

    def side(target: Target, level: str) -> HypothesisSide:
        on = [s for s in servers if s.arm == target.arm]
        points = [
            p.id for s in on for p in s.points
            if level == "point" and p.workload == target.workload and p.level == target.level
        ]
        hosts = [s.id for s in on if level == "server" or any(p.id in points for p in s.points)]
        closed = study.load.concurrency is not None
        return HypothesisSide(
            arm=target.arm, workload=target.workload,
            concurrency=int(target.level) if closed and target.level is not None else None,
            rate_rps=None if closed or target.level is None else float(target.level),
            points=tuple(points), servers=tuple(hosts),
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
    study: Study, arm: str, cache: Literal["reset", "keep"], vocab: int, shape: Any, hardware: Any, kv_dtype: str
) -> list[PointStep]:
    load = study.load
    vocab_lo, vocab_hi = 16, max(32, int(vocab * 0.9))
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
                estimate = _estimate_point_s(params, shape, hardware, kv_dtype)
                out.append(
                    PointStep.model_validate({
                        "id": f"{study.study.id}/{arm}/{wname}/{label}/r{repeat}",
                        "estimated_s": estimate,
                        "fingerprint": fingerprint(params),
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
