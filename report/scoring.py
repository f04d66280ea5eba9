"""Hypotheses x a run -> scores: predicted value, measured value with its spread and 95% interval,
the distance from the band, a verdict and the structured reasons behind it. Pure: it reads a study
context (report.context: the run's plan, model shapes, hardware); shared by `studyc audit` and the site.
Each side of a hypothesis is exactly the plan's point ids (server ids for a server metric).

Predictions are resolved twice: against the run's calibrated ceilings (the verdict) and against the
spec sheet (how far the vendor number would have misled).

Intervals are computed at the level that really varies (report.intervals): launches between, repeats
within; a ratio is paired only where the design pairs its sides (same block), else a ratio of means;
both on the log scale, so a ratio's interval is never negative. A run with a sequential budget is read
with the stopping rule's repeated confidence interval at the block it stopped (report.sequential).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from compiler.expr import ExprError, parse
from compiler.hardware import Hardware, HardwareError
from compiler.load import LoadedStudy
from compiler.metrics import METRICS
from compiler.modelmath import ModelError
from compiler.predict_env import build_env
from compiler.study import Hypothesis
from report.context import ArmModel, StudyContext, arm_models, build_context, side_label
from report.intervals import Interval, Layout, Obs, mean_interval, ratio_interval
from report.results import RunData
from report.sequential import look_critical, look_level
from runner.store.records import CheckResult, PointRecord, ServerRecord, base_server_id
from studyc import format as fmt

Verdict = Literal["confirmed", "refuted", "inconclusive", "invalid", "not run"]
VERDICTS: tuple[Verdict, ...] = ("confirmed", "refuted", "inconclusive", "invalid", "not run")

@dataclass(frozen=True)
class Stats:
    n: int
    mean: float
    low: float  # spread: min over repeats
    high: float  # spread: max over repeats
    ci_low: float
    ci_high: float


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


def straddled(kind: str, relation: str | None, band_low: float | None, band_high: float | None,
              low: float, high: float) -> tuple[float, ...]:
    """The band edges (or the relation's threshold) lying inside the interval [low, high]: what makes a
    verdict inconclusive."""
    edges: tuple[float | None, ...] = (band_low, band_high)
    if kind == "relation":
        edges = (band_low if relation in (">", ">=") else band_high,)
    return tuple(e for e in edges if e is not None and low <= e <= high and low < high)


def judge(
    kind: str, relation: str | None, band_low: float | None, band_high: float | None, low: float, high: float
) -> Verdict:
    """Verdict of the interval [low, high] against a band (value, range) or a threshold (relation):
    inside -> confirmed, entirely outside -> refuted, straddling -> inconclusive."""
    if kind == "relation":
        threshold = band_low if relation in (">", ">=") else band_high
        assert threshold is not None
        holds: dict[str, Callable[[float], bool]] = {
            ">": lambda x: x > threshold, ">=": lambda x: x >= threshold,
            "<": lambda x: x < threshold, "<=": lambda x: x <= threshold,
        }
        test = holds[relation or ">"]
        if test(low) and test(high):
            return "confirmed"
        if not test(low) and not test(high):
            return "refuted"
        return "inconclusive"
    assert band_low is not None and band_high is not None
    if band_low <= low and high <= band_high:
        return "confirmed"
    if high < band_low or low > band_high:
        return "refuted"
    return "inconclusive"


@dataclass(frozen=True)
class Resolved:
    """A prediction as numbers: the central value and the band a measurement must fall in."""

    predicted: float | None
    band_low: float | None
    band_high: float | None


class Why(StrEnum):
    """What a reason is about."""

    SELECTOR = "selector"  # the hypothesis' points could not be selected
    PREDICTION = "prediction"  # the prediction could not be evaluated
    NOT_CALIBRATED = "not calibrated"  # the run measured no ceilings: predicted against the spec sheet
    NO_POINTS = "no points"  # the run has no point for the selector
    NOT_MEASURED = "not measured"  # the points lack the metric
    POINT_STATUS = "point status"  # a point did not finish
    FAILED_CHECK = "failed check"  # a point failed a fail-level check
    SERVER_FAILED = "server failed"  # a server the metric is read from failed
    UNPAIRED = "unpaired repeats"  # launches (or repeats) without a partner in their block
    SINGLE_LAUNCH = "single launch"  # the interval rests on one launch's repeats
    NOT_EXCHANGEABLE = "not exchangeable"  # a point the plan marks as differing by construction: left out
    ZERO_DENOMINATOR = "zero denominator"  # repeats whose ratio has a zero denominator
    NOT_POSITIVE = "ratio not positive"  # a ratio <= 0: summarized on the linear scale
    STRADDLES = "straddles edge"  # the 95% interval contains a band edge: inconclusive
    EARLY_LOOK = "early look"  # measured in fewer blocks than the run: its interval is read at its own last look


@dataclass(frozen=True)
class Reason:
    """One structured reason behind a score: which point failed which check, what was not measured,
    which edge the interval straddles."""

    why: Why
    point: str = ""  # point or server id
    checks: tuple[str, ...] = ()  # failed fail-level checks (FAILED_CHECK)
    edge: float | None = None  # the band edge (STRADDLES), in the metric's unit
    unit: str = ""  # display unit of `edge`
    count: int = 0  # how many repeats (UNPAIRED, ZERO_DENOMINATOR)
    detail: str = ""  # free text from below (an exception, a status, an error)

    @property
    def text(self) -> str:
        w = self.why
        if w is Why.FAILED_CHECK:
            return f"{self.point}: failed check {', '.join(self.checks) or '(marked invalid)'}"
        if w is Why.POINT_STATUS:
            return f"{self.point}: status {self.detail}"
        if w is Why.SERVER_FAILED:
            return f"{self.point}: server failed ({self.detail or 'no detail'})"
        if w is Why.STRADDLES:
            edge = fmt.quantity(self.edge, self.unit, measured=False)
            return f"the 95% interval straddles the band edge {edge}: more repeats could decide"
        if w is Why.NOT_CALIBRATED:
            return "run not calibrated: predicted against the spec sheet"
        if w is Why.NO_POINTS:
            return "no measured points for this selector in the run"
        if w is Why.NOT_MEASURED:
            return f"metric {self.detail} was not measured on these points"
        if w is Why.UNPAIRED:
            return (f"{self.count} launch(es) or repeat(s) without a partner in their block were left out of "
                    "the paired interval")
        if w is Why.SINGLE_LAUNCH:
            return "single launch: launch-to-launch variation not included"
        if w is Why.NOT_EXCHANGEABLE:
            return f"{self.point}: left out of the interval, not exchangeable ({self.detail})"
        if w is Why.ZERO_DENOMINATOR:
            return f"{self.count} repeat(s) with a zero denominator were left out"
        if w is Why.NOT_POSITIVE:
            return "a ratio is not positive: its interval is on the linear scale"
        if w is Why.EARLY_LOOK:
            return (f"measured in {self.count} of the run's blocks (a decided hypothesis is not measured "
                    f"again): its interval is read at that look, at {self.detail}")
        return f"{w.value}: {self.detail}"

    @property
    def invalidates(self) -> bool:
        return self.why in (Why.FAILED_CHECK, Why.POINT_STATUS, Why.SERVER_FAILED)


@dataclass(frozen=True)
class Score:
    study_id: str
    hypothesis: str
    claim: str
    metric: str
    unit: str
    kind: str  # value | range | relation
    relation: str | None
    tolerance: float | None
    ratio: bool
    targets: tuple[str, ...]
    predicted: float | None
    predicted_spec: float | None
    band_low: float | None
    band_high: float | None
    band_low_spec: float | None
    band_high_spec: float | None
    values: tuple[float, ...]
    n: int
    measured: float | None
    ci_low: float | None
    ci_high: float | None
    spread_low: float | None
    spread_high: float | None
    error: float | None  # value predictions: (mean - predicted) / |predicted|; None for ranges, relations
    error_spec: float | None
    off_band: float | None  # relative distance from the mean to the band, 0 inside (`off_band`)
    off_band_spec: float | None
    verdict: Verdict
    verdict_spec: Verdict
    run_id: str | None
    calibrated: bool
    checks: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    reasons: tuple[Reason, ...] = ()
    point_ids: tuple[str, ...] = field(default=(), repr=False)
    interval: str = ""  # how the interval was computed (report.intervals)

    @property
    def notes(self) -> tuple[str, ...]:
        """The reasons as sentences."""
        return tuple(r.text for r in self.reasons)

    def has(self, why: Why) -> bool:
        return any(r.why is why for r in self.reasons)

    @property
    def display_unit(self) -> str:
        """The unit its numbers are shown in: x, %, ms or the metric's own (studyc.format)."""
        metric = METRICS.get(self.metric)
        return fmt.display_unit(metric.unit if metric else self.unit, ratio=self.ratio)


# -- prediction --------------------------------------------------------------------------------------


def _evaluate(value: float | str, env: Callable[[], dict[str, Any]]) -> float:
    if isinstance(value, int | float):
        return float(value)
    return parse(value).evaluate(env())


def resolve_prediction(
    loaded: LoadedStudy, hyp: Hypothesis, arm: str, hw: Hardware | None, models: dict[str, ArmModel] | None = None
) -> Resolved:
    """Numbers of a prediction on one card, with the arm's model (from the study context; read from the
    study file when none is given). Raises ExprError/ModelError/ValueError when it cannot."""
    models = models if models is not None else arm_models(loaded)
    model = models.get(arm, models[""])

    def env() -> dict[str, Any]:
        if model.folder is None:
            model.require()
        if hw is None:
            raise HardwareError(f"unknown hardware {loaded.study.study.hardware!r}")
        shape, dtype, kv = model.require()
        return build_env(shape, hw, dtype=dtype, kv_dtype=kv)

    p = hyp.predict
    if p.kind == "range":
        assert p.range is not None
        low, high = sorted((_evaluate(p.range[0], env), _evaluate(p.range[1], env)))
        return Resolved((low + high) / 2, low, high)
    assert p.value is not None
    value = _evaluate(p.value, env)
    if p.kind == "relation":
        if p.relation in (">", ">="):
            return Resolved(value, value, None)
        return Resolved(value, None, value)
    low, high = sorted((value * (1 - p.band), value * (1 + p.band)))
    return Resolved(value, low, high)


# -- measurement -------------------------------------------------------------------------------------


@dataclass
class _Side:
    values: list[Obs] = field(default_factory=list)  # with their launch, block and exchangeability
    rows: int = 0
    point_ids: list[str] = field(default_factory=list)
    invalid: list[Reason] = field(default_factory=list)
    checks: set[str] = field(default_factory=set)
    flags: dict[str, list[str]] = field(default_factory=dict)  # what is flagged -> point ids


def _point_side(data: RunData, ids: Sequence[str], metric: str, failed_checks: dict[str, list[CheckResult]],
                design: Layout) -> _Side:
    """The stored points of one side of a hypothesis: exactly the plan's point ids."""
    side = _Side()
    wanted = set(ids)
    rows: list[PointRecord] = [p for p in data.points if p.point_id in wanted]
    for row in sorted(rows, key=lambda r: (r.repeat, r.point_id)):
        side.rows += 1
        side.point_ids.append(row.point_id)
        fails = failed_checks.get(row.point_id, [])
        fail_names = sorted({c.name for c in fails if c.severity == "fail"})
        warn_names = sorted({c.name for c in fails if c.severity != "fail"})
        side.checks.update(fail_names + warn_names)
        if row.status != "ok":
            error = row.error
            side.invalid.append(Reason(Why.POINT_STATUS, point=row.point_id,
                                       detail=f"{row.status}" + (f" ({error})" if error else "")))
        elif fail_names or not row.valid:
            side.invalid.append(Reason(Why.FAILED_CHECK, point=row.point_id, checks=tuple(fail_names)))
        if row.cache_policy == "keep":
            side.flags.setdefault("prefix cache kept between points (cache = keep)", []).append(row.point_id)
        for name in warn_names:
            if not (name == "cache_cold" and row.cache_policy == "keep"):
                side.flags.setdefault(f"warning {name}", []).append(row.point_id)
        value = row.metric(metric)
        if value is not None and math.isfinite(value):
            at = design.point(row.point_id, row.server_id, row.repeat)
            side.values.append(Obs(row.point_id, value, at.launch, at.block, at.repeat, at.exchangeable, at.why))
    return side


# A start that compiled its graphs is not exchangeable, for a server metric, with the starts of the same run
# that loaded them: vLLM profiles memory with the compiler's allocations in it (H200, Qwen3-8B, fp8 KV: a
# cold start reported 1,628,304 KV tokens, its warm starts 1,635,648 each) and takes twice as long.
COLD_COMPILE = ("its start compiled the graphs (cold compile cache) where this run's other starts loaded them: "
                "its memory profile and start time differ by construction")


def _server_side(data: RunData, ids: Sequence[str], metric: str, design: Layout) -> _Side:
    """The stored servers of one side of a server-metric hypothesis: exactly the plan's server ids,
    each by its latest start (a resumed launch starts its servers again, as "<id>~N")."""
    side = _Side()
    wanted = set(ids)
    latest: dict[str, ServerRecord] = {}
    for s in data.servers:
        base = base_server_id(s.server_id)
        if base in wanted and (base not in latest or _started(s) >= _started(latest[base])):
            latest[base] = s
    servers = [latest[b] for b in sorted(latest)]
    warm_seen = any(s.compile_cache == "warm" for s in data.servers)
    for index, server in enumerate(servers):
        side.rows += 1
        side.point_ids.append(server.server_id)
        if server.status == "failed":
            side.invalid.append(Reason(Why.SERVER_FAILED, point=server.server_id,
                                       detail=str(server.error or "")))
        value = server.metric(metric)
        if value is not None and math.isfinite(float(value)):
            at = design.server(base_server_id(server.server_id), index)
            cold = warm_seen and server.compile_cache == "cold"
            side.values.append(Obs(server.server_id, float(value), at.launch, at.block, at.repeat,
                                   not cold, COLD_COMPILE if cold else ""))
    return side


def _started(server: ServerRecord) -> float:
    return server.started_at.timestamp() if server.started_at else float("-inf")


def score_study(loaded: LoadedStudy, data: RunData | None) -> list[Score]:
    """Score every hypothesis of a study against one run (None: the study has not run)."""
    return score(build_context(loaded, data))


def score(ctx: StudyContext) -> list[Score]:
    """Score every hypothesis of the context's study against its run."""
    failed: dict[str, list[CheckResult]] = {}
    for check in ctx.data.checks if ctx.data else ():
        if not check.passed:
            failed.setdefault(check.point_id, []).append(check)
    run_blocks = len(ctx.layout.blocks(ctx.data.points)) if ctx.data else 0
    return [_score(ctx, hyp, failed, run_blocks) for hyp in ctx.study.hypothesis]


def _score(ctx: StudyContext, hyp: Hypothesis, failed: dict[str, list[CheckResult]], run_blocks: int) -> Score:
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
            resolved.append(resolve_prediction(ctx.loaded, hyp, step.numerator.arm if step else "", hw, ctx.models))
        except (ExprError, ModelError, HardwareError, ValueError) as exc:
            resolved.append(None)
            if Reason(Why.PREDICTION, detail=str(exc)) not in notes:
                notes.append(Reason(Why.PREDICTION, detail=str(exc)))
    cal, spec = resolved

    side_list: list[_Side] = []
    if data is not None and metric is not None:
        for plan_side in plan_sides:
            if metric.level == "server":
                side_list.append(_server_side(data, plan_side.servers, hyp.metric, ctx.layout))
            else:
                side_list.append(_point_side(data, plan_side.points, hyp.metric, failed, ctx.layout))
    values, stats, method = _estimate(side_list, notes, ctx.layout, run_blocks)
    checks = sorted(set().union(*(s.checks for s in side_list))) if side_list else []
    flagged: dict[str, list[str]] = {}
    for s in side_list:
        for what, ids in s.flags.items():
            flagged.setdefault(what, []).extend(ids)
    flags = [f"{what} on {', '.join(sorted(ids))}" for what, ids in sorted(flagged.items())]
    invalid = [i for s in side_list for i in s.invalid]

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
        verdict = _verdict(hyp, cal, stats, notes, unit)
        verdict_spec = _verdict(hyp, spec, stats, [], unit)

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
    )


