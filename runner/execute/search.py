"""A capacity search on a running launch: probe after probe, each a full point (warmup, verified cache reset,
the checks), the next load chosen by `compiler.capacity` from the probes so far, until the search is over.

A probe holds when it is valid and its SLO attainment is at least the study's; an invalid or failed probe
stops the search (unresolved: the report names the probe that stopped it).
"""

from __future__ import annotations

from collections.abc import Callable

from compiler.capacity import Found, Probe, found, holds, next_level, probe_point
from compiler.plan import PointStep, SearchStep
from runner.execute.point import PointOutcome


def probe_held(outcome: PointOutcome, attainment: float) -> bool | None:
    """Whether a measured probe held `attainment`; None when it cannot say (invalid, failed, not judged)."""
    if not outcome.valid or outcome.judgement is None:
        return None
    return holds(outcome.judgement.summary.slo_attainment, attainment)


def run_search(search: SearchStep, measure: Callable[[PointStep], PointOutcome]) -> Found:
    """Measure the search's probes with `measure` (which runs and reports one point) until it is over."""
    integer = search.over == "concurrency"
    done: list[Probe] = []
    while (level := next_level(search.lo, search.hi, search.probes, integer, done)) is not None:
        outcome = measure(probe_point(search, level))
        done.append(Probe(level, probe_held(outcome, search.attainment)))
    return found(search.lo, search.hi, search.probes, integer, done)
