"""Rows -> records (`runner.store.tables.row_reader`): what a NULL or a missing column reads as, for each
kind of field, and the rows it refuses. A synthetic table over a record declared here, and the real one."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Optional

import pytest

from base.errors import StoreError
from runner.store.records import RequestRecord
from runner.store.tables import (
    REQUESTS,
    TABLES,
    Table,
    _optional,
    arrow_type,
    row_reader,
    sql_type,
    to_row,
)


@dataclass(frozen=True)
class Inner:
    hits: int = 0
    rate: float | None = None


@dataclass(frozen=True)
class Rec:
    name: str
    size: float
    note: str | None
    times: tuple[float, ...]
    tags: tuple[str, ...] = field(default_factory=lambda: ("fresh",))
    count: int = 7
    inner: Inner = field(default_factory=Inner)


TABLE = Table("recs", Rec, keys=("run_id",))
NAMES = ("run_id", "name", "size", "note", "times", "tags", "count", "hits", "rate")


def test_every_column_given_reads_back_converted() -> None:
    rec = row_reader(TABLE, NAMES)(["r1", "a", 3, "n", [0.5, 1.5], ["x"], 2, 4, 0.25])
    assert rec == Rec("a", 3.0, "n", (0.5, 1.5), ("x",), 2, Inner(4, 0.25))
    assert isinstance(rec.size, float) and isinstance(rec.times, tuple) and isinstance(rec.tags, tuple)


def test_null_reads_none_where_optional_and_the_default_elsewhere() -> None:
    read = row_reader(TABLE, NAMES)
    rec = read(["r1", "a", 1.0, None, [], None, None, None, None])
    assert rec.note is None and rec.times == () and rec.count == 7 and rec.inner == Inner(0, None)
    assert rec.tags == ("fresh",)  # a default_factory's value


def test_a_column_the_row_lacks_reads_as_null() -> None:
    rec = row_reader(TABLE, ("name", "size", "times", "note"))(["a", 2.0, [1.0], "x"])
    assert rec == Rec("a", 2.0, "x", (1.0,), ("fresh",), 7, Inner())
    assert row_reader(TABLE, ("name", "size", "times"))(["a", 2.0, [1.0]]).note is None


def test_a_column_the_record_lacks_is_ignored() -> None:
    rec = row_reader(TABLE, ("extra", "name", "size", "times"))(["zz", "a", 2.0, [1.0]])
    assert rec.name == "a" and rec.size == 2.0


@pytest.mark.parametrize("column, at", [("name", 1), ("size", 2), ("times", 4)])
def test_null_where_the_record_needs_a_value_is_refused_naming_the_column(column: str, at: int) -> None:
    row: list[object] = ["r1", "a", 1.0, None, [1.0], None, None, None, None]
    row[at] = None
    with pytest.raises(StoreError, match=rf"recs\.{column} is NULL in a stored row"):
        row_reader(TABLE, NAMES)(row)


def test_a_missing_required_column_is_refused() -> None:
    with pytest.raises(StoreError, match=r"recs\.size is NULL"):
        row_reader(TABLE, ("name", "times"))(["a", [1.0]])


@pytest.mark.parametrize("row", [["r1", "a"], ["r1", "a", 1.0, None, [], None, None, None, None, "one too many"]])
def test_a_row_of_another_width_than_its_names_is_refused(row: list[object]) -> None:
    with pytest.raises(ValueError, match="recs: a row of"):
        row_reader(TABLE, NAMES)(row)


def test_the_default_factory_is_called_for_each_row() -> None:
    calls: list[int] = []

    @dataclass(frozen=True)
    class Counted:
        name: str
        seen: tuple[int, ...] = field(default_factory=lambda: (calls.append(1), len(calls))[1:])

    read = row_reader(Table("counted", Counted), ("name", "seen"))
    assert [read(["a", None]).seen, read(["b", None]).seen] == [(1,), (2,)]


def test_a_request_round_trips_through_its_row() -> None:
    req = RequestRecord(3, False, 0.5, 0.5, 0.6, 1.0, (0.6, 0.8, 1.0), 64, 3, 3, True, None, 200, 2, 1)
    names = REQUESTS.column_names
    row = to_row(REQUESTS, req, ("run-1", "p1"))
    assert row_reader(REQUESTS, names)(row) == req
    old = [v for n, v in zip(names, row, strict=True) if n not in ("conversation", "turn")]  # a version 6 row
    single = row_reader(REQUESTS, tuple(n for n in names if n not in ("conversation", "turn")))(old)
    assert (single.conversation, single.turn) == (-1, 0) and single.index == 3


def test_each_column_type_has_its_arrow_type_and_an_unknown_one_is_refused() -> None:
    import pyarrow as pa

    want = {"VARCHAR": pa.string(), "BOOLEAN": pa.bool_(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(),
            "TIMESTAMP": pa.timestamp("us")}
    for sql, tp in want.items():
        assert arrow_type(sql) == tp and arrow_type(sql + "[]") == pa.list_(tp)
    assert {c.sql for t in TABLES for c in t.columns} <= set(want) | {k + "[]" for k in want}
    with pytest.raises(TypeError, match="HUGEINT"):
        arrow_type("HUGEINT")


def test_column_types_and_the_field_types_that_have_none() -> None:
    assert sql_type(Literal["a", "b"]) == "VARCHAR" and sql_type(str | None) == "VARCHAR"
    assert sql_type(tuple[float, ...]) == "DOUBLE[]" and sql_type(datetime) == "TIMESTAMP"
    for tp, says in [(int | str, r"a union of \[<class 'int'>, <class 'str'>\]"),
                     (tuple[int, str], r"only tuple\[X, \.\.\.\] is stored, not tuple\[int, str\]"),
                     (tuple[int], r"only tuple\[X, \.\.\.\] is stored"),
                     (dict[str, int], r"no column type for dict\[str, int\]")]:
        with pytest.raises(TypeError, match=says):
            sql_type(tp)
    assert _optional(int | None) and _optional(Optional[str])  # noqa: UP045 (the older spelling, as stored records may use)
    assert not _optional(int | str) and not _optional(tuple[None, ...]) and not _optional(int)


def test_a_row_is_written_from_its_own_record_type_with_every_key() -> None:
    req = RequestRecord(0, True, 0.0, 0.0, None, 1.0, (), 8, 0, 0, False, "boom", None)
    with pytest.raises(TypeError, match="requests stores RequestRecord, not Rec"):
        to_row(REQUESTS, Rec("a", 1.0, None, ()), ("run-1", "p1"))
    for keys in [("run-1",), ("run-1", "p1", "extra")]:
        with pytest.raises(ValueError):
            to_row(REQUESTS, req, keys)
    row = to_row(REQUESTS, req, ("run-1", "p1"))
    assert row[:2] == ["run-1", "p1"] and row[REQUESTS.column_names.index("token_times_s")] == []
