"""Decidability before the run: per hypothesis of a plan, at the most blocks its design allows, the smallest
distance from an edge it detects, the narrowest band it could confirm, its best-case power and whether it
can be decided; after a run, why an inconclusive verdict is inconclusive. Pure: the priors (the spread per
metric) are handed in (report.planning.priors reads them from a database; `DEFAULTS` without one).

The arithmetic is report.stats.power's, at the interval a run reads at its end (report.planning.block_planner): a truth
at distance d from an edge is decided (the interval clears that edge) with probability power_to_clear; a
truth at a band's centre is confirmed (the interval inside both edges) with probability power_inside. See
docs/decidability.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from compiler.metrics import METRICS
from compiler.plan import Plan, PointStep
from report.stats.intervals import fixed_critical
from report.stats.power import power_inside, power_to_clear, sd_upper
from report.stats.sequential import look_critical

POWER = 0.8  # the power the distances are stated at
REFUSE_BELOW = 0.5  # `studyc run` refuses a hypothesis whose best-case power is below this
YES, NO = "yes", "no"
ONE_LAUNCH = "one launch per arm: the interval has no launch-to-launch variation in it (at most 'inconclusive (one launch)')"


@dataclass(frozen=True)
class Prior:
    """The spread of one metric's values, relative (log scale): between launches of one configuration
    (the within part removed) and between repeats of one launch, with the degrees of freedom of the
    launch part (None: taken as known) and where it came from."""

    metric: str
    launch_sd: float
    within_sd: float
    df: float | None
    source: str
    pair_sd: float | None = None  # of a block's log-ratio of two configurations paired in it
    pair_df: float | None = None

    def block_sd(self, repeats: int, ratio: bool) -> tuple[float, float | None]:
        """SD of one block's value and its df: sqrt(sL^2 + sW^2 / r); for a ratio, the paired blocks' own
        spread where stored runs give one, else the two sides' added (times sqrt(2))."""
        if ratio and self.pair_sd is not None:
            return self.pair_sd, self.pair_df
        var = self.launch_sd ** 2 + self.within_sd ** 2 / max(repeats, 1)
        return math.sqrt(var * (2.0 if ratio else 1.0)), self.df


Family = Literal["throughput", "token latency", "first token", "tail latency", "share", "error", "load",
                 "machine", "server", "startup", "capacity"]
TAILS = ("_p90_s", "_p95_s", "_p99_s")


def family(metric: str) -> Family:
    """The metric family whose default spread a metric takes without stored runs of it."""
    found = METRICS[metric]
    if found.level == "search":
        return "capacity"
    if metric == "startup_s":
        return "startup"
    if found.level == "server":
        return "server"
    if metric.startswith("ttft_"):
        return "first token"
    if metric.endswith(TAILS):
        return "tail latency"
    if metric.endswith("_s"):
        return "token latency"
    if metric == "littles_law_error":
        return "error"
    if metric == "mean_in_flight":
        return "load"
    if found.unit == "ratio":
        return "share"
    return "machine" if metric in ("power_mean_w", "energy_per_token_j", "sm_clock_mean_mhz") else "throughput"


# Per family: (launch SD, within SD, df of the launch part, SD of a paired block's log-ratio, its df), relative,
# computed from results/h200 by scripts/decidability_defaults.py (report.planning.priors.family_priors: every
# run, pooled across GPU, model, vLLM and engine, outlier configurations dropped), rounded up to two
# significant digits. "share" (only prefix_hit_rate stored, without spread) and "capacity" (a search stores
# no point summary) take the throughput family's: docs/decidability.md.
DEFAULTS_UNTIL = datetime(2026, 12, 6, 9, 58, 25)
DEFAULT_SPREADS: dict[Family, tuple[float, float, float, float, float]] = {
    "throughput": (0.033, 0.025, 1982, 0.053, 680),
    "token latency": (0.055, 0.042, 2456, 0.093, 826),
    "first token": (0.16, 0.19, 2091, 0.22, 668),
    "tail latency": (0.12, 0.080, 3699, 0.16, 1236),
    "error": (0.64, 0.15, 419, 0.27, 136),
    "load": (0.00030, 0.000042, 417, 0.000056, 136),
    "machine": (0.033, 0.018, 1235, 0.025, 402),
    "server": (0.0092, 0.0, 210, 0.011, 67),
    "startup": (0.42, 0.0, 184, 0.26, 63),
}
DEFAULT_SPREADS |= {"share": DEFAULT_SPREADS["throughput"], "capacity": DEFAULT_SPREADS["throughput"]}


def default_prior(metric: str) -> Prior:
    """The documented default spread of a metric's family (docs/decidability.md)."""
    launch, within, df, pair, pair_df = DEFAULT_SPREADS[family(metric)]
    return Prior(metric, launch, within, df, f"default for {family(metric)} metrics", pair, pair_df)


