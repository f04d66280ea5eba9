"""Planning with power: how many blocks a hypothesis likely needs, from the spread of earlier runs.

From the runs in a database on the same GPU, model and vLLM version (read by report.planning.stored_repeats;
the statistics here take what it read), the spread of each metric on the log scale (relative): within a launch
(repeats of one point on one server) and between launches (the same configuration on different server
launches). Then, for a planned study, the blocks each hypothesis needs for 80% and for 95% power
(report.stats.power): the probability that the interval read at the run's end (the stopping rule's critical
value) decides it, with the block SD at its upper confidence bound from its degrees of freedom (a spread
measured on few blocks may have come out low); what that costs in GPU time, and a warning where a tolerance is
below the launch-to-launch spread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compiler.metrics import SERVER_METRICS
from compiler.plan import HypothesisStep, Launch, Plan, PointStep, budget_points
from report.planning.stored_repeats import Key as Key
from report.planning.stored_repeats import StoredRepeats, config_key, model_name, read_repeats
from report.planning.stored_repeats import launch_configuration as launch_configuration
from report.scoring.score_model import Why
from report.stats.intervals import fixed_critical, welch_df
from report.stats.power import power_inside, power_to_clear, sd_upper
from report.stats.sequential import look_critical

CLIFF_WARNING = "the last run read this percentile on a cliff between two modes: no number of blocks decides it"

if TYPE_CHECKING:
    from report.scoring.score_model import Score


@dataclass(frozen=True)
class Spread:
    """Relative (log-scale) standard deviations of one metric, with their degrees of freedom."""

    metric: str
    launch_sd: float | None  # between launches, the within part removed; None when no config ran twice
    launch_df: int
    within_sd: float | None  # between repeats of one launch
    within_df: int

    def per_block(self, repeats: int, ratio: bool) -> float | None:
        """SD of one block's value: sqrt(sL^2 + sW^2 / r), times sqrt(2) for a ratio paired in blocks."""
        if self.launch_sd is None and self.within_sd is None:
            return None
        var = (self.launch_sd or 0.0) ** 2 + (self.within_sd or 0.0) ** 2 / max(repeats, 1)
        return math.sqrt(var * (2.0 if ratio else 1.0))

    def parts(self, repeats: int) -> list[tuple[float, float]]:
        """The (variance, df) parts of one block's value, for Welch-Satterthwaite (report.stats.intervals.welch_df)."""
        return [((self.launch_sd or 0.0) ** 2, self.launch_df),
                ((self.within_sd or 0.0) ** 2 / max(repeats, 1), self.within_df)]


@dataclass(frozen=True, order=True)
class Group:
    """Repeats measured together in one stored run: on one launch (its id) or in one block (its index)."""

    run_id: str
    at: str | int


Steps = dict[str, tuple[Launch, PointStep]]  # point id -> its launch and step
Cells = dict[tuple[str, Key], dict[Group, list[float]]]  # (metric, config) -> launch or block -> log values


def read_spreads(
    db: Path, hardware: str, models: Sequence[str], vllm_version: str | None = None,
) -> tuple[dict[str, Spread], dict[tuple[str, Key], Spread], str | None]:
    """(per metric, per (metric, config), vLLM version used) from the runs on `hardware` serving one of
    `models` (folder names). vLLM version: the given one, else the newest such run's."""
    stored = read_repeats(db, hardware, models, vllm_version)
    return _spreads(cells(stored)[0]) + (stored.vllm_version,)


def _spreads(cells: Cells) -> tuple[dict[str, Spread], dict[tuple[str, Key], Spread]]:
    by_config = {k: _spread(k[0], v) for k, v in cells.items()}
    by_metric: dict[str, Spread] = {}
    for name in sorted({k[0] for k in cells}):
        merged = [v for k, v in cells.items() if k[0] == name]
        by_metric[name] = pool(name, merged)
    return by_metric, by_config


