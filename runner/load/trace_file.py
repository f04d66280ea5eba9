"""The trace a point replays, read again from its file at run time: the plan holds its path and sha256,
and a file that changed since the plan was compiled is refused."""

from __future__ import annotations

from pathlib import Path

from base.errors import EngineError
from compiler.plan import PointStep
from compiler.trace import TraceRow
from compiler.workload_check import FileProblem, read_trace


def trace_rows(point: PointStep) -> list[TraceRow] | None:
    """The rows of the point's trace; None when it replays none. EngineError when the file is gone,
    malformed, or not the file the plan was compiled from."""
    if point.shape is None or point.shape.trace is None:
        return None
    ref = point.shape.trace
    try:
        found = read_trace(Path(ref.path), ref.path)
    except FileProblem as exc:
        raise EngineError(f"{point.id}: cannot replay its trace: {exc}") from None
    if found.sha256 != ref.sha256:
        raise EngineError(f"{point.id}: the trace {ref.path} changed since the plan was compiled (sha256 "
                          f"{found.sha256[:12]}, the plan's {ref.sha256[:12]}): re-plan, or restore the file")
    return found.rows
