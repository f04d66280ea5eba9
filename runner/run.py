"""Plan -> DuckDB: start each server step, run its points, commit each point in one transaction.

A server step is self-contained (`run_server_step`: its plan slice in, outcomes out), so steps can
later be spread over GPUs or dispatched elsewhere without reshaping this loop.
"""

from __future__ import annotations

import platform
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from compiler.plan import Plan, PointStep, ServerStep
from runner.point import Endpoint, PointContext, PointOutcome, run_point
from runner.store import Store, as_json
from studyc import __version__
from studyc.errors import EngineError, StudycError


@dataclass
class RunOptions:
    db: Path
    resume: bool = False
    keep_going: bool = False
    runs_dir: Path = Path("runs")
    engine_command: list[str] | None = None
    startup_timeout_s: float | None = None
    calibrate: bool = True
    client_selftest: bool = True


@dataclass
class RunReport:
    run_id: str
    points_done: int = 0
    points_skipped: int = 0
    points_failed: list[str] = field(default_factory=list)
    servers_failed: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    flagged: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    window_s: float = 0.0


class Progress:
    """Receives progress events; the CLI renders them live, tests may ignore them."""

    def start(self, total: int, done: int) -> None: ...
    def server(self, step: ServerStep, status: str) -> None: ...
    def point_started(self, point: PointStep) -> None: ...
    def point_done(self, outcome: PointOutcome) -> None: ...
    def message(self, text: str) -> None: ...
    def close(self) -> None: ...


def git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def run_plan(plan: Plan, options: RunOptions, progress: Progress | None = None) -> RunReport:
    """Carry out a plan. Ctrl-C stops cleanly: no orphaned server, committed points kept."""
    progress = progress or Progress()
    origin = time.monotonic()
    with Store(options.db) as store:
        run_id, done = _open_run(store, plan, options, progress)
        report = RunReport(run_id=run_id)
        run = store.run(run_id) or {}
        ctx = PointContext(
            thresholds=plan.checks,
            client_ceiling_chunks_per_s=run.get("client_ceiling_chunks_per_s"),
            gpu_index=_gpu_index(),
            clock_origin_s=origin,
            client_cpus=_client_cpus(bool(run.get("nvml_available"))),
        )
        todo = [(s, [p for p in s.points if done.get(p.id) != p.fingerprint]) for s in plan.servers]
        report.points_skipped = len(plan.points) - sum(len(ps) for _, ps in todo)
        progress.start(len(plan.points), report.points_skipped)
        status = "interrupted"
        try:
            for step, points in todo:
                if not points:
                    continue
                try:
                    for outcome in run_server_step(step, points, ctx, store, run_id, options, progress):
                        _commit(store, run_id, step, outcome)
                        _account(report, outcome)
                        progress.point_done(outcome)
                        if outcome.status != "ok" and not options.keep_going:
                            raise StudycError(f"point {outcome.point.id} failed: {outcome.error}")
                except EngineError as exc:
                    report.servers_failed.append(step.id)
                    progress.message(f"server {step.id} failed: {exc.message}")
                    if not options.keep_going:
                        raise
            status = "complete" if not (report.points_failed or report.servers_failed) else "partial"
        finally:
            report.wall_s = time.monotonic() - origin
            store.update_run(run_id, status=status, finished_at=datetime.now(UTC))
            progress.close()
    return report


def run_server_step(
    step: ServerStep,
    points: list[PointStep],
    ctx: PointContext,
    store: Store,
    run_id: str,
    options: RunOptions,
    progress: Progress,
) -> Iterator[PointOutcome]:
    """Start one server, run its points, stop it. Yields each point's outcome as it completes."""
    from runner.engine import VllmServer

    log_dir = options.runs_dir / run_id
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / (step.id.replace("/", "__") + ".log")
    progress.server(step, "starting")
    if Path(step.model_dir, "config.json").is_file():
        from runner.tokenizer import ensure_tokenizer

        if ensure_tokenizer(step.model_dir):
            progress.message(f"built the local tokenizer of {step.model_dir}")
    server = VllmServer(
        step.argv, env=step.env, log_path=log_path, command=options.engine_command,
        startup_timeout_s=options.startup_timeout_s,
    )
    row: dict[str, Any] = {
        "run_id": run_id, "server_id": step.id, "arm": step.arm, "fingerprint": step.fingerprint,
        "argv_json": as_json(list(server.argv)), "env_json": as_json(step.env),
        "started_at": datetime.now(UTC), "log_path": str(log_path),
    }
    try:
        server.start()
        info = server.wait_ready()
    except EngineError as exc:
        server.stop()
        store.record_server(row | {"status": "failed", "error": exc.message})
        raise
    except BaseException:
        server.stop()
        raise
    store.record_server(row | {
        "status": "ready", "startup_s": info.startup_s, "kv_capacity_tokens": info.kv_capacity_tokens,
        "vllm_version": info.vllm_version, "torch_version": info.torch_version, "gpu_name": info.gpu_name,
    })
    _fill_run_versions(store, run_id, info)
    progress.server(step, f"ready in {info.startup_s:.1f} s, KV {info.kv_capacity_tokens or '?'} tokens")
    endpoint = Endpoint(info.base_url, info.api_key, step.served_model_name)
    try:
        for point in points:
            progress.point_started(point)
            outcome = run_point(point, endpoint, ctx)
            if outcome.status != "ok" and server.poll() is not None:
                outcome.error = f"{outcome.error}; server exited ({server.poll()}): {server.log_tail(8)}"
                yield outcome
                raise EngineError(f"server {step.id} died during {point.id}")
            yield outcome
    finally:
        server.stop()
        progress.server(step, "stopped")


