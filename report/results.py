"""Results databases -> the latest complete run of each study, read once into memory for scoring and the site.

Several databases (one per host) combine: for each study the latest complete run across all of them is the
one its verdicts are read from; a run that did not complete (partial, interrupted, still running) is never
scored as the study's result (`report.run_compare` shows it beside the published one).
Reads go through `runner.store.store.Store` only; nothing here speaks SQL. Everything is a typed record
(`runner.store.records`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from pathlib import Path

from base.errors import StoreError
from compiler.hardware import HardwareError, get_hardware
from compiler.plan import Plan
from runner.store.records import (
    CheckResult,
    PhaseRecord,
    PointRecord,
    RunRecord,
    SegmentRecord,
    ServerRecord,
    TelemetrySample,
)
from runner.store.store import Store


@dataclass(frozen=True)
class RunData:
    """One run with everything the report reads from it."""

    db: Path
    run: RunRecord
    servers: tuple[ServerRecord, ...]
    points: tuple[PointRecord, ...]
    checks: tuple[CheckResult, ...]
    telemetry: tuple[TelemetrySample, ...]
    set_aside: tuple[PointRecord, ...] = field(default=())  # kept, not read (`PointRecord.set_aside` says why)
    segments: tuple[SegmentRecord, ...] = ()  # where its wall went (none in a run stored before they were)
    phases: tuple[PhaseRecord, ...] = ()
    study_runs: tuple[RunRecord, ...] = ()  # every run of its study in the databases read (report.stats.alpha_ledger)

    @cached_property
    def hosts(self) -> dict[str, str]:
        """Server id (and launch id) -> the host it ran on: its machine id, or where none was recorded the
        session of the run it started in ("session 2 of 3, host not recorded"): a resume may have moved host."""
        resumes = sorted(datetime.fromisoformat(t.replace("Z", "+00:00")).replace(tzinfo=None)
                         for t in RESUMED.findall(self.run.notes or ""))
        out: dict[str, str] = {}
        for s in sorted(self.servers, key=lambda s: s.server_id):
            host = s.machine_id
            if host is None:
                started = s.started_at.replace(tzinfo=None) if s.started_at else None
                k = 1 + sum(1 for t in resumes if started is not None and t <= started)
                host = f"session {k} of {len(resumes) + 1} (host not recorded)" if resumes else "host not recorded"
            out[s.server_id] = host
            out.setdefault(s.launch_id or s.server_id, host)
        return out

    @cached_property
    def plan(self) -> Plan | None:
        """The plan the run stored, read once for every reader of this run (None: none, or unreadable)."""
        return Plan.from_stored(self.run.plan_json)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def study_id(self) -> str:
        return self.run.study_id

    @property
    def started_at(self) -> datetime | None:
        return self.run.started_at

    @property
    def finished_at(self) -> datetime | None:
        return self.run.finished_at or self.run.started_at


RESUMED = re.compile(r"resumed on \S+ at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")  # runner.execute.run's note
ASIDE = "#aside"  # in the id of a set-aside point (runner.store.store.Store.set_aside)
PUBLISHED = "complete"  # the one run status whose verdicts are published


def run_order(run: RunRecord) -> tuple[str, str]:
    """Runs oldest first: by start time (an unrecorded one first), then id."""
    return (run.started_at.isoformat() if run.started_at else "", run.run_id)


def all_runs(dbs: Sequence[Path]) -> dict[str, list[tuple[Path, RunRecord]]]:
    """study_id -> every run of it across the databases, oldest first, with the database it is in."""
    out: dict[str, list[tuple[Path, RunRecord]]] = {}
    for db in dbs:
        with Store(db, read_only=True) as store:
            for run in store.runs():
                out.setdefault(run.study_id, []).append((Path(db), run))
    return {k: sorted(v, key=lambda dr: run_order(dr[1])) for k, v in sorted(out.items())}


def latest_runs(dbs: Sequence[Path]) -> dict[str, RunData]:
    """study_id -> its latest complete run across every database (by start time, then run id)."""
    best: dict[str, tuple[Path, RunRecord]] = {}
    every: dict[str, list[RunRecord]] = {}
    for db in dbs:
        with Store(db, read_only=True) as store:
            for run in store.runs():
                every.setdefault(run.study_id, []).append(run)
                if run.status != PUBLISHED:
                    continue
                current = best.get(run.study_id)
                if current is None or run_order(run) > run_order(current[1]):
                    best[run.study_id] = (Path(db), run)
    return {study_id: replace(read_run(db, run.run_id), study_runs=tuple(sorted(every[study_id], key=run_order)))
            for study_id, (db, run) in sorted(best.items())}


def read_run(db: Path, run_id: str) -> RunData:
    with Store(db, read_only=True) as store:
        return from_store(store, run_id)


def from_store(store: Store, run_id: str) -> RunData:
    """One run from an open store: its set-aside points (and their checks, telemetry) apart from the rest."""
    run = store.run(run_id)
    if run is None:
        raise StoreError(f"{store.path}: no run {run_id}")
    points = store.points(run_id)
    segments, phases = store.timing(run_id)
    return RunData(
        db=Path(store.path),
        run=run,
        servers=tuple(store.servers(run_id)),
        points=tuple(p for p in points if p.set_aside is None),
        checks=tuple(c for c in store.checks(run_id) if ASIDE not in c.point_id),
        telemetry=tuple(t for t in store.telemetry(run_id) if ASIDE not in t.point_id),
        set_aside=tuple(p for p in points if p.set_aside is not None),
        segments=tuple(segments),
        phases=tuple(phases),
    )


def same_gpu(gpu_name: str | None, hardware: str) -> bool:
    """Whether a run's recorded GPU is `hardware`'s (an unrecorded or unknown GPU is not)."""
    if not gpu_name:
        return False
    try:
        return get_hardware(gpu_name).name == get_hardware(hardware).name
    except HardwareError:
        return False
