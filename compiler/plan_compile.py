"""Study -> Plan: compile a validated study into the plan its run carries out. Pure: same file in,
byte-identical plan out (the plan's types are compiler.plan's)."""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from compiler.capacity import wave_requests
from compiler.configurations import compile_cache_off, primed_configurations
from compiler.engine_options import parallel_gpus
from compiler.load import LoadedStudy
from compiler.metrics import MACHINE_METRICS
from compiler.plan import Block, BlockDesign, Engine, Launch, Plan, PointStep, SearchStep, mark_cold
from compiler.plan_estimate import estimate_point_s
from compiler.plan_resolve import plan_hypotheses
from compiler.study import Rung, Study
from compiler.workload import Shape
from compiler.workload_check import conversation_requests, shape_of

if TYPE_CHECKING:
    from compiler.hardware import Hardware
    from compiler.modelmath import ModelShape


@dataclass(frozen=True)
class ArmWorkload:
    """A workload on an arm (`shape_of`): its shape (None: classic), mean prompt and mean output length."""

    form: Shape | None
    mean_in: float
    mean_out: float

    @property
    def turns(self) -> int:
        return self.form.turns if self.form else 1


@dataclass(frozen=True)
class ArmServer:
    """An arm's server, resolved once per compile: the fields every launch of the arm carries, and what its
    points are estimated from."""

    argv: tuple[str, ...]
    env: dict[str, str]
    model_dir: str
    served_model_name: str
    kv_cache_dtype: str
    engine: Engine
    estimated_start_s: float
    fingerprint: str
    replicas: int
    balance: Literal["least_outstanding", "round_robin"]
    gpus_per_server: int
    gpus: int
    model: ModelShape | None  # from the model folder's config; None without one
    workloads: dict[str, ArmWorkload]  # by workload name, read once (a trace is hashed here)


@dataclass(frozen=True)
class LaunchSite:
    """What every point and search of one launch shares."""

    study: Study
    arm: str
    server: ArmServer
    hardware: Hardware
    launch: int | None  # None for an arm's only launch: its ids and fingerprints are those of schema v1
    block: int
    cache: Literal["reset", "keep"]

    @property
    def vocab(self) -> int:
        return self.server.model.vocab_size if self.server.model else 32000


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


LAUNCH_CALIBRATION_S = 6.0  # runner.measure.calibrate once per launch (5-6 s a run on the H200 host)


def compile_study(loaded: LoadedStudy) -> Plan:
    """Compile a validated study. Pure: same file in, byte-identical plan out."""
    from compiler.hardware import get_hardware

    study = loaded.study
    hardware = get_hardware(study.study.hardware)
    # Paths in the plan are absolute, so the plan means the same from any working directory;
    # fingerprints use them relative to the study file, so they don't depend on the checkout's place.
    study_path = os.path.normpath(os.path.abspath(loaded.path))
    directory = os.path.dirname(study_path)
    # A GPU start, measured on the H200 (Qwen3-8B shape, vLLM 0.26, 2026-12-04, launch-cost and engine-fork):
    # 35-45 s held with the compile cache warm (58-66 s with --cold-starts), 100-113 s for the first start of
    # a configuration on a fresh machine (its compile cache cold) and up to 140 s on earlier machines.
    start_s = 25.0 if hardware.name == "cpu" else 45.0
    first_start_s = 25.0 if hardware.name == "cpu" else 140.0
    servers = {name: _arm_server(study, name, directory, start_s) for name in study.arms}
    design = plan_design(study)
    launches: list[Launch] = []
    for block in design.blocks:
        for order, lid in enumerate(block.launches, start=1):
            arm_name, index = _launch_key(lid, study.study.id)
            arm = study.arms[arm_name]
            site = LaunchSite(study, arm_name, servers[arm_name], hardware,
                              index if lid.endswith(f"/L{index}") else None, block.index,
                              arm.cache or study.load.cache)
            launches += _launch_steps(site, lid, index, block, order)
    launches = _first_starts_cold(launches, first_start_s)
    required = [s for s in launches if s.required]
    # A machine metric named: each launch calibrates its GPU first (5-6 s a calibration on the H200 host).
    calibrate = any(h.metric in MACHINE_METRICS for h in study.hypothesis)
    calibrate_s = LAUNCH_CALIBRATION_S if calibrate else 0.0
    # On a GPU host each configuration's first (compiling) start is an unmeasured prime (runner.execute.prime):
    # one start more per configuration, at the warm start's time
    primed = 0 if hardware.name == "cpu" else primed_configurations(required)
    primes_s = start_s * primed
    total = sum(s.estimated_s + calibrate_s for s in required) + primes_s
    most = sum(s.estimated_s + calibrate_s for s in launches) + primes_s
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
            f"{len(required)} launch(es) one at a time, each starting its servers in {start_s:.0f} s"
            + (" (held; about 20 s more with --cold-starts)" if hardware.name != "cpu" else "")
            + (f" ({first_start_s:.0f} s the first start of a configuration: its compile cache cold; that start is"
               f" an unmeasured prime, {primed} x {start_s:.0f} s more, unless --no-prime)"
               if first_start_s != start_s else "")
            + "; decode at "
            f"75% of the {hardware.name} spec-sheet bandwidth roofline, with a per-step floor; prefill at half the spec-sheet bf16 FLOP/s, no prefix cache"
            + ("; a capacity search as its probes at hi, lo and the middle of the range" if study.load.search else "")
            + (f"; each launch first calibrates its GPU ({calibrate_s:.0f} s)" if calibrate else "")
        ),
        hypotheses=tuple(plan_hypotheses(study, launches)),
        slo=study.slo,
        calibrate_launches=calibrate,
        prime_s=primes_s,
    )


