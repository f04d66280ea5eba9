"""The results tables, declared from `runner.store.records`: their DuckDB columns and DDL, and records <-> rows.

`runner.store.store` owns the database; this module only describes what it holds.

Schema versions: 1 (first release), 2 (typed records: `servers.warnings`, `points.server_warnings`,
`points.reset_attempts`, `telemetry.energy_j`; the API key scrubbed from `servers.argv_json`;
`runs.git_sha` = 'HEAD' made NULL), 3 (`checks.status` pass/fail/unverified, filled from `passed`;
`points.verdict`, the edge counters `points.counters_before_json`/`counters_after_json`, the
steady-phase, scheduled-latency, client-lag and fidelity statistics; `points.concurrency_error` is
no longer written; the step-time model's `points.predicted_*` and `prediction_note`), 4 (scale-out:
`runs.wall_s`/`window_s`/`devices`/`placement_json`/`interference_json`, `servers.launch_id`/`device`/
`stopped_at`, `points.device`/`client_cpus`/`replicas_json`), 5 (`points.level` dropped: a point's rung is
its `concurrency` or `rate_rps`), 6 (provenance: `servers.machine_id`/`hostname`/`gpu_uuid`/`gpu_serial`,
`runs.study_toml_sha256`, `points.set_aside`; the `segments` and `phases` tables: where a run's wall time
went), 7 (multi-turn: `requests.conversation`/`turn`; `points.slo_attainment`: the share of a point's
requests meeting the study's [slo]). A database opened for writing is migrated in place (columns added,
dropped ones removed); one opened read-only at an older version is refused with the command that migrates
it, except versions 4 to 6, read as they are (their missing columns read None, or the field's default: a
request of a version 6 file reads as a single request; a missing table reads as empty).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Union, get_args, get_origin

from base.errors import StoreError
from runner.store.records import (
    CheckResult,
    PhaseRecord,
    PointRecord,
    RequestRecord,
    RunRecord,
    SegmentRecord,
    ServerRecord,
    TelemetrySample,
)


# --------------------------------------------------------------------------------- declaration
def sql_type(tp: Any) -> str:
    """The DuckDB column type of a record field's Python type (Optional allowed: columns are nullable)."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"cannot store a union of {inner}")
        return sql_type(inner[0])
    if origin is Literal:
        return "VARCHAR"
    if origin is tuple:
        args = get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"only tuple[X, ...] is stored, not {tp}")
        return sql_type(args[0]) + "[]"
    simple = {str: "VARCHAR", bool: "BOOLEAN", int: "BIGINT", float: "DOUBLE", datetime: "TIMESTAMP"}
    if tp in simple:
        return simple[tp]
    raise TypeError(f"no column type for {tp}")


def _optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


@dataclass(frozen=True)
class Column:
    name: str  # column name
    sql: str  # DuckDB type
    field: str  # the record's field (or the nested summary's field)
    nested: str | None  # the record field holding a nested record (points.summary)
    py: Any  # the field's Python type


@dataclass(frozen=True)
class Table:
    """A table declared from a record type: key columns the record lacks, then its fields in order
    (a nested record's fields in place of the field holding it)."""

    name: str
    record: type
    keys: tuple[str, ...] = ()  # VARCHAR key columns the store adds (the record does not carry them)
    primary_key: tuple[str, ...] = ()
    rename: tuple[tuple[str, str], ...] = ()  # (field, column) where they differ
    order: str = ""  # ORDER BY of reads and exports

    @functools.cached_property
    def columns(self) -> tuple[Column, ...]:
        names = dict(self.rename)
        cols = [Column(k, "VARCHAR", k, None, str) for k in self.keys]
        hints = _hints(self.record)
        for f in dataclasses.fields(self.record):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                sub = _hints(hints[f.name])
                cols += [Column(g.name, sql_type(sub[g.name]), g.name, f.name, sub[g.name])
                         for g in dataclasses.fields(tp)]
            else:
                cols.append(Column(names.get(f.name, f.name), sql_type(tp), f.name, None, tp))
        return tuple(cols)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def ddl(self) -> str:
        body = [f"{c.name} {c.sql}" for c in self.columns]
        if self.primary_key:
            body.append(f"PRIMARY KEY ({', '.join(self.primary_key)})")
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({', '.join(body)})"


RUNS = Table("runs", RunRecord, primary_key=("run_id",), order="study_id, started_at, run_id")
SERVERS = Table("servers", ServerRecord, primary_key=("run_id", "server_id"), order="started_at, server_id")
POINTS = Table("points", PointRecord, primary_key=("run_id", "point_id"), order="started_at, point_id")
REQUESTS = Table("requests", RequestRecord, keys=("run_id", "point_id"), rename=(("index", "idx"),),
                 order="point_id, warmup DESC, idx")
