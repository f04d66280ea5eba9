"""Plan -> DuckDB: start each server step, run its points, commit each point in one transaction.

A server step is self-contained (`run_server_step`: its plan slice in, outcomes out), so steps can
later be spread over GPUs or dispatched elsewhere without reshaping this loop.
"""

from __future__ import annotations

import platform
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compiler.plan import Design, Launch, Plan, PointStep, budget_points
from runner.launch import Event, LaunchSpec, PointEvent, PointStartEvent, ServerEvent, run_launch
from runner.parallel import run_parallel
from runner.placement import Placement, idle_gpus, parse_gpus, place, place_one
from runner.point import PointContext, PointOutcome
from runner.records import PointRecord, PointSummary, RunRecord
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
    cache_dir: Path | None = None  # vLLM's compile cache lives in cache_dir/compile-cache (None: runs_dir)
    gpu_index: int = 0
    client_cpus: str = "auto"  # STUDYC_CLIENT_CPUS: 'auto', 'all' or a list like '1,2-3'
    resume: bool = False
    keep_going: bool = False
    startup_timeout_s: float | None = None
    calibrate: bool = True
    client_selftest: bool = True
    gpus: str | None = None  # --gpus: device ids ("0,1"); None: every idle GPU, or one logical device on a CPU host
    ray: str | None = None  # --ray: None off; "local" a Ray cluster started here; else the address to join
    warnings: tuple[str, ...] = ()  # preflight warnings a flag let through: stored in the run's notes
    # The sequential rule, asked before each budget block (`required = false` launches): given the open
    # store and the run id, whether a hypothesis is still undecided, or which ones (their ids: then the
    # block measures only the points they rest on). None: no budget block runs.
    decide_more: Callable[[Store, str], bool | Collection[str]] | None = None