def cells(stored: StoredRepeats) -> tuple[Cells, Cells]:
    """The log values by (metric, config), grouped by launch and by block of each run."""
    launches: Cells = {}
    blocks: Cells = {}
    for m in stored.measured:
        log = math.log(m.value)
        launches.setdefault((m.metric, m.config), {}).setdefault(Group(m.run_id, m.launch), []).append(log)
        if m.block is not None:
            blocks.setdefault((m.metric, m.config), {}).setdefault(Group(m.run_id, m.block), []).append(log)
    return launches, blocks


@dataclass(frozen=True)
class Paired:
    """The SD of a block's log-ratio of two configurations measured in the same blocks of earlier runs."""

    sd: float
    df: int
    blocks: int


def paired_spread(blocks: Cells, metric: str, top: Key, bottom: Key) -> Paired | None:
    """What a paired ratio's interval really rests on: per block, log(top) - log(bottom); centred per run
    (a host can shift the ratio), pooled. Whatever the two sides share within a block (the host, the
    time, a drift) cancels, which adding the two sides' launch-to-launch variances ignores. None
    without a run holding two such blocks."""
    a, b = blocks.get((metric, top), {}), blocks.get((metric, bottom), {})
    by_run: dict[str, list[float]] = {}
    for group in sorted(set(a) & set(b)):
        d = math.fsum(a[group]) / len(a[group]) - math.fsum(b[group]) / len(b[group])
        by_run.setdefault(group.run_id, []).append(d)
    pooled = pool(metric, [by_run])  # each run's block log-ratios as one group: the pooled within SD
    n = sum(len(ds) for ds in by_run.values())
    return Paired(pooled.within_sd, pooled.within_df, n) if pooled.within_sd is not None else None


def _spread(metric: str, launches: Mapping[Group, Sequence[float]]) -> Spread:
    return pool(metric, [launches])


def pool(metric: str, groups: Sequence[Mapping[Any, Sequence[float]]]) -> Spread:
    """Pooled within-launch variance of repeats, and between-launch variance of launch means with the
    within part (sW^2 / r) taken out (method of moments, floored at 0), each weighted by its df."""
    w_ss, w_df, b_ss, b_df = 0.0, 0, 0.0, 0
    for launches in groups:
        means, within = [], []
        for values in launches.values():
            m = math.fsum(values) / len(values)
            means.append(m)
            if len(values) > 1:
                ss = math.fsum((v - m) ** 2 for v in values)
                w_ss += ss
                w_df += len(values) - 1
                within.append(ss / (len(values) - 1) / len(values))
        if len(means) > 1:
            grand = math.fsum(means) / len(means)
            var_means = math.fsum((m - grand) ** 2 for m in means) / (len(means) - 1)
            excess = var_means - (math.fsum(within) / len(within) if within else 0.0)
            b_ss += max(excess, 0.0) * (len(means) - 1)
            b_df += len(means) - 1
    within_sd = math.sqrt(w_ss / w_df) if w_df else None
    launch_sd = math.sqrt(b_ss / b_df) if b_df else None
    return Spread(metric, launch_sd, b_df, within_sd, w_df)


@lru_cache(maxsize=4096)
def _critical(n: int, first: int) -> float:
    """The t multiplier (df n - 1) of the interval a run of n blocks reads at its end: a fixed design's
    95% for n up to the required blocks `first`, else the last look of a budget of n blocks
    (`report.stats.sequential`: 80% of the 5%)."""
    return look_critical(n, n, first)(n - 1) if n > first else fixed_critical(n - 1)


POWERS = (0.8, 0.95)  # the powers the planner plans for


def _df(df: float | None) -> float | None:
    """An SD's df for its upper bound; None (taken as known) where nothing estimated it."""
    return df if df else None


def blocks_needed(tolerance: float, spread: float, *, power: float = 0.8, df: float | None = None,
                  most: int = 100, first: int = 2) -> int | None:
    """Fewest blocks n (>= 2) at which a truth at the prediction (the band's centre) is confirmed with
    probability `power`: the interval at the run's end (`_critical`) inside the band on both sides (two
    one-sided tests). `tolerance` is relative (its log, log1p, is the nearer edge on the log scale);
    `spread` the block SD, taken at its upper confidence bound from `df` (None: as known). None when
    `most` blocks do not do it. Past the `first` required blocks the interval is a budget's last look."""
    if tolerance <= 0:
        return None
    sd, edge = sd_upper(spread, _df(df)), math.log1p(tolerance)
    return next((n for n in range(2, most + 1) if power_inside(edge, sd, n, _critical(n, first)) >= power), None)