CHECKS = Table("checks", CheckResult, keys=("run_id",), order="point_id, name")
TELEMETRY = Table("telemetry", TelemetrySample, keys=("run_id",), order="point_id, source, t_s")
SEGMENTS = Table("segments", SegmentRecord, keys=("run_id",), primary_key=("run_id", "segment"), order="segment")
PHASES = Table("phases", PhaseRecord, keys=("run_id",), order="segment, seq")
TABLES: tuple[Table, ...] = (RUNS, SERVERS, POINTS, REQUESTS, CHECKS, TELEMETRY, SEGMENTS, PHASES)
TABLE_BY_NAME = {t.name: t for t in TABLES}


def schema_sql() -> str:
    """The DDL of every table, generated from the records."""
    meta = "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)"
    return ";\n".join([meta, *(t.ddl() for t in TABLES)]) + ";"


# ------------------------------------------------------------------------------ rows <-> records
def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, tuple):
        return [_clean(v) for v in value]
    return value


def to_row(table: Table, record: Any, keys: Sequence[str] = ()) -> list[Any]:
    """One record as the table's row values, in column order (`keys`: the key columns' values)."""
    if not isinstance(record, table.record):
        raise TypeError(f"{table.name} stores {table.record.__name__}, not {type(record).__name__}")
    given = dict(zip(table.keys, keys, strict=True))
    out = []
    for c in table.columns:
        if c.name in given:
            out.append(given[c.name])
        elif c.nested:
            out.append(_clean(getattr(getattr(record, c.nested), c.field)))
        else:
            out.append(_clean(getattr(record, c.field)))
    return out


def _null(table: Table, col: Column, record: type) -> Callable[[], Any]:
    """What a NULL (or missing) column reads as: None where the field is optional, else its default;
    a field with neither refuses the row."""
    if _optional(col.py):
        return lambda: None
    field = _fields(record)[col.field]
    if field.default is not dataclasses.MISSING:
        default = field.default
        return lambda: default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory

    def refuse() -> Any:
        raise StoreError(f"{table.name}.{col.name} is NULL in a stored row, and the record needs a value")
    return refuse


def _convert(col: Column) -> Callable[[Any], Any]:
    if col.sql.endswith("[]"):
        return tuple
    if col.sql == "DOUBLE":
        return float
    return lambda value: value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A record type's field types (resolved once: every row read asks)."""
    return typing.get_type_hints(cls)


@functools.cache
def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


def row_reader(table: Table, names: tuple[str, ...]) -> Callable[[Sequence[Any]], Any]:
    """How a stored row with these column names becomes the table's record, worked out once per query
    (a read of a run's requests turns 100 k rows). Columns the record lacks are ignored; a column the
    row lacks reads as NULL."""
    hints = _hints(table.record)
    at = {name: i for i, name in enumerate(names)}
    steps = []  # (row index or None, record field, nested record field or None, convert, null)
    for c in table.columns:
        if c.name in table.keys:
            continue
        record = hints[c.nested] if c.nested else table.record
        steps.append((at.get(c.name), c.field, c.nested, _convert(c), _null(table, c, record)))
    nested_types = {c.nested: hints[c.nested] for c in table.columns if c.nested}
    width = len(names)

    def read(row: Sequence[Any]) -> Any:
        if len(row) != width:
            raise ValueError(f"{table.name}: a row of {len(row)} values for {width} columns")
        top: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {name: {} for name in nested_types}
        for i, field, inner, convert, null in steps:
            raw = None if i is None else row[i]
            value = null() if raw is None else convert(raw)
            if inner:
                nested[inner][field] = value
            else:
                top[field] = value
        for name, values in nested.items():
            top[name] = nested_types[name](**values)
        return table.record(**top)
    return read


def arrow_type(sql: str) -> Any:
    """A column's pyarrow type, from its DuckDB type (pyarrow imported here: only bulk writes need it)."""
    import pyarrow as pa

    if sql.endswith("[]"):
        return pa.list_(arrow_type(sql[:-2]))
    base = {"VARCHAR": pa.string, "BOOLEAN": pa.bool_, "BIGINT": pa.int64, "DOUBLE": pa.float64,
            "TIMESTAMP": lambda: pa.timestamp("us")}
    if sql not in base:
        raise TypeError(f"no arrow type for the column type {sql}")
    return base[sql]()
