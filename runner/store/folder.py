"""Results as a folder of files, one folder per run (`studyc export`, `import`, `merge` into a folder, and any
`--db` given a folder): the part of `runner.store.store.Store` that writes and reads them. SQL through the
store's own connection; nothing here opens a database. The layout is documented in docs/results-format.md.

A folder holds `manifest.json` (the format, the schema version: the `meta` table, the one table not keyed by
run) and `<run_id>/`, each with `manifest.json` (its files, rows and sha256) and one file per table. A
`--db` that is a folder is read through a DuckDB file built from it once, under the cache folder, named by
the digest of the folder's files: a changed folder builds a new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from base.errors import StoreError
from base.settings import load_settings
from runner.store.tables import TABLE_BY_NAME, TABLES, Table
from runner.store.timefmt import TIMES_S, decode_times, encode_times, read_table, write_table

MANIFEST = "manifest.json"
FORMAT = "studyc-results"
FORMAT_VERSION = 1
FORMATS = ("parquet", "csv")
READABLE = (4, 5, 6)  # older schema versions a folder may hold: read as they are (runner.store.tables)
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The order rows are written in: a unique key per table, so an export is byte-identical for the same rows.
_ORDER = {"runs": "run_id", "servers": "server_id", "points": "point_id"}


def is_folder(path: Path) -> bool:
    return Path(path).is_dir()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"{path}: missing (a results folder holds {MANIFEST} at its top and in each run)") from None
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: not a readable manifest ({exc})") from None
    if not isinstance(found, dict):
        raise StoreError(f"{path}: not a manifest (a JSON object)")
    return found


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def folder_manifest(folder: Path, code_version: int) -> dict[str, Any]:
    """The folder's top manifest, checked: its format, and a schema version this code reads."""
    path = Path(folder) / MANIFEST
    top = _load_json(path)
    if top.get("format") != FORMAT or top.get("file_format") not in FORMATS:
        raise StoreError(f"{path}: not a studyc results folder (format {top.get('format')!r}, "
                         f"file_format {top.get('file_format')!r})")
    version = top.get("schema_version")
    if not isinstance(version, int):
        raise StoreError(f"{path}: schema_version {version!r} is not a number")
    if version > code_version:
        raise StoreError(f"{path}: schema version {version}, newer than this studyc reads ({code_version}): "
                         "upgrade studyc to read it")
    if version != code_version and version not in READABLE:
        raise StoreError(f"{path}: schema version {version}, this studyc reads {code_version}: import it with an "
                         "older studyc, migrate the database (studyc recheck --db DB) and export it again")
    return top


def run_folders(folder: Path) -> list[Path]:
    """The run folders of a results folder, sorted (each named by its run id)."""
    return sorted(p for p in Path(folder).iterdir() if p.is_dir() and (p / MANIFEST).exists())


_DIGESTS: dict[tuple[object, ...], str] = {}  # a command opens its --db many times: each file is read once


def folder_digest(folder: Path) -> str:
    """The digest of every file in the folder (names and contents): what names its cached database."""
    files: list[Path] = []
    seen: list[object] = [str(Path(folder).resolve())]
    for top, _, names in sorted(os.walk(folder)):
        for name in sorted(names):
            path = Path(top) / name
            stat = path.stat()
            files.append(path)
            seen.append((str(path), stat.st_size, stat.st_mtime_ns))
    key = tuple(seen)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        for path in files:
            h.update(path.relative_to(folder).as_posix().encode() + b"\0" + _sha256(path).encode())
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def cache_file(folder: Path, cache_dir: Path) -> Path:
    """Where the database built from `folder` is kept: one per folder path, named by its digest."""
    where = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:12]
    return Path(cache_dir) / "results" / f"{where}-{folder_digest(folder)[:32]}.duckdb"


def stored_points(folder: Path, code_version: int) -> dict[str, set[str]]:
    """run_id -> its point ids, for each run of a results folder (reading only the points files)."""
    top = folder_manifest(folder, code_version)
    out: dict[str, set[str]] = {}
    for run_dir in run_folders(folder):
        for _, data in run_tables(run_dir, top, only="points"):
            out[run_dir.name] = {str(p) for p in data.column("point_id").to_pylist()}
    return out