def edge_distance(last: Score) -> float | None:
    """Log-scale (relative) distance from a scored run's mean to the nearest edge its interval must clear:
    a band's edges, or a relation's threshold. None without a positive mean or edge."""
    if last.measured is None or last.measured <= 0:
        return None
    edges: tuple[float | None, ...] = (last.band_low, last.band_high)
    if last.kind == "relation":
        edges = (last.band_low if last.relation in (">", ">=") else last.band_high,)
    found = [abs(math.log(last.measured / e)) for e in edges if e is not None and e > 0]
    return min(found) if found else None


def blocks_to_clear(distance: float, spread: float, *, power: float = 0.8, df: float | None = None,
                    most: int = 100, first: int = 2) -> int | None:
    """Fewest blocks n (>= 2) at which, if the truth is where the last run put it (`distance` from the
    nearest edge, log scale), the interval at the run's end (`_critical`) clears that edge with probability
    `power` (report.stats.power.power_to_clear; the SD at its upper bound from `df`). None when `most` blocks do
    not do it (the mean sits on the edge, or the spread is too large)."""
    sd = sd_upper(spread, _df(df))
    return next((n for n in range(2, most + 1) if power_to_clear(distance, sd, n, _critical(n, first)) >= power),
                None)


def blocks_within(distance: float, spread: float, *, first: int, budget: int, power: float = 0.8,
                  df: float | None = None) -> int | None:
    """Fewest blocks n (from the first look to `budget`) whose look under a budget of `budget` blocks
    (`report.stats.sequential`: an early look's share, the last look's 80%) clears `distance` with probability
    `power`; None when even its last look does not. Earlier looks can only add to it."""
    sd = sd_upper(spread, _df(df))
    return next((n for n in range(max(2, first), budget + 1)
                 if power_to_clear(distance, sd, n, look_critical(n, budget, first)(n - 1)) >= power), None)


@dataclass(frozen=True)
class Last:
    """The latest stored run's estimate of a hypothesis, and what deciding it from there would take."""

    measured: float
    distance: float  # relative (log) distance to the nearest edge
    edge: float
    blocks: int | None  # for 80% power
    gpu_s: float | None
    budget: int | None = None  # the study's budget blocks, where it has one
    within: int | None = None  # the look of that budget by which it is decided with 80% power
    blocks_95: int | None = None  # for 95% power
    gpu_95_s: float | None = None


@dataclass(frozen=True)
class BlockCosts:
    """GPU-seconds of a block from the stored runs (`report.planning.design_costs.block_costs`): a required block whole,
    and a budget block run for one hypothesis, with only its points; a hypothesis left out has none stored."""

    required_s: float
    budget_s: dict[str, float]


@dataclass(frozen=True)
class PowerRow:
    hypothesis: str
    metric: str
    tolerance: float | None  # relative half-width of the band
    block_sd: float | None  # expected SD of one block's value (relative)
    blocks: int | None  # for 80% power to confirm a truth at the prediction
    gpu_s: float | None  # GPU time of that many blocks, one launch at a time: the required blocks whole,
    # each budget block with only the points this hypothesis rests on
    source: str  # where the spread came from
    warnings: tuple[str, ...] = ()
    launch_sd: float | None = None  # launch-to-launch SD of one side (relative)
    launch_df: int = 0
    last: Last | None = None  # from the latest run of this study in the database, when scored
    block_df: float | None = None  # degrees of freedom of block_sd (Welch-Satterthwaite over its parts)
    blocks_95: int | None = None  # for 95% power
    gpu_95_s: float | None = None
    stored_costs: bool = False  # the GPU time from the stored runs' starts and points, not the plan's estimates


