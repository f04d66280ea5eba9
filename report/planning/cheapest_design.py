"""The design that decides a hypothesis at the least GPU time: launches per arm x repeats per launch, from
variance components (between launches, between repeats of one launch) and the cost of a launch's start and
of one repeat of its points (report.planning.design_costs reads them from a database). Pure.

A launch's value is the mean of its r repeats, so its variance is L + R / r; the interval is read between
the n launches per arm (a fixed design's 95% t on n - 1 df), with that SD at its upper confidence bound on
its Welch-Satterthwaite df (report.stats.power.sd_upper). Repeats shrink only R / r; launches shrink all of it.
A design of n launches and r repeats costs n x (start + r x point). One block is one launch per arm: arms
swapped inside one launch (sleep and wake) are not built, so blocks per launch is always 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from report.stats.intervals import fixed_critical, welch_df
from report.stats.power import power_inside, power_to_clear, sd_upper

POWER = 0.8


@dataclass(frozen=True)
class Components:
    """Log-scale (relative) variances of one block's value: between launches beyond the repeats (for a ratio,
    what does not cancel between its two sides), and between repeats of one launch (a ratio: both sides').
    A df of 0 means the component was not measured."""

    launch_var: float
    launch_df: float
    repeat_var: float
    repeat_df: float

    def block(self, repeats: int) -> tuple[float, float]:
        """(SD, df) of one block's value with `repeats` repeats per launch."""
        parts = [(self.launch_var, self.launch_df), (self.repeat_var / repeats, self.repeat_df)]
        return math.sqrt(self.launch_var + self.repeat_var / repeats), welch_df(parts)


@dataclass(frozen=True)
class Costs:
    """GPU-seconds of one block: `start_s` once per block (every arm's start and stop), `point_s` per repeat
    (every point the hypothesis rests on, every arm)."""

    start_s: float
    point_s: float

    def gpu_s(self, launches: int, repeats: int) -> float:
        return launches * (self.start_s + repeats * self.point_s)


@dataclass(frozen=True)
class Goal:
    """What deciding means: the interval clears an edge `distance` (log scale) from the truth, or (`inside`)
    lies wholly inside a band of +-`distance` around it; with probability `power`."""

    distance: float
    inside: bool = False
    power: float = POWER


@dataclass(frozen=True)
class Limits:
    launches: int = 30  # per arm
    repeats: int = 10  # per launch
    gpu_s: float | None = None  # the most GPU time a design may cost


LIMITS = Limits()


@dataclass(frozen=True)
class Design:
    launches: int  # per arm (= blocks)
    repeats: int  # per launch
    gpu_s: float
    power: float  # the weakest goal's, where several
    block_sd: float  # one block's SD at its upper confidence bound, the weakest goal's


@dataclass(frozen=True)
class Proposal:
    """The cheapest design, or None and why not."""

    design: Design | None
    why_not: str = ""


def power(components: Components, goal: Goal, launches: int, repeats: int) -> tuple[float, float]:
    """(power, the block SD it used) of `launches` per arm with `repeats` each: 0 below two launches or
    without a measured spread."""
    sd, df = components.block(repeats)
    if launches < 2 or not (components.launch_df or components.repeat_df):
        return 0.0, sd
    if df:  # a spread measured as exactly 0 has no df and stays 0
        sd = sd_upper(sd, df)
    critical = fixed_critical(launches - 1)
    if goal.inside:
        return power_inside(goal.distance, sd, launches, critical), sd
    return power_to_clear(goal.distance, sd, launches, critical), sd


def _fewest(items: Sequence[tuple[Components, Goal]], repeats: int, most: int) -> tuple[int, float, float] | None:
    """The fewest launches (2..most) at which every goal has its power, with the weakest (power, SD)."""
    for n in range(2, most + 1):
        got = [(power(c, g, n, repeats), g.power) for c, g in items]
        if all(p >= want for (p, _), want in got):
            (p, sd), _ = min(got, key=lambda x: x[0][0] - x[1])
            return n, p, sd
    return None


def cheapest(items: Sequence[tuple[Components, Goal]], costs: Costs, limits: Limits = LIMITS) -> Proposal:
    """The design of least GPU time (ties: fewer launches, then fewer repeats) at which every (components,
    goal) is decided with its power, within `limits`."""
    if not items:
        return Proposal(None, "nothing to decide")
    if any(not c.launch_df for c, _ in items):
        return Proposal(None, "the spread between launches was not measured: it needs an earlier run of at "
                              "least 2 launches per arm")
    best: Design | None = None
    for r in range(1, limits.repeats + 1):
        found = _fewest(items, r, limits.launches)
        if found is None:
            continue
        n, p, sd = found
        design = Design(n, r, costs.gpu_s(n, r), p, sd)
        if best is None or (design.gpu_s, n, r) < (best.gpu_s, best.launches, best.repeats):
            best = design
    if best is None:
        return Proposal(None, f"no design of up to {limits.launches} launches per arm and {limits.repeats} "
                              f"repeats decides it with {max(g.power for _, g in items):.0%} power")
    if limits.gpu_s is not None and best.gpu_s > limits.gpu_s:
        return Proposal(None, f"the cheapest design ({best.launches} launches per arm x {best.repeats} repeats) "
                              f"costs {best.gpu_s:,.0f} GPU-s, over the cap of {limits.gpu_s:,.0f}")
    return Proposal(best)
