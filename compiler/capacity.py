"""The capacity search, pure: which load to probe next from the probes so far, what the search found, and
the probe point a level makes. The runner (`runner.execute.search`) measures the probes; the report replays
the same functions on the stored probes, so the capacity is recomputed from the database, never stored.

The search assumes attainment falls as load rises. It probes `hi` first (holds: the capacity is above the
range, "above"), then `lo` (fails: below the range, "below"), then bisects the bracket [highest level that
held, lowest that failed] until the probes are spent or, for concurrency, the bracket is one apart. An
invalid probe (a failed check) stops the search: "unresolved", no capacity.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from compiler.plan import PointStep, SearchStep

Status = Literal["running", "resolved", "above", "below", "unresolved"]


@dataclass(frozen=True)
class Probe:
    level: float
    held: bool | None  # None: the probe was invalid, so whether it held is unknown


@dataclass(frozen=True)
class Found:
    """What a search found: the capacity (highest level that held) where resolved, and its bracket."""

    status: Status
    capacity: float | None  # the highest level that held; None unless resolved
    held: float | None  # highest level that held so far
    failed: float | None  # lowest level that failed so far
    probes: int

    @property
    def detail(self) -> str:
        if self.status == "resolved":
            return f"holds at {self.held:g}, fails at {self.failed:g}"
        if self.status == "above":
            return f"holds at the top of the range ({self.held:g}): raise hi"
        if self.status == "below":
            return f"fails at the bottom of the range ({self.failed:g}): lower lo"
        return "stopped by an invalid probe" if self.status == "unresolved" else "still searching"


def holds(attainment: float | None, target: float) -> bool | None:
    """Whether a valid probe's SLO attainment holds the target (at least it); None when not measured."""
    return None if attainment is None else attainment >= target


def found(lo: float, hi: float, probes: int, integer: bool, done: Sequence[Probe]) -> Found:
    """The state of a search of [lo, hi] with at most `probes` probes, after the probes `done` (in order)."""
    good = max((p.level for p in done if p.held), default=None)
    bad = min((p.level for p in done if p.held is False), default=None)

    def state(status: Status) -> Found:
        return Found(status, good if status == "resolved" else None, good, bad, len(done))

    if any(p.held is None for p in done):
        return state("unresolved")
    if done and done[0].held:
        return state("above")
    if len(done) >= 2 and not done[1].held:
        return state("below")
    if len(done) < 2:
        return state("running")
    assert good is not None and bad is not None
    if len(done) >= probes or (integer and bad - good <= 1):
        return state("resolved")
    return state("running")


def next_level(lo: float, hi: float, probes: int, integer: bool, done: Sequence[Probe]) -> float | None:
    """The next level to probe, or None when the search is over."""
    now = found(lo, hi, probes, integer, done)
    if now.status != "running":
        return None
    if not done:
        return hi
    if len(done) == 1:
        return lo
    assert now.held is not None and now.failed is not None
    if integer:
        return float((int(now.held) + int(now.failed)) // 2)
    return (now.held + now.failed) / 2


def level_label(search: SearchStep, level: float) -> str:
    """A probe's part of its point id: `c12`, `rate2.5`."""
    return f"c{int(level)}" if search.over == "concurrency" else f"rate{level:g}"


def wave_requests(waves: int, concurrency: int, turns: int) -> int:
    """The requests of `waves` waves at `concurrency`: waves x concurrency conversations of `turns` requests
    each (one request each when single-turn)."""
    return waves * concurrency * turns


def probe_point(search: SearchStep, level: float) -> PointStep:
    """The probe of `search` at `level`: its template point at that load, with its own id and fingerprint;
    with `waves`, its requests are that many waves of the level."""
    closed = search.over == "concurrency"
    blob = f"{search.template.fingerprint}|{search.over}|{level!r}".encode()
    update: dict[str, Any] = {
        "id": f"{search.id}/{level_label(search, level)}/r1",
        "concurrency": int(level) if closed else None,
        "rate_rps": None if closed else level,
        "fingerprint": hashlib.sha256(blob).hexdigest()[:16],
    }
    if search.waves is not None:
        shape = search.template.shape
        update["requests"] = wave_requests(search.waves, int(level), shape.turns if shape else 1)
    return search.template.model_copy(update=update)


def replay(search: SearchStep, levels: dict[float, bool | None]) -> tuple[list[Probe], Found]:
    """The search replayed on stored probes (level -> held): the probes it made, in its order, and what it
    found. A level it would probe that is not stored ends the replay (a search cut short: still running)."""
    integer = search.over == "concurrency"
    done: list[Probe] = []
    while (level := next_level(search.lo, search.hi, search.probes, integer, done)) is not None:
        if level not in levels:
            break
        done.append(Probe(level, levels[level]))
    return done, found(search.lo, search.hi, search.probes, integer, done)


def probe_of(searches: Sequence[SearchStep], point: Any) -> PointStep | None:
    """The probe step a stored point (a `PointRecord`: its id, concurrency and rate) was measured as; None
    when it is no search's probe."""
    for search in searches:
        if point.point_id.startswith(search.id + "/"):
            level = stored_level(search, point)
            if level is not None:
                return probe_point(search, level)
    return None


def stored_level(search: SearchStep, point: Any) -> float | None:
    """The load a stored probe (a `PointRecord`) ran at: its concurrency or its rate; None when it has none."""
    level = point.concurrency if search.over == "concurrency" else point.rate_rps
    return None if level is None else float(level)


def stored_held(search: SearchStep, point: Any) -> bool | None:
    """Whether a stored probe (a `PointRecord`) held the search's attainment; None when it cannot say (not
    measured ok and valid, or no attainment stored)."""
    if not (point.status == "ok" and point.valid):
        return None
    return holds(point.summary.slo_attainment, search.attainment)
