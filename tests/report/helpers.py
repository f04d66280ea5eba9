"""Small results databases written through Store's own write API, and study files to score them with."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from runner.store.records import (
    CheckResult,
    PointRecord,
    PointSummary,
    RunRecord,
    ServerRecord,
    TelemetrySample,
)
from runner.store.store import Store

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "models" / "tiny-qwen3"


def study_text(hypotheses: str, *, study_id: str = "toy", title: str = "Toy study", claim_extra: str = "",
               hardware: str = "cpu") -> str:
    """A two-arm, one-workload, concurrency [1, 4] study on the tiny model; `hypotheses` is TOML."""
    return f'''
[study]
id = "{study_id}"
title = {title!r}
question = "Does the toy behave?{claim_extra}"
hardware = "{hardware}"

[model]
path = "{TINY_MODEL}"
name = "tiny"

[engine]
max_model_len = 2048

[arms.a]
description = "arm a"

[arms.b]
description = "arm b"
cache = "keep"

[workloads.w]
input_len = 128
output_len = 32

[load]
concurrency = [1, 4]
requests = 8
warmup = 2
repeats = 3
{hypotheses}
'''


def write_study(tmp: Path, hypotheses: str, **kw: Any) -> Path:
    path = tmp / f"{kw.get('study_id', 'toy')}.toml"
    path.write_text(study_text(hypotheses, **kw))
    return path


@dataclass
class P:
    """One point to commit: metrics by name, and the checks that did not pass as (name, severity)."""

    arm: str
    concurrency: int
    repeat: int
    metrics: dict[str, float]
    status: str = "ok"
    failed_checks: list[tuple[str, str]] = field(default_factory=list)
    workload: str = "w"
    telemetry: list[dict[str, Any]] = field(default_factory=list)  # TelemetrySample fields

    @property
    def point_id(self) -> str:
        return f"toy/{self.arm}/{self.workload}/c{self.concurrency}/r{self.repeat}"


def make_db(
    path: Path, points: Iterable[P], *, study_id: str = "toy", run_id: str = "run-1",
    started: datetime = datetime(2025, 1, 2, 3, 4, 5), calibrated: bool = False,
    bandwidth_Bps: float | None = None, flops_bf16: float | None = None,
    servers: dict[str, dict[str, Any]] | None = None,
) -> Path:
    with Store(path) as store:
        store.save_run(RunRecord(
            run_id=run_id, study_id=study_id, study_path=f"{study_id}.toml", study_sha256="0" * 64,
            plan_json="{}", studyc_version="0.1.0", git_sha=None, host="testhost",
            started_at=started, finished_at=started + timedelta(minutes=5), status="complete",
            vllm_version="0.0-test", torch_version="2.x", gpu_name=None, calibrated=calibrated,
            bandwidth_Bps=bandwidth_Bps, flops_bf16=flops_bf16,
        ))
        for arm, extra in (servers or {"a": {}, "b": {}}).items():
            store.record_server(ServerRecord(**{
                "run_id": run_id, "server_id": f"{study_id}/{arm}", "arm": arm, "status": "ready",
                "started_at": started, "startup_s": 10.0, "kv_capacity_tokens": 1000, **extra,
            }))
        for i, p in enumerate(points):
            fails = [c for c in p.failed_checks if c[1] == "fail"]
            warns = [c for c in p.failed_checks if c[1] == "warn"]
            row = PointRecord(
                run_id=run_id, point_id=p.point_id, server_id=f"{study_id}/{p.arm}", arm=p.arm,
                workload=p.workload, concurrency=p.concurrency, repeat=p.repeat,
                status=p.status, cache_policy="keep" if p.arm == "b" else "reset",
                started_at=started + timedelta(seconds=i), valid=p.status == "ok" and not fails,
                flagged=bool(warns) or p.arm == "b", summary=PointSummary(**p.metrics),  # type: ignore[arg-type]
            )
            names = {"littles_law", "cache_cold", "errors"} | {c[0] for c in p.failed_checks}
            severity = dict(p.failed_checks)
            checks = [
                CheckResult(p.point_id, n, n not in severity, severity.get(n, "fail"), 0.0, 0.03,  # type: ignore[arg-type]
                            f"{n} detail")
                for n in sorted(names)
            ]
            telemetry = [TelemetrySample(point_id=p.point_id, **t) for t in p.telemetry]
            store.commit_point(row, [], checks, telemetry)
    return path


_POINT = {"arm": "a", "workload": "w", "concurrency": 1, "rate_rps": None, "repeat": 1, "requests": 8, "warmup": 0,
          "cache": "reset", "input_len": 128, "output_len": 32, "prefix_len": 0, "prompt_seed": 0, "vocab_lo": 16,
          "vocab_hi": 100, "arrival": "poisson", "burstiness": 1.0, "request_timeout_s": 60.0,
          "point_timeout_s": None, "estimated_s": 1.0, "fingerprint": "f"}
_LAUNCH = {"arm": "a", "argv": ["serve", "m"], "env": {}, "model_dir": "m", "served_model_name": "m",
           "kv_cache_dtype": "auto", "estimated_start_s": 1.0, "fingerprint": "f"}
_V2_LAUNCH = {"launch": 1, "block": 1, "order": 1}


def _toy_point(point: dict[str, Any]) -> dict[str, Any]:
    """A point's arm, workload and level from a toy id (toy/<arm>/<workload>/c<level>/<tag>), where it has one."""
    parts = str(point["id"]).split("/")
    if len(parts) == 5 and parts[0] == "toy" and parts[3].startswith("c") and parts[3][1:].isdigit():
        return {"arm": parts[1], "workload": parts[2], "concurrency": int(parts[3][1:])}
    return {}


def plan_json(plan: dict[str, Any]) -> str:
    """A stored plan's JSON from the fields a test cares about (schema v2 `launches` or v1 `servers`), every
    other field a plain default, so that `Plan.from_stored` reads it."""
    v1 = plan.get("schema_version") == 1
    key = "servers" if v1 else "launches"
    launches = [{**_LAUNCH, **({} if v1 else _V2_LAUNCH), **launch,
                 "points": [{**_POINT, **_toy_point(p), **p} for p in launch.get("points", ())]}
                for launch in plan.get(key, ())]
    design = {"seed": 0, "launches": {}, "repeats": 1, "blocks": [], **plan.get("design", {})}
    full = {"study_id": "toy", "title": "t", "study_path": "toy.toml", "study_sha256": "0", "hardware": "cpu",
            "checks": {}, "estimated_s": 0.0, "estimated_max_s": 0.0, "estimate_basis": "", **plan, key: launches}
    if not v1:
        full["design"] = design
    return json.dumps(full)


def with_searches(plan: Any, estimated_s: float = 100.0) -> tuple[Any, Any]:
    """`plan` with a capacity search of `estimated_s` on every launch of arm a, and a launch of its own
    (arm c, a copy of arm a's first launch) that runs only that search. Returns (that plan, that launch)."""
    from compiler.plan import SearchStep

    search = SearchStep.model_construct(id="toy/a/search", estimated_s=estimated_s)
    first_a = next(launch for launch in plan.launches if launch.arm == "a" and launch.block == 1)
    only_search = first_a.model_copy(update={"id": "toy/c", "arm": "c", "points": (), "searches": (search,)})
    return plan.model_copy(update={"launches": (*(
        launch.model_copy(update={"searches": (search,)}) if launch.arm == "a" else launch
        for launch in plan.launches), only_search)}), only_search