def _tolerance(pred: Any) -> float | None:
    if pred.kind == "value":
        return float(pred.band)
    if pred.kind == "range" and all(isinstance(x, int | float) for x in pred.range):
        low, high = sorted(float(x) for x in pred.range)
        center = (low + high) / 2
        return (high - low) / 2 / abs(center) if center else None
    return None


SEARCH_SPREAD = "a capacity search (one value a launch, from its probes): see 'GPU time to a decision' below"


def _side_spread(
    metric: str, point: str | None, steps: Steps, by_config: dict[tuple[str, Key], Spread],
    by_metric: dict[str, Spread],
) -> tuple[Spread | None, str]:
    """One side's spread and where it came from: its configuration's, with the metric's pooled
    launch-to-launch spread where the configuration never ran on two launches."""
    if point is not None and point not in steps:  # a capacity search's id: no point of the plan
        return None, SEARCH_SPREAD
    if point is not None and (metric, config_key(*steps[point])) in by_config:
        spread = by_config[(metric, config_key(*steps[point]))]
        if spread.launch_sd is None and metric in by_metric:
            pooled = by_metric[metric]
            return (Spread(metric, pooled.launch_sd, pooled.launch_df, spread.within_sd, spread.within_df),
                    "the same configuration (within); every configuration of the metric (between launches)")
        return spread, "the same configuration"
    if metric in by_metric:
        return by_metric[metric], "every configuration of the metric"
    if metric in SERVER_METRICS:  # one value a start, not a point's: read by report.planning.design_costs
        return None, "a server metric (one value a start): see 'GPU time to a decision' below"
    return None, "no earlier run of this metric on this GPU, model and vLLM version"


def _launch_s(launch: Launch, points: Sequence[PointStep]) -> float:
    """A launch's start, `points` and every capacity search it runs (a budget block trims its points,
    never its searches)."""
    return launch.estimated_start_s + sum(p.estimated_s for p in points) + sum(q.estimated_s for q in launch.searches)


def _last(score: Score | None, sd: float | None, df: float | None, gpu_time: Callable[[int], float], first: int,
          budget: int | None = None) -> Last | None:
    distance = edge_distance(score) if score is not None else None
    if score is None or score.measured is None or distance is None or sd is None:
        return None
    edges = [e for e in (score.band_low, score.band_high) if e is not None and e > 0]
    edge = min(edges, key=lambda e: abs(math.log(score.measured / e)))  # type: ignore[operator]
    blocks, blocks_95 = (blocks_to_clear(distance, sd, power=p, df=df, first=first) for p in POWERS)
    within = blocks_within(distance, sd, first=first, budget=budget, df=df) if budget else None
    return Last(score.measured, distance, edge, blocks, gpu_time(blocks) if blocks else None, budget, within,
                blocks_95, gpu_time(blocks_95) if blocks_95 else None)


def _pair(hyp: HypothesisStep, steps: Steps, block_cells: Cells) -> Paired | None:
    assert hyp.denominator is not None  # a ratio's
    top, bottom = next(iter(hyp.numerator.points), None), next(iter(hyp.denominator.points), None)
    if top not in steps or bottom not in steps:  # none, or a capacity search's
        return None
    return paired_spread(block_cells, hyp.metric, config_key(*steps[top]), config_key(*steps[bottom]))


def power_plan(
    plan: Plan, db: Path, last: dict[str, Score] | None = None, costs: BlockCosts | None = None,
) -> tuple[list[PowerRow], str | None]:
    """`power_rows` from the runs stored in `db` on the plan's GPU serving its models."""
    return power_rows(plan, read_repeats(db, plan.hardware, sorted({model_name(s) for s in plan.launches})),
                      last, costs)