Shape = tuple[object, ...]


def shape_of(point: PointStep | None) -> Shape | None:
    """What makes configurations similar across GPU, model, vLLM and engine (report.planning.priors.similar): the
    workload's lengths and the load; () for a server metric (point None), None for a capacity search."""
    if point is None:
        return ()
    return (point.input_len, point.output_len, point.prefix_len, point.concurrency, point.rate_rps)


def step_mode(enforce_eager: bool) -> str:
    """How an engine runs its steps: "eager" (--enforce-eager: every kernel launched from Python) or
    "graphs" (CUDA graphs); what, with the shape, makes configurations similar."""
    return "eager" if enforce_eager else "graphs"


MODES = ("eager", "graphs")
MODE_SETS = (("graphs",), ("eager",), MODES)  # a hypothesis's sides' modes, sorted


def step_modes(plan: Plan, arms: Iterable[str]) -> tuple[str, ...]:
    """The sorted set of the arms' `step_mode`s: with the shape, what picks a hypothesis's similar
    configurations (report.planning.priors.similar_parts)."""
    wanted = set(arms)
    return tuple(sorted({step_mode(launch.engine.enforce_eager) for launch in plan.launches if launch.arm in wanted}))


@dataclass(frozen=True)
class Priors:
    """The spreads a plan's hypotheses are judged with: per (metric, shape) from similar configurations,
    per metric from every configuration, else the metric family's default."""

    by_metric: Mapping[str, Prior] = field(default_factory=dict)
    by_shape: Mapping[tuple[str, Shape], Prior] = field(default_factory=dict)

    def prior(self, metric: str, shape: Shape | None) -> Prior:
        found = self.by_shape.get((metric, shape)) if shape is not None else None
        return found or self.by_metric.get(metric) or default_prior(metric)


def end_critical(blocks: int, first: int) -> float:
    """The t multiplier of the interval a run of `blocks` blocks reads at its end: a fixed design's 95% up
    to the `first` required blocks, else the last look of a budget of that many blocks (report.stats.sequential)."""
    return look_critical(blocks, blocks, first)(blocks - 1) if blocks > first else fixed_critical(blocks - 1)


def smallest(power: Callable[[float], float], target: float = POWER) -> float:
    """The smallest x >= 0 with power(x) >= target, power increasing in x, to a relative 1e-4; 0.0 where
    every x down to 1e-12 reaches it (blocks without spread decide any distance)."""
    low, high = 0.0, 1e-3
    while power(high) < target:
        if high > 1e3:  # a thousand-fold distance: nothing decides it
            return math.inf
        low, high = high, high * 2.0
    while high - low > 1e-4 * high:
        if high < 1e-12:  # the threshold is 0: halving towards it would never end
            return 0.0
        mid = (low + high) / 2.0
        low, high = (low, mid) if power(mid) >= target else (mid, high)
    return high


@dataclass(frozen=True)
class Decidability:
    """What a hypothesis' planned design can decide, at the most blocks it allows (its best case)."""

    hypothesis: str
    metric: str
    kind: str  # value | range | relation
    blocks: int  # launches per arm the interval can rest on: the required blocks, or the budget's
    block_sd: float  # of one block's value, at its upper confidence bound (report.stats.power.sd_upper)
    band: float | None  # relative half-width of the band (log scale); None: a relation, or no positive band
    detectable: float | None  # the distance from an edge decided with 80% power; None: no interval
    narrowest: float | None  # the narrowest band (relative half-width) confirmed with 80% power
    best_power: float  # the power to confirm the prediction with the truth where it helps most
    source: str  # where the spread came from
    one_launch: bool = False  # a fixed design of one launch per arm: declared to decide nothing

    @property
    def decidable(self) -> str:
        """"yes" (a truth at the band's centre is confirmed with 80% power), "only if the truth is at
        least d from an edge" (a relation, or a band too narrow to confirm: only a truth that far outside
        is decided), or "no" (no interval between launches)."""
        if self.detectable is None:
            return NO
        if self.band is not None and self.narrowest is not None and self.band >= self.narrowest:
            return YES
        return f"only if the truth is at least {percent(self.detectable)} from an edge"

    @property
    def inconclusive_kind(self) -> str:
        """Which inconclusive the design risks: "underpowered" where its band is narrower than the narrowest it
        could confirm (its interval will be wider than the band), "one launch" where no interval between
        launches is read, else "near an edge" (only a truth near one leaves it undecided)."""
        if self.detectable is None:
            return "one launch"
        if self.band is not None and (self.narrowest is None or self.band < self.narrowest):
            return "underpowered"
        return "near an edge"

    @property
    def refused(self) -> bool:
        """`studyc run` refuses it without --underpowered: best-case power under 50%. A fixed design of one
        launch per arm is exempt: it states that it decides nothing, and every verdict says so."""
        return self.best_power < REFUSE_BELOW and not self.one_launch

    def to_json(self) -> dict[str, object]:
        return {"hypothesis": self.hypothesis, "metric": self.metric, "blocks": self.blocks,
                "block_sd": _round(self.block_sd), "band": _round(self.band),
                "min_detectable_distance": _round(self.detectable), "narrowest_band": _round(self.narrowest),
                "best_case_power": round(self.best_power, 3), "decidable": self.decidable,
                "inconclusive_would_be": self.inconclusive_kind,
                "refused_by_run": self.refused, "prior": self.source}


