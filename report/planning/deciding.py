"""What would decide an undecided hypothesis: more blocks (a sequential budget with room), more launches
per arm (one launch per arm, or a fixed design), with a number from the spread its own interval shows and
the block planner's arithmetic (report.planning.block_planner). Pure.

There is no "more repeats" here: repeats are the unit only inside one launch, and an interval on one
launch's repeats decides nothing (report.scoring.scoring: at most "inconclusive (one launch)").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from report.planning.block_planner import blocks_to_clear, blocks_within
from report.stats.intervals import Critical, Interval

MOST = 100  # the planner's search limit, in blocks or launches per arm
FIXED = MOST  # `first` for the planner: every n up to MOST read at a fixed design's 95%


def gap(mean: float, edges: Sequence[float]) -> float | None:
    """Relative (log-scale) distance from the mean to the nearest edge; None without a positive mean and
    edge (then on the linear scale, relative to the edge, where the edge is not 0)."""
    if mean > 0 and any(e > 0 for e in edges):
        return min(abs(math.log(mean / e)) for e in edges if e > 0)
    found = [abs(mean - e) / abs(e) for e in edges if e != 0]
    return min(found) if found else None


def unit_spread(est: Interval, critical: Critical) -> float | None:
    """The relative SD of one unit (a block's ratio, a launch's mean, a repeat) behind the interval:
    its half-width over the multiplier it was read with, times sqrt(n). None for one value."""
    if est.n < 2 or not est.df:
        return None
    if est.log_scale:
        if est.ci_low <= 0:
            return None
        half = (math.log(est.ci_high) - math.log(est.ci_low)) / 2
    else:
        if est.mean == 0:
            return None
        half = (est.ci_high - est.ci_low) / 2 / abs(est.mean)
    return half / critical(est.df) * math.sqrt(est.n)


def one_launch(est: Interval, critical: Critical, edges: Sequence[float], budget: int | None) -> str:
    """What would decide a row on one launch per arm: launches (under a budget, its blocks), at least as
    many as the repeats' spread asks for (a lower bound: launches vary at least as much as repeats)."""
    per = "launches per arm" + (" (blocks of the budget)" if budget is not None else "")
    spread = unit_spread(est, critical)
    distance = gap(est.mean, edges)
    if spread is None or distance is None:
        return f"at least 2 {per}, for an interval between launches"
    n = blocks_to_clear(distance, spread, most=MOST, first=FIXED)
    if n is None:
        return f"more than {MOST} {per} at its repeats' spread (the mean sits at an edge)"
    return f"at least {max(n, 2)} {per} (from its repeats' spread; launches vary at least as much)"


def straddling(est: Interval, critical: Critical, edges: Sequence[float], budget: int | None, first: int,
               blocks: int) -> str:
    """What would decide an interval between launches that straddles an edge: more blocks while a budget
    has room, else a (new) run of more blocks or launches per arm, with the planner's number at this
    spread."""
    spread = unit_spread(est, critical)
    distance = gap(est.mean, edges)
    known = spread is not None and distance is not None and distance > 0
    if budget is not None and blocks < budget:
        if not known:
            return "more blocks (the budget has room)"
        assert spread is not None and distance is not None
        n = blocks_within(distance, spread, first=first, budget=budget)
        if n is None:
            return f"more blocks than the budget's {budget} at this spread (a new run with a larger budget)"
        return f"more blocks: at this spread, about block {max(n, blocks + 1)} of the budget's {budget}"
    what = "blocks" if budget is not None else "launches per arm"
    head = "the budget is spent: a new run of " if budget is not None else ""
    if not known:
        return f"{head}more {what}"
    assert spread is not None and distance is not None
    n = blocks_to_clear(distance, spread, most=MOST, first=first if budget is not None else FIXED)
    if n is None:
        return f"{head}more than {MOST} {what} at this spread (the mean sits at an edge)"
    return f"{head}about {max(n, est.n + 1)} {what} at this spread"
