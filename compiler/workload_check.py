"""Workloads against what they name: the trace and histogram files they read, the model length they must
fit in; and each workload's `Shape` for one arm, as the plan holds it.

Reads only the files the study names (a trace, a histogram, the model's config.json); never writes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.study import Study
from compiler.trace import TraceError, TraceRow, parse_histogram, parse_trace
from compiler.workload import Histogram, Length, Shape, TraceRef, Workload, length_floor

Finding = tuple[str, str]  # (dotted key, message)
DEFAULT_BLOCK_TOKENS = 16  # vLLM's default --block-size on GPUs and on the CPU build


class FileProblem(ValueError):
    """A file a workload names cannot be used; the message names the file and, where it has one, its line."""


@dataclass(frozen=True)
class TraceFile:
    rows: list[TraceRow]
    sha256: str
    path: Path


def read_trace(path: Path, name: str) -> TraceFile:
    """The trace at `path` (`name` as the study wrote it), parsed; FileProblem when missing or malformed."""
    raw = _read(path, name)
    try:
        rows = parse_trace(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise FileProblem(f"{name}:1: not UTF-8 text") from None
    except TraceError as exc:
        raise FileProblem(f"{name}:{exc.line}: {exc.message}") from None
    return TraceFile(rows, hashlib.sha256(raw).hexdigest(), path)


def read_histogram(path: Path, name: str) -> Histogram:
    """An inline histogram from a `length,weight` CSV file."""
    raw = _read(path, name)
    try:
        values, weights = parse_histogram(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise FileProblem(f"{name}:1: not UTF-8 text") from None
    except TraceError as exc:
        raise FileProblem(f"{name}:{exc.line}: {exc.message}") from None
    return Histogram(dist="histogram", values=values, weights=weights)


def _read(path: Path, name: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise FileProblem(f"{name}: no such file") from None
    except OSError as exc:
        raise FileProblem(f"{name}: cannot read: {exc.strerror}") from None


def arm_options(study: Study, arm: str) -> dict[str, Any]:
    return {k.replace("-", "_"): v for k, v in {**study.engine, **study.arms[arm].args}.items()}


def max_model_len(study: Study, arm: str, directory: Path) -> int | None:
    """The arm's `max_model_len` where the study sets a number, else its model's max_position_embeddings
    (vLLM's default), else None (unknown: lengths are not clipped)."""
    value = arm_options(study, arm).get("max_model_len")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) > 0:
        return int(value)
    model = study.arms[arm].model or study.model.path
    if model is None:
        return None
    try:
        config = json.loads((directory / model / "config.json").read_text())
    except (OSError, ValueError):
        return None
    found = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return found if isinstance(found, int) and found > 0 else None


def block_tokens(study: Study, arm: str) -> int:
    value = arm_options(study, arm).get("block_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else DEFAULT_BLOCK_TOKENS


def resolved(work: Workload, directory: Path) -> tuple[Length | None, Length | None]:
    """input_len and output_len with histogram files read into inline values."""
    def one(length: Length | None) -> Length | None:
        if isinstance(length, Histogram) and length.file is not None:
            return read_histogram(directory / length.file, length.file)
        return length
    return one(work.input_len), one(work.output_len)


def check_workloads(study: Study, directory: Path) -> Iterator[Finding]:
    """Files that must read, arrivals that need a trace, lengths that must fit every arm's model length."""
    for name, work in study.workloads.items():
        base = f"workloads.{name}"
        rows: list[TraceRow] = []
        if work.trace is not None:
            try:
                rows = read_trace(directory / work.trace, work.trace).rows
            except FileProblem as exc:
                yield f"{base}.trace", str(exc)
                continue
            if study.load.arrival == "trace" and rows[-1].timestamp_ms <= rows[0].timestamp_ms:
                yield f"{base}.trace", f"{work.trace}: every timestamp is the same: no arrival shape to replay"
        elif study.load.arrival == "trace":
            yield "load.arrival", f"arrival = \"trace\" needs a trace in every workload; {base} has none"
        lengths: list[tuple[str, Length | None]] = []
        for key in ("input_len", "output_len"):
            try:
                length = resolved(work, directory)[0 if key == "input_len" else 1]
            except FileProblem as exc:
                yield f"{base}.{key}.file", str(exc)
                break
            lengths.append((key, length))
        else:
            yield from _fits(study, directory, name, work, rows, lengths)


def _fits(study: Study, directory: Path, name: str, work: Workload, rows: list[TraceRow],
          lengths: list[tuple[str, Length | None]]) -> Iterator[Finding]:
    base = f"workloads.{name}"
    (_, inp), (_, out) = lengths
    if inp is not None and not isinstance(inp, int) and work.prefix_len >= length_floor(inp):
        yield f"{base}.prefix_len", (f"prefix_len ({work.prefix_len}) must be below the shortest input_len "
                                     f"({length_floor(inp)})")
        return
    for arm in study.arms:
        limit = max_model_len(study, arm, directory)
        if limit is None:
            continue
        if rows:
            for row in rows:
                if row.input_length + row.output_length > limit:
                    yield f"{base}.trace", (
                        f"{work.trace}:{row.line}: input_length + output_length = "
                        f"{row.input_length + row.output_length} exceeds max_model_len {limit} of arm {arm}")
                    break
            continue
        if inp is None or out is None:
            continue
        least = work.turns * (max(length_floor(inp), 1) + length_floor(out))
        if least > limit:
            turns = f" over {work.turns} turns" if work.turns > 1 else ""
            yield f"{base}.input_len", (
                f"the shortest {'conversation' if work.turns > 1 else 'request'}{turns} needs {least} tokens (input_len + output_len"
                f"{' per turn' if work.turns > 1 else ''}), more than max_model_len {limit} of arm {arm}")


def shape_of(study: Study, name: str, arm: str, directory: Path) -> tuple[Shape | None, float, float]:
    """(the point's shape, its mean prompt length, its mean output length) for workload `name` on `arm`.
    The shape is None for a classic workload (fixed lengths, one turn, no templates, no trace)."""
    work = study.workloads[name]
    if work.classic:
        return None, *(work.mean_lengths or (0.0, 0.0))
    limit = max_model_len(study, arm, directory)
    blocks = block_tokens(study, arm)
    trace_arrivals = study.load.arrival == "trace"
    if work.trace is not None:
        found = read_trace(directory / work.trace, work.trace)
        ref = TraceRef(path=str(found.path.resolve()), sha256=found.sha256, rows=len(found.rows))
        mean_in = sum(r.input_length for r in found.rows) / len(found.rows)
        mean_out = sum(r.output_length for r in found.rows) / len(found.rows)
        shape = Shape(trace=ref, trace_arrivals=trace_arrivals, max_len=limit, block_tokens=blocks)
        return shape, mean_in, mean_out
    inp, out = resolved(work, directory)
    assert inp is not None and out is not None  # the schema requires them without a trace
    shape = Shape(input=inp, output=out, templates=work.templates or 1, turns=work.turns, think_s=work.think_s,
                  max_len=limit, block_tokens=blocks)
    mean_in, mean_out = work.model_copy(update={"input_len": inp, "output_len": out}).mean_lengths or (0.0, 0.0)
    return shape, mean_in, mean_out


def conversation_requests(requests: int, turns: int) -> int:
    """A point's request count rounded up to whole conversations of `turns` requests each."""
    return math.ceil(requests / turns) * turns
