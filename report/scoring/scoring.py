"""Scoring: every hypothesis of a study against one run -> its Score (report.scoring.score_model): the prediction
resolved (report.scoring.prediction), the measured sides read (report.scoring.sides), the interval and the verdict
(report.stats.verdict). Pure: it reads a study context (report.scoring.context: the run's plan, model shapes,
hardware); shared by `studyc audit` and the site. Also the runner's hook of the stopping rule
(`undecided`), which scores the run after each budget block.

Predictions are resolved twice: against the run's calibrated ceilings (the verdict) and against the
spec sheet (how far the vendor number would have misled).

Intervals are computed at the level that really varies (report.stats.intervals): launches between, repeats
within; a ratio is paired only where the design pairs its sides (same block), else a ratio of means;
both on the log scale, so a ratio's interval is never negative. A run with a sequential budget is read
with the stopping rule's repeated confidence interval at the run's look after the last block the interval uses
(report.stats.intervals.run_look, report.stats.sequential), and the score says which (`Score.interval_label`). An interval without launch-to-launch
variation (one launch per arm, or a single value) decides nothing: at most "inconclusive (one launch)",
with what would decide it (report.planning.deciding).

Across runs, a hypothesis stated alike by m complete runs spends 5%/m in each (report.stats.alpha_ledger, read from
the context): its looks are read at that share. A block set aside after the run (split across hosts by a
resume) is left out of the published verdict; the verdict the stopping rule saw with it is kept beside it
(`Score.set_aside`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from base import format as fmt
from compiler.expr import ExprError
from compiler.hardware import HardwareError
from compiler.load import LoadedStudy
from compiler.metrics import METRICS
from compiler.modelconfig import ModelError
from compiler.study import Hypothesis
from report.planning import deciding
from report.results import RunData
from report.scoring.capacity import search_side
from report.scoring.context import StudyContext, build_context, side_label
from report.scoring.prediction import Resolved, resolve_prediction
from report.scoring.premise import premised
from report.scoring.score_model import Reason, Score, SetAside, Why, interval_label
from report.scoring.sides import MeasuredSide, point_side, server_side, split_blocks
from report.stats.intervals import (
    Critical,
    Interval,
    Layout,
    fixed_critical,
    mean_interval,
    ratio_interval,
    run_look,
)
from report.stats.sequential import look_alpha, look_critical
from report.stats.verdict import Verdict, judge, straddled
from runner.checks.tails import TAILS
from runner.store.records import CheckResult


@dataclass(frozen=True)
class Stats:
    """A measurement's numbers: n, mean, min-max spread and the interval (at its look's confidence)."""

    n: int
    mean: float
    low: float  # spread: min over repeats
    high: float  # spread: max over repeats
    ci_low: float
    ci_high: float
    interval: Interval
    critical: Critical  # the multiplier it was read with
    confidence: float  # two-sided, of its look
    look: tuple[int, int] | None  # (blocks it uses, the budget's blocks); None: a fixed design
    design: Layout
    run_blocks: int  # the blocks the run has measured: whether its budget has room is theirs to say


def off_band(band_low: float | None, band_high: float | None, mean: float) -> float | None:
    """Signed relative distance from the measured mean to the band, 0 inside it: below the low edge
    (mean - low) / |low|, above the high edge (mean - high) / |high|. An open end (a relation) is never
    crossed. None when the edge crossed is 0 (no relative distance)."""
    for edge, outside in ((band_low, band_low is not None and mean < band_low),
                          (band_high, band_high is not None and mean > band_high)):
        if outside:
            assert edge is not None
            return None if edge == 0 else (mean - edge) / abs(edge)
    return 0.0


def score_study(loaded: LoadedStudy, data: RunData | None, *, explain: bool = True) -> list[Score]:
    """Score every hypothesis of a study against one run (None: the study has not run); `explain` as in
    `score`."""
    return score(build_context(loaded, data), explain=explain)


def score(ctx: StudyContext, *, explain: bool = True) -> list[Score]:
    """Score every hypothesis of the context's study against its run; `explain` False: the verdicts without
    the reasons' planner figures (what the stopping rule asks after each block needs only the verdicts)."""
    failed: dict[str, list[CheckResult]] = {}
    for check in ctx.data.checks if ctx.data else ():
        if not check.passed:
            failed.setdefault(check.point_id, []).append(check)
    run_blocks = run_look(ctx.layout.blocks(ctx.data.points)) if ctx.data else 0
    hypotheses = ctx.study.hypothesis
    scores = premised(hypotheses, [_score(ctx, hyp, failed, run_blocks, explain) for hyp in hypotheses])
    aside = sorted(split_blocks(ctx.data, ctx.layout)) if ctx.data else []
    if not aside:
        return scores
    during = {s.hypothesis: s for s in score(replace(ctx, layout=replace(ctx.layout, during_run=True)), explain=False)}
    return [replace(s, set_aside=SetAside(tuple(aside), d.verdict, d.measured, d.ci_low, d.ci_high, d.confidence,
                                          d.look, d.n)) if s.has(Why.SPLIT_HOSTS) and (d := during[s.hypothesis])
            else s for s in scores]


