"""Plan -> DuckDB: open the run, place its launches on devices, and hand them to an executor.

One launch after another here (`run_sequential`), on several device slots at once (`runner.execute.parallel`),
or on a Ray cluster (`runner.execute.ray_exec`); `runner.execute.driver.Driver` commits what they emit.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from base import __version__
from base.errors import EngineError, StudycError
from base.settings import parse_cpus
from compiler.load import Problem, study_version
from compiler.plan import BlockDesign, Launch, Plan, PointStep
from compiler.toml_lines import key_lines, line_of
from runner.execute import reaper
from runner.execute.calibration_run import calibration_json
from runner.execute.driver import (
    Driver,
    Progress,
    RunOptions,
    RunReport,
    fresh_server_ids,
    run_phases,
    stored_run,
)
from runner.execute.launch import LaunchSpec, PhaseEvent, new_server, run_launch_retried
from runner.execute.parallel import run_parallel
from runner.execute.point import NVML_NOTE, PointContext
from runner.execute.prestart import Prestart
from runner.execute.prime import prime, prime_note, primes
from runner.execute.ray_exec import run_ray
from runner.execute.resume import rerun_cut_searches, rerun_whole_blocks
from runner.execute.segments import PRIME, Timeline, phase_table
from runner.load.loadgen_limit import measure_client_ceiling
from runner.measure.calibrate import calibrate
from runner.measure.host import machine_id
from runner.measure.host_probe import host_probe
from runner.measure.nvml import gpu_info
from runner.server.placement import Placement, idle_gpus, parse_gpus, place
from runner.server.startlog import HELD_FIRST_IMPORTS
from runner.store.records import RunRecord, new_run_id
from runner.store.store import Store, as_json

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding runner/, studyc/, compiler/
COMMIT_FILE = ".studyc-commit"  # the commit, written into a copy of the tree made without .git (device.sh stamp)


def git_sha(root: Path = SOURCE_ROOT) -> str | None:
    """The commit of studyc's own source: HEAD where `root` is the top of a git checkout with a commit
    (an installed copy inside some other repository is not studyc's checkout), else the commit written
    into `root/.studyc-commit` by the step that copied the tree; None when neither says."""
    found = _git_head(root)
    if found is not None:
        return found
    try:
        stamped = (root / COMMIT_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return stamped if re.fullmatch(r"[0-9a-f]{40}", stamped) else None


def _git_head(root: Path) -> str | None:
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
    """Carry out a plan: its launches in plan order (blocks), each on the devices `runner.server.placement`
    gives it; on one device one after another, on several at the same time (one thread per device
    slot; only this thread writes the database). Ctrl-C stops cleanly: no orphaned server,
    committed points kept."""
    progress = progress or Progress()
    reaper.guard()  # killed outright, this process leaves no server or probe running
    origin, started_at = time.monotonic(), datetime.now(UTC)
    if plan.calibrate_launches and options.ray is not None:
        raise StudycError(f"{plan.study_id}: a hypothesis names a machine metric (machine_flops, machine_bandwidth, "
                          "ridge_point): each launch calibrates its GPU while no other launch measures, which a Ray "
                          "cluster does not promise; run it without --ray")
    with Store(options.db) as store:
        before: list[tuple[str, float]] = []  # the run's own phases before the timeline opens
        run_id, done = _open_run(store, plan, options, progress, before)
        timeline = Timeline(store, run_id, origin, started_at)
        timeline.add("", before)
        report = RunReport(run_id=run_id)
        run = stored_run(store, run_id)
        t = time.monotonic()
        predictions = options.predict(store, plan, run, progress) if options.predict else {}
        timeline.add("", [("predictions", time.monotonic() - t)] if options.predict else [])
        ctx = PointContext(
            thresholds=plan.checks,
            client_ceiling_chunks_per_s=run.client_ceiling_chunks_per_s,
            gpu_index=options.gpu_index,
            clock_origin_s=origin,
            client_cpus=parse_cpus(options.client_cpus, gpu_present=bool(run.nvml_available)),
            slo=plan.slo,
        )
        gpu_host = bool(run.nvml_available)
        devices = resolve_devices(options.gpus, gpu_host=gpu_host, gpu_index=options.gpu_index)
        placements = place(plan, devices, gpu_host=gpu_host, client_cpus=ctx.client_cpus)
        report.devices = devices
        report.slots = len({p.slot for p in placements})
        store.save_run(replace(stored_run(store, run_id), devices=",".join(devices), placement_json=as_json(
            [{"launch": p.launch_id, "slot": p.slot, "devices": [list(d) for d in p.server_devices],
              "client_cpus": list(p.client_cpus) if p.client_cpus is not None else None} for p in placements])))
        specs = []
        taken = {s.server_id for s in store.servers(run_id)}  # a resumed run's servers keep their rows
        for launch, placed in zip(plan.launches, placements, strict=True):
            points = tuple(p for p in launch.points if done.get(p.id) != p.fingerprint)
            # A search with probes stored ended (runner.execute.resume set aside the probes of one cut short,
            # to run it again whole): it is not run again.
            searches = tuple(q for q in launch.searches if not any(i.startswith(q.id + "/") for i in done))
            specs.append(replace(_spec(launch, points, placed, ctx, run_id, options, gpu_host,
                                       fresh_server_ids(launch, taken), plan.calibrate_launches), searches=searches))
        report.points_skipped = len(plan.points) - sum(len(sp.points) for sp in specs)
        # A capacity search counts its most probes: the bar may finish short of its total.
        progress.start(len(plan.points) + sum(q.probes for sp in specs for q in sp.searches), report.points_skipped)
        driver = Driver(store, run_id, plan, report, progress, predictions, options, origin=origin)
        driver.timeline = timeline
        status = "interrupted"
        try:
            if primes(options.prime, gpu_host, options.ray is not None):
                _prime(store, run_id, [sp for sp in specs if sp.points or sp.searches], timeline, progress)
            if options.ray is not None:
                run_ray(specs, driver, options, devices=len(devices))
            elif report.slots > 1 and plan.calibrate_launches:
                # A launch's calibration must not run while another launch measures: one at a time.
                report.sequential_from = ("a hypothesis names a machine metric: each launch calibrates its GPU "
                                          "before its servers start, so launches run one at a time")
                progress.message(report.sequential_from)
                run_phases(specs, driver, lambda some: run_sequential(some, driver, options.held_start))
            elif report.slots > 1:
                progress.message(f"running launches on {report.slots} device slots at once ({','.join(devices)})")
                run_phases(specs, driver, lambda some: run_parallel(some, driver, options))
            else:
                run_phases(specs, driver, lambda some: run_sequential(some, driver, options.held_start))
            status = "complete" if not (report.points_failed or report.servers_failed) else "partial"
        finally:
            report.wall_s = time.monotonic() - origin
            try:  # a database the disk refuses raises StoreError here too: the live display still closes
                timeline.close(status, report.slots)
                report.phases = phase_table(*store.timing(run_id))
                whole = report.phases  # the run's wall and windows: every segment's, a killed one's too
                store.save_run(replace(stored_run(store, run_id), status=status, finished_at=datetime.now(UTC),
                                       wall_s=round(whole.wall_s if whole else report.wall_s, 3),
                                       window_s=round(whole.window_s if whole else report.window_s, 3)))
            finally:
                progress.close()
    return report


def _prime(store: Store, run_id: str, specs: list[LaunchSpec], timeline: Timeline, progress: Progress) -> None:
    """Each configuration's first start, unmeasured (`runner.execute.prime`): its time in the run's phases,
    what it did in the run's notes."""
    t0 = time.monotonic()
    primed = prime(specs, progress.message)
    if primed:
        timeline.add("", [(PRIME, time.monotonic() - t0)])
        run = stored_run(store, run_id)
        store.save_run(replace(run, notes=_with_notes(run.notes, (prime_note(primed),))))


def resolve_devices(gpus: str | None, *, gpu_host: bool, gpu_index: int = 0) -> tuple[str, ...]:
    """`--gpus` as given; else every GPU NVML shows idle (GPU `gpu_index` when none is); on a CPU
    host one logical device."""
    if gpus:
        return parse_gpus(gpus)
    if not gpu_host:
        return ("0",)
    return idle_gpus() or (str(gpu_index),)


def _spec(launch: Launch, points: tuple[PointStep, ...], placed: Placement, ctx: PointContext, run_id: str,
          options: RunOptions, gpu_host: bool, server_ids: tuple[str, ...], launch_calibration: bool = False) -> LaunchSpec:
    first = placed.server_devices[0][0]
    local = replace(ctx, client_cpus=placed.client_cpus,
                    gpu_index=int(first) if gpu_host and first.isdigit() else ctx.gpu_index)
    calibrating = options.calibrate and launch_calibration
    return LaunchSpec(
        calibrate_python=tuple(options.python_argv) if calibrating else (),
        calibration_skipped="skipped (--no-calibrate)" if launch_calibration and not options.calibrate else "",
        launch=launch, points=points, run_id=run_id, placement=placed, ctx=local,
        engine_command=tuple(options.engine_command), log_dir=options.runs_dir / run_id,
        cache_root=(options.cache_dir or options.runs_dir) / "compile-cache", startup_timeout_s=options.startup_timeout_s,
        key_dir=options.cache_dir or options.runs_dir,
        gpu_host=gpu_host, server_ids=server_ids,
    )


def run_sequential(specs: list[LaunchSpec], driver: Driver, held: bool = True) -> None:
    """One launch after another on this thread (one device); with `held`, each launch's server is spawned
    held while the launch before it runs, and the first one held and let go once imported, so every start
    counts from the same point (`runner.execute.prestart`)."""
    prestart = Prestart() if held else None
    try:
        if prestart is not None and specs and len(specs[0].servers) == 1:
            first = specs[0]
            waited = prestart.hold_first(new_server(first, first.servers[0], first.placement.server_devices[0]))
            if waited is not None:
                driver.handle(PhaseEvent(first.launch.id, ((HELD_FIRST_IMPORTS, waited),)))
        for i, spec in enumerate(specs):
            try:
                run_launch_retried(spec, driver.handle, prestart=prestart,
                                   next_spec=specs[i + 1] if i + 1 < len(specs) else None)
            except EngineError as exc:
                driver.server_failed(spec.launch, exc)
    finally:
        if prestart is not None:
            prestart.close()


def _open_run(store: Store, plan: Plan, options: RunOptions, progress: Progress,
              spent: list[tuple[str, float]] | None = None) -> tuple[str, dict[str, str]]:
    """The run to carry on (resumed) or a new one, calibrated: its id and the points done. The new run's
    own phases (calibration, client self-test) are added to `spent`."""
    if options.resume:
        previous = store.latest_run(plan.study_id)
        if previous is not None:
            _same_stopping_rule(store, previous, plan)
            resumed = f"resumed on {socket.gethostname()} at {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}"
            if previous.study_sha256 and previous.study_sha256 != plan.study_sha256:  # e.g. a budget added
                resumed += f" from a changed study file (sha256 {previous.study_sha256[:12]} -> {plan.study_sha256[:12]})"
            store.save_run(replace(previous, status="running", plan_json=plan.to_json(), study_sha256=plan.study_sha256,
                                   study_toml_sha256=_study_version(plan),
                                   notes=_with_notes(previous.notes, (*options.warnings, resumed,
                                                                      *setup_notes(options, os.environ)))))
            progress.message(f"resuming run {previous.run_id}")
            done, reruns = rerun_whole_blocks(store, previous.run_id, plan, store.done_points(previous.run_id),
                                              machine_id())
            done, searches = rerun_cut_searches(store, previous.run_id, plan, done)
            for message in (*reruns, *searches):
                progress.message(message)
            return previous.run_id, done
        progress.message("nothing to resume: starting a new run")
    run_id = new_run_id()
    run = RunRecord(
        run_id=run_id, study_id=plan.study_id, study_path=plan.study_path, study_sha256=plan.study_sha256,
        study_toml_sha256=_study_version(plan),
        plan_json=plan.to_json(), studyc_version=__version__, git_sha=git_sha(), host=socket.gethostname(),
        started_at=datetime.now(UTC), status="running", engine_command=" ".join(options.engine_command),
        notes=_with_notes(platform.platform(), (*options.warnings, *setup_notes(options, os.environ))),
    )
    t0 = time.monotonic()
    run = _calibration(run, options, progress)
    t1 = time.monotonic()
    run = _client_ceiling(run, options, progress)
    took = (("calibration", t1 - t0), ("client self-test", time.monotonic() - t1))
    (spent if spent is not None else []).extend((name, s) for name, s in took if s > 0)
    store.save_run(_gpu(run, options))
    return run_id, {}


def _study_version(plan: Plan) -> str | None:
    """The study file's TOML hash (`compiler.load.study_version`), where the file still holds what was planned."""
    try:
        raw = Path(plan.study_path).read_bytes()
    except OSError:
        return None
    same = hashlib.sha256(raw).hexdigest() == plan.study_sha256
    return study_version(raw.decode("utf-8", "replace")) if same else None


def _same_stopping_rule(store: Store, previous: RunRecord, plan: Plan) -> None:
    """Refuse to resume a run that has measured something under another stopping rule: its required
    launches per arm (the first look) and its budget's blocks (the horizon) fix how the error rate is
    spent across looks (`report.stats.sequential`), so changing them once blocks were seen spends it twice.
    The budget's minutes only stop blocks from starting: they may change."""
    stored = Plan.from_stored(previous.plan_json)
    if stored is None or not store.done_points(previous.run_id):
        return  # no plan, or one that does not read: nothing to compare against
    before = stored.design

    def rule(design: BlockDesign) -> tuple[dict[str, int], int | None]:
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
    try:
        text = Path(plan.study_path).read_text()
    except OSError:
        return f"{plan.study_path}: {message}"
    return str(Problem(plan.study_path, line_of(key_lines(text), key), key, message))


SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASS", "AUTH", "CREDENTIAL")


def setup_notes(options: RunOptions, environ: Mapping[str, str]) -> tuple[str, ...]:
    """What a run's notes say of how it ran that its plan does not: how its servers started (`studyc
    phases` reads "starts:") and the VLLM_* variables its servers inherit from the shell (every server gets
    them, so they can change what is measured), never one whose name says it is a secret."""
    starts = "starts: held" if options.held_start else "starts: cold (--cold-starts)"
    inherited = sorted(f"{k}={v}" for k, v in environ.items()
                       if k.startswith("VLLM_") and not any(w in k for w in SECRET_WORDS))
    return (starts, *((f"servers inherit {', '.join(inherited)}",) if inherited else ()))


def _with_notes(notes: str | None, more: tuple[str, ...]) -> str | None:
    """The run's notes with each of `more` added once ("; " between)."""
    added = [m for m in dict.fromkeys(more) if m not in (notes or "")]
    return "; ".join(x for x in (notes, *added) if x) or None


def _calibration(run: RunRecord, options: RunOptions, progress: Progress) -> RunRecord:
    if not options.calibrate:
        return replace(run, calibrated=False, calibration_json=as_json({"reason": "skipped (--no-calibrate)"}))
    progress.message("calibrating the machine (HBM bandwidth, bf16 matmul, the host probe)")
    cal = calibrate(options.python_argv)
    host = host_probe()
    progress.message(
        f"calibrated: {cal.bandwidth_Bps / 1e12:.3f} TB/s, {cal.flops_bf16 / 1e12:.0f} TFLOP/s on {cal.device}"
        if cal.calibrated and cal.bandwidth_Bps and cal.flops_bf16
        else f"not calibrated: {cal.reason}"
    )
    return replace(
        run, calibrated=cal.calibrated, bandwidth_Bps=cal.bandwidth_Bps, flops_bf16=cal.flops_bf16,
        calibration_json=calibration_json(cal, host),
    )


def _client_ceiling(run: RunRecord, options: RunOptions, progress: Progress) -> RunRecord:
    if not options.client_selftest:
        return run
    progress.message("measuring the load generator's own ceiling on this host")
    try:
        found = measure_client_ceiling()
    except Exception as exc:  # the self-test is advisory: record why it is missing
        return replace(run, client_ceiling_json=as_json({"error": f"{type(exc).__name__}: {exc}"}))
    return replace(run, client_ceiling_chunks_per_s=found.get("chunks_per_s"), client_ceiling_json=as_json(found))


def _gpu(run: RunRecord, options: RunOptions) -> RunRecord:
    info = gpu_info(options.gpu_index)
    if info is None:
        return replace(run, nvml_available=False)
    return replace(run, nvml_available=True, gpu_name=info.get("name"), driver_version=info.get("driver_version"),
                   notes="; ".join(x for x in (run.notes, NVML_NOTE) if x))