def run_tables(run_dir: Path, top: dict[str, Any], only: str | None = None) -> Iterator[tuple[Table, Any]]:
    """Each table of one run folder (or the one named `only`) as an arrow table with the stored columns
    (token times as seconds), every file checked against its run's manifest first."""
    manifest = _load_json(run_dir / MANIFEST)
    listed = manifest.get("tables")
    if not isinstance(listed, dict):
        raise StoreError(f"{run_dir / MANIFEST}: no `tables` (table -> file, rows, sha256)")
    for name, entry in listed.items():
        if only is not None and name != only:
            continue
        table = TABLE_BY_NAME.get(name)
        if table is None:
            raise StoreError(f"{run_dir / MANIFEST}: unknown table {name!r}")
        file = str(entry.get("file", "")) if isinstance(entry, dict) else ""
        if not file or Path(file).name != file:
            raise StoreError(f"{run_dir / MANIFEST}: table {name}: no file name (a file in the run's folder)")
        path = run_dir / file
        if not path.is_file():
            raise StoreError(f"{path}: missing (listed in {run_dir / MANIFEST})")
        if _sha256(path) != entry.get("sha256"):
            raise StoreError(f"{path}: its sha256 differs from {run_dir / MANIFEST} (damaged, or changed by hand)")
        data = read_table(path, table, str(top["file_format"]))
        if data.num_rows != entry.get("rows"):
            raise StoreError(f"{path}: {data.num_rows} rows, {run_dir / MANIFEST} says {entry.get('rows')}")
        odd = [n for n in data.column_names if not _COLUMN.fullmatch(n)]
        if odd:
            raise StoreError(f"{path}: {odd[0]!r} is not a column name")
        if "run_id" not in data.column_names:
            raise StoreError(f"{path}: no run_id column")
        others = set(data.column("run_id").to_pylist()) - {run_dir.name}
        if others:
            raise StoreError(f"{path}: rows of run {sorted(map(str, others))[0]} in the folder of run {run_dir.name}")
        yield table, decode_times(data)



