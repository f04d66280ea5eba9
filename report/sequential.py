"""Sequential decisions: add blocks until every hypothesis is decided, with the error rate kept honest.

The rule: repeated confidence intervals with Bonferroni alpha spending over the looks the budget
allows. The rule looks after every block from the first look (the required blocks, at least 2) to the
budget's maximum blocks K. The last look gets 80% of alpha (so a run that uses its whole budget reads
an interval close to a fixed design's), and the looks before it share the other 20% equally. Each
look's interval is an exact t interval at its own level. By the union bound, the intervals cover the
truth at every look at once with probability >= 95% for normal block values, whatever their number
of degrees of freedom and however the looks are correlated. So a verdict read at whatever look the
run stopped (decided, or out of budget) is wrong with probability <= 5% overall (<= 2.5% for a false
"refuted" on one side of the band), however often it peeked.

An exact group-sequential boundary (O'Brien-Fleming spending from the normal recursion, converted to
t by its nominal level) was tried first and rejected: with 1-7 df per look its false-refuted rate
came out at 3.0-3.3% against 2.5% in the simulation test.

A fixed design (no budget, or a budget of one look) has one look: the plain t interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from report.intervals import (
    Critical,
    Interval,
    Obs,
    fixed_critical,
    mean_interval,
    ratio_interval,
    t_quantile,
)

if TYPE_CHECKING:
    from compiler.load import LoadedStudy
    from report.results import RunData

ALPHA = 0.05
FINAL_SHARE = 0.8  # of alpha, spent at the last look


def looks(first: int, max_blocks: int) -> tuple[int, ...]:
    """The blocks after which the rule looks: every block from the first look (>= 2) to the maximum."""
    first = max(2, min(first, max_blocks))
    return tuple(range(first, max_blocks + 1))


def look_alpha(blocks: int, max_blocks: int | None, first: int = 2) -> float:
    """The two-sided level of the interval at the look after `blocks` blocks. No budget, or a single
    look: ALPHA. A look off the schedule (before the first) gets an early look's share."""
    if max_blocks is None:
        return ALPHA
    schedule = looks(first, max_blocks)
    if len(schedule) == 1:
        return ALPHA
    if blocks >= max_blocks:
        return ALPHA * FINAL_SHARE
    return ALPHA * (1.0 - FINAL_SHARE) / (len(schedule) - 1)


def look_level(blocks: int, max_blocks: int | None, first: int = 2) -> str:
    """The confidence level of the interval at the look after `blocks` blocks, as the audit words it ("99.9%")."""
    return f"{100 * (1 - look_alpha(blocks, max_blocks, first)):.3g}%"


@lru_cache(maxsize=4096)
def _t_at(alpha: float, df: float) -> float:
    return t_quantile(1.0 - alpha / 2.0, df)


def look_critical(blocks: int, max_blocks: int | None, first: int = 2) -> Critical:
    """The interval multiplier (a function of df) at the look after `blocks` blocks."""
    alpha = look_alpha(blocks, max_blocks, first)
    if alpha == ALPHA:
        return fixed_critical

    def critical(df: float) -> float:
        return _t_at(alpha, round(df, 6))

    return critical


# -- decisions ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """What a hypothesis predicts, as numbers: a band (value, range) or a threshold (relation)."""

    kind: str  # value | range | relation
    relation: str | None
    band_low: float | None
    band_high: float | None


@dataclass(frozen=True)
class SoFar:
    """The observations so far: the numerator side and, for a ratio, the denominator side."""

    top: Sequence[Obs]
    bottom: Sequence[Obs] | None = None


@dataclass(frozen=True)
class Budget:
    """The sequential budget: at most `max_blocks` blocks, the first look after `first_look`."""

    max_blocks: int
    first_look: int = 2


@dataclass(frozen=True)
class Decision:
    decided: bool  # the interval lies wholly inside or wholly outside the band
    verdict: str  # confirmed | refuted | inconclusive
    blocks_used: int
    interval: Interval | None = None
    stop: bool = False  # decided, or the budget's blocks are spent


def blocks_of(data: SoFar) -> int:
    """Blocks the data spans (distinct known blocks; unknown blocks count as one)."""
    obs = [*data.top, *(data.bottom or ())]
    return len({o.block for o in obs}) if obs else 0


def interval_at(data: SoFar, budget: Budget | None) -> Interval:
    """The interval at the current look: the repeated confidence interval under a budget."""
    n = blocks_of(data)
    critical = look_critical(n, budget.max_blocks, budget.first_look) if budget else fixed_critical
    if data.bottom is None:
        return mean_interval(data.top, critical)
    return ratio_interval(data.top, data.bottom, critical)


def decide(hypothesis: Claim, data_so_far: SoFar, budget: Budget) -> Decision:
    """Decide a hypothesis from the blocks so far: decided when the repeated confidence interval lies
    wholly inside (confirmed) or wholly outside (refuted) the band; stop then or when the budget is spent."""
    from report.scoring import judge

    used = blocks_of(data_so_far)
    interval = interval_at(data_so_far, budget)
    verdict = judge(hypothesis.kind, hypothesis.relation, hypothesis.band_low, hypothesis.band_high,
                    interval.ci_low, interval.ci_high)
    decided = verdict in ("confirmed", "refuted")
    return Decision(decided, verdict, used, interval, decided or used >= budget.max_blocks)


def undecided(loaded: LoadedStudy, data: RunData) -> tuple[str, ...]:
    """The runner's hook after each block of a run with `[design] budget`: the ids of the hypotheses
    still inconclusive (their repeated confidence interval straddles a band edge) while the budget's
    blocks are not spent; none for a fixed design or a spent budget. The next block need measure only
    what they rest on. Scoring reads the budget from the run's plan, so its intervals are this rule's."""
    from report.context import build_context
    from report.scoring import score

    ctx = build_context(loaded, data)  # reads the stored plan once, for the layout and the scores
    design = ctx.layout
    if design.budget_blocks is None:
        return ()
    if len(design.blocks(data.points)) >= design.budget_blocks:
        return ()
    return tuple(s.hypothesis for s in score(ctx) if s.verdict == "inconclusive")
