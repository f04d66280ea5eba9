"""Plan -> DuckDB: start each server step, run its points, commit each point in one transaction.

A server step is self-contained (`run_server_step`: its plan slice in, outcomes out), so steps can
later be spread over GPUs or dispatched elsewhere without reshaping this loop.
"""

from __future__ import annotations

import json
import platform
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compiler.plan import Plan, PointStep, ServerStep
from runner.point import Endpoint, PointContext, PointOutcome, log_size, log_warnings, run_point
from runner.records import PointRecord, PointSummary, RunRecord, ServerRecord, redact_argv
from runner.store import Store, as_json
from studyc import __version__
from studyc.errors import EngineError, StudycError
from studyc.settings import parse_cpus

if TYPE_CHECKING:
    from report.ledger import PointPrediction
    from studyc.settings import Settings


@dataclass
class RunOptions:
    """Everything a run needs from the command line and the settings (read once, by the caller)."""

    db: Path
    engine_command: list[str]
    python_argv: list[str]
    runs_dir: Path
    gpu_index: int = 0
    client_cpus: str = "auto"  # STUDYC_CLIENT_CPUS: 'auto', 'all' or a list like '1,2-3'
    resume: bool = False
    keep_going: bool = False
    startup_timeout_s: float | None = None
    calibrate: bool = True
    client_selftest: bool = True


def run_options(settings: Settings, db: Path, **flags: Any) -> RunOptions:
    """RunOptions from loaded settings plus command-line flags (resume, keep_going, calibrate, ...)."""
    return RunOptions(
        db=db, engine_command=list(settings.vllm_argv), python_argv=list(settings.python_argv),
        runs_dir=Path(settings.runs_dir) if settings.runs_dir else db.parent / "runs",
        gpu_index=int(settings.gpu_index), client_cpus=settings.client_cpus,
        startup_timeout_s=settings.startup_timeout_s, **flags,
    )


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


SOURCE_ROOT = Path(__file__).resolve().parent.parent  # the folder holding runner/, studyc/, compiler/


