"""The measured side of a capacity hypothesis: one capacity per launch, recomputed from the search's stored
probe points by replaying the search (compiler.capacity.replay), never stored on its own.

The interval on a capacity is between launches, like a server metric's: each launch searched once, its
capacity is one value, and the t interval (or, for a ratio, the paired one by block) is taken over the
launches' capacities (report.stats.intervals). A capacity is the highest level that held, and the search's
resolution is part of its uncertainty: the interval is widened to the one taken over each launch's lowest
level that failed (for a ratio, the numerator's failing levels over the denominator's held ones, and the
other way round), so launches that bisected to the same levels never read as a zero-width interval. The probes' own attainment is a binomial proportion; its Wilson
interval (`wilson`) is shown beside each probe, never used for the verdict. A launch whose search has no
capacity (an invalid probe, no bracket in the range, or a search cut short) makes the hypothesis invalid,
naming the probe or the search and why: a launch left out silently would bias the ratio.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from compiler.capacity import replay, stored_held, stored_level
from compiler.plan import SearchStep
from report.results import RunData
from report.scoring.score_model import Reason, Why
from report.scoring.sides import MeasuredSide
from report.stats.intervals import Layout, Obs, Place
from runner.store.records import CheckResult, PointRecord


@dataclass(frozen=True)
class ProbeRow:
    """One stored probe of a search, as the pages show it."""

    point_id: str
    level: float
    attainment: float | None
    requests: int
    valid: bool
    held: bool | None


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval of a binomial proportion (95% by default); None for n = 0."""
    if n <= 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def probe_rows(data: RunData, search: SearchStep) -> list[ProbeRow]:
    """The search's stored probes in a run, by load."""
    return stored_probe_rows(data.points, search)


def stored_probe_rows(points: Sequence[PointRecord], search: SearchStep) -> list[ProbeRow]:
    """The search's probes among stored `points`, by load."""
    out = []
    for p in (p for p in points if p.point_id.startswith(search.id + "/")):
        level = stored_level(search, p)
        if level is None:
            continue
        out.append(ProbeRow(p.point_id, level, p.summary.slo_attainment,
                            p.summary.requests_ok + p.summary.requests_failed, p.status == "ok" and p.valid,
                            stored_held(search, p)))
    return sorted(out, key=lambda r: r.level)


def search_side(data: RunData, ids: Sequence[str], searches: Mapping[str, SearchStep],
                failed_checks: dict[str, list[CheckResult]], design: Layout) -> MeasuredSide:
    """One side of a capacity hypothesis: a capacity per search (one search per launch) that stored probes."""
    side = MeasuredSide()
    for sid in ids:
        search = searches.get(sid)
        if search is None:
            continue
        rows = {r.level: r for r in probe_rows(data, search)}
        if not rows:
            continue
        side.rows += 1
        side.point_ids.append(sid)
        done, result = replay(search, {level: r.held for level, r in rows.items()})
        if result.status == "resolved" and result.capacity is not None:
            place = launch_place(design, sid.rsplit("/", 2)[0])  # study/arm[/L<k>]/workload/search -> its launch
            side.values.append(Obs(sid, result.capacity, place.launch, place.block, 1))
            assert result.failed is not None  # resolved: bracketed by a level that held and one that failed
            side.ceilings.append(Obs(sid, result.failed, place.launch, place.block, 1))
        elif result.status == "unresolved":
            bad = rows[done[-1].level]
            checks = tuple(sorted({c.name for c in failed_checks.get(bad.point_id, []) if c.severity == "fail"}))
            side.invalid.append(Reason(Why.FAILED_CHECK, point=bad.point_id, checks=checks))
        else:
            side.invalid.append(Reason(Why.SEARCH_OPEN, point=sid,
                                       detail=result.detail if result.status != "running" else "cut short"))
    return side


def launch_place(design: Layout, launch: str) -> Place:
    """A launch's place in the blocks: its server's (its first server's where it has several)."""
    return design.servers.get(launch) or design.servers.get(f"{launch}/s1") or Place(launch, None)
