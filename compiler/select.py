"""Hypothesis selectors -> the one point (or server) each side of a prediction rests on.

Shared by validation (a selector must match exactly one point) and scoring (which rows to read).
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.metrics import METRICS
from compiler.study import Hypothesis, Rung, Study, Where


@dataclass(frozen=True)
class Target:
    """One side of a prediction: an arm, and for point metrics a workload and a rung of the ladder (a
    closed-loop `concurrency` or an open-loop `rate_rps`; both None for a server metric)."""

    arm: str
    workload: str | None
    concurrency: int | None = None
    rate_rps: float | None = None

    @property
    def label(self) -> str:
        parts = [self.arm] + ([self.workload] if self.workload else [])
        if self.concurrency is not None or self.rate_rps is not None:
            parts.append(Rung(self.concurrency, self.rate_rps).label)
        return "/".join(parts)


def merge(base: Where, side: str | Where | None) -> Where:
    if side is None:
        return base
    if isinstance(side, str):
        return base.model_copy(update={"arm": side})
    update = {k: v for k, v in side.model_dump().items() if v is not None}
    return base.model_copy(update=update)


def candidates(study: Study, where: Where, metric: str) -> list[Target]:
    """Every point (or server, or search) the selector matches."""
    load = study.load
    arms = [a for a in study.arms if where.arm in (None, a)]
    if METRICS[metric].level == "server":
        return [Target(a, None) for a in arms]
    workloads = [w for w in study.workloads if where.workload in (None, w)]
    if METRICS[metric].level == "search":  # one capacity per launch and workload: no rung to pick
        return [Target(a, w) for a in arms for w in workloads] if load.search is not None else []
    if load.concurrency is not None:
        rungs = [r for r in load.ladder if where.concurrency in (None, r.concurrency)]
    else:
        rungs = [r for r in load.ladder if where.rate is None or r.rate_rps == float(where.rate)]
    return [Target(a, w, r.concurrency, r.rate_rps) for a in arms for w in workloads for r in rungs]


def resolve(study: Study, where: Where, metric: str) -> Target:
    """The single target of a selector; ValueError says what is missing or ambiguous."""
    found = candidates(study, where, metric)
    if len(found) == 1:
        return found[0]
    if not found:
        raise ValueError("selector matches no point of the plan")
    dims = []
    closed = study.load.concurrency is not None
    for name, values in (
        ("arm", {t.arm for t in found}),
        ("workload", {t.workload for t in found}),
        ("concurrency", {t.concurrency for t in found}) if closed else ("rate", {t.rate_rps for t in found}),
    ):
        if len(values) > 1:
            dims.append(f"{name} ({', '.join(sorted(f'{v:g}' if isinstance(v, float) else str(v) for v in values))})")
    return_msg = f"selector matches {len(found)} points; narrow it by " + " and ".join(dims)
    raise ValueError(return_msg)


def sides(study: Study, hypothesis: Hypothesis) -> tuple[Target, Target | None]:
    """(numerator, denominator) targets; the denominator is None without `ratio`."""
    ratio = hypothesis.predict.ratio
    if ratio is None:
        return resolve(study, hypothesis.where, hypothesis.metric), None
    top = resolve(study, merge(hypothesis.where, ratio[0]), hypothesis.metric)
    bottom = resolve(study, merge(hypothesis.where, ratio[1]), hypothesis.metric)
    return top, bottom
