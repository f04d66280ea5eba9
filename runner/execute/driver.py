"""The run's one database writer (`Driver`): commits what launches emit, and decides budget blocks.

Both executors (`runner.execute.parallel`, `runner.execute.ray_exec`) and the sequential loop in `runner.execute.run` hand it
every event; `run_phases` orders required launches before each budget block.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from base.errors import EngineError, StudycError
from compiler.plan import Launch, Plan, PointStep, budget_points
from runner.execute.launch import (
    Event,
    LaunchSpec,
    PhaseEvent,
    PointEvent,
    PointStartEvent,
    RetryEvent,
    ServerEvent,
)
from runner.execute.point import PointOutcome
from runner.execute.segments import PhaseTable, Timeline, point_phases
from runner.store.records import PointRecord, PointSummary, RunRecord
from runner.store.store import Store, as_json

if TYPE_CHECKING:
    from base.settings import Settings

Q = TypeVar("Q")  # what an executor's event queue holds


class PredictedPoint(Protocol):
    """The step-time model's prediction for one point: metric -> value (None where it cannot
    predict), and why not. `RunOptions.predict` gives one per point; the driver stores it."""

    @property
    def values(self) -> Mapping[str, float | None]: ...

    @property
    def note(self) -> str: ...


@dataclass
class RunOptions:
    """Everything a run needs from the command line and the settings (read once, by the caller)."""

    db: Path
    engine_command: list[str]
    python_argv: list[str]
    runs_dir: Path
    cache_dir: Path | None = None  # vLLM's compile cache (cache_dir/compile-cache) and the servers' API key (None: runs_dir)
    gpu_index: int = 0
    client_cpus: str = "auto"  # STUDYC_CLIENT_CPUS: 'auto', 'all' or a list like '1,2-3'
    resume: bool = False
    keep_going: bool = False
    startup_timeout_s: float = 900.0  # STUDYC_STARTUP_TIMEOUT_S's default
    calibrate: bool = True
    client_selftest: bool = True
    held_start: bool = True  # spawn the next launch's server held while one runs (--cold-starts: off)
    # start each configuration once, unmeasured, before the first launch (runner.execute.prime); None: on a
    # GPU host (--prime / --no-prime)
    prime: bool | None = None
    gpus: str | None = None  # --gpus: device ids ("0,1"); None: every idle GPU, or one logical device on a CPU host
    ray: str | None = None  # --ray: None off; "local" a Ray cluster started here; else the address to join
    warnings: tuple[str, ...] = ()  # preflight warnings a flag let through: stored in the run's notes
    # The sequential rule, asked before each budget block (`required = false` launches): given the open
    # store and the run id, whether a hypothesis is still undecided, or which ones (their ids: then the
    # block measures only the points they rest on). None: no budget block runs.
    decide_more: Callable[[Store, str], bool | Collection[str]] | None = None
    # The step-time model's predictions, asked once the run is open: (open store, plan, this run's
    # record, progress) -> point id -> prediction. None: no point has a prediction.
    predict: Callable[[Store, Plan, RunRecord, Progress], Mapping[str, PredictedPoint]] | None = None


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
    interference: dict[str, Any] | None = None  # runner.execute.parallel.interference_result, when measured
    sequential_from: str | None = None  # why launches went back to one at a time, if they did
    phases: PhaseTable | None = None  # where the run's wall went, every segment (runner.execute.segments)
    starts_retried: list[str] = field(default_factory=list)  # "failed id -> retry id": a start tried again, cold


class Progress:
    """Receives progress events; the CLI renders them live, tests may ignore them."""

    def start(self, total: int, done: int) -> None: ...
    def server(self, step: Launch, status: str, starting: bool = False) -> None: ...
    def point_started(self, point: PointStep) -> None: ...
    def point_done(self, outcome: PointOutcome) -> None: ...
    def message(self, text: str) -> None: ...
    def close(self) -> None: ...


def fresh_server_ids(launch: Launch, taken: set[str]) -> tuple[str, ...]:
    """The launch's server ids, or, where one is already in the run (a resumed launch), the same ids
    with the first free "~N" suffix: the servers that measured the earlier points keep their rows."""
    ids = tuple(launch.server_ids or (launch.id,))
    n = 1
    while any((sid if n == 1 else f"{sid}~{n}") in taken for sid in ids):
        n += 1
    return ids if n == 1 else tuple(f"{sid}~{n}" for sid in ids)


class Driver:
    """Commits what launches emit: the one writer of the database."""

    def __init__(self, store: Store, run_id: str, plan: Plan, report: RunReport, progress: Progress,
                 predictions: Mapping[str, PredictedPoint], options: RunOptions, origin: float | None = None) -> None:
        self.store, self.run_id, self.report, self.progress = store, run_id, report, progress
        self.predictions, self.options = predictions, options
        self.launches = {launch.id: launch for launch in plan.launches}
        self.hypotheses = {h.id: h for h in plan.hypotheses}
        self.budget = plan.design.budget
        self.origin = time.monotonic() if origin is None else origin
        self.blocks: dict[int, bool] = {}  # budget block -> run it (decided once, for all its launches)
        self.undecided: dict[int, frozenset[str]] = {}  # budget block -> the hypotheses it runs for, where named
        self.timeline: Timeline | None = None  # where the segment's wall goes (None: not recorded)

    def handle(self, event: Event) -> None:
        if isinstance(event, ServerEvent):
            self.store.record_server(event.record)
            if event.info is not None:
                _fill_run_versions(self.store, self.run_id, event.info)
            launch = self.launches[event.record.launch_id or event.record.server_id]
            self.progress.server(launch, event.status if launch.replicas == 1
                                 else f"{event.record.server_id}: {event.status}", starting=event.starting)
        elif isinstance(event, PointStartEvent):
            self.progress.point_started(event.point)
        elif isinstance(event, RetryEvent):
            self.report.starts_retried.append(f"{event.failed} -> {event.again}")
            self.progress.message(f"{event.failed}: its server exited before it was ready ({event.reason}); "
                                  f"starting it once more, cold, as {event.again}")
        elif isinstance(event, PhaseEvent):
            if self.timeline is not None:
                self.timeline.add(event.launch_id, event.phases)
        elif isinstance(event, PointEvent):
            outcome = event.outcome
            if self.timeline is not None:
                self.timeline.add(event.launch.id, point_phases(outcome.phases, outcome.window_s))
            _commit(self.store, self.run_id, event.server_id, outcome, self.predictions.get(outcome.point.id),
                    device=event.device, client_cpus=event.client_cpus)
            _account(self.report, outcome)
            self.progress.point_done(outcome)
            if outcome.status != "ok" and not self.options.keep_going:
                raise StudycError(f"point {outcome.point.id} failed: {outcome.error}")

    def store_interference(self, found: dict[str, Any]) -> None:
        self.store.save_run(replace(stored_run(self.store, self.run_id), interference_json=as_json(found)))

    def server_failed(self, launch: Launch, exc: EngineError) -> None:
        self.report.servers_failed.append(launch.id)
        if not self.options.keep_going:
            raise exc  # the CLI prints it; printing here too would show it twice
        self.progress.message(f"server {launch.id} failed: {exc.message}")

    def wanted(self, spec: LaunchSpec) -> bool:
        """Whether to run the launch: it has points left and is required, or its budget block is."""
        if not spec.points and not spec.searches:
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


def run_phases(specs: list[LaunchSpec], driver: Driver, execute: Callable[[list[LaunchSpec]], None]) -> None:
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
            if spec.points or spec.searches:
                phase.append(spec)
            else:
                driver.report.launches_not_needed.append(spec.launch.id)
        if phase:
            execute(phase)


def drain(events: queue.Queue[Q], driver: Driver, event: Callable[[Q], object]) -> None:
    """After a stop, commit the points an executor's queue still holds that completed (they are valid
    measurements); the rest of the queue is dropped. `event` gives the launch event an item carries."""
    while True:
        try:
            item = event(events.get_nowait())
        except queue.Empty:
            return
        if isinstance(item, PointEvent) and item.outcome.status == "ok":
            try:
                driver.handle(item)
            except Exception:  # already stopping
                return


def stored_run(store: Store, run_id: str) -> RunRecord:
    run = store.run(run_id)
    if run is None:
        raise StudycError(f"run {run_id} vanished from {store.path}")
    return run


def _fill_run_versions(store: Store, run_id: str, info: Any) -> None:
    """The engine's versions and GPU, where the run does not have them yet (the first server's)."""
    run = stored_run(store, run_id)
    filled = replace(
        run,
        vllm_version=run.vllm_version or info.vllm_version,
        torch_version=run.torch_version or info.torch_version,
        gpu_name=run.gpu_name or info.gpu_name,
        driver_version=run.driver_version or info.driver_version,
    )
    if filled != run:
        store.save_run(filled)


def point_record(
    run_id: str, server_id: str, outcome: PointOutcome, predicted: PredictedPoint | None = None
) -> PointRecord:
    p = outcome.point
    judged = outcome.judgement
    values = predicted.values if predicted else {}
    note = predicted.note if predicted else "no prediction: open-loop points are not replayed by the step-time model"
    return PointRecord(
        predicted_output_throughput=values.get("output_throughput"), predicted_tpot_s=values.get("tpot_s"),
        predicted_ttft_s=values.get("ttft_s"), prediction_note=note or None,
        run_id=run_id, point_id=p.id, server_id=server_id, arm=p.arm, workload=p.workload,
        concurrency=p.concurrency, rate_rps=p.rate_rps, repeat=p.repeat,
        fingerprint=p.fingerprint, status=outcome.status, error=outcome.error, cache_policy=p.cache,
        reset_ok=outcome.reset.ok if outcome.reset else None, started_at=outcome.started_at,
        summary=judged.summary if judged else PointSummary(), valid=outcome.valid, flagged=outcome.flagged,
        phases_json=as_json(outcome.phases), server_warnings=outcome.server_warnings,
        reset_attempts=outcome.reset.attempts if outcome.reset else None,
        verdict=judged.reason if judged else None, counters_before_json=outcome.counters_before_json,
        counters_after_json=outcome.counters_after_json,
    )


def _commit(
    store: Store, run_id: str, server_id: str, outcome: PointOutcome, predicted: PredictedPoint | None = None,
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

