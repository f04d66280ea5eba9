"""The stopping rule's math: the confidence of each look's interval when blocks are added until every
hypothesis is decided, with the error rate kept honest. Pure.

The rule: repeated confidence intervals with Bonferroni alpha spending over the looks the budget
allows. The rule looks after every block from the first look (the required blocks, at least 2) to the
budget's maximum blocks K. The last look gets 80% of alpha (so a run that uses its whole budget reads
an interval close to a fixed design's), and the looks before it share the other 20% equally. Each
look's interval is an exact t interval at its own confidence. By the union bound, the intervals cover the
truth at every look at once with probability >= 95% for normal block values, whatever their number
of degrees of freedom and however the looks are correlated. So a verdict read at whatever look the
run stopped (decided, or out of budget) is wrong with probability <= 5% overall (<= 2.5% for a false
"refuted" on one side of the band), however often it peeked.

An exact group-sequential boundary (O'Brien-Fleming spending from the normal recursion, converted to
t by its nominal confidence) was tried first and rejected: with 1-7 df per look its false-refuted rate
came out at 3.0-3.3% against 2.5% in the simulation test.

A fixed design (no budget, or a budget of one look) has one look: the plain t interval.

A hypothesis run more than once under the same prediction spends one 5% across its runs (report.stats.alpha_ledger):
each run reads its looks with its share of ALPHA (`share`, 1/m for m such runs), so its intervals widen.
"""

from __future__ import annotations

from functools import lru_cache

from report.stats.intervals import Critical, fixed_critical, t_quantile

ALPHA = 0.05
FINAL_SHARE = 0.8  # of alpha, spent at the last look
FIXED_ALPHA = 0.05  # the alpha `report.stats.intervals.fixed_critical` is the multiplier of (t at 0.975)


def looks(first: int, max_blocks: int) -> tuple[int, ...]:
    """The blocks after which the rule looks: every block from the first look (>= 2) to the maximum."""
    first = max(2, min(first, max_blocks))
    return tuple(range(first, max_blocks + 1))


def look_alpha(blocks: int, max_blocks: int | None, first: int = 2, share: float = 1.0) -> float:
    """The two-sided alpha of the interval at the look after `blocks` blocks, of a run spending `share` of
    ALPHA (its part of the hypothesis' ledger). No budget, or a single look: the run's whole alpha. A look off
    the schedule (before the first) gets an early look's share."""
    alpha = ALPHA * share
    if max_blocks is None:
        return alpha
    schedule = looks(first, max_blocks)
    if len(schedule) == 1:
        return alpha
    if blocks >= max_blocks:
        return alpha * FINAL_SHARE
    return alpha * (1.0 - FINAL_SHARE) / (len(schedule) - 1)


def look_confidence(blocks: int, max_blocks: int | None, first: int = 2, share: float = 1.0) -> str:
    """The confidence of the interval at the look after `blocks` blocks, as the audit words it ("99.9%")."""
    return f"{100 * (1 - look_alpha(blocks, max_blocks, first, share)):.3g}%"


@lru_cache(maxsize=4096)
def _t_at(alpha: float, df: float) -> float:
    return t_quantile(1.0 - alpha / 2.0, df)


def look_critical(blocks: int, max_blocks: int | None, first: int = 2, share: float = 1.0) -> Critical:
    """The interval multiplier (a function of df) at the look after `blocks` blocks. Only an alpha of exactly
    5% is the fixed design's cached multiplier; any other (a look's, a run's share, a rule spending ALPHA
    other than 5%) is computed at that alpha, so a changed ALPHA reaches a fixed design too."""
    alpha = look_alpha(blocks, max_blocks, first, share)
    if alpha == FIXED_ALPHA:
        return fixed_critical

    def critical(df: float) -> float:
        return _t_at(alpha, round(df, 6))

    return critical
