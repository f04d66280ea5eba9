"""How a results folder's files hold the tables (runner.store.timefmt), on small arrow tables: per-token times
as whole-microsecond gaps (rounded half to even, then differenced, so a running sum gives the rounded times
back exactly), in place; files of whole nanoseconds (written before) read back bit for bit; Parquet with zstd,
dictionaries for all but the times, the gaps split byte by byte; CSV with lists as JSON text, read back to the
store's types; a file that does not read is named."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from base.errors import StoreError
from runner.store.tables import REQUESTS
from runner.store.timefmt import (
    GAPS_US,
    TIMES_NS,
    TIMES_S,
    ZSTD_LEVEL,
    cumulative,
    decode_times,
    encode_times,
    read_table,
    whole_us,
    write_table,
)

SECONDS = pa.list_(pa.float64())


def _requests(times: list[list[float | None] | None]) -> pa.Table:
    n = len(times)
    return pa.table({"point_id": pa.array([f"p{i % 2}" for i in range(n)]), TIMES_S: pa.array(times, SECONDS),
                     "chunks": pa.array(range(n), pa.int64())})


def _decode_like(n: int = 300, chunks: int = 60, seed: int = 1) -> list[list[float]]:
    """n requests of `chunks` times 8-12 ms apart in whole nanoseconds of a clock some minutes up, as a
    decode's."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = rng.randint(400_000_000_000, 500_000_000_000)
        out.append([(start + t) / 1e9 for t in itertools.accumulate(rng.randint(8_000_000, 12_000_000)
                                                                    for _ in range(chunks))])
    return out


def _as_nanoseconds(data: pa.Table) -> pa.Table:
    """`token_times_s` as the files written before the gaps held it: `token_times_ns`, whole nanoseconds."""
    lists = data.column(TIMES_S).combine_chunks()
    ns = np.round(lists.flatten().to_numpy() * 1e9).astype(np.int64)
    at = data.column_names.index(TIMES_S)
    return data.remove_column(at).add_column(at, TIMES_NS, pa.ListArray.from_arrays(lists.offsets, pa.array(ns)))


def test_times_become_microsecond_gaps_in_place() -> None:
    data = _requests([[1.000000001, 2.5], [], [2.01, 0.7], [3.25]])
    encoded = encode_times(data)
    assert encoded.column_names == ["point_id", GAPS_US, "chunks"]
    assert encoded.schema.field(GAPS_US).type == pa.list_(pa.int64())
    # each list starts at its first time, absolute (not a gap from the list before); then the gaps, which may
    # be negative; 2.01 s is 2009999.9999999998 us as a double: rounded, not cut
    assert encoded.column(GAPS_US).to_pylist() == [[1000000, 1500000], [], [2010000, -1310000], [3250000]]
    assert decode_times(encoded).column(TIMES_S).to_pylist() == [[1.0, 2.5], [], [2.01, 0.7], [3.25]]
    assert decode_times(encoded).drop_columns([TIMES_S]).equals(data.drop_columns([TIMES_S]))
    assert decode_times(encoded).column_names == data.column_names


def test_times_are_rounded_to_the_microsecond_half_to_even() -> None:
    seconds = [1.0000004, 1.0000006, 1.0000005, 1.0000015, 2.5e-6, 3.5e-6, 0.0000004999, 0.0]
    assert whole_us(seconds).tolist() == [1000000, 1000001, 1000000, 1000002, 2, 4, 0, 0]
    assert whole_us(seconds).dtype == np.int64
    # rounded first, then differenced: 1.0000004 and 1.0000006 are 1 us apart, not 0.2 us rounded to 0
    encoded = encode_times(_requests([[1.0000004, 1.0000006, 1.0000015]]))
    assert encoded.column(GAPS_US).to_pylist() == [[1000000, 1, 1]]


