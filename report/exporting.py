"""Results published as files (docs/results-format.md): `studyc export` writes a database as a results folder,
one folder per run; `studyc import` builds a database from one; `studyc merge FOLDER DB...` adds runs to one,
writing only their folders. The files themselves: runner.store.folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from base.errors import StoreError
from runner.store.folder import MANIFEST, folder_manifest, run_folders, stored_points
from runner.store.store import SCHEMA_VERSION, Store


def export_database(db: Path, out: Path, fmt: str = "parquet") -> dict[str, int]:
    """Write every run of `db` under `out` (new, or an empty folder): table -> rows written."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StoreError(f"{out}: exists and is not an empty folder (add runs to a results folder with "
                         f"`studyc merge {out} DB`)")
    with Store(db, read_only=True) as store:
        counts = store.export_runs(out, store.run_ids(), fmt)
    return {"runs": len(run_folders(out))} | {k: v for k, v in counts.items() if k != "runs"}


def import_folder(folder: Path, db: Path) -> int:
    """Build the database `db` (which must not exist) from a results folder; the number of runs."""
    if not (Path(folder) / MANIFEST).is_file():
        raise StoreError(f"{folder}: not a results folder (no {MANIFEST}; write one with `studyc export`)")
    if Path(db).exists():
        raise StoreError(f"{db}: exists; import into a new file (or merge into it: `studyc merge {db} {folder}`)")
    try:
        with Store(db) as store:
            return store.load_folder(Path(folder))
    except BaseException:
        Path(db).unlink(missing_ok=True)  # no half-built database is left behind
        raise


def merge_into_folder(out: Path, inputs: Sequence[Path]) -> list[str]:
    """Add each input's runs to the results folder `out`: a new run gets its folder; a run already there is
    replaced when the input holds every point of it and more (continued with `--resume`), kept otherwise.
    No other run's files are written."""
    lines = []
    for source in inputs:
        if not Path(source).exists():
            raise StoreError(f"{source}: no such results database")
        if Path(source).resolve() == Path(out).resolve():
            raise StoreError(f"{source}: cannot merge a folder into itself")
        points = stored_points(out, SCHEMA_VERSION)
        with Store(source, read_only=True) as store:
            new, continued, kept = [], [], 0
            for run_id in store.run_ids():
                if run_id not in points:
                    new.append(run_id)
                elif points[run_id] < {p.point_id for p in store.points(run_id)}:
                    continued.append(run_id)
                else:
                    kept += 1
            store.export_runs(out, new + continued, folder_manifest(out, SCHEMA_VERSION)["file_format"])
        line = f"{source}: {len(new)} new run(s)"
        if continued:
            line += f", {len(continued)} continued (more points than the copy in {out})"
        if kept:
            line += f", {kept} already there (kept)"
        lines.append(f"{line} -> {out}")
    return lines