def _round(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.3g}")


def percent(x: float) -> str:
    """A relative distance as shown: 1.3%, 113% (two significant digits, never in exponent form)."""
    value = 100 * x
    return f"{value:.2g}%" if value < 99.5 else f"{value:.0f}%"


def band_width(kind: str, tolerance: float | None, low: float | None, high: float | None) -> float | None:
    """Relative half-width of a band on the log scale: log1p(tolerance) for a value (its nearer edge),
    log(high / low) / 2 for a range of positive numbers; None for a relation or another range."""
    if kind == "value" and tolerance is not None:
        return math.log1p(tolerance)
    if kind == "range" and low is not None and high is not None and 0 < low < high:
        return math.log(high / low) / 2.0
    return None


def decide(hypothesis: str, kind: str, band: float | None, prior: Prior, *, blocks: int, first: int,
           repeats: int, ratio: bool) -> Decidability:
    """The decidability of one hypothesis whose interval rests on at most `blocks` blocks (launches per
    arm), the first `first` required, each of `repeats` repeats; the block SD is the prior's at its upper
    confidence bound."""
    sd = sd_upper(*prior.block_sd(repeats, ratio))
    if blocks < 2:  # one launch per arm (a budget has two blocks at least)
        return Decidability(hypothesis, prior.metric, kind, blocks, sd, band, None, None, 0.0, prior.source,
                            one_launch=True)
    c = end_critical(blocks, first)
    detectable = smallest(lambda d: power_to_clear(d, sd, blocks, c))
    narrowest = smallest(lambda t: power_inside(t, sd, blocks, c))
    best = 1.0 if band is None else power_inside(band, sd, blocks, c)
    return Decidability(hypothesis, prior.metric, kind, blocks, sd, band, detectable, narrowest, best, prior.source)


Inconclusive = Literal["underpowered", "near an edge"]


def inconclusive_reason(kind: str, band_low: float | None, band_high: float | None, ci_low: float,
                        ci_high: float) -> Inconclusive:
    """Why an interval straddling an edge is inconclusive: "underpowered" where it is wider than the band
    (no position of it could lie inside), else "near an edge" (the estimate sits near or on one). Widths
    on the log scale where everything is positive, else linear. A relation has no width to compare."""
    if kind == "relation" or band_low is None or band_high is None:
        return "near an edge"
    if min(ci_low, band_low) > 0:
        wide = math.log(ci_high / ci_low) > math.log(band_high / band_low)
    else:
        wide = ci_high - ci_low > band_high - band_low
    return "underpowered" if wide else "near an edge"


def plan_decidability(plan: Plan, priors: Priors) -> list[Decidability]:
    """Every hypothesis of a compiled plan, at the most blocks its design allows: a budget's blocks, else its
    launches per arm (the fewest of its sides' arms)."""
    steps = {p.id: p for launch in plan.launches for p in launch.points}
    required = sum(1 for b in plan.design.blocks if b.required)
    out = []
    for hyp in plan.hypotheses:
        sides = [s for s in (hyp.numerator, hyp.denominator) if s is not None]
        fixed = min(plan.design.launches[s.arm] for s in sides)
        blocks = plan.design.budget.blocks if plan.design.budget is not None else fixed
        point = next(iter(hyp.numerator.points), None)  # none: a server metric; not a step: a search's id
        shape = shape_of(None) if point is None else shape_of(steps[point]) if point in steps else None
        if shape:
            shape = (step_modes(plan, (side.arm for side in sides)), *shape)
        pred = hyp.prediction
        low, high = pred.range if pred.range is not None else (None, None)
        band = band_width(pred.kind, pred.band if pred.kind == "value" else None,
                          low if isinstance(low, int | float) else None, high if isinstance(high, int | float) else None)
        out.append(decide(hyp.id, pred.kind, band, priors.prior(hyp.metric, shape), blocks=blocks, first=required,
                          repeats=plan.design.repeats, ratio=hyp.denominator is not None))
    return out
