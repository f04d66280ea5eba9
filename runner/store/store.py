"""The one module that owns DuckDB: tables declared from `runner.store.records`, one transaction per point,
typed reads, versioned schema with its migrations.

Results are the truth; the site is derived from them. Every client statistic can be recomputed
from the `requests` table. Nobody else imports duckdb.

Schema versions and what each changed: `runner.store.tables`. A database opened for writing is migrated in
place; one opened read-only at an older version is refused with the command that migrates it, except those in
READS_AS_CURRENT, read as they are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from base.errors import StoreError
from runner.store.folder import Folders
from runner.store.merging import Merging
from runner.store.records import (
    CheckResult,
    PhaseRecord,
    PointRecord,
    RequestRecord,
    RunRecord,
    SegmentRecord,
    ServerRecord,
    TelemetrySample,
    redact_argv,
)
from runner.store.tables import (
    CHECKS,
    PHASES,
    POINTS,
    REQUESTS,
    RUNS,
    SEGMENTS,
    SERVERS,
    TABLE_BY_NAME,
    TABLES,
    TELEMETRY,
    Column,
    Table,
    arrow_type,
    row_reader,
    schema_sql,
    to_row,
)

_REFUSED = ("Could not write", "No space left", "File too large", "Disk quota exceeded")


def write_refused(exc: BaseException) -> bool:
    """Whether DuckDB's error is the file system refusing a write (a full disk, a file size limit), not a
    fault of the statement."""
    return isinstance(exc, duckdb.IOException) or any(text in str(exc) for text in _REFUSED)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]

SCHEMA_VERSION = 7
READS_AS_CURRENT = ("4", "5", "6")  # read-only, these versions are read as they are: only columns the reads ignore differ
DROPPED = (("points", "level"),)  # (table, column) a migration removes

R = TypeVar("R")


# ------------------------------------------------------------------------------------ the store
class Store(Merging, Folders):
    """A results database. Use as a context manager; `transaction()` wraps one point's writes."""

    schema_version = str(SCHEMA_VERSION)

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        if read_only and not self.path.exists():
            raise StoreError(f"{self.path}: no such results database (run `studyc run` first, or pass --db)")
        file = self.database_file(self.path, read_only)  # a results folder: the database built from it
        try:
            self.con = duckdb.connect(str(file), read_only=read_only)
        except duckdb.Error as exc:
            raise StoreError(f"{self.path}: cannot open results database: {exc}") from None
        found = self._version()
        if not read_only:
            if found is None:
                self.con.execute(schema_sql())
                self.con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
                found = str(SCHEMA_VERSION)
            elif found != str(SCHEMA_VERSION):
                self._migrate(found)
                found = str(SCHEMA_VERSION)
            elif self._missing_columns():  # a nullable field added within a version: added here
                with self.transaction():
                    self._add_columns()
        if found != str(SCHEMA_VERSION) and not (read_only and found in READS_AS_CURRENT):
            self.con.close()
            if found is not None and found.isdigit() and int(found) < SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {found}, this studyc reads {SCHEMA_VERSION}: migrate it in place "
                    f"with `studyc recheck --db {self.path}` (any command that writes it migrates it)"
                )
            raise StoreError(f"{self.path}: schema version {found}, this studyc reads {SCHEMA_VERSION}")

    @staticmethod
    def _file_version(path: Path) -> str | None:
        return _version_of(path)

    @classmethod
    def _migrated(cls, path: Path) -> None:
        cls(path).close()

    def _version(self) -> str | None:
        try:
            row = self.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except duckdb.Error:
            return None
        return None if row is None else str(row[0])

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One all-or-nothing write. A write the disk refuses (full, or a file size limit) rolls back and
        raises StoreError saying so: what was committed before is kept (`write_refused`)."""
        self.con.begin()
        try:
            yield
            self.con.commit()
        except duckdb.Error as exc:
            try:
                self.con.rollback()
            except duckdb.Error:
                pass  # the failed commit already ended the transaction
            if write_refused(exc):
                raise StoreError(f"{self.path}: the results database could not be written ({_first_line(exc)}); "
                                 "the points committed before are kept: free some space (or give another --db) "
                                 "and continue with --resume") from exc
            raise
        except BaseException:
            self.con.rollback()
            raise

    # -- migration ------------------------------------------------------------------------------

    def _migrate(self, found: str) -> None:
        if found not in ("1", "2", "3", "4", "5", "6"):
            raise StoreError(f"{self.path}: schema version {found}, this studyc reads {SCHEMA_VERSION}")
        with self.transaction():
            self.con.execute(schema_sql())  # the tables added since (CREATE ... IF NOT EXISTS)
            self._add_columns()
            self.con.execute(
                "UPDATE checks SET status = CASE WHEN passed THEN 'pass' ELSE 'fail' END WHERE status IS NULL"
            )
            if found == "1":
                self._migrate_v1_rows()
            for table, column in DROPPED:
                if column in self._columns(table):
                    self.con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
            self.con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])

    def _columns(self, table: str, schema: str = "main", catalog: str | None = None) -> set[str]:
        return {r[0] for r in self.con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ? AND table_schema = ? "
            "AND table_catalog = coalesce(?, current_database())", [table, schema, catalog]
        ).fetchall()}

    def _missing_columns(self) -> list[tuple[Table, Column]]:
        out = []
        for table in TABLES:
            have = self._columns(table.name)
            out += [(table, c) for c in table.columns if c.name not in have]
        return out

    def _add_columns(self) -> None:
        """Add the columns the records have and the tables lack (nullable: old rows read None)."""
        for table, c in self._missing_columns():
            self.con.execute(f"ALTER TABLE {table.name} ADD COLUMN {c.name} {c.sql}")

    def _migrate_v1_rows(self) -> None:
        """Version 1 rows: the API key scrubbed from argv, a git_sha that is not a commit made NULL."""
        for run_id, server_id, argv in self.con.execute(
            "SELECT run_id, server_id, argv_json FROM servers WHERE argv_json IS NOT NULL"
        ).fetchall():
            self.con.execute("UPDATE servers SET argv_json = ? WHERE run_id = ? AND server_id = ?",
                             [json.dumps(redact_argv(json.loads(argv))), run_id, server_id])
        self.con.execute("UPDATE runs SET git_sha = NULL WHERE NOT regexp_full_match(git_sha, '[0-9a-f]{40}')")

    # -- writes ---------------------------------------------------------------------------------

    def _insert(self, table: Table, record: Any, keys: Sequence[str] = ()) -> None:
        cols = table.column_names
        self.con.execute(
            f"INSERT INTO {table.name} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
            to_row(table, record, keys),
        )

    def _insert_many(self, table: Table, records: Sequence[Any], keys: Sequence[str] = ()) -> None:
        if not records:
            return
        import pyarrow as pa

        cols = table.columns
        rows = [to_row(table, r, keys) for r in records]
        data = pa.table({c.name: pa.array([row[i] for row in rows], type=arrow_type(c.sql))
                         for i, c in enumerate(cols)})
        self.con.register("_incoming", data)
        try:
            names = ", ".join(c.name for c in cols)
            self.con.execute(f"INSERT INTO {table.name} ({names}) SELECT {names} FROM _incoming")
        finally:
            self.con.unregister("_incoming")

    def save_run(self, run: RunRecord) -> None:
        """Insert a run, or replace the stored one with the same id."""
        with self.transaction():
            self.con.execute("DELETE FROM runs WHERE run_id = ?", [run.run_id])
            self._insert(RUNS, run)

    def record_server(self, server: ServerRecord) -> None:
        if server.argv_json is not None and redact_argv(json.loads(server.argv_json)) != json.loads(server.argv_json):
            raise StoreError(f"server {server.server_id}: argv holds an API key; store redact_argv(argv)")
        with self.transaction():
            self.con.execute(
                "DELETE FROM servers WHERE run_id = ? AND server_id = ?", [server.run_id, server.server_id]
            )
            self._insert(SERVERS, server)

    def commit_point(
        self,
        point: PointRecord,
        requests: Sequence[RequestRecord],
        checks: Sequence[CheckResult],
        telemetry: Sequence[TelemetrySample],
    ) -> None:
        """Write one point with its requests, checks and telemetry in one transaction (replacing a retry)."""
        _same_point(point, checks, telemetry)
        key = [point.run_id, point.point_id]
        with self.transaction():
            for table in ("points", "requests", "checks", "telemetry"):
                self.con.execute(f"DELETE FROM {table} WHERE run_id = ? AND point_id = ?", key)
            self._insert(POINTS, point)
            self._insert_many(REQUESTS, requests, key)
            self._insert_many(CHECKS, checks, key[:1])
            self._insert_many(TELEMETRY, telemetry, key[:1])

    def replace_judgement(self, point: PointRecord, checks: Sequence[CheckResult]) -> None:
        """Store a point re-judged from its records (its row and its checks), in one transaction."""
        _same_point(point, checks, ())
        key = [point.run_id, point.point_id]
        with self.transaction():
            self.con.execute("DELETE FROM points WHERE run_id = ? AND point_id = ?", key)
            self._insert(POINTS, point)
            self.con.execute("DELETE FROM checks WHERE run_id = ? AND point_id = ?", key)
            self._insert_many(CHECKS, checks, key[:1])

    def set_aside(self, run_id: str, point_ids: Sequence[str], reason: str) -> None:
        """Keep points and their rows as "<id>#aside<N>", marked with why (their ids measure again)."""
        with self.transaction():
            for pid in point_ids:
                n = len(self._read(POINTS, "run_id = ? AND starts_with(point_id, ?)", [run_id, pid + "#aside"]))
                key = [f"{pid}#aside{n + 1}", run_id, pid]
                for table in ("points", "requests", "checks", "telemetry"):
                    self.con.execute(f"UPDATE {table} SET point_id = ? WHERE run_id = ? AND point_id = ?", key)
                self.con.execute("UPDATE points SET set_aside = ? WHERE run_id = ? AND point_id = ?",
                                 [reason, run_id, key[0]])

    def put_timing(self, run_id: str, records: Sequence[SegmentRecord | PhaseRecord]) -> None:
        """Store a run's phases and segments (a segment replaces the stored one of its number), in one transaction."""
        with self.transaction():
            for r in records:
                if isinstance(r, SegmentRecord):
                    self.con.execute("DELETE FROM segments WHERE run_id = ? AND segment = ?", [run_id, r.segment])
                self._insert(SEGMENTS if isinstance(r, SegmentRecord) else PHASES, r, [run_id])

    # -- reads ----------------------------------------------------------------------------------

    def _read(self, table: Table, where: str, params: Sequence[Any], order: str | None = None) -> list[Any]:
        cur = self.con.execute(
            f"SELECT * FROM {table.name} WHERE {where} ORDER BY {order or table.order}", list(params)
        )
        read = row_reader(table, tuple(d[0] for d in cur.description))
        return [read(row) for row in cur.fetchall()]

    def runs(self) -> list[RunRecord]:
        return list(self._read(RUNS, "TRUE", []))

    def run(self, run_id: str) -> RunRecord | None:
        return next(iter(self._read(RUNS, "run_id = ?", [run_id])), None)

    def latest_run(self, study_id: str) -> RunRecord | None:
        return next(iter(self._read(RUNS, "study_id = ?", [study_id], "started_at DESC, run_id DESC")), None)

    def done_points(self, run_id: str) -> dict[str, str]:
        """point_id -> fingerprint of points committed as ok (what `--resume` may skip; set-aside ones are not)."""
        rows = self.con.execute(
            "SELECT point_id, fingerprint FROM points WHERE run_id = ? AND status = 'ok' AND set_aside IS NULL",
            [run_id]
        ).fetchall()
        return {pid: fp for pid, fp in rows}

    def timing(self, run_id: str) -> tuple[list[SegmentRecord], list[PhaseRecord]]:
        """The run's segments and phases (none in a database from before they were stored)."""
        if not self._columns("phases"):
            return [], []
        return self._read(SEGMENTS, "run_id = ?", [run_id]), self._read(PHASES, "run_id = ?", [run_id])

    def servers(self, run_id: str) -> list[ServerRecord]:
        return list(self._read(SERVERS, "run_id = ?", [run_id]))

    def points(self, run_id: str) -> list[PointRecord]:
        return list(self._read(POINTS, "run_id = ?", [run_id]))

    def checks(self, run_id: str) -> list[CheckResult]:
        return list(self._read(CHECKS, "run_id = ?", [run_id]))

    def telemetry(self, run_id: str, point_id: str | None = None) -> list[TelemetrySample]:
        if point_id is None:
            return list(self._read(TELEMETRY, "run_id = ?", [run_id], "t_s, source, point_id"))
        return list(self._read(TELEMETRY, "run_id = ? AND point_id = ?", [run_id, point_id], "t_s, source"))

    def request_records(self, run_id: str, point_id: str) -> list[RequestRecord]:
        """Every request of a point with its token times, warmup first, in order (to recompute statistics)."""
        return list(self._read(REQUESTS, "run_id = ? AND point_id = ?", [run_id, point_id], "warmup DESC, idx"))

    def run_request_records(self, run_id: str) -> dict[str, list[RequestRecord]]:
        """`request_records` of every point of a run, read in one query (one scan of the table, where a
        query per point scans it once per point)."""
        cur = self.con.execute("SELECT * FROM requests WHERE run_id = ? ORDER BY point_id, warmup DESC, idx", [run_id])
        names = tuple(d[0] for d in cur.description)
        at, read = names.index("point_id"), row_reader(REQUESTS, names)
        out: dict[str, list[RequestRecord]] = {}
        for row in cur.fetchall():
            out.setdefault(row[at], []).append(read(row))
        return out

    def send_times(self, run_id: str) -> dict[str, list[tuple[float, float | None]]]:
        """Per point, (sent_s, first_token_s) of its measured requests that succeeded, in send order
        (what the step-time model reads of a burst's arrival)."""
        rows = self.con.execute(
            "SELECT point_id, sent_s, first_token_s FROM requests WHERE run_id = ? AND NOT warmup AND ok "
            "ORDER BY point_id, sent_s, idx", [run_id]
        ).fetchall()
        out: dict[str, list[tuple[float, float | None]]] = {}
        for point_id, sent, first in rows:
            out.setdefault(point_id, []).append((float(sent), None if first is None else float(first)))
        return out

    def counts(self, run_id: str) -> dict[str, int]:
        out = {}
        for table in (t for t in TABLES if self._columns(t.name)):
            row = self.con.execute(f"SELECT count(*) FROM {table.name} WHERE run_id = ?", [run_id]).fetchone()
            out[table.name] = int(row[0]) if row else 0
        return out

    # -- report reads (site downloads) ----------------------------------------------------------

    def export_sorted(self, run_id: str, table: str, path: Path, fmt: str) -> int:
        """One run's rows of a table as CSV (without per-token times) or Parquet, in a stable order so a
        rebuilt site is byte-identical. Returns the number of rows written."""
        spec = TABLE_BY_NAME.get(table)
        if spec is None:
            raise StoreError(f"unknown table {table}")
        order = {"runs": "run_id", "servers": "server_id", "points": "point_id"}.get(table, spec.order)
        cursor = self.con.cursor()  # a fresh cursor: no other result of this connection is left pending
        try:
            rel = cursor.sql(f"SELECT * FROM {table} WHERE run_id = ? ORDER BY {order}", params=[run_id])
            arrow = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
        finally:
            cursor.close()
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(arrow, str(path), compression="zstd", compression_level=9)
        elif fmt == "csv":
            import pyarrow.csv as pcsv

            keep = [c for c in arrow.column_names if not str(arrow.schema.field(c).type).startswith("list")]
            pcsv.write_csv(arrow.select(keep), str(path))
        else:
            raise StoreError(f"unknown export format {fmt} (csv or parquet)")
        return int(arrow.num_rows)