def _estimate(side_list: list[_Side], notes: list[Reason], design: Layout,
              run_blocks: int) -> tuple[list[float], Stats | None, str]:
    """(unit values, statistics, method): the interval at the level that varies (report.intervals), read at
    the look of the hypothesis's last block when the plan had a sequential budget (report.sequential): a
    hypothesis decided before the run's last block is read at the look that decided it, and says so."""
    if not side_list or any(not s.values for s in side_list):
        return [], None, ""
    blocks = len({o.block for s in side_list for o in s.values})
    critical = look_critical(blocks, design.budget_blocks, design.first_look)
    if design.budget_blocks is not None and blocks < run_blocks:
        notes.append(Reason(Why.EARLY_LOOK, count=blocks,
                            detail=look_level(blocks, design.budget_blocks, design.first_look)))
    est: Interval
    try:
        if len(side_list) == 1:
            est = mean_interval(side_list[0].values, critical)
        else:
            est = ratio_interval(side_list[0].values, side_list[1].values, critical)
    except ZeroDivisionError:
        notes.append(Reason(Why.ZERO_DENOMINATOR, count=len(side_list[1].values)))
        return [], None, ""
    except ValueError:  # every observation of a side is not exchangeable
        notes.extend(Reason(Why.NOT_EXCHANGEABLE, point=o.id, detail=o.why) for s in side_list for o in s.values
                     if not o.exchangeable)
        return [], None, ""
    if est.single_launch:
        notes.append(Reason(Why.SINGLE_LAUNCH))
    notes.extend(Reason(Why.NOT_EXCHANGEABLE, point=i, detail=why) for i, why in est.excluded)
    if est.unpaired:
        notes.append(Reason(Why.UNPAIRED, count=est.unpaired))
    if est.zero_denominator:
        notes.append(Reason(Why.ZERO_DENOMINATOR, count=est.zero_denominator))
    if len(side_list) == 2 and not est.log_scale:
        notes.append(Reason(Why.NOT_POSITIVE))
    stats = Stats(est.n, est.mean, est.spread_low, est.spread_high, est.ci_low, est.ci_high)
    return list(est.units), stats, est.method


def _verdict(hyp: Hypothesis, resolved: Resolved | None, stats: Stats, notes: list[Reason], unit: str) -> Verdict:
    if resolved is None:
        notes.append(Reason(Why.PREDICTION, detail="could not be evaluated: no verdict"))
        return "inconclusive"
    p = hyp.predict
    verdict = judge(p.kind, p.relation, resolved.band_low, resolved.band_high, stats.ci_low, stats.ci_high)
    if verdict == "inconclusive":
        notes.extend(Reason(Why.STRADDLES, edge=e, unit=unit) for e in
                     straddled(p.kind, p.relation, resolved.band_low, resolved.band_high, stats.ci_low, stats.ci_high))
    return verdict


def verdict_counts(scores: Sequence[Score]) -> dict[str, int]:
    """Verdict -> count, every verdict present (zeros included), in VERDICTS order."""
    return {v: sum(1 for s in scores if s.verdict == v) for v in VERDICTS}
