"""How a results folder's files hold the tables (runner.store.folder): zstd Parquet or CSV, and per-token
times as whole-microsecond gaps.

`requests.token_times_s` is most of the data (a double per SSE chunk). The client stamps a chunk when the
event loop hands it over, tens of microseconds after it arrived, so the digits below a microsecond are
noise: the files hold `token_gaps_us` (int64 lists), per request the first time in whole microseconds,
then each gap to the previous time, all rounded to the microsecond before they are differenced, so a
cumulative sum gives back each rounded time exactly. Folders written before hold `token_times_ns` (whole
nanoseconds, read back to the very same doubles); both read. A NULL list or time stays as doubles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from base.errors import StoreError
from runner.store.tables import Table, arrow_type

TIMES_S = "token_times_s"
TIMES_NS = "token_times_ns"  # folders written before the microsecond gaps: read, never written
GAPS_US = "token_gaps_us"
ZSTD_LEVEL = 9
_LIMIT_S = 9.2e9  # a time past this many seconds has no int64 nanosecond: kept as doubles


def whole_us(seconds: Any) -> Any:
    """Seconds as int64 whole microseconds: each time to its whole nanosecond (which the client's clock
    counts), then half to even to the microsecond, in integers, so a time of exactly n.5 µs has one answer."""
    import numpy as np

    ns = np.round(np.asarray(seconds, np.float64) * 1e9).astype(np.int64)
    us, rest = np.divmod(ns, 1000)
    return us + ((rest > 500) | ((rest == 500) & (us % 2 == 1)))


def _starts(offsets: Any) -> Any:
    """The index of each non-empty list's first value."""
    return offsets[:-1][offsets[1:] > offsets[:-1]]


def encode_times(data: Any) -> Any:
    """`token_times_s` as `token_gaps_us` (int64 lists, in place); other tables, and times with a NULL or a
    value that is not a finite time, as given."""
    import numpy as np
    import pyarrow as pa

    if TIMES_S not in data.column_names:
        return data
    at = data.column_names.index(TIMES_S)
    lists = data.column(TIMES_S).combine_chunks()
    values = lists.flatten()
    if lists.null_count or values.null_count:
        return data  # a NULL list or time (never written by the store): kept as doubles
    seconds = values.to_numpy(zero_copy_only=False)
    if not np.all(np.abs(seconds) < _LIMIT_S):  # NaN and infinities too
        return data
    offsets = lists.offsets.to_numpy()
    offsets = offsets - offsets[0]  # a slice's offsets start where it does
    us = whole_us(seconds)
    gaps = np.diff(us, prepend=np.int64(0))
    starts = _starts(offsets)
    gaps[starts] = us[starts]
    encoded = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(gaps, pa.int64()))
    return data.remove_column(at).add_column(at, GAPS_US, encoded)


def _int_lists(data: Any, name: str) -> tuple[Any, Any]:
    """A column of int64 lists as (offsets from 0, values), whatever list type it was read as."""
    import pyarrow as pa

    lists = data.column(name).combine_chunks()
    if not isinstance(lists, pa.ListArray):
        lists = lists.cast(pa.list_(pa.int64()))
    offsets = lists.offsets.to_numpy()
    return offsets - offsets[0], lists.flatten().to_numpy(zero_copy_only=False)


def cumulative(gaps: Any, offsets: Any) -> Any:
    """Each list's running sum (the absolute microseconds of `token_gaps_us`), summing only within a list."""
    import numpy as np

    starts = _starts(offsets)
    steps = gaps.astype(np.int64, copy=True)
    steps[starts] = 0  # the absolute firsts stay out of the running sum: it adds gaps only
    running = np.cumsum(steps)
    base = np.zeros(len(offsets) - 1, np.int64)
    nonempty = offsets[1:] > offsets[:-1]
    base[nonempty] = gaps[starts] - running[starts]
    return running + np.repeat(base, np.diff(offsets))


def decode_times(data: Any) -> Any:
    """`token_gaps_us` (running sum / 1e6) or `token_times_ns` (n / 1e9, the very double the store held)
    back to `token_times_s`; a table with neither as given."""
    import pyarrow as pa

    if GAPS_US in data.column_names:
        name = GAPS_US
        offsets, gaps = _int_lists(data, name)
        seconds = cumulative(gaps, offsets) / 1e6
    elif TIMES_NS in data.column_names:
        name = TIMES_NS
        offsets, ns = _int_lists(data, name)
        seconds = ns / 1e9
    else:
        return data
    at = data.column_names.index(name)
    decoded = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(seconds, pa.float64()))
    return data.remove_column(at).add_column(at, TIMES_S, decoded)


def write_table(data: Any, path: Path, fmt: str) -> None:
    """One table's rows to a Parquet file (zstd) or a CSV file (lists as JSON text)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        # Dictionaries for every column but the times (distinct values: a dictionary only adds bytes). The
        # gaps are split byte by byte (BYTE_STREAM_SPLIT): their high bytes are nearly all zero, which zstd
        # then packs; the key is the leaf's path, and pyarrow ignores a key that names no leaf.
        plain = [n for n in data.column_names if n not in (TIMES_NS, GAPS_US)]
        split = {f"{GAPS_US}.list.element": "BYTE_STREAM_SPLIT"} if GAPS_US in data.column_names else None
        pq.write_table(data, str(path), compression="zstd", compression_level=ZSTD_LEVEL, use_dictionary=plain,
                       column_encoding=split)
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
        types[TIMES_NS] = types[GAPS_US] = pa.list_(pa.int64())
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