def _same_point(point: PointRecord, checks: Sequence[CheckResult], telemetry: Sequence[TelemetrySample]) -> None:
    ids = {c.point_id for c in checks} | {t.point_id for t in telemetry}
    if ids - {point.point_id}:
        raise StoreError(f"records of point(s) {sorted(ids - {point.point_id})} given with point {point.point_id}")


def compact(path: Path) -> tuple[int, int]:
    """Rewrite a results database without the space its deleted rows left (DuckDB never shrinks a file:
    replacing a continued run in `merge` leaves the old copy's blocks behind). Written beside it, then
    moved over it, so a fault leaves the old file whole. (bytes before, bytes after)."""
    path = Path(path)
    before = path.stat().st_size
    tmp = path.with_name(f".{path.name}.compact")
    tmp.unlink(missing_ok=True)
    try:
        con = duckdb.connect(str(tmp))
        try:
            quoted = str(path).replace("'", "''")
            con.execute(f"ATTACH '{quoted}' AS src (READ_ONLY)")
            name = str(con.execute("SELECT current_database()").fetchone()[0])  # type: ignore[index]
            con.execute(f"COPY FROM DATABASE src TO \"{name}\"")
            con.execute("DETACH src")
            con.execute("CHECKPOINT")
        finally:
            con.close()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (duckdb.Error, OSError) as exc:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"{path}: cannot compact the results database: {exc}") from None
    return before, path.stat().st_size


def _version_of(path: Path) -> str | None:
    if not Path(path).exists():
        raise StoreError(f"{path}: no such results database")
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as exc:
        raise StoreError(f"{path}: cannot open results database: {exc}") from None
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except duckdb.Error:
        return None
    finally:
        con.close()
    return None if row is None else str(row[0])


def as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
