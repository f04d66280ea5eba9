"""Results databases -> the latest run of each study, read once into memory for scoring and the site.

Several databases (one per host) combine: for each study the latest run across all of them wins.
Reads go through `runner.store.Store` only; nothing here speaks SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.store import PointRow, Store


@dataclass(frozen=True)
class RunData:
    """One run with everything the report reads from it."""

    db: Path
    run: dict[str, Any]
    servers: tuple[dict[str, Any], ...]
    points: tuple[PointRow, ...]
    checks: tuple[dict[str, Any], ...]
    telemetry: tuple[dict[str, Any], ...]

    @property
    def run_id(self) -> str:
        return str(self.run["run_id"])

    @property
    def study_id(self) -> str:
        return str(self.run["study_id"])

    @property
    def started_at(self) -> datetime | None:
        return self.run.get("started_at")

    @property
    def finished_at(self) -> datetime | None:
        return self.run.get("finished_at") or self.run.get("started_at")


def _key(run: dict[str, Any]) -> tuple[str, str]:
    started = run.get("started_at")
    return (started.isoformat() if isinstance(started, datetime) else str(started or ""), str(run["run_id"]))


def latest_runs(dbs: Sequence[Path]) -> dict[str, RunData]:
    """study_id -> its latest run across every database (by start time, then run id)."""
    best: dict[str, tuple[Path, dict[str, Any]]] = {}
    for db in dbs:
        with Store(db, read_only=True) as store:
            for run in store.runs():
                current = best.get(run["study_id"])
                if current is None or _key(run) > _key(current[1]):
                    best[run["study_id"]] = (Path(db), run)
    return {study_id: read_run(db, run["run_id"]) for study_id, (db, run) in sorted(best.items())}


def read_run(db: Path, run_id: str) -> RunData:
    with Store(db, read_only=True) as store:
        run = store.run(run_id) or {}
        return RunData(
            db=Path(db),
            run=run,
            servers=tuple(store.servers(run_id)),
            points=tuple(store.point_rows(run_id)),
            checks=tuple(store.checks(run_id)),
            telemetry=tuple(store.telemetry(run_id)),
        )