def test_a_running_sum_gives_back_the_rounded_times_exactly() -> None:
    times = _decode_like(50, 40, seed=7) + [[], [12.0]]
    encoded = encode_times(_requests(times))  # type: ignore[arg-type]
    for gaps, request in zip(encoded.column(GAPS_US).to_pylist(), times, strict=True):
        assert list(itertools.accumulate(gaps)) == whole_us(request).tolist()
    decoded = decode_times(encoded).column(TIMES_S).to_pylist()
    assert decoded == [(whole_us(r) / 1e6).tolist() for r in times]
    flat = np.array([t for r in times for t in r])
    back = np.array([t for r in decoded for t in r])
    assert np.abs(back - flat).max() <= 5e-7 + 1e-12 and not np.array_equal(back, flat)  # rounded, by at most 0.5 us


def test_the_running_sum_stays_within_each_list() -> None:
    offsets = np.array([0, 2, 2, 3, 6])
    gaps = np.array([100, 5, 7, 200, 1, -2])
    assert cumulative(gaps, offsets).tolist() == [100, 105, 7, 200, 201, 199]
    assert cumulative(np.array([], np.int64), np.array([0, 0])).tolist() == []


def test_a_table_in_chunks_or_sliced_is_encoded_whole() -> None:
    data = pa.concat_tables([_requests([[1.0], [2.0, 3.0]]), _requests([[4.5]])])
    assert data.column(TIMES_S).num_chunks == 2
    encoded = encode_times(data)
    assert encoded.column(GAPS_US).to_pylist() == [[1000000], [2000000, 1000000], [4500000]]
    assert decode_times(encoded).column(TIMES_S).to_pylist() == [[1.0], [2.0, 3.0], [4.5]]
    sliced = _requests([[1.0, 1.5], [2.0, 3.0], [4.5]]).slice(1)
    assert encode_times(sliced).column(GAPS_US).to_pylist() == [[2000000, 1000000], [4500000]]
    assert decode_times(encode_times(sliced)).column(TIMES_S).to_pylist() == [[2.0, 3.0], [4.5]]


@pytest.mark.parametrize("times", [[[1.0], None], [[1.0, None]], [[1.0, float("nan")]], [[float("inf")]],
                                   [[1e10]]], ids=["null list", "null time", "nan", "inf", "past int64 ns"])
def test_null_or_unwritable_times_are_kept_as_doubles(times: list[list[float | None] | None]) -> None:
    data = _requests(times)
    assert encode_times(data) is data


def test_other_tables_are_kept_as_given_and_finer_times_rounded() -> None:
    plain = pa.table({"chunks": pa.array([1], pa.int64())})
    assert encode_times(plain) is plain and decode_times(plain) is plain
    finer = _requests([[1.0], [0.1 + 1e-12]])  # not a whole nanosecond: rounded like any other time
    assert encode_times(finer).column(GAPS_US).to_pylist() == [[1000000], [100000]]


def test_nanosecond_files_written_before_decode_bit_for_bit(tmp_path: Path) -> None:
    times = _decode_like(20, 30, seed=3) + [[], [2.01, 425.951875063]]
    data = _requests(times)  # type: ignore[arg-type]
    old = _as_nanoseconds(data)
    path = tmp_path / "requests.parquet"  # as the files written before were: zstd, no dictionary for the times
    pq.write_table(old, path, compression="zstd", compression_level=ZSTD_LEVEL, use_dictionary=["point_id"])
    back = decode_times(read_table(path, REQUESTS, "parquet"))
    assert back.column_names == data.column_names and back.equals(data)
    large = pa.table({TIMES_NS: pa.array([[1500000000, 7], []], pa.large_list(pa.int64()))})
    decoded = decode_times(large)
    assert decoded.column_names == [TIMES_S] and decoded.schema.field(TIMES_S).type == SECONDS
    assert decoded.column(TIMES_S).to_pylist() == [[1.5, 7e-9], []]


def test_gaps_read_as_another_list_type_decode_alike() -> None:
    large = pa.table({GAPS_US: pa.array([[1500000, 7], []], pa.large_list(pa.int64()))})
    decoded = decode_times(large)
    assert decoded.column_names == [TIMES_S] and decoded.schema.field(TIMES_S).type == SECONDS
    assert decoded.column(TIMES_S).to_pylist() == [[1.5, 1.500007], []]


