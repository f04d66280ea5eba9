"""Where a run's wall time went: each `studyc run` invocation on it is a segment, and each segment's wall
is split into phases (calibration, server start phases, warmup, ramp/drain, windows, stops, and the gap
no phase covers), stored as they happen (`SegmentRecord`, `PhaseRecord`) so a killed segment keeps what
it measured. A segment's phases add up to its wall x its device slots.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from runner.server.startlog import HELD_FIRST_IMPORTS, START_PHASES, UNSPLIT
from runner.store.records import PhaseRecord, SegmentRecord
from runner.store.store import Store

GAP = "gap"
WINDOW = "window"
PRIME = "prime (unmeasured start)"  # runner.execute.prime: a configuration's first start, before the first launch
START = "start"  # every start phase's name begins with it (START_PHASES, UNSPLIT, "start (failed)", ...)
# Every phase, in the order a run goes through them (tables and charts keep this order).
PHASES: tuple[str, ...] = (
    "calibration", "client self-test", "predictions", PRIME, HELD_FIRST_IMPORTS, *(name for name, _ in START_PHASES), UNSPLIT,
    "start (failed)", "warmup", "reset, scrape", "ramp/drain", WINDOW, "judge", "stop", GAP,
)


def point_phases(phases: dict[str, float], window_s: float) -> list[tuple[str, float]]:
    """A point's seconds by phase, from its `PointOutcome.phases` and its measurement window: the measured
    load is the window plus the measured requests outside it (ramp and drain)."""
    measure = phases.get("measure", 0.0)
    window = min(max(window_s, 0.0), measure)
    out = [("warmup", phases.get("warmup", 0.0)),
           ("reset, scrape", phases.get("reset", 0.0) + phases.get("scrape_before", 0.0)),
           ("ramp/drain", measure - window), (WINDOW, window), ("judge", phases.get("judge", 0.0))]
    return [(name, s) for name, s in out if s > 0]


class Timeline:
    """This invocation's segment of a run: opened once the run is, every phase stored as it is measured,
    together with the segment's wall so far. A segment a killed invocation left "running" is closed as
    "killed" (with its gap) when the next one opens."""

    def __init__(self, store: Store, run_id: str, origin: float, started_at: datetime) -> None:
        self.store, self.run_id, self.origin = store, run_id, origin
        segments, phases = store.timing(run_id)
        for seg in segments:
            if seg.ended == "running":
                mine = [p for p in phases if p.segment == seg.segment]
                store.put_timing(run_id, [replace(seg, ended="killed"),
                                          *_gap(seg, mine, max((p.seq for p in mine), default=0) + 1)])
        self.segment = SegmentRecord(segment=max((s.segment for s in segments), default=0) + 1,
                                     started_at=started_at, host=socket.gethostname())
        self.seq = 0
        self.add("", [])

    def add(self, launch_id: str, phases: Iterable[tuple[str, float]]) -> None:
        rows = []
        for name, seconds in phases:
            self.seq += 1
            rows.append(PhaseRecord(self.segment.segment, self.seq, launch_id, name, round(seconds, 3)))
        self.segment = replace(self.segment, ended_at=datetime.now(UTC),
                               wall_s=round(time.monotonic() - self.origin, 3))
        self.store.put_timing(self.run_id, [self.segment, *rows])

    def close(self, ended: str, slots: int) -> None:
        """End the segment: its wall, how it ended, and the gap no phase covers."""
        self.segment = replace(self.segment, ended=ended, slots=slots, ended_at=datetime.now(UTC),
                               wall_s=round(time.monotonic() - self.origin, 3))
        _, phases = self.store.timing(self.run_id)
        mine = [p for p in phases if p.segment == self.segment.segment]
        self.store.put_timing(self.run_id, [self.segment, *_gap(self.segment, mine, self.seq + 1)])


def _gap(seg: SegmentRecord, phases: Sequence[PhaseRecord], seq: int) -> list[PhaseRecord]:
    spent = sum(p.seconds for p in phases if p.phase != GAP)
    return [PhaseRecord(seg.segment, seq, "", GAP, round(seg.wall_s * seg.slots - spent, 3))]


@dataclass(frozen=True)
class PhaseTable:
    """A run's phases summed over its segments: (phase, seconds, share of the total), in `PHASES` order."""

    rows: tuple[tuple[str, float, float], ...]
    total_s: float  # the segments' wall x slots: what the rows add up to
    wall_s: float  # the segments' wall
    segments: int
    ended: tuple[str, ...]  # how each segment ended

    @property
    def window_s(self) -> float:
        return sum(s for name, s, _ in self.rows if name == WINDOW)

    def text(self) -> str:
        slots = "" if self.total_s == self.wall_s else f", {self.total_s:.1f} device-slot s"
        head = (f"  where the wall went ({self.segments} segment(s): {', '.join(self.ended)}; "
                f"wall {self.wall_s:.1f} s{slots})")
        width = max((len(n) for n, _, _ in self.rows), default=5)
        lines = [head, f"    {'phase':<{width}}  {'seconds':>9}  {'share':>6}"]
        lines += [f"    {n:<{width}}  {s:>9.1f}  {share:>6.1%}" for n, s, share in self.rows]
        return "\n".join(lines)


def phase_table(segments: Sequence[SegmentRecord], phases: Sequence[PhaseRecord],
                launch_id: str | None = None) -> PhaseTable | None:
    """The run's (or, with `launch_id`, one launch's) phases summed; a segment still "running" gets its gap
    computed here. None when no segment was stored (a run from before they were)."""
    if not segments:
        return None
    rows = list(phases)
    for seg in segments:
        mine = [p for p in rows if p.segment == seg.segment]
        if not any(p.phase == GAP for p in mine):
            rows += _gap(seg, mine, 0)
    if launch_id is not None:
        rows = [p for p in rows if p.launch_id == launch_id]
    sums: dict[str, float] = {}
    for p in rows:
        sums[p.phase] = sums.get(p.phase, 0.0) + p.seconds
    total = sum(s.wall_s * s.slots for s in segments) if launch_id is None else sum(sums.values())
    order = {name: i for i, name in enumerate(PHASES)}
    out = tuple((name, s, s / total if total else 0.0)
                for name, s in sorted(sums.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
    return PhaseTable(out, round(total, 3), round(sum(s.wall_s for s in segments), 3), len(segments),
                      tuple(s.ended for s in segments))


def launch_phases(phases: Sequence[PhaseRecord]) -> dict[str, list[tuple[str, float]]]:
    """launch id -> its (phase, seconds) summed over segments, in `PHASES` order (the study page's bars)."""
    out: dict[str, dict[str, float]] = {}
    for p in phases:
        if p.launch_id:
            got = out.setdefault(p.launch_id, {})
            got[p.phase] = got.get(p.phase, 0.0) + p.seconds
    order = {name: i for i, name in enumerate(PHASES)}
    return {lid: sorted(got.items(), key=lambda kv: order.get(kv[0], len(order))) for lid, got in sorted(out.items())}


def as_rows(table: PhaseTable | None) -> list[dict[str, Any]]:
    return [] if table is None else [{"phase": n, "seconds": s, "share": sh} for n, s, sh in table.rows]
