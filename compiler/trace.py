"""Request traces and length histograms read from text: the Mooncake trace format (one JSON object a
line: `timestamp` in ms, `input_length`, `output_length`, `hash_ids`) and `length,weight` CSV files.

Pure: text in, rows out; the caller reads the file. Every problem names the file's own line.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field

BLOCK_TOKENS = 512  # a Mooncake hash id stands for 512 prompt tokens; the last block of a prompt is partial


class TraceError(ValueError):
    """A problem of a trace or histogram file at one of its lines (1-based)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace: its arrival (ms), its lengths and the ids of its 512-token blocks."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    line: int = field(default=0, compare=False)  # the row's line in its file, for messages


def _int(value: object, name: str, line: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceError(line, f"`{name}` should be an integer >= {minimum}, got {json.dumps(value)}")
    return value


def parse_trace(text: str) -> list[TraceRow]:
    """Rows of a Mooncake-format trace; blank lines are skipped. Timestamps must not go back in time,
    and a row needs ceil(input_length / 512) hash ids (one per block, the last one partial)."""
    rows: list[TraceRow] = []
    last = -math.inf
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise TraceError(number, f"not a JSON object: {exc.args[0] if exc.args else exc}") from None
        if not isinstance(doc, dict):
            raise TraceError(number, "not a JSON object")
        missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in doc]
        if missing:
            raise TraceError(number, f"missing key(s) {', '.join(missing)}")
        stamp = doc["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp) or stamp < 0:
            raise TraceError(number, f"`timestamp` should be a number of ms >= 0, got {json.dumps(stamp)}")
        if stamp < last:
            raise TraceError(number, f"`timestamp` {stamp} is before the previous row's {last}")
        last = stamp
        inp = _int(doc["input_length"], "input_length", number, 1)
        out = _int(doc["output_length"], "output_length", number, 1)
        ids = doc["hash_ids"]
        if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in ids):
            raise TraceError(number, "`hash_ids` should be a list of integers")
        need = math.ceil(inp / BLOCK_TOKENS)
        if len(ids) != need:
            raise TraceError(number, f"`hash_ids` has {len(ids)} ids for input_length {inp}: need {need} "
                                     f"(one per {BLOCK_TOKENS}-token block)")
        rows.append(TraceRow(float(stamp), inp, out, tuple(ids), number))
    if not rows:
        raise TraceError(1, "the trace has no rows")
    return rows


def parse_histogram(text: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(lengths, weights) of a `length,weight` CSV (a header line of those names is allowed)."""
    values: list[int] = []
    weights: list[float] = []
    for number, cells in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not cells or not "".join(cells).strip():
            continue
        if number == 1 and [c.strip().lower() for c in cells] == ["length", "weight"]:
            continue
        if len(cells) != 2:
            raise TraceError(number, f"expected 2 columns (length,weight), got {len(cells)}")
        try:
            length, weight = int(cells[0]), float(cells[1])
        except ValueError:
            raise TraceError(number, f"expected an integer length and a number weight, got {','.join(cells)}") from None
        if length < 1 or not weight >= 0 or not math.isfinite(weight):
            raise TraceError(number, f"length should be >= 1 and weight >= 0, got {length},{cells[1].strip()}")
        values.append(length)
        weights.append(weight)
    if not values or sum(weights) <= 0:
        raise TraceError(1, "the histogram has no length with a positive weight")
    return tuple(values), tuple(weights)
