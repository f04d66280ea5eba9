"""The one module that owns DuckDB: schema, one transaction per point, typed reads.

Results are the truth; the site is derived from them. Every statistic can be recomputed from the
`requests` table. Nobody else imports duckdb.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from studyc.errors import StoreError

SCHEMA_VERSION = 1

POINT_METRICS = (
    "output_throughput", "total_throughput", "request_throughput", "chunk_throughput", "goodput",
    *(f"{stem}_{stat}_s" for stem in ("ttft", "itl", "tpot", "e2e") for stat in ("mean", "p50", "p90", "p95", "p99")),
    "prefix_hit_rate", "kv_cache_usage_peak", "littles_law_error", "mean_in_flight",
    "power_mean_w", "energy_per_token_j", "sm_clock_mean_mhz",
)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS runs (
  run_id VARCHAR PRIMARY KEY, study_id VARCHAR, study_path VARCHAR, study_sha256 VARCHAR, plan_json VARCHAR,
  studyc_version VARCHAR, git_sha VARCHAR, host VARCHAR, started_at TIMESTAMP, finished_at TIMESTAMP,
  status VARCHAR, engine_command VARCHAR, vllm_version VARCHAR, torch_version VARCHAR, gpu_name VARCHAR,
  driver_version VARCHAR, calibrated BOOLEAN, bandwidth_Bps DOUBLE, flops_bf16 DOUBLE, calibration_json VARCHAR,
  client_ceiling_chunks_per_s DOUBLE, client_ceiling_json VARCHAR, nvml_available BOOLEAN, notes VARCHAR
);
CREATE TABLE IF NOT EXISTS servers (
  run_id VARCHAR, server_id VARCHAR, arm VARCHAR, fingerprint VARCHAR, argv_json VARCHAR, env_json VARCHAR,
  started_at TIMESTAMP, startup_s DOUBLE, kv_capacity_tokens BIGINT, vllm_version VARCHAR, torch_version VARCHAR,
  gpu_name VARCHAR, status VARCHAR, error VARCHAR, log_path VARCHAR, PRIMARY KEY (run_id, server_id)
);
CREATE TABLE IF NOT EXISTS points (
  run_id VARCHAR, point_id VARCHAR, server_id VARCHAR, arm VARCHAR, workload VARCHAR, concurrency INTEGER,
  rate_rps DOUBLE, level DOUBLE, repeat INTEGER, fingerprint VARCHAR, status VARCHAR, error VARCHAR,
  cache_policy VARCHAR, reset_ok BOOLEAN, started_at TIMESTAMP, window_s DOUBLE, requests_ok INTEGER,
  requests_failed INTEGER, input_tokens BIGINT, output_tokens BIGINT, chunks BIGINT,
  {", ".join(f"{m} DOUBLE" for m in POINT_METRICS)},
  prefix_queries DOUBLE, prefix_hits DOUBLE, preemptions DOUBLE, concurrency_error DOUBLE,
  mem_clock_mean_mhz DOUBLE, energy_j DOUBLE, temp_max_c DOUBLE, valid BOOLEAN, flagged BOOLEAN,
  phases_json VARCHAR, PRIMARY KEY (run_id, point_id)
);
CREATE TABLE IF NOT EXISTS requests (
  run_id VARCHAR, point_id VARCHAR, idx INTEGER, warmup BOOLEAN, scheduled_s DOUBLE, sent_s DOUBLE,
  first_token_s DOUBLE, end_s DOUBLE, prompt_tokens INTEGER, output_tokens INTEGER, chunks INTEGER,
  ok BOOLEAN, error VARCHAR, status INTEGER, token_times_s DOUBLE[]
);
CREATE TABLE IF NOT EXISTS checks (
  run_id VARCHAR, point_id VARCHAR, name VARCHAR, passed BOOLEAN, severity VARCHAR, value DOUBLE,
  threshold DOUBLE, detail VARCHAR
);
CREATE TABLE IF NOT EXISTS telemetry (
  run_id VARCHAR, point_id VARCHAR, source VARCHAR, t_s DOUBLE, sm_clock_mhz DOUBLE, mem_clock_mhz DOUBLE,
  power_w DOUBLE, temp_c DOUBLE, mem_used_bytes DOUBLE, gpu_util DOUBLE, kv_cache_usage DOUBLE,
  running DOUBLE, waiting DOUBLE
);
"""

TABLES = ("runs", "servers", "points", "requests", "checks", "telemetry")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass(frozen=True)
class PointRow:
    """One point as stored: identity, status and every summary metric (None where unmeasured)."""

    run_id: str
    point_id: str
    arm: str
    workload: str
    level: float
    repeat: int
    status: str
    valid: bool
    flagged: bool
    values: dict[str, Any]

    def metric(self, name: str) -> float | None:
        value = self.values.get(name)
        return None if value is None else float(value)