def run_options(settings: Settings, db: Path, **flags: Any) -> RunOptions:
    """RunOptions from loaded settings plus command-line flags (resume, keep_going, calibrate, ...)."""
    return RunOptions(
        db=db, engine_command=list(settings.vllm_argv), python_argv=list(settings.python_argv),
        runs_dir=Path(settings.runs_dir) if settings.runs_dir else db.parent / "runs",
        cache_dir=settings.cache_path, gpu_index=int(settings.gpu_index), client_cpus=settings.client_cpus,
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
    devices: tuple[str, ...] = ()
    slots: int = 1  # device slots launches ran on at once (1: one after another)
    launches_not_needed: list[str] = field(default_factory=list)  # budget launches not run
    interference: dict[str, Any] | None = None  # runner.parallel.interference_result, when measured
    sequential_from: str | None = None  # why launches went back to one at a time, if they did


class Progress:
    """Receives progress events; the CLI renders them live, tests may ignore them."""

    def start(self, total: int, done: int) -> None: ...
    def server(self, step: Launch, status: str) -> None: ...
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
    """Carry out a plan: its launches in plan order (blocks), each on the devices `runner.placement`
    gives it; on one device one after another, on several at the same time (one thread per device
    slot; only this thread writes the database). Ctrl-C stops cleanly: no orphaned server,
    committed points kept."""
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
        gpu_host = bool(run.nvml_available)
        devices = resolve_devices(options.gpus, gpu_host=gpu_host, gpu_index=options.gpu_index)
        placements = place(plan, devices, gpu_host=gpu_host, client_cpus=ctx.client_cpus)
        report.devices = devices
        report.slots = len({p.slot for p in placements})
        store.save_run(replace(_run(store, run_id), devices=",".join(devices), placement_json=as_json(
            [{"launch": p.launch_id, "slot": p.slot, "devices": [list(d) for d in p.server_devices],
              "client_cpus": list(p.client_cpus) if p.client_cpus is not None else None} for p in placements])))
        specs = []
        taken = {s.server_id for s in store.servers(run_id)}  # a resumed run's servers keep their rows
        for launch, placed in zip(plan.launches, placements, strict=True):
            points = tuple(p for p in launch.points if done.get(p.id) != p.fingerprint)
            specs.append(_spec(launch, points, placed, ctx, run_id, options, gpu_host,
                               fresh_server_ids(launch, taken)))
        report.points_skipped = len(plan.points) - sum(len(sp.points) for sp in specs)
        progress.start(len(plan.points), report.points_skipped)
        driver = _Driver(store, run_id, plan, report, progress, predictions, options, origin=origin)
        status = "interrupted"
        try:
            if options.ray is not None:
                from runner.ray_exec import run_ray

                run_ray(specs, driver, options, devices=len(devices))
            elif report.slots > 1:
                progress.message(f"running launches on {report.slots} device slots at once ({','.join(devices)})")
                run_phases(specs, driver, lambda some: run_parallel(some, driver, options))
            else:
                run_phases(specs, driver, lambda some: run_sequential(some, driver))
            status = "complete" if not (report.points_failed or report.servers_failed) else "partial"
        finally:
            report.wall_s = time.monotonic() - origin
            store.save_run(replace(_run(store, run_id), status=status, finished_at=datetime.now(UTC),
                                   wall_s=round(report.wall_s, 3), window_s=round(report.window_s, 3)))
            progress.close()
    return report


def resolve_devices(gpus: str | None, *, gpu_host: bool, gpu_index: int = 0) -> tuple[str, ...]:
    """`--gpus` as given; else every GPU NVML shows idle (GPU `gpu_index` when none is); on a CPU
    host one logical device."""
    if gpus:
        return parse_gpus(gpus)
    if not gpu_host:
        return ("0",)
    return idle_gpus() or (str(gpu_index),)


def fresh_server_ids(launch: Launch, taken: set[str]) -> tuple[str, ...]:
    """The launch's server ids, or, where one is already in the run (a resumed launch), the same ids
    with the first free "~N" suffix: the servers that measured the earlier points keep their rows."""
    ids = tuple(launch.server_ids or (launch.id,))
    n = 1
    while any((sid if n == 1 else f"{sid}~{n}") in taken for sid in ids):
        n += 1
    return ids if n == 1 else tuple(f"{sid}~{n}" for sid in ids)


def _spec(launch: Launch, points: tuple[PointStep, ...], placed: Placement, ctx: PointContext, run_id: str,
          options: RunOptions, gpu_host: bool, server_ids: tuple[str, ...]) -> LaunchSpec:
    first = placed.server_devices[0][0]
    local = replace(ctx, client_cpus=placed.client_cpus,
                    gpu_index=int(first) if gpu_host and first.isdigit() else ctx.gpu_index)
    return LaunchSpec(
        launch=launch, points=points, run_id=run_id, placement=placed, ctx=local,
        engine_command=tuple(options.engine_command), log_dir=options.runs_dir / run_id,
        cache_root=(options.cache_dir or options.runs_dir) / "compile-cache", startup_timeout_s=options.startup_timeout_s,
        gpu_host=gpu_host, server_ids=server_ids,
    )


class _Driver:
    """Commits what launches emit: the one writer of the database."""

    def __init__(self, store: Store, run_id: str, plan: Plan, report: RunReport, progress: Progress,
                 predictions: dict[str, PointPrediction], options: RunOptions, origin: float | None = None) -> None:
        self.store, self.run_id, self.report, self.progress = store, run_id, report, progress
        self.predictions, self.options = predictions, options
        self.launches = {launch.id: launch for launch in plan.launches}
        self.hypotheses = {h.id: h for h in plan.hypotheses}
        self.budget = plan.design.budget
        self.origin = time.monotonic() if origin is None else origin
        self.blocks: dict[int, bool] = {}  # budget block -> run it (decided once, for all its launches)
        self.undecided: dict[int, frozenset[str]] = {}  # budget block -> the hypotheses it runs for, where named

    def handle(self, event: Event) -> None:
        if isinstance(event, ServerEvent):
            self.store.record_server(event.record)
            if event.info is not None:
                _fill_run_versions(self.store, self.run_id, event.info)
            launch = self.launches[event.record.launch_id or event.record.server_id]
            self.progress.server(launch, event.status if launch.replicas == 1
                                 else f"{event.record.server_id}: {event.status}")
        elif isinstance(event, PointStartEvent):
            self.progress.point_started(event.point)
        elif isinstance(event, PointEvent):
            outcome = event.outcome
            _commit(self.store, self.run_id, event.server_id, outcome, self.predictions.get(outcome.point.id),
                    device=event.device, client_cpus=event.client_cpus)
            _account(self.report, outcome)
            self.progress.point_done(outcome)
            if outcome.status != "ok" and not self.options.keep_going:
                raise StudycError(f"point {outcome.point.id} failed: {outcome.error}")

    def store_interference(self, found: dict[str, Any]) -> None:
        self.store.save_run(replace(_run(self.store, self.run_id), interference_json=as_json(found)))

    def server_failed(self, launch: Launch, exc: EngineError) -> None:
        self.report.servers_failed.append(launch.id)
        if not self.options.keep_going:
            raise exc  # the CLI prints it; printing here too would show it twice
        self.progress.message(f"server {launch.id} failed: {exc.message}")

    def wanted(self, spec: LaunchSpec) -> bool:
        """Whether to run the launch: it has points left and is required, or its budget block is."""
        if not spec.points:
            return False
        if spec.launch.required or self.more(spec.launch.block):
            return True
        self.report.launches_not_needed.append(spec.launch.id)
        return False

    def more(self, block: int) -> bool:
        """Whether budget block `block` runs: asked once per block, so its arms run together; never
        after a block was declined, past the budget's minutes, or without a sequential rule."""
        if block not in self.blocks:
            self.blocks[block] = self._decide(block)
        return self.blocks[block]

    def _decide(self, block: int) -> bool:
        if self.options.decide_more is None or self.budget is None or not all(self.blocks.values()):
            return False
        spent_s = time.monotonic() - self.origin
        if self.budget.minutes is not None and spent_s >= 60 * self.budget.minutes:
            self.progress.message(f"budget of {self.budget.minutes:g} min spent: block {block} not run")
            return False
        more = self.options.decide_more(self.store, self.run_id)
        named = ""
        if not isinstance(more, bool):
            self.undecided[block] = frozenset(more)
            named = f" ({', '.join(sorted(more))})"
        self.progress.message(f"block {block}: " + (f"undecided{named}: running it" if more
                                                    else "every hypothesis decided (or budget spent): not run"))
        return bool(more)

    def trimmed(self, spec: LaunchSpec) -> LaunchSpec:
        """A budget block's launch with only the points its undecided hypotheses rest on
        (`compiler.plan.budget_points`); whole where the rule named none."""
        ids = self.undecided.get(spec.launch.block)
        if spec.launch.required or ids is None:
            return spec
        points = budget_points(spec.launch, [self.hypotheses[i] for i in ids if i in self.hypotheses], spec.points)
        if len(points) < len(spec.points):
            self.progress.message(f"{spec.launch.id}: {len(points)} of {len(spec.points)} points (the rest serve "
                                  "decided hypotheses only)")
        return replace(spec, points=points)


def run_phases(specs: list[LaunchSpec], driver: _Driver, execute: Callable[[list[LaunchSpec]], None]) -> None:
    """The required launches first, all handed to `execute` at once; then each budget block in turn,
    decided and trimmed only once every launch before it has run and been committed (`execute`
    returns when its launches are done), so the sequential rule reads what they measured."""
    required = [s for s in specs if s.launch.required]
    execute([s for s in required if driver.wanted(s)])
    for block in sorted({s.launch.block for s in specs if not s.launch.required}):
        phase = []
        for spec in specs:
            if spec.launch.required or spec.launch.block != block or not driver.wanted(spec):
                continue
            spec = driver.trimmed(spec)
            if spec.points:
                phase.append(spec)
            else:
                driver.report.launches_not_needed.append(spec.launch.id)
        if phase:
            execute(phase)


def run_sequential(specs: list[LaunchSpec], driver: _Driver) -> None:
    """One launch after another on this thread (one device)."""
    for spec in specs:
        try:
            run_launch(spec, driver.handle)
        except EngineError as exc:
            driver.server_failed(spec.launch, exc)


def run_server_step(
    step: Launch,
    points: list[PointStep],
    ctx: PointContext,
    store: Store,
    run_id: str,
    options: RunOptions,
    progress: Progress,
) -> Iterator[PointOutcome]:
    """Start one launch on the first device, run its points, stop it. Yields each point's outcome
    as it completes (the server records are stored as they come). Kept for callers of v1."""
    placed = place_one(step, ("0",), client_cpus=ctx.client_cpus)
    spec = LaunchSpec(launch=step, points=tuple(points), run_id=run_id, placement=placed, ctx=ctx,
                      engine_command=tuple(options.engine_command), log_dir=options.runs_dir / run_id,
                      startup_timeout_s=options.startup_timeout_s)
    outcomes: list[PointOutcome] = []

    def emit(event: Any) -> None:
        if isinstance(event, ServerEvent):
            store.record_server(event.record)
            progress.server(step, event.status)
        elif isinstance(event, PointEvent):
            outcomes.append(event.outcome)

    run_launch(spec, emit)
    yield from outcomes


def _open_run(store: Store, plan: Plan, options: RunOptions, progress: Progress) -> tuple[str, dict[str, str]]:
    if options.resume:
        previous = store.latest_run(plan.study_id)
        if previous is not None:
            _same_stopping_rule(store, previous, plan)
            resumed = f"resumed on {socket.gethostname()} at {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}"
            if previous.study_sha256 and previous.study_sha256 != plan.study_sha256:  # e.g. a budget added
                resumed += f" from a changed study file (sha256 {previous.study_sha256[:12]} -> {plan.study_sha256[:12]})"
            store.save_run(replace(previous, status="running", plan_json=plan.to_json(), study_sha256=plan.study_sha256,
                                   notes=_with_notes(previous.notes, (*options.warnings, resumed))))
            progress.message(f"resuming run {previous.run_id}")
            return previous.run_id, store.done_points(previous.run_id)
        progress.message("nothing to resume: starting a new run")
    run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    run = RunRecord(
        run_id=run_id, study_id=plan.study_id, study_path=plan.study_path, study_sha256=plan.study_sha256,
        plan_json=plan.to_json(), studyc_version=__version__, git_sha=git_sha(), host=socket.gethostname(),
        started_at=datetime.now(UTC), status="running", engine_command=" ".join(options.engine_command),
        notes=_with_notes(platform.platform(), options.warnings),
    )
    run = _calibration(run, options, progress)
    run = _client_ceiling(run, options, progress)
    store.save_run(_gpu(run, options))
    return run_id, {}


def _same_stopping_rule(store: Store, previous: RunRecord, plan: Plan) -> None:
    """Refuse to resume a run that has measured something under another stopping rule: its required
    launches per arm (the first look) and its budget's blocks (the horizon) fix how the error rate is
    spent across looks (`report.sequential`), so changing them once blocks were seen spends it twice.
    The budget's minutes only stop blocks from starting: they may change."""
    if not previous.plan_json or not store.done_points(previous.run_id):
        return
    try:
        before = Plan.model_validate_json(previous.plan_json).design
    except ValueError:  # not JSON, or not a plan: nothing to compare against
        return

    def rule(design: Design) -> tuple[dict[str, int], int | None]:
        return design.launches, design.budget.blocks if design.budget else None

    was, now = rule(before), rule(plan.design)
    if was != now:
        message = (f"run {previous.run_id} of {plan.study_id} measured points under launches {was[0]} and budget "
                   f"blocks {was[1]}; the study now says launches {now[0]} and budget blocks {now[1]}. A resumed "
                   "run keeps the stopping rule it started with: raising the budget after a look would spend the "
                   "error rate twice. Run without --resume to start a new run under the new rule.")
        raise StudycError(_at(plan, "design.budget" if was[1] != now[1] else "load.launches", message))


def _at(plan: Plan, key: str, message: str) -> str:
    """`file:line: key: message` for a key of the plan's study file (`file: message` where it cannot be read)."""
    from compiler.load import Problem
    from compiler.toml_lines import key_lines, line_of

    try:
        text = Path(plan.study_path).read_text()
    except OSError:
        return f"{plan.study_path}: {message}"
    return str(Problem(plan.study_path, line_of(key_lines(text), key), key, message))


def _with_notes(notes: str | None, more: tuple[str, ...]) -> str | None:
    """The run's notes with each of `more` added once ("; " between)."""
    added = [m for m in dict.fromkeys(more) if m not in (notes or "")]
    return "; ".join(x for x in (notes, *added) if x) or None


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
        return predict_points(plan, points, hardware=run.gpu_name)
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
    store: Store, run_id: str, server_id: str, outcome: PointOutcome, predicted: PointPrediction | None = None,
    *, device: str | None = None, client_cpus: str | None = None,
) -> None:
    checks = outcome.judgement.checks if outcome.judgement else ()
    record = replace(point_record(run_id, server_id, outcome, predicted), device=device, client_cpus=client_cpus,
                     replicas_json=outcome.replicas_json)
    store.commit_point(record, outcome.records, checks, outcome.telemetry)


def _account(report: RunReport, outcome: PointOutcome) -> None:
    report.points_done += 1
    report.window_s += outcome.window_s
    if outcome.status != "ok":
        report.points_failed.append(outcome.point.id)
    elif not outcome.valid:
        report.invalid.append(outcome.point.id)
    if outcome.flagged:
        report.flagged.append(outcome.point.id)

