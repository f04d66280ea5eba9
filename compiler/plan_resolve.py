"""Hypotheses resolved onto a plan: the one builder of a `HypothesisSide` and a `HypothesisStep`, for the
compiler and for the report where a run stored none."""

from __future__ import annotations

from collections.abc import Sequence

from compiler.metrics import METRICS
from compiler.plan import HypothesisSide, HypothesisStep, Launch
from compiler.select import Target, sides
from compiler.study import Hypothesis, Study


def hypothesis_side(target: Target, points: Sequence[str], launches: Sequence[str] = (),
                    servers: Sequence[str] = ()) -> HypothesisSide:
    """One side of a prediction at `target`, measured on `points`, read from `launches` and their `servers`."""
    return HypothesisSide(
        arm=target.arm, workload=target.workload, concurrency=target.concurrency, rate_rps=target.rate_rps,
        points=tuple(points), launches=tuple(launches), servers=tuple(servers),
    )


def hypothesis_step(hyp: Hypothesis, numerator: HypothesisSide, denominator: HypothesisSide | None) -> HypothesisStep:
    """A hypothesis of the study file on its resolved sides (ValueError: an unknown metric)."""
    metric = METRICS.get(hyp.metric)
    if metric is None:
        raise ValueError(f"unknown metric {hyp.metric!r}")
    return HypothesisStep(
        id=hyp.id, claim=hyp.claim, metric=hyp.metric, unit=metric.unit, level=metric.level, source=hyp.source,
        prediction=hyp.predict, points=numerator.points + (denominator.points if denominator else ()),
        numerator=numerator, denominator=denominator,
    )


def plan_hypotheses(study: Study, launches: Sequence[Launch]) -> list[HypothesisStep]:
    """Every hypothesis of a study resolved onto the compiled launches: each side's points (every launch
    and repeat; a search metric: its searches, one per launch), the launches they run on (every launch of the
    arm for a server metric) and their servers."""
    def side(target: Target, level: str) -> HypothesisSide:
        on = [s for s in launches if s.arm == target.arm]
        if level == "search":
            found = [(s, q.id) for s in on for q in s.searches if q.workload == target.workload]
            return hypothesis_side(target, [i for _, i in found], [s.id for s, _ in found],
                                   [i for s, _ in found for i in s.server_ids])
        points = [
            p.id for s in on for p in s.points
            if level == "point" and p.workload == target.workload
            and (p.concurrency, p.rate_rps) == (target.concurrency, target.rate_rps)
        ]
        hosts = [s for s in on if level == "server" or any(p.id in points for p in s.points)]
        return hypothesis_side(target, points, [s.id for s in hosts],
                               [i for s in hosts for i in s.server_ids])

    out: list[HypothesisStep] = []
    for hyp in study.hypothesis:
        level = METRICS[hyp.metric].level
        top, bottom = sides(study, hyp)
        out.append(hypothesis_step(hyp, side(top, level), side(bottom, level) if bottom is not None else None))
    return out
