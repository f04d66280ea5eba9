"""`studyc run` as library calls: check the host and engine and set the run's options, run one study's
plan, and say how it went.

The command line wires its options into `prepare_run`, calls `run_study` per study and prints
`run_summary`; stopping on a signal and the exit code stay with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from compiler.load import LoadedStudy
from compiler.plan import Plan
from runner.execute.driver import RunOptions, RunReport, run_options
from runner.execute.run import run_plan
from runner.store.store import Store


@dataclass(frozen=True)
class RunSetup:
    """What every study of one `studyc run` shares: the run options and the hardware mismatches allowed."""

    options: RunOptions
    mismatches: tuple[str, ...]


def prepare_run(plans: Sequence[Plan], db: Path, *, resume: bool, keep_going: bool, calibrate: bool,
                gpus: str | None, ray: str | None, allow_hardware_mismatch: bool,
                say: Callable[[str], None], held_start: bool = True, prime: bool | None = None) -> RunSetup:
    """Settings -> the host's GPU checked against each study's hardware -> the engine checked -> RunOptions.
    `say` gets the warnings and the engine line as they come."""
    from base.settings import load_settings
    from runner.measure.nvml import gpu_info
    from runner.server.engine_check import check_engine
    from runner.server.preflight import check_hardware
    from studyc.predictions import predict_run

    settings = load_settings()
    gpu = gpu_info(settings.gpu_index)
    gpu_name = gpu.get("name") if gpu else None
    mismatches = check_hardware([(p.study_id, p.hardware) for p in plans], gpu_name, allow_hardware_mismatch)
    for warning in mismatches:
        say(f"warning: {warning}")
    engine = check_engine(settings.vllm_argv, cache_dir=settings.cache_path)
    say(f"engine: {' '.join(settings.vllm_argv)} ({engine.version}); GPU: {gpu_name or 'none'}")
    options = run_options(settings, db, resume=resume, keep_going=keep_going, calibrate=calibrate,
                          gpus=gpus, ray=ray, predict=predict_run, held_start=held_start, prime=prime)
    return RunSetup(options, tuple(mismatches))


def run_study(setup: RunSetup, loaded: LoadedStudy, plan: Plan) -> RunReport:
    """Run one study's plan with live progress on stderr; its report once it is done."""
    from studyc.progress import LiveProgress

    allowed = tuple(f"hardware mismatch allowed (--allow-hardware-mismatch): {w}" for w in setup.mismatches
                    if w.startswith(f"{plan.study_id}: "))
    options = replace(setup.options, warnings=allowed, decide_more=decide_more(loaded))
    return run_plan(plan, options, LiveProgress(plan))


def failed(report: RunReport) -> bool:
    """A point or a server failed (the command exits 1)."""
    return bool(report.points_failed or report.servers_failed)


def run_summary(plan: Plan, report: RunReport, db: Path) -> str:
    """What a finished run did: points, wall time against the measurement windows, devices, what failed."""
    lines = [
        f"run {report.run_id} ({plan.study_id}): {report.points_done} point(s) measured, "
        f"{report.points_skipped} skipped, wall {report.wall_s:.1f} s "
        f"(measurement windows {report.window_s:.1f} s) -> {db}",
        f"  wall {report.wall_s:.1f} s over measurement windows {report.window_s:.1f} s"
        + (f" = {report.wall_s / report.window_s:.1f}x" if report.window_s else "")
        + f"; devices {','.join(report.devices) or '-'}, {report.slots} slot(s) at once",
    ]
    whole = report.phases
    if whole is not None and whole.segments > 1:
        lines.append(f"  the run's {whole.segments} segments: wall {whole.wall_s:.1f} s over measurement windows "
                     f"{whole.window_s:.1f} s" + (f" = {whole.wall_s / whole.window_s:.1f}x" if whole.window_s else ""))
    if whole is not None:
        lines.append(whole.text())
    if report.interference is not None:
        found = report.interference
        effect = "n/a" if found["effect"] is None else f"{found['effect']:.1%}"
        limit = "n/a" if found["threshold"] is None else f"{found['threshold']:.1%}"
        lines.append(f"  interference on {found['point']}: {effect} (noise threshold {limit}): {found['why']}")
    if report.starts_retried:
        lines.append(f"  starts retried once, cold (a server exited before it was ready): {', '.join(report.starts_retried)}")
    if report.launches_not_needed:
        lines.append(f"  budget launches not run: {len(report.launches_not_needed)}")
    for label, items in (("failed", report.points_failed), ("servers failed", report.servers_failed),
                         ("invalid (a check failed)", report.invalid), ("flagged", report.flagged)):
        if items:
            lines.append(f"  {label}: {', '.join(items)}")
    return "\n".join(lines) + "\n"


def decide_more(loaded: LoadedStudy) -> Callable[[Store, str], tuple[str, ...]]:
    """The sequential rule for `run_plan`: reads the run's stored points through the open store and asks
    `report.scoring.scoring.undecided` which hypotheses are still open (the runner never imports the report)."""

    def ask(store: Store, run_id: str) -> tuple[str, ...]:
        from report.results import from_store
        from report.scoring.scoring import undecided

        return undecided(loaded, from_store(store, run_id))

    return ask