def _open_run(store: Store, plan: Plan, options: RunOptions, progress: Progress) -> tuple[str, dict[str, str]]:
    if options.resume:
        previous = store.latest_run(plan.study_id)
        if previous is not None:
            store.update_run(previous["run_id"], status="running", plan_json=plan.to_json())
            progress.message(f"resuming run {previous['run_id']}")
            return previous["run_id"], store.done_points(previous["run_id"])
        progress.message("nothing to resume: starting a new run")
    run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    row: dict[str, Any] = {
        "run_id": run_id, "study_id": plan.study_id, "study_path": plan.study_path,
        "study_sha256": plan.study_sha256, "plan_json": plan.to_json(), "studyc_version": __version__,
        "git_sha": git_sha(), "host": socket.gethostname(), "started_at": datetime.now(UTC),
        "status": "running", "engine_command": " ".join(options.engine_command or _engine_command()),
        "notes": platform.platform(),
    }
    row |= _calibration(options, progress) | _client_ceiling(options, progress) | _gpu(progress)
    store.begin_run(row)
    return run_id, {}


def _engine_command() -> list[str]:
    from studyc.settings import load_settings

    return list(load_settings().vllm_argv)


def _gpu_index() -> int:
    from studyc.settings import load_settings

    return int(load_settings().gpu_index)


def _client_cpus(gpu_present: bool) -> tuple[int, ...] | None:
    from studyc.settings import load_settings, parse_cpus

    return parse_cpus(load_settings().client_cpus, gpu_present=gpu_present)


def _calibration(options: RunOptions, progress: Progress) -> dict[str, Any]:
    if not options.calibrate:
        return {"calibrated": False, "calibration_json": as_json({"reason": "skipped (--no-calibrate)"})}
    from runner.calibrate import calibrate
    from studyc.settings import load_settings

    progress.message("calibrating the machine (HBM bandwidth, bf16 matmul)")
    cal = calibrate(load_settings().python_argv)
    progress.message(
        f"calibrated: {cal.bandwidth_Bps / 1e12:.3f} TB/s, {cal.flops_bf16 / 1e12:.0f} TFLOP/s on {cal.device}"
        if cal.calibrated and cal.bandwidth_Bps and cal.flops_bf16
        else f"not calibrated: {cal.reason}"
    )
    return {
        "calibrated": cal.calibrated, "bandwidth_Bps": cal.bandwidth_Bps, "flops_bf16": cal.flops_bf16,
        "calibration_json": as_json({"device": cal.device, "reason": cal.reason, "details": cal.details}),
    }


def _client_ceiling(options: RunOptions, progress: Progress) -> dict[str, Any]:
    if not options.client_selftest:
        return {}
    progress.message("measuring the load generator's own ceiling on this host")
    try:
        from runner.ceiling import measure_client_ceiling

        found = measure_client_ceiling()
    except Exception as exc:  # the self-test is advisory: record why it is missing
        return {"client_ceiling_json": as_json({"error": f"{type(exc).__name__}: {exc}"})}
    return {"client_ceiling_chunks_per_s": found.get("chunks_per_s"), "client_ceiling_json": as_json(found)}


def _gpu(progress: Progress) -> dict[str, Any]:
    from runner.nvml import gpu_info

    info = gpu_info(_gpu_index())
    if info is None:
        return {"nvml_available": False}
    return {"nvml_available": True, "gpu_name": info.get("name"), "driver_version": info.get("driver_version")}


def _fill_run_versions(store: Store, run_id: str, info: Any) -> None:
    run = store.run(run_id) or {}
    update = {
        k: v for k, v in {
            "vllm_version": info.vllm_version, "torch_version": info.torch_version,
            "gpu_name": info.gpu_name, "driver_version": info.driver_version,
        }.items() if v is not None and run.get(k) is None
    }
    if update:
        store.update_run(run_id, **update)


def _commit(store: Store, run_id: str, step: ServerStep, outcome: PointOutcome) -> None:
    p = outcome.point
    row = {
        "run_id": run_id, "point_id": p.id, "server_id": step.id, "arm": p.arm, "workload": p.workload,
        "concurrency": p.concurrency, "rate_rps": p.rate_rps, "level": p.level, "repeat": p.repeat,
        "fingerprint": p.fingerprint, "status": outcome.status, "error": outcome.error,
        "cache_policy": p.cache, "reset_ok": outcome.reset_ok, "started_at": outcome.started_at,
        "valid": outcome.valid, "flagged": outcome.flagged, "phases_json": as_json(outcome.phases),
    } | {k: v for k, v in outcome.summary.items()}
    requests = [
        {"run_id": run_id, "point_id": p.id, "idx": r.index, "warmup": r.warmup, "scheduled_s": r.scheduled_s,
         "sent_s": r.sent_s, "first_token_s": r.first_token_s, "end_s": r.end_s,
         "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "chunks": r.chunks, "ok": r.ok,
         "error": r.error, "status": r.status, "token_times_s": list(r.token_times_s)}
        for r in outcome.records
    ]
    checks = [{"run_id": run_id, "point_id": p.id, **c.row()} for c in outcome.checks]
    telemetry = [{"run_id": run_id, "point_id": p.id, **t} for t in outcome.telemetry]
    store.commit_point(row, requests, checks, telemetry)


def _account(report: RunReport, outcome: PointOutcome) -> None:
    report.points_done += 1
    report.window_s += float(outcome.summary.get("window_s") or 0.0)
    if outcome.status != "ok":
        report.points_failed.append(outcome.point.id)
    elif not outcome.valid:
        report.invalid.append(outcome.point.id)
    if outcome.flagged:
        report.flagged.append(outcome.point.id)


def default_runs_dir(db: Path) -> Path:
    from studyc.settings import load_settings

    configured = load_settings().runs_dir
    return Path(configured) if configured else db.parent / "runs"
