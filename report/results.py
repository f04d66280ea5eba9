"""Results databases -> the latest run of each study, read once into memory for scoring and the site.

Several databases (one per host) combine: for each study the latest run across all of them wins.
Reads go through `runner.store.store.Store` only; nothing here speaks SQL. Everything is a typed record
(`runner.store.records`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path

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
from studyc.errors import StoreError


@dataclass(frozen=True)
class RunData:
    """One run with everything the report reads from it."""

    db: Path
    run: RunRecord
    servers: tuple[ServerRecord, ...]
    points: tuple[PointRecord, ...]
    checks: tuple[CheckResult, ...]
    telemetry: tuple[TelemetrySample, ...]
    segments: tuple[SegmentRecord, ...] = ()  # where its wall went (none in a run stored before they were)
    phases: tuple[PhaseRecord, ...] = ()

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


def _key(run: RunRecord) -> tuple[str, str]:
    started = run.started_at
    return (started.isoformat() if started is not None else "", run.run_id)


def latest_runs(dbs: Sequence[Path]) -> dict[str, RunData]:
    """study_id -> its latest run across every database (by start time, then run id)."""
    best: dict[str, tuple[Path, RunRecord]] = {}
    for db in dbs:
        with Store(db, read_only=True) as store:
            for run in store.runs():
                current = best.get(run.study_id)
                if current is None or _key(run) > _key(current[1]):
                    best[run.study_id] = (Path(db), run)
    return {study_id: read_run(db, run.run_id) for study_id, (db, run) in sorted(best.items())}


def read_run(db: Path, run_id: str) -> RunData:
    with Store(db, read_only=True) as store:
        run = store.run(run_id)
        if run is None:
            raise StoreError(f"{db}: no run {run_id}")
        segments, phases = store.timing(run_id)
        return RunData(
            db=Path(db),
            run=run,
            servers=tuple(store.servers(run_id)),
            points=tuple(store.points(run_id)),
            checks=tuple(store.checks(run_id)),
            telemetry=tuple(store.telemetry(run_id)),
            segments=tuple(segments),
            phases=tuple(phases),
        )