def rewrite_folder(folder: Path, out: Path, code_version: int) -> dict[str, int]:
    """Write every run of a results folder again under `out` (new, or an empty folder) in this studyc's
    file encoding: each table's rows, columns and order as read, each run's manifest with its new files'
    sha256; a table without token times is copied as it is. Table -> rows written."""
    top = folder_manifest(folder, code_version)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StoreError(f"{out}: exists and is not an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / MANIFEST, top | {"format_version": FORMAT_VERSION})
    fmt = str(top["file_format"])
    counts = dict.fromkeys((t.name for t in TABLES), 0)
    for run_dir in run_folders(folder):
        manifest = _load_json(run_dir / MANIFEST)
        (out / run_dir.name).mkdir()
        tables: dict[str, Any] = {}
        for table, data in run_tables(run_dir, top):
            path = out / run_dir.name / str(manifest["tables"][table.name]["file"])  # checked by run_tables
            if TIMES_S in data.column_names:
                write_table(encode_times(data), path, fmt)
            else:  # the same bytes (written again, its lists would name their items as pyarrow does)
                shutil.copyfile(run_dir / path.name, path)
            tables[table.name] = {"file": path.name, "rows": data.num_rows, "sha256": _sha256(path)}
            counts[table.name] += data.num_rows
        _write_json(out / run_dir.name / MANIFEST, manifest | {"tables": tables})
    return counts

class Folders:
    """`Store.export_runs`, `Store.load_folder` and `Store.materialised`; the store gives the connection."""

    con: Any
    schema_version: str

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def transaction(self) -> Any:
        raise NotImplementedError

    def run_ids(self) -> list[str]:
        return [r[0] for r in self.con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]

    def export_runs(self, out: Path, run_ids: list[str], fmt: str = "parquet") -> dict[str, int]:
        """Write each run's folder under `out` (made a results folder if it is not one): table -> rows."""
        out = Path(out)
        if fmt not in FORMATS:
            raise StoreError(f"unknown format {fmt} (parquet or csv)")
        if not (out / MANIFEST).exists():
            out.mkdir(parents=True, exist_ok=True)
            _write_json(out / MANIFEST, {"format": FORMAT, "format_version": FORMAT_VERSION,
                                         "schema_version": int(self.schema_version), "file_format": fmt})
        top = folder_manifest(out, int(self.schema_version))
        if top["file_format"] != fmt or top["schema_version"] != int(self.schema_version):
            raise StoreError(f"{out / MANIFEST}: a folder of {top['file_format']} files at schema version "
                             f"{top['schema_version']}: runs of {fmt} at {self.schema_version} cannot join it")
        counts = dict.fromkeys((t.name for t in TABLES), 0)
        for run_id in run_ids:
            for name, rows in self._export_run(out, run_id, fmt).items():
                counts[name] += rows
        return counts

    def _export_run(self, out: Path, run_id: str, fmt: str) -> dict[str, int]:
        if not _RUN_ID.fullmatch(run_id):
            raise StoreError(f"run id {run_id!r} cannot name a folder")
        run_dir = out / run_id
        run_dir.mkdir(exist_ok=True)
        tables: dict[str, Any] = {}
        for table in TABLES:
            order = _ORDER.get(table.name, table.order)
            cursor = self.con.cursor()
            try:
                data = cursor.sql(f"SELECT * FROM {table.name} WHERE run_id = ? ORDER BY {order}",
                                  params=[run_id]).to_arrow_table()
            finally:
                cursor.close()
            path = run_dir / f"{table.name}.{fmt}"
            write_table(encode_times(data), path, fmt)
            tables[table.name] = {"file": path.name, "rows": data.num_rows, "sha256": _sha256(path)}
        _write_json(run_dir / MANIFEST, {"run_id": run_id, "schema_version": int(self.schema_version),
                                         "tables": tables})
        return {name: int(entry["rows"]) for name, entry in tables.items()}

    def load_folder(self, folder: Path) -> int:
        """Insert every run of a results folder (in one transaction); the number of runs."""
        top = folder_manifest(folder, int(self.schema_version))
        runs = run_folders(folder)
        with self.transaction():
            for run_dir in runs:
                for table, data in run_tables(run_dir, top):
                    self._insert_arrow(table, data)
        return len(runs)

    def _columns(self, table: str, schema: str = "main", catalog: str | None = None) -> set[str]:
        raise NotImplementedError

    def _insert_arrow(self, table: Table, data: Any) -> None:
        """Insert a file's rows; a column this studyc no longer declares (say `points.concurrency_error` of
        schema 3) is added to the table as it was, so an import keeps every stored value."""
        if not data.num_rows:
            return
        self.con.register("_incoming", data)
        try:
            have = self._columns(table.name)
            for name in (n for n in data.column_names if n not in have):
                kind = self.con.execute(f'DESCRIBE SELECT "{name}" FROM _incoming').fetchone()[1]
                self.con.execute(f'ALTER TABLE {table.name} ADD COLUMN "{name}" {kind}')
            names = ", ".join(f'"{n}"' for n in data.column_names)
            self.con.execute(f"INSERT INTO {table.name} ({names}) SELECT {names} FROM _incoming")
        finally:
            self.con.unregister("_incoming")

    @classmethod
    def database_file(cls, path: Path, read_only: bool) -> Path:
        """The DuckDB file to open for `--db path`: itself (its folder made if it will be written), or, for a
        results folder, the one built from it."""
        if Path(path).is_dir():
            return cls.materialised(path, read_only, load_settings().cache_path)
        if not read_only:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        return Path(path)

    @classmethod
    def materialised(cls, folder: Path, read_only: bool, cache_dir: Path) -> Path:
        """The DuckDB file built from a results folder (built now if its digest has none yet)."""
        if not read_only:
            raise StoreError(f"{folder}: a results folder is read-only here: import it into a database "
                             f"(studyc import {folder} --db DB) and write to that")
        folder_manifest(folder, int(cls.schema_version))
        target = cache_file(folder, cache_dir)
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        try:
            store = cls(tmp)
            try:
                store.load_folder(folder)
            finally:
                store.close()
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        for stale in target.parent.glob(target.name.split("-")[0] + "-*.duckdb"):  # the same folder, before
            if stale != target:
                stale.unlink(missing_ok=True)
        return target