def _score(ctx: StudyContext, hyp: Hypothesis, failed: dict[str, list[CheckResult]], run_blocks: int,
           explain: bool) -> Score:
    study, data = ctx.study, ctx.data
    metric = METRICS.get(hyp.metric)
    notes: list[Reason] = []
    unit = fmt.display_unit(metric.unit if metric else "", ratio=hyp.predict.ratio is not None)
    step = ctx.hypotheses.get(hyp.id)
    if step is None:
        notes.append(Reason(Why.SELECTOR, detail=ctx.unresolved.get(hyp.id, "not in the plan")))
    plan_sides = [s for s in (step.numerator, step.denominator) if s is not None] if step else []
    targets = tuple(side_label(s) for s in plan_sides)
    if data is not None and not ctx.calibrated:
        notes.append(Reason(Why.NOT_CALIBRATED))

    resolved: list[Resolved | None] = []
    for hw in (ctx.calibrated_hw, ctx.spec_hw):
        try:
            resolved.append(resolve_prediction(ctx.loaded, hyp, step.numerator.arm if step else "", hw, ctx.models,
                                               step.model.value if step and step.model else None))
        except (ExprError, ModelError, HardwareError, ValueError) as exc:
            resolved.append(None)
            if Reason(Why.PREDICTION, detail=str(exc)) not in notes:
                notes.append(Reason(Why.PREDICTION, detail=str(exc)))
    cal, spec = resolved

    side_list: list[MeasuredSide] = []
    searches = {q.id: q for launch in ctx.plan.launches for q in launch.searches} if ctx.plan else {}
    if data is not None and metric is not None:
        for plan_side in plan_sides:
            if metric.level == "search":
                side_list.append(search_side(data, plan_side.points, searches, failed, ctx.layout))
            elif metric.level == "server":
                side_list.append(server_side(data, plan_side.servers, hyp.metric, ctx.layout))
            else:
                side_list.append(point_side(data, plan_side.points, hyp.metric, failed, ctx.layout))
    share = ctx.alpha.get(hyp.id)
    values, stats, method = _estimate(side_list, notes, ctx.layout, run_blocks, share.share if share else 1.0)
    checks = sorted(set().union(*(s.checks for s in side_list))) if side_list else []
    flagged: dict[str, list[str]] = {}
    for s in side_list:
        for what, ids in s.flags.items():
            flagged.setdefault(what, []).extend(ids)
    flags = [f"{what} on {', '.join(sorted(ids))}" for what, ids in sorted(flagged.items())]
    invalid = [i for s in side_list for i in s.invalid]
    notes.extend(r for s in side_list for r in s.missing(hyp.metric))  # points without the metric: how many, why

    verdict: Verdict
    verdict_spec: Verdict
    if data is None or not side_list or any(s.rows == 0 for s in side_list):
        verdict = verdict_spec = "not run"
        if data is not None:
            notes.append(Reason(Why.NO_POINTS))
    elif invalid:
        verdict = verdict_spec = "invalid"
        notes.extend(invalid)
    elif stats is None:
        verdict = verdict_spec = "not run"
        notes.append(Reason(Why.NOT_MEASURED, detail=hyp.metric))
    else:
        verdict = _verdict(hyp, cal, stats, notes if explain else None, unit)
        verdict_spec = _verdict(hyp, spec, stats, None, unit)
        cliffs = [p for s in side_list for p in s.cliffs]
        if cliffs and "invalid" not in (verdict, verdict_spec):  # named, not a lock: docs/verdicts.md
            notes.append(Reason(Why.ON_A_CLIFF, count=len(cliffs), detail=", ".join(cliffs),
                                label=f"p{TAILS[hyp.metric][1]:g}"))

    def rel_error(r: Resolved | None) -> float | None:
        if stats is None or r is None or r.predicted is None or r.predicted == 0 or hyp.predict.kind != "value":
            return None
        return (stats.mean - r.predicted) / abs(r.predicted)

    def distance(r: Resolved | None) -> float | None:
        return None if stats is None or r is None else off_band(r.band_low, r.band_high, stats.mean)

    return Score(
        study_id=study.study.id, hypothesis=hyp.id, claim=hyp.claim, metric=hyp.metric,
        unit="ratio" if hyp.predict.ratio else (metric.unit if metric else ""),
        kind=hyp.predict.kind, relation=hyp.predict.relation,
        tolerance=hyp.predict.band if hyp.predict.kind == "value" else None,
        ratio=hyp.predict.ratio is not None, targets=targets,
        predicted=cal.predicted if cal else None, predicted_spec=spec.predicted if spec else None,
        band_low=cal.band_low if cal else None, band_high=cal.band_high if cal else None,
        band_low_spec=spec.band_low if spec else None, band_high_spec=spec.band_high if spec else None,
        values=tuple(values), n=stats.n if stats else 0, measured=stats.mean if stats else None,
        ci_low=stats.ci_low if stats else None, ci_high=stats.ci_high if stats else None,
        spread_low=stats.low if stats else None, spread_high=stats.high if stats else None,
        error=rel_error(cal), error_spec=rel_error(spec), off_band=distance(cal), off_band_spec=distance(spec),
        verdict=verdict, verdict_spec=verdict_spec,
        run_id=data.run_id if data else None, calibrated=ctx.calibrated, checks=tuple(checks),
        flags=tuple(flags), reasons=tuple(notes),
        point_ids=tuple(p for s in side_list for p in s.point_ids), interval=method,
        confidence=stats.confidence if stats else 1.0 - look_alpha(0, None, share=share.share if share else 1.0),
        look=stats.look if stats else None, alpha_ledger=share,
    )