def _columns(path: Path) -> dict[str, pq.ColumnChunkMetaData]:
    meta = pq.ParquetFile(path).metadata.row_group(0)
    return {meta.column(i).path_in_schema.split(".")[0]: meta.column(i) for i in range(meta.num_columns)}


def test_parquet_is_zstd_with_dictionaries_but_for_the_gaps_split_by_bytes(tmp_path: Path) -> None:
    data = _requests(_decode_like())  # type: ignore[arg-type]
    encoded = encode_times(data)
    path = tmp_path / "requests.parquet"
    write_table(encoded, path, "parquet")
    columns = _columns(path)
    assert {c.compression for c in columns.values()} == {"ZSTD"}
    assert columns[GAPS_US].path_in_schema == f"{GAPS_US}.list.element"
    assert "BYTE_STREAM_SPLIT" in columns[GAPS_US].encodings
    assert not any("DICTIONARY" in e for e in columns[GAPS_US].encodings)
    assert any("DICTIONARY" in e for e in columns["point_id"].encodings)
    assert "BYTE_STREAM_SPLIT" not in columns["chunks"].encodings
    assert read_table(path, REQUESTS, "parquet").equals(encoded)
    assert decode_times(read_table(path, REQUESTS, "parquet")).column(TIMES_S).to_pylist() == [
        (whole_us(r) / 1e6).tolist() for r in data.column(TIMES_S).to_pylist()]
    default = tmp_path / "default.parquet"  # the same file at zstd's default level: a bigger one
    pq.write_table(encoded, default, compression="zstd", use_dictionary=["point_id", "chunks"],
                   column_encoding={f"{GAPS_US}.list.element": "BYTE_STREAM_SPLIT"})
    assert path.stat().st_size < default.stat().st_size
    unsplit = tmp_path / "unsplit.parquet"  # the gaps without the byte split: a bigger one
    pq.write_table(encoded, unsplit, compression="zstd", compression_level=ZSTD_LEVEL,
                   use_dictionary=["point_id", "chunks"])
    assert path.stat().st_size < unsplit.stat().st_size
    plain = tmp_path / "plain.parquet"  # a table without times
    write_table(pa.table({"point_id": ["a", "a", "b"]}), plain, "parquet")
    assert read_table(plain, REQUESTS, "parquet").column("point_id").to_pylist() == ["a", "a", "b"]


def test_gaps_take_under_half_the_bytes_of_nanoseconds(tmp_path: Path) -> None:
    data = _requests(_decode_like())  # type: ignore[arg-type]  # 300 requests of 60 chunks
    new, old = tmp_path / "new.parquet", tmp_path / "old.parquet"
    write_table(encode_times(data), new, "parquet")
    pq.write_table(_as_nanoseconds(data), old, compression="zstd", compression_level=ZSTD_LEVEL,
                   use_dictionary=["point_id", "chunks"])
    assert new.stat().st_size < 0.5 * old.stat().st_size


def test_csv_holds_lists_as_json_and_reads_back_the_stores_types(tmp_path: Path) -> None:
    encoded = encode_times(_requests([[1.25, 2.0], [], [3.0]]))
    path = tmp_path / "requests.csv"
    write_table(encoded, path, "csv")
    lines = path.read_text().splitlines()
    assert lines[0] == '"point_id","token_gaps_us","chunks"'
    assert lines[1] == '"p0","[1250000, 750000]",0' and lines[2] == '"p1","[]",1'
    back = read_table(path, REQUESTS, "csv")
    assert back.equals(encoded)
    old = _as_nanoseconds(_requests([[1.25, 2.0], [], [425.951875063]]))  # a CSV folder written before
    write_table(old, path, "csv")
    assert path.read_text().splitlines()[1] == '"p0","[1250000000, 2000000000]",0'
    assert decode_times(read_table(path, REQUESTS, "csv")).column(TIMES_S).to_pylist() == [
        [1.25, 2.0], [], [425.951875063]]
    doubles = _requests([[0.5], None, []])  # a NULL list keeps the times doubles, and stays NULL
    write_table(encode_times(doubles), path, "csv")
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
