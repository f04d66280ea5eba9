"""How a results folder's files hold the tables (runner.store.folder): zstd Parquet or CSV, and per-token
times as integer nanoseconds.

`requests.token_times_s` is most of the data (a double per SSE chunk). The client's clock
(`time.monotonic()`) counts whole nanoseconds, so each stored time is n / 1e9 for an integer n: the files
hold n (`token_times_ns`, int64 lists, zstd without a dictionary), and n / 1e9 gives back the very same double. A run
whose times are not all whole nanoseconds keeps `token_times_s` as doubles, so no file ever loses a bit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from base.errors import StoreError
from runner.store.tables import Table, arrow_type

TIMES_S = "token_times_s"
TIMES_NS = "token_times_ns"
ZSTD_LEVEL = 9


def encode_times(data: Any) -> Any:
    """`token_times_s` as `token_times_ns` (int64 lists), where that is exact; other tables as given."""
    import numpy as np
    import pyarrow as pa

    if TIMES_S not in data.column_names:
        return data
    at = data.column_names.index(TIMES_S)
    lists = data.column(TIMES_S).combine_chunks()
    seconds = lists.flatten().to_numpy(zero_copy_only=False)
    ns = np.round(seconds * 1e9).astype(np.int64)
    if not np.array_equal(ns / 1e9, seconds):
        return data
    offsets = lists.offsets if lists.null_count == 0 else None
    if offsets is None:
        return data  # a NULL list (never written by the store): kept as doubles
    encoded = pa.ListArray.from_arrays(offsets, pa.array(ns, pa.int64()))
    return data.remove_column(at).add_column(at, TIMES_NS, encoded)


def decode_times(data: Any) -> Any:
    """`token_times_ns` back to `token_times_s` (n / 1e9, the double the store held)."""
    import pyarrow as pa

    if TIMES_NS not in data.column_names:
        return data
    at = data.column_names.index(TIMES_NS)
    lists = data.column(TIMES_NS).combine_chunks()
    if not isinstance(lists, pa.ListArray):
        lists = lists.cast(pa.list_(pa.int64()))
    seconds = lists.flatten().to_numpy(zero_copy_only=False) / 1e9
    decoded = pa.ListArray.from_arrays(lists.offsets, pa.array(seconds, pa.float64()))
    return data.remove_column(at).add_column(at, TIMES_S, decoded)


def write_table(data: Any, path: Path, fmt: str) -> None:
    """One table's rows to a Parquet file (zstd) or a CSV file (lists as JSON text)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        # Dictionaries for every column but the nanoseconds (distinct values, so a dictionary only adds
        # bytes). Delta encoding of the nested list was tried: larger after zstd (9.6 MB -> 11.9 MB on
        # fp8-kv's requests), so the plain encoding stays.
        plain = [n for n in data.column_names if n != TIMES_NS]
        pq.write_table(data, str(path), compression="zstd", compression_level=ZSTD_LEVEL, use_dictionary=plain)
        return
    import pyarrow as pa
    import pyarrow.csv as pcsv

    for i, name in enumerate(data.column_names):
        if pa.types.is_list(data.schema.field(name).type):
            text = [None if v is None else json.dumps(v) for v in data.column(name).to_pylist()]
            data = data.set_column(i, name, pa.array(text, pa.string()))
    pcsv.write_csv(data, str(path))


def read_table(path: Path, table: Table, fmt: str) -> Any:
    """A file of `write_table` as an arrow table; a file that cannot be read is refused, naming it."""
    import pyarrow as pa

    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(str(path))
        import pyarrow.csv as pcsv

        types = {c.name: arrow_type(c.sql) for c in table.columns}
        types[TIMES_NS] = pa.list_(pa.int64())
        listed = {name: tp for name, tp in types.items() if pa.types.is_list(tp)}
        data = pcsv.read_csv(str(path), parse_options=pcsv.ParseOptions(newlines_in_values=True),
                             convert_options=pcsv.ConvertOptions(
                                 column_types={n: (pa.string() if n in listed else tp) for n, tp in types.items()},
                                 strings_can_be_null=True, quoted_strings_can_be_null=False))
        for i, name in enumerate(data.column_names):
            if name in listed:
                values = [None if v is None else json.loads(v) for v in data.column(name).to_pylist()]
                data = data.set_column(i, name, pa.array(values, listed[name]))
        return data
    except (pa.ArrowException, OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StoreError(f"{path}: cannot read it as {fmt} ({first})") from None