class Store:
    """A results database. Use as a context manager; `transaction()` wraps one point's writes."""

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        if read_only and not self.path.exists():
            raise StoreError(f"{self.path}: no such results database (run `studyc run` first, or pass --db)")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.con = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.Error as exc:
            raise StoreError(f"{self.path}: cannot open results database: {exc}") from None
        if not read_only:
            self.con.execute(_SCHEMA)
            found = self._version()
            if found is None:
                self.con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        found = self._version()
        if found != str(SCHEMA_VERSION):
            raise StoreError(f"{self.path}: schema version {found}, this studyc reads {SCHEMA_VERSION}")

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
        self.con.begin()
        try:
            yield
        except BaseException:
            self.con.rollback()
            raise
        self.con.commit()

    # -- writes ---------------------------------------------------------------------------------

    def _insert(self, table: str, row: dict[str, Any]) -> None:
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        self.con.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", [_clean(v) for v in row.values()])

    def _update(self, table: str, keys: dict[str, Any], values: dict[str, Any]) -> None:
        sets = ", ".join(f"{k} = ?" for k in values)
        where = " AND ".join(f"{k} = ?" for k in keys)
        params = [_clean(v) for v in values.values()] + list(keys.values())
        self.con.execute(f"UPDATE {table} SET {sets} WHERE {where}", params)

    def begin_run(self, row: dict[str, Any]) -> None:
        with self.transaction():
            self._insert("runs", row)

    def update_run(self, run_id: str, **values: Any) -> None:
        with self.transaction():
            self._update("runs", {"run_id": run_id}, values)

    def record_server(self, row: dict[str, Any]) -> None:
        with self.transaction():
            self.con.execute(
                "DELETE FROM servers WHERE run_id = ? AND server_id = ?", [row["run_id"], row["server_id"]]
            )
            self._insert("servers", row)

    def commit_point(
        self,
        point: dict[str, Any],
        requests: Sequence[dict[str, Any]],
        checks: Sequence[dict[str, Any]],
        telemetry: Sequence[dict[str, Any]],
    ) -> None:
        """Write one point with its requests, checks and telemetry in one transaction (replacing a retry)."""
        key = [point["run_id"], point["point_id"]]
        with self.transaction():
            for table in ("points", "requests", "checks", "telemetry"):
                self.con.execute(f"DELETE FROM {table} WHERE run_id = ? AND point_id = ?", key)
            self._insert("points", point)
            self._insert_many("requests", requests)
            self._insert_many("checks", checks)
            self._insert_many("telemetry", telemetry)

    def _insert_many(self, table: str, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        import pyarrow as pa

        cols = list(dict.fromkeys(c for r in rows for c in r))  # rows may differ in keys (nvml vs metrics)
        data = pa.table({c: [_clean(r.get(c)) for r in rows] for c in cols})
        self.con.register("_incoming", data)
        try:
            self.con.execute(f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(cols)} FROM _incoming")
        finally:
            self.con.unregister("_incoming")

    # -- reads ----------------------------------------------------------------------------------

    def _dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cur = self.con.execute(sql, list(params))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def latest_run(self, study_id: str) -> dict[str, Any] | None:
        rows = self._dicts(
            "SELECT * FROM runs WHERE study_id = ? ORDER BY started_at DESC, run_id DESC LIMIT 1", [study_id]
        )
        return rows[0] if rows else None

    def runs(self) -> list[dict[str, Any]]:
        return self._dicts("SELECT * FROM runs ORDER BY study_id, started_at")

    def run(self, run_id: str) -> dict[str, Any] | None:
        rows = self._dicts("SELECT * FROM runs WHERE run_id = ?", [run_id])
        return rows[0] if rows else None

    def done_points(self, run_id: str) -> dict[str, str]:
        """point_id -> fingerprint of points committed as ok (what `--resume` may skip)."""
        rows = self.con.execute(
            "SELECT point_id, fingerprint FROM points WHERE run_id = ? AND status = 'ok'", [run_id]
        ).fetchall()
        return {pid: fp for pid, fp in rows}

    def servers(self, run_id: str) -> list[dict[str, Any]]:
        return self._dicts("SELECT * FROM servers WHERE run_id = ? ORDER BY started_at", [run_id])

    def point_rows(self, run_id: str) -> list[PointRow]:
        rows = self._dicts("SELECT * FROM points WHERE run_id = ? ORDER BY started_at, point_id", [run_id])
        return [
            PointRow(
                run_id=r["run_id"], point_id=r["point_id"], arm=r["arm"], workload=r["workload"],
                level=float(r["level"]), repeat=int(r["repeat"]), status=r["status"],
                valid=bool(r["valid"]), flagged=bool(r["flagged"]), values=r,
            )
            for r in rows
        ]

    def checks(self, run_id: str) -> list[dict[str, Any]]:
        return self._dicts("SELECT * FROM checks WHERE run_id = ? ORDER BY point_id, name", [run_id])

    def telemetry(self, run_id: str) -> list[dict[str, Any]]:
        return self._dicts("SELECT * FROM telemetry WHERE run_id = ? ORDER BY t_s", [run_id])

    def requests(self, run_id: str, point_id: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * EXCLUDE (token_times_s) FROM requests WHERE run_id = ?"
        params: list[Any] = [run_id]
        if point_id is not None:
            sql += " AND point_id = ?"
            params.append(point_id)
        return self._dicts(sql + " ORDER BY point_id, idx", params)

    def counts(self, run_id: str) -> dict[str, int]:
        out = {}
        for table in TABLES:
            key = "run_id"
            row = self.con.execute(f"SELECT count(*) FROM {table} WHERE {key} = ?", [run_id]).fetchone()
            out[table] = int(row[0]) if row else 0
        return out

    def request_records(self, run_id: str, point_id: str) -> list[dict[str, Any]]:
        """Every request of a point with its token times, in order (to recompute statistics)."""
        return self._dicts(
            "SELECT * FROM requests WHERE run_id = ? AND point_id = ? ORDER BY warmup DESC, idx", [run_id, point_id]
        )

    def replace_checks(
        self, run_id: str, point_id: str, values: dict[str, Any], checks: Sequence[dict[str, Any]]
    ) -> None:
        """Store recomputed statistics and checks of one point, in one transaction."""
        with self.transaction():
            self._update("points", {"run_id": run_id, "point_id": point_id}, values)
            self.con.execute("DELETE FROM checks WHERE run_id = ? AND point_id = ?", [run_id, point_id])
            self._insert_many("checks", checks)

    # -- merging --------------------------------------------------------------------------------

    def merge_from(self, other: Path) -> dict[str, int]:
        """Copy every run of another results database into this one (runs already present are skipped)."""
        alias = "src"
        path = str(other).replace("'", "''")
        self.con.execute(f"ATTACH '{path}' AS {alias} (READ_ONLY)")
        try:
            version = self.con.execute(f"SELECT value FROM {alias}.meta WHERE key = 'schema_version'").fetchone()
            if version is None or version[0] != str(SCHEMA_VERSION):
                raise StoreError(f"{other}: schema version {version and version[0]}, expected {SCHEMA_VERSION}")
            new = [r[0] for r in self.con.execute(
                f"SELECT run_id FROM {alias}.runs WHERE run_id NOT IN (SELECT run_id FROM runs)"
            ).fetchall()]
            copied: dict[str, int] = {}
            with self.transaction():
                for table in TABLES:
                    if not new:
                        break
                    marks = ", ".join("?" for _ in new)
                    cur = self.con.execute(
                        f"INSERT INTO {table} SELECT * FROM {alias}.{table} WHERE run_id IN ({marks})", new
                    )
                    if cur.description:
                        row = cur.fetchone()
                        assert row is not None  # an INSERT with a result returns its one count row
                        copied[table] = int(row[0])
                    else:
                        copied[table] = 0
            return copied | {"runs_new": len(new)}
        finally:
            self.con.execute(f"DETACH {alias}")

    # -- report reads (site downloads) ----------------------------------------------------------

    def export_sorted(self, run_id: str, table: str, path: Path, fmt: str) -> int:
        """One run's rows of a table as CSV (without per-token times) or Parquet, in a stable order so a
        rebuilt site is byte-identical. Returns the number of rows written."""
        order = {
            "runs": "run_id", "servers": "server_id", "points": "point_id", "requests": "point_id, warmup DESC, idx",
            "checks": "point_id, name", "telemetry": "point_id, source, t_s",
        }
        if table not in order:
            raise StoreError(f"unknown table {table}")
        cursor = self.con.cursor()  # a fresh cursor: no other result of this connection is left pending
        try:
            rel = cursor.sql(
                f"SELECT * FROM {table} WHERE run_id = ? ORDER BY {order[table]}", params=[run_id]
            )
            arrow = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
        finally:
            cursor.close()
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(arrow, str(path), compression="zstd", compression_level=9)
        elif fmt == "csv":
            import pyarrow.csv as pcsv

            keep = [c for c in arrow.column_names if c != "token_times_s"]
            pcsv.write_csv(arrow.select(keep), str(path))
        else:
            raise StoreError(f"unknown export format {fmt} (csv or parquet)")
        return int(arrow.num_rows)


def as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