def _interval(side_list: list[MeasuredSide], critical: Critical) -> Interval:
    if len(side_list) == 1:
        return mean_interval(side_list[0].values, critical)
    return ratio_interval(side_list[0].values, side_list[1].values, critical)


def _estimate(side_list: list[MeasuredSide], notes: list[Reason], design: Layout,
              run_blocks: int, share: float = 1.0) -> tuple[list[float], Stats | None, str]:
    """(unit values, statistics, method): the interval at the level that varies (report.stats.intervals), read at
    the look of the blocks it uses when the plan had a sequential budget (report.stats.sequential): a paired
    ratio's paired blocks, else the blocks its values come from, at the run's look after the last of them
    (`run_look`: a block set aside after the run does not make it an earlier look). A hypothesis decided
    before the run's last block is read at the look that decided it, and says so."""
    if not side_list or any(not s.values for s in side_list):
        return [], None, ""
    try:
        blocks = run_look(_interval(side_list, fixed_critical).blocks)  # the run's look at its last block
        critical = look_critical(blocks, design.budget_blocks, design.first_look, share)
        est = _interval(side_list, critical)
    except ZeroDivisionError:
        notes.append(Reason(Why.ZERO_DENOMINATOR, count=len(side_list[1].values)))
        return [], None, ""
    except ValueError:  # every observation of a side is not exchangeable
        notes.extend(Reason(Why.NOT_EXCHANGEABLE, point=o.id, detail=o.why) for s in side_list for o in s.values
                     if not o.exchangeable)
        return [], None, ""
    confidence = 1.0 - look_alpha(blocks, design.budget_blocks, design.first_look, share)
    look = (blocks, design.budget_blocks) if design.budget_blocks is not None else None
    if look is not None and blocks < run_blocks:
        notes.append(Reason(Why.EARLY_LOOK, count=blocks, detail=interval_label(confidence, look)))
    notes.extend(Reason(Why.NOT_EXCHANGEABLE, point=i, detail=why) for i, why in est.excluded)
    if est.unpaired:
        notes.append(Reason(Why.UNPAIRED, count=est.unpaired))
    if est.zero_denominator:
        notes.append(Reason(Why.ZERO_DENOMINATOR, count=est.zero_denominator))
    if len(side_list) == 2 and not est.log_scale:
        notes.append(Reason(Why.NOT_POSITIVE))
    ci_low, ci_high = est.ci_low, est.ci_high
    if all(len(s.ceilings) == len(s.values) for s in side_list) and any(s.ceilings for s in side_list):
        ci_low, ci_high = _bracketed(side_list, critical, est, notes)
    stats = Stats(est.n, est.mean, est.spread_low, est.spread_high, ci_low, ci_high, est, critical,
                  confidence, look, design, run_blocks)
    return list(est.units), stats, est.method