def _arm_server(study: Study, arm_name: str, directory: str, start_s: float) -> ArmServer:
    """The arm's server: its argv (paths absolute) and env, and the fingerprint of both (paths relative to the
    study file's folder)."""
    from compiler.modelconfig import load_model

    arm = study.arms[arm_name]
    workloads = {name: ArmWorkload(*shape_of(study, name, arm_name, Path(directory))) for name in study.workloads}
    model_rel = arm.model or study.model.path
    model_dir = os.path.normpath(os.path.join(directory, model_rel)) if model_rel else None
    options = {**study.engine, **arm.args}
    served = _served_name(study, arm.model, model_dir)
    portable = _serve_argv(study, ".", model_dir and os.path.relpath(model_dir, directory), served, options)
    env = {**study.env, **arm.env}
    per_server = parallel_gpus(options)
    kv_dtype = str(options.get("kv_cache_dtype", options.get("kv-cache-dtype", "auto")))
    argv = tuple(_serve_argv(study, directory, model_dir, served, options))
    return ArmServer(
        argv=argv, env=env, model_dir=model_dir or served, served_model_name=served, kv_cache_dtype=kv_dtype,
        engine=Engine.from_argv(argv), estimated_start_s=start_s,
        fingerprint=fingerprint({"argv": portable, "env": env}), replicas=arm.replicas, balance=arm.balance,
        gpus_per_server=per_server, gpus=arm.replicas * per_server,
        model=load_model(model_dir) if model_dir else None, workloads=workloads,
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


def _first_starts_cold(launches: list[Launch], first_start_s: float) -> list[Launch]:
    """The first launch of each configuration (its fingerprint) starts in `first_start_s`: its compile cache
    is cold on a fresh machine; every launch of an arm that turns the cache off does."""
    seen: set[str] = set()
    out = []
    for launch in launches:
        cold = launch.fingerprint not in seen or compile_cache_off(launch.env)
        if cold and launch.estimated_start_s < first_start_s:
            launch = launch.model_copy(update={"estimated_start_s": first_start_s})
        seen.add(launch.fingerprint)
        out.append(launch)
    return out


def arm_warmup(study: Study, arm: str) -> int:
    """Warmup requests before each of the arm's points: the arm's own `warmup`, else load.warmup."""
    own = study.arms[arm].warmup
    return study.load.warmup if own is None else own


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


def plan_design(study: Study) -> BlockDesign:
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
    return BlockDesign(
        seed=seed, seed_from=source, launches=counts, repeats=study.load.repeats, blocks=tuple(blocks),
        budget=budget, gpus=study.design.gpus,
    )


def _launch_key(launch: str, study_id: str) -> tuple[str, int]:
    parts = launch[len(study_id) + 1:].split("/")
    return parts[0], int(parts[1][1:]) if len(parts) > 1 else 1


def _launch_steps(site: LaunchSite, lid: str, index: int, block: Block, order: int) -> list[Launch]:
    """The launch `lid` (launch `index` of its arm, at `order` in `block`); with a server per point, one
    launch per point."""
    arm, server = site.study.arms[site.arm], site.server
    points = _points(site, lid)

    def launch(at: str, steps: tuple[PointStep, ...], searches: tuple[SearchStep, ...] = ()) -> Launch:
        return Launch(
            id=at, arm=site.arm, launch=index, block=block.index, order=order, required=block.required,
            replicas=server.replicas, balance=server.balance, gpus_per_server=server.gpus_per_server,
            gpus=server.gpus, server_ids=_server_ids(at, arm.replicas), argv=server.argv, env=server.env,
            expect_log=tuple(arm.expect_log), model_dir=server.model_dir, served_model_name=server.served_model_name,
            kv_cache_dtype=server.kv_cache_dtype, engine=server.engine, estimated_start_s=server.estimated_start_s,
            fingerprint=server.fingerprint, points=steps, searches=searches,
        )

    if site.study.load.server == "per-point":
        fresh = [p.model_copy(update={"exchangeable": True, "not_exchangeable_because": ""}) for p in points]
        return [launch(p.id, (p,)) for p in fresh]
    return [launch(lid, tuple(points), _searches(site, lid))]


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


def _points(site: LaunchSite, lid: str) -> list[PointStep]:
    """The points of one launch, repeats interleaved."""
    load = site.study.load
    out: list[PointStep] = []
    for repeat in range(1, load.repeats + 1):
        for wname in site.study.workloads:
            for index, rung in enumerate(load.ladder):
                out.append(_point(site, wname, rung, load.requests_at(index), repeat,
                                  f"{lid}/{wname}/{rung.id_label}/r{repeat}"))
    return list(mark_cold(out))


def _searches(site: LaunchSite, lid: str) -> tuple[SearchStep, ...]:
    """One capacity search per workload on this launch; its template is the probe at `hi`."""
    search, slo = site.study.load.search, site.study.slo
    if search is None or slo is None:
        return ()
    out = []
    for wname in site.study.workloads:
        sid = f"{lid}/{wname}/search"

        def probe(level: float, wname: str = wname, sid: str = sid) -> PointStep:
            """The probe at `level` as the plan estimates it (its own request count with waves)."""
            rung = Rung(concurrency=int(level)) if search.over == "concurrency" else Rung(rate_rps=level)
            requests = site.study.load.requests_at(0) if search.waves is None else \
                wave_requests(search.waves, int(level), site.server.workloads[wname].turns)
            return _point(site, wname, rung, requests, 1, f"{sid}/{rung.id_label}/r1")

        template = probe(search.hi)
        # hi, then lo, then bisection: the later probes taken at the middle of the range
        middle = (search.lo + search.hi) / 2
        estimate = template.estimated_s + probe(search.lo).estimated_s + (search.probes - 2) * probe(
            float(int(middle)) if search.over == "concurrency" else middle).estimated_s
        out.append(SearchStep(
            id=sid, arm=site.arm, workload=wname, over=search.over, lo=search.lo, hi=search.hi, probes=search.probes,
            attainment=slo.attainment, template=template, estimated_s=round(estimate, 1), waves=search.waves,
        ))
    return tuple(out)


def _point(site: LaunchSite, wname: str, rung: Rung, requests: int, repeat: int, point_id: str) -> PointStep:
    """One point of workload `wname` at `rung`; `requests` counts conversations for a multi-turn shape."""
    study, arm = site.study, site.arm
    load, work, on_arm = study.load, study.workloads[wname], site.server.workloads[wname]
    form = on_arm.form
    if form is not None:  # multi-turn: whole conversations
        requests = conversation_requests(requests, form.turns)
    # The point's resolved parameters: its fields, and what its fingerprint is of.
    params = {
        "arm": arm, "workload": wname, "concurrency": rung.concurrency,
        "rate_rps": rung.rate_rps, "repeat": repeat, "requests": requests,
        "warmup": arm_warmup(study, arm), "cache": site.cache, "input_len": round(on_arm.mean_in),
        "output_len": round(on_arm.mean_out), "prefix_len": work.prefix_len, "prompt_seed": work.seed,
        "vocab_lo": 16, "vocab_hi": max(32, int(site.vocab * 0.9)), "arrival": load.arrival,
        "burstiness": load.burstiness, "request_timeout_s": load.request_timeout_s,
        "point_timeout_s": load.point_timeout_s,
    }
    estimate = estimate_point_s(params, site.server.model, site.hardware, site.server.kv_cache_dtype,
                                turns=on_arm.turns, think_s=form.think_s if form else 0.0)
    keyed: dict[str, Any] = params if site.launch is None else {**params, "launch": site.launch}
    if form is not None:  # a classic point's fingerprint stays as before shapes existed
        keyed = {**keyed, "shape": form.fingerprint_payload()}
    return PointStep.model_validate({
        "id": point_id, "launch": site.launch or 1, "block": site.block,
        "burst": load.burst and rung.concurrency is not None,
        "estimated_s": estimate, "fingerprint": fingerprint(keyed), "shape": form, **params,
    })
