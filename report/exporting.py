"""Results published as files (docs/results-format.md): `studyc export` writes a database as a results folder,
one folder per run; `studyc import` builds a database from one; `studyc merge FOLDER DB...` adds runs to one,
writing only their folders (report.merge). The files themselves: runner.store.folder.
"""

from __future__ import annotations

from pathlib import Path

from base.errors import StoreError
from runner.store.folder import MANIFEST, run_folders
from runner.store.store import Store


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