def _bracketed(side_list: list[MeasuredSide], critical: Critical, est: Interval,
               notes: list[Reason]) -> tuple[float, float]:
    """A capacity's interval widened by its search's resolution (report.scoring.capacity): the low end also over
    the levels that held against (for a ratio) the denominator's levels that failed, the high end over the
    levels that failed against the denominator's that held."""
    if len(side_list) == 1:
        high = mean_interval(side_list[0].ceilings, critical)
        low_ci, high_ci = est.ci_low, high.ci_high
    else:
        top, bottom = side_list
        low_ci = ratio_interval(top.values, bottom.ceilings, critical).ci_low
        high_ci = ratio_interval(top.ceilings, bottom.values, critical).ci_high
    low_ci, high_ci = min(est.ci_low, low_ci), max(est.ci_high, high_ci)
    notes.append(Reason(Why.SEARCH_RESOLUTION, detail=f"{fmt.significant(low_ci, 3)} to {fmt.significant(high_ci, 3)}"))
    return low_ci, high_ci


UNEVALUABLE = "could not be evaluated: invalid, and left out of the blocks a sequential budget adds"


def _verdict(hyp: Hypothesis, resolved: Resolved | None, stats: Stats, notes: list[Reason] | None,
             unit: str) -> Verdict:
    """The verdict of the interval against the prediction, at most inconclusive where the interval has no
    launch-to-launch variation in it (one launch per arm, or one value); `notes` (None: the spec sheet's
    verdict, which adds none) get the reasons. A prediction that cannot be evaluated is invalid, not
    inconclusive: no block the budget adds could decide it."""
    if resolved is None:
        if notes is not None:
            notes.append(Reason(Why.PREDICTION, detail=UNEVALUABLE))
        return "invalid"
    p = hyp.predict
    verdict = judge(p.kind, p.relation, resolved.band_low, resolved.band_high, stats.ci_low, stats.ci_high)
    est, design = stats.interval, stats.design
    if notes is None:
        return "inconclusive" if est.one_launch else verdict
    label = interval_label(stats.confidence, stats.look)
    edges = [e for e in ((resolved.band_low if p.relation in (">", ">=") else resolved.band_high,)
                         if p.kind == "relation" else (resolved.band_low, resolved.band_high)) if e is not None]
    crossed = straddled(p.kind, p.relation, resolved.band_low, resolved.band_high, stats.ci_low, stats.ci_high)
    if est.one_launch:
        edge_text = " and ".join(fmt.quantity(e, unit, measured=False) for e in crossed) or "an edge"
        alone = f"would read {verdict}" if verdict != "inconclusive" else f"straddles {edge_text}"
        head = (f"its {label} rests on the repeats of one launch per arm and {alone}" if est.n >= 2
                else f"a single value, no interval; alone it {alone}")
        notes.append(Reason(Why.ONE_LAUNCH, detail=head,
                            decide=deciding.one_launch(est, stats.critical, edges, design.budget_blocks)))
        return "inconclusive"
    if verdict == "inconclusive":
        decide = deciding.straddling(est, stats.critical, list(crossed) or edges, design.budget_blocks,
                                     design.first_look, max(stats.run_blocks, len(est.blocks)))
        notes.extend(Reason(Why.STRADDLES, edge=e, unit=unit, label=label, decide=decide) for e in crossed)
    return verdict


def undecided(loaded: LoadedStudy, data: RunData) -> tuple[str, ...]:
    """The runner's hook after each block of a run with `[design] budget`: the ids of the hypotheses
    still inconclusive (their repeated confidence interval straddles a band edge) while the budget's
    blocks are not spent; none for a fixed design or a spent budget. The next block need measure only
    what they rest on. A one-launch row is inconclusive too and stays on the list: under a budget every block
    holds a launch of each arm its undecided hypotheses rest on (compiler.plan_compile), so blocks add the
    launches that can decide it, and the budget bounds them. Scoring reads the budget from the run's plan, so its intervals are this rule's."""
    ctx = build_context(loaded, data)  # reads the stored plan once, for the layout and the scores
    design = ctx.layout
    if design.budget_blocks is None:
        return ()
    if len(design.blocks(data.points)) >= design.budget_blocks:
        return ()
    return tuple(s.hypothesis for s in score(ctx, explain=False) if s.verdict == "inconclusive")