def git_sha(root: Path = SOURCE_ROOT) -> str | None:
    """The commit of studyc's own source: None unless `root` is the top of a git checkout with a
    commit (an installed copy inside some other repository is not studyc's checkout)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2:
        return None
    top, sha = lines
    if Path(top).resolve() != root.resolve() or not re.fullmatch(r"[0-9a-f]{40}", sha):
        return None
    return sha


def run_plan(plan: Plan, options: RunOptions, progress: Progress | None = None) -> RunReport:
    """Carry out a plan. Ctrl-C stops cleanly: no orphaned server, committed points kept."""
    progress = progress or Progress()
    origin = time.monotonic()
    with Store(options.db) as store:
        run_id, done = _open_run(store, plan, options, progress)
        report = RunReport(run_id=run_id)
        run = _run(store, run_id)
        predictions = _predictions(store, plan, run, progress)
        ctx = PointContext(
            thresholds=plan.checks,
            client_ceiling_chunks_per_s=run.client_ceiling_chunks_per_s,
            gpu_index=options.gpu_index,
            clock_origin_s=origin,
            client_cpus=parse_cpus(options.client_cpus, gpu_present=bool(run.nvml_available)),
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
                        _commit(store, run_id, step, outcome, predictions.get(outcome.point.id))
                        _account(report, outcome)
                        progress.point_done(outcome)
                        if outcome.status != "ok" and not options.keep_going:
                            raise StudycError(f"point {outcome.point.id} failed: {outcome.error}")
                except EngineError as exc:
                    report.servers_failed.append(step.id)
                    if not options.keep_going:
                        raise  # the CLI prints it; printing here too would show it twice
                    progress.message(f"server {step.id} failed: {exc.message}")
            status = "complete" if not (report.points_failed or report.servers_failed) else "partial"
        finally:
            report.wall_s = time.monotonic() - origin
            store.save_run(replace(_run(store, run_id), status=status, finished_at=datetime.now(UTC)))
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
    log_start = log_size(log_path)
    record = ServerRecord(
        run_id=run_id, server_id=step.id, arm=step.arm, fingerprint=step.fingerprint,
        argv_json=as_json(redact_argv(list(server.argv))), env_json=as_json(step.env),
        started_at=datetime.now(UTC), log_path=str(log_path),
    )
    try:
        server.start()
        info = server.wait_ready()
    except EngineError as exc:
        server.stop()
        store.record_server(replace(record, status="failed", error=exc.message,
                                    warnings=log_warnings(log_path, log_start)))
        raise
    except BaseException:
        server.stop()
        raise
    store.record_server(replace(
        record, status="ready", startup_s=info.startup_s, kv_capacity_tokens=info.kv_capacity_tokens,
        vllm_version=info.vllm_version, torch_version=info.torch_version, gpu_name=info.gpu_name,
        warnings=log_warnings(log_path, log_start),
    ))
    _fill_run_versions(store, run_id, info)
    progress.server(step, f"ready in {info.startup_s:.1f} s, KV {info.kv_capacity_tokens or '?'} tokens")
    endpoint = Endpoint(info.base_url, info.api_key, step.served_model_name, log_path)
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
            store.save_run(replace(previous, status="running", plan_json=plan.to_json()))
            progress.message(f"resuming run {previous.run_id}")
            return previous.run_id, store.done_points(previous.run_id)
        progress.message("nothing to resume: starting a new run")
    run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    run = RunRecord(
        run_id=run_id, study_id=plan.study_id, study_path=plan.study_path, study_sha256=plan.study_sha256,
        plan_json=plan.to_json(), studyc_version=__version__, git_sha=git_sha(), host=socket.gethostname(),
        started_at=datetime.now(UTC), status="running", engine_command=" ".join(options.engine_command),
        notes=platform.platform(),
    )
    run = _calibration(run, options, progress)
    run = _client_ceiling(run, options, progress)
    store.save_run(_gpu(run, options))
    return run_id, {}


def _run(store: Store, run_id: str) -> RunRecord:
    run = store.run(run_id)
    if run is None:
        raise StudycError(f"run {run_id} vanished from {store.path}")
    return run


def _calibration(run: RunRecord, options: RunOptions, progress: Progress) -> RunRecord:
    if not options.calibrate:
        return replace(run, calibrated=False, calibration_json=as_json({"reason": "skipped (--no-calibrate)"}))
    from runner.calibrate import calibrate

    progress.message("calibrating the machine (HBM bandwidth, bf16 matmul)")
    cal = calibrate(options.python_argv)
    progress.message(
        f"calibrated: {cal.bandwidth_Bps / 1e12:.3f} TB/s, {cal.flops_bf16 / 1e12:.0f} TFLOP/s on {cal.device}"
        if cal.calibrated and cal.bandwidth_Bps and cal.flops_bf16
        else f"not calibrated: {cal.reason}"
    )
    return replace(
        run, calibrated=cal.calibrated, bandwidth_Bps=cal.bandwidth_Bps, flops_bf16=cal.flops_bf16,
        calibration_json=as_json({"device": cal.device, "reason": cal.reason, "details": cal.details}),
    )


def _client_ceiling(run: RunRecord, options: RunOptions, progress: Progress) -> RunRecord:
    if not options.client_selftest:
        return run
    progress.message("measuring the load generator's own ceiling on this host")
    try:
        from runner.ceiling import measure_client_ceiling

        found = measure_client_ceiling()
    except Exception as exc:  # the self-test is advisory: record why it is missing
        return replace(run, client_ceiling_json=as_json({"error": f"{type(exc).__name__}: {exc}"}))
    return replace(run, client_ceiling_chunks_per_s=found.get("chunks_per_s"), client_ceiling_json=as_json(found))


def _gpu(run: RunRecord, options: RunOptions) -> RunRecord:
    from runner.nvml import gpu_info

    info = gpu_info(options.gpu_index)
    if info is None:
        return replace(run, nvml_available=False)
    from runner.point import NVML_NOTE

    return replace(run, nvml_available=True, gpu_name=info.get("name"), driver_version=info.get("driver_version"),
                   notes="; ".join(x for x in (run.notes, NVML_NOTE) if x))


def _fill_run_versions(store: Store, run_id: str, info: Any) -> None:
    """The engine's versions and GPU, where the run does not have them yet (the first server's)."""
    run = _run(store, run_id)
    filled = replace(
        run,
        vllm_version=run.vllm_version or info.vllm_version,
        torch_version=run.torch_version or info.torch_version,
        gpu_name=run.gpu_name or info.gpu_name,
        driver_version=run.driver_version or info.driver_version,
    )
    if filled != run:
        store.save_run(filled)


def _predictions(store: Store, plan: Plan, run: RunRecord, progress: Progress) -> dict[str, PointPrediction]:
    """The step-time model's prediction for every point, fitted from the other runs in this database on
    the host's GPU (this run's own points never fit it). Where it cannot predict, each point says why."""
    from report.ledger import PointPrediction, predict_points, store_points

    points = [p for p in store_points(store) if p.run_id != run.run_id]
    if not run.gpu_name:
        note = "no GPU on this host (NVML found none): the step-time model is fitted per GPU"
        return {p.id: PointPrediction(dict.fromkeys(("output_throughput", "tpot_s", "ttft_s")), note)
                for p in plan.points}
    progress.message(f"fitting the step-time model from {len({p.run_id for p in points})} run(s)")
    try:
        return predict_points(json.loads(plan.to_json()), points, hardware=run.gpu_name)
    except ValueError as exc:
        note = f"the step-time model could not be fitted: {exc}"
        return {p.id: PointPrediction(dict.fromkeys(("output_throughput", "tpot_s", "ttft_s")), note)
                for p in plan.points}


def point_record(
    run_id: str, server_id: str, outcome: PointOutcome, predicted: PointPrediction | None = None
) -> PointRecord:
    p = outcome.point
    judged = outcome.judgement
    values = predicted.values if predicted else {}
    note = predicted.note if predicted else "no prediction: open-loop points are not replayed by the step-time model"
    return PointRecord(
        predicted_output_throughput=values.get("output_throughput"), predicted_tpot_s=values.get("tpot_s"),
        predicted_ttft_s=values.get("ttft_s"), prediction_note=note or None,
        run_id=run_id, point_id=p.id, server_id=server_id, arm=p.arm, workload=p.workload,
        concurrency=p.concurrency, rate_rps=p.rate_rps, level=p.level, repeat=p.repeat,
        fingerprint=p.fingerprint, status=outcome.status, error=outcome.error, cache_policy=p.cache,
        reset_ok=outcome.reset.ok if outcome.reset else None, started_at=outcome.started_at,
        summary=judged.summary if judged else PointSummary(), valid=outcome.valid, flagged=outcome.flagged,
        phases_json=as_json(outcome.phases), server_warnings=outcome.server_warnings,
        reset_attempts=outcome.reset.attempts if outcome.reset else None,
        verdict=judged.reason if judged else None, counters_before_json=outcome.counters_before_json,
        counters_after_json=outcome.counters_after_json,
    )


def _commit(
    store: Store, run_id: str, step: ServerStep, outcome: PointOutcome, predicted: PointPrediction | None = None
) -> None:
    checks = outcome.judgement.checks if outcome.judgement else ()
    store.commit_point(point_record(run_id, step.id, outcome, predicted), outcome.records, checks,
                       outcome.telemetry)


def _account(report: RunReport, outcome: PointOutcome) -> None:
    report.points_done += 1
    report.window_s += outcome.window_s
    if outcome.status != "ok":
        report.points_failed.append(outcome.point.id)
    elif not outcome.valid:
        report.invalid.append(outcome.point.id)
    if outcome.flagged:
        report.flagged.append(outcome.point.id)

