"""How a results folder's files hold the tables (runner.store.timefmt), on small arrow tables: per-token times
as whole nanoseconds where that is exact, in place; Parquet with zstd, dictionaries for all but the
nanoseconds; CSV with lists as JSON text, read back to the store's types; a file that does not read is
named."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from base.errors import StoreError
from runner.store.tables import REQUESTS
from runner.store.timefmt import TIMES_NS, TIMES_S, decode_times, encode_times, read_table, write_table

SECONDS = pa.list_(pa.float64())


def _requests(times: list[list[float | None] | None]) -> pa.Table:
    n = len(times)
    return pa.table({"point_id": pa.array([f"p{i % 2}" for i in range(n)]), TIMES_S: pa.array(times, SECONDS),
                     "chunks": pa.array(range(n), pa.int64())})


def test_times_become_nanoseconds_in_place() -> None:
    data = _requests([[1.000000001, 2.5], [], [2.01, 0.7]])
    encoded = encode_times(data)
    assert encoded.column_names == ["point_id", TIMES_NS, "chunks"]
    assert encoded.schema.field(TIMES_NS).type == pa.list_(pa.int64())
    # 2.01 s is 2009999999.9999998 ns as a double: rounded, not cut, to the nanosecond it came from
    assert encoded.column(TIMES_NS).to_pylist() == [[1000000001, 2500000000], [], [2010000000, 700000000]]
    assert decode_times(encoded).equals(data)
    assert encoded.column("chunks").equals(data.column("chunks"))


def test_a_table_in_chunks_is_encoded_whole() -> None:
    data = pa.concat_tables([_requests([[1.0], [2.0, 3.0]]), _requests([[4.5]])])
    assert data.column(TIMES_S).num_chunks == 2
    encoded = encode_times(data)
    assert encoded.column(TIMES_NS).to_pylist() == [[1000000000], [2000000000, 3000000000], [4500000000]]
    assert decode_times(encoded).column(TIMES_S).to_pylist() == [[1.0], [2.0, 3.0], [4.5]]


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # the NULL time, as NaN
def test_other_tables_and_inexact_or_null_times_are_kept_as_given() -> None:
    plain = pa.table({"chunks": pa.array([1], pa.int64())})
    assert encode_times(plain) is plain and decode_times(plain) is plain
    finer = _requests([[1.0], [0.1 + 1e-12]])
    assert encode_times(finer) is finer
    null = _requests([[1.0], None])
    assert encode_times(null) is null  # a NULL list (never written by the store): kept as doubles
    hole = _requests([[1.0, None]])  # a NULL time in a list: not a whole nanosecond, kept as doubles
    assert encode_times(hole) is hole


def test_nanoseconds_read_as_another_list_type_decode_alike() -> None:
    large = pa.table({TIMES_NS: pa.array([[1500000000, 7], []], pa.large_list(pa.int64()))})
    decoded = decode_times(large)
    assert decoded.column_names == [TIMES_S] and decoded.schema.field(TIMES_S).type == SECONDS
    assert decoded.column(TIMES_S).to_pylist() == [[1.5, 7e-9], []]


def test_parquet_is_zstd_with_dictionaries_but_for_the_nanoseconds(tmp_path: Path) -> None:
    rng = random.Random(1)  # 300 requests of 60 chunks 8-12 ms apart, as a decode's times
    encoded = encode_times(_requests([[n / 1e9 for n in itertools.accumulate(rng.randint(8_000_000, 12_000_000)
                                                                          for _ in range(60))] for _ in range(300)]))
    path = tmp_path / "requests.parquet"
    write_table(encoded, path, "parquet")
    meta = pq.ParquetFile(path).metadata.row_group(0)
    columns = {meta.column(i).path_in_schema.split(".")[0]: meta.column(i) for i in range(meta.num_columns)}
    assert {c.compression for c in columns.values()} == {"ZSTD"}
    assert not any("DICTIONARY" in e for e in columns[TIMES_NS].encodings)
    assert any("DICTIONARY" in e for e in columns["point_id"].encodings)
    assert read_table(path, REQUESTS, "parquet").equals(encoded)
    default = tmp_path / "default.parquet"  # the same file at zstd's default level: a bigger one
    pq.write_table(encoded, default, compression="zstd", use_dictionary=["point_id", "chunks"])
    assert path.stat().st_size < default.stat().st_size
    plain = tmp_path / "plain.parquet"  # a table without nanoseconds
    write_table(pa.table({"point_id": ["a", "a", "b"]}), plain, "parquet")
    assert read_table(plain, REQUESTS, "parquet").column("point_id").to_pylist() == ["a", "a", "b"]


def test_csv_holds_lists_as_json_and_reads_back_the_stores_types(tmp_path: Path) -> None:
    encoded = encode_times(_requests([[1.25, 2.0], [], [3.0]]))
    path = tmp_path / "requests.csv"
    write_table(encoded, path, "csv")
    lines = path.read_text().splitlines()
    assert lines[0] == '"point_id","token_times_ns","chunks"'
    assert lines[1] == '"p0","[1250000000, 2000000000]",0' and lines[2] == '"p1","[]",1'
    back = read_table(path, REQUESTS, "csv")
    assert back.equals(encoded)
    doubles = _requests([[0.1 + 1e-12], None, []])  # inexact times stay doubles; a NULL list stays NULL
    write_table(doubles, path, "csv")
    assert path.read_text().splitlines()[2] == '"p1",,1'  # NULL: an empty field, not the text null
    assert read_table(path, REQUESTS, "csv").equals(doubles)


def test_csv_lists_read_back_typed_when_no_value_says_the_type(tmp_path: Path) -> None:
    path = tmp_path / "requests.csv"
    cases: list[list[list[float | None] | None]] = [[[], []], [None, None], [[], None]]
    for times in cases:
        write_table(_requests(times), path, "csv")
        back = read_table(path, REQUESTS, "csv")
        assert back.schema.field(TIMES_S).type == SECONDS and back.column(TIMES_S).to_pylist() == times


def test_a_text_column_holding_newlines_or_empty_text_reads_back(tmp_path: Path) -> None:
    data = pa.table({"error": pa.array(["line one\nline two", "", None]), "chunks": pa.array([1, 2, 3], pa.int64())})
    path = tmp_path / "requests.csv"
    write_table(data, path, "csv")
    assert read_table(path, REQUESTS, "csv").column("error").to_pylist() == ["line one\nline two", "", None]
    # a file past the reader's 1 MB blocks, of errors over three lines each (a traceback's)
    errors = [f"Traceback (most recent call last):\n  line {i}\nValueError: bad {i}" for i in range(30000)]
    write_table(pa.table({"error": errors, "chunks": pa.array(range(30000), pa.int64())}), path, "csv")
    assert path.stat().st_size > 2_000_000
    assert read_table(path, REQUESTS, "csv").column("error").to_pylist() == errors


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_file_that_does_not_read_is_named(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"requests.{fmt}"
    path.write_text('"chunks"\n"not a number"\n' if fmt == "csv" else "not parquet")
    with pytest.raises(StoreError) as err:
        read_table(path, REQUESTS, fmt)
    message = str(err.value)
    assert message.startswith(f"{path}: cannot read it as {fmt} (") and message.endswith(")")
    assert "\n" not in message
    said = "invalid value 'not a number')" if fmt == "csv" else "Parquet magic bytes not found in footer."
    assert said in message  # the first line of what the reader said
    missing = tmp_path / "missing"
    with pytest.raises(StoreError, match="No such file" if fmt == "csv" else f"as parquet \\({missing}\\)$"):
        read_table(missing, REQUESTS, fmt)