def power_rows(
    plan: Plan, earlier: StoredRepeats, last: dict[str, Score] | None = None, costs: BlockCosts | None = None,
) -> tuple[list[PowerRow], str | None]:
    """Per hypothesis of a compiled plan: the blocks it likely needs and their GPU time, from the repeats
    `earlier` runs stored. With `last` (hypothesis id -> the latest stored run's score), also the blocks
    that would decide it if the truth is where that run measured it. The GPU time is the stored runs'
    (`costs`) where a hypothesis has them, else the plan's estimates."""
    steps = {p.id: (s, p) for s in plan.launches for p in s.points}
    launch_cells, block_cells = cells(earlier)
    by_metric, by_config = _spreads(launch_cells)
    block_one = [launch for launch in plan.launches if launch.block == 1]
    block_s = sum(_launch_s(launch, launch.points) for launch in block_one)
    required = sum(1 for b in plan.design.blocks if b.required) or 1
    rows: list[PowerRow] = []
    for hyp in plan.hypotheses:
        # A budget block, run for this hypothesis alone, measures only the points it rests on.
        stored = costs is not None and hyp.id in costs.budget_s
        first_s, budget_s = ((costs.required_s, costs.budget_s[hyp.id]) if costs is not None and stored else
                             (block_s, sum(_launch_s(launch, pts) for launch in block_one
                                           if (pts := budget_points(launch, [hyp])) or launch.searches)))

        def gpu_time(blocks: int, first_s: float = first_s, budget_s: float = budget_s) -> float:
            return min(blocks, required) * first_s + max(blocks - required, 0) * budget_s

        pred = hyp.prediction
        ratio = hyp.denominator is not None
        tol = _tolerance(pred)
        sides = [hyp.numerator] + ([hyp.denominator] if hyp.denominator is not None else [])
        found = [_side_spread(hyp.metric, next(iter(side.points), None), steps, by_config, by_metric)
                 for side in sides]
        spread, source = found[0]
        pair = _pair(hyp, steps, block_cells) if ratio else None
        sd: float | None
        df: float | None = None
        if pair is not None:
            sd, df = pair.sd, pair.df
            source = f"paired blocks of the same two configurations ({pair.blocks} blocks, df {pair.df})"
        elif len(found) == 2 and found[1][0] is not None and spread is not None:
            # a ratio: its block's variance is the sum of the two sides' (each side's own spread)
            sd_parts = [s.per_block(plan.design.repeats, False) for s, _ in found if s is not None]
            sd = math.sqrt(math.fsum(x * x for x in sd_parts if x is not None)) if None not in sd_parts else None
            df = welch_df([part for s, _ in found if s is not None for part in s.parts(plan.design.repeats)])
            if found[1][1] != source:
                source = f"numerator: {source}; denominator: {found[1][1]}"
        else:
            sd = spread.per_block(plan.design.repeats, ratio) if spread else None
            df = welch_df(spread.parts(plan.design.repeats)) if spread else None
        warnings: list[str] = []
        if spread and spread.launch_sd is None:
            warnings.append("no configuration ran on two launches: launch-to-launch spread unknown")
        launch_sd = spread.launch_sd * (math.sqrt(2) if ratio else 1.0) if spread and spread.launch_sd else None
        if pair is not None:  # what does not cancel in a block's pair
            launch_sd, what = pair.sd, "block-to-block spread of the paired ratio"
        else:
            what = "launch-to-launch spread"
        if tol is not None and launch_sd is not None and tol < launch_sd:
            warnings.append(f"tolerance {100 * tol:.2g}% is below the {what} "
                            f"{100 * launch_sd:.2g}%: it cannot be decided at any budget worth running")
        blocks, blocks_95 = ((blocks_needed(tol, sd, power=p, df=df, first=required) for p in POWERS)
                             if tol is not None and sd is not None else (None, None))
        prior = (last or {}).get(hyp.id)
        if prior is not None and prior.has(Why.ON_A_CLIFF):  # no number of blocks moves it off the cliff
            warnings.append(CLIFF_WARNING)
            prior = None
        if tol is None:
            warnings.append("no relative band (a relation or an expression): blocks depend on the distance "
                            "to the threshold")
        rows.append(PowerRow(hyp.id, hyp.metric, tol, sd, blocks, gpu_time(blocks) if blocks else None, source,
                             tuple(warnings), spread.launch_sd if spread else None,
                             spread.launch_df if spread else 0,
                             _last(prior, sd, df, gpu_time, required,
                                   plan.design.budget.blocks if plan.design.budget else None),
                             df or None, blocks_95, gpu_time(blocks_95) if blocks_95 else None, stored))
    return rows, earlier.vllm_version
