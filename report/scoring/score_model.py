"""The Score model: one hypothesis scored against a run (prediction, measurement, verdict) and the
structured reasons behind it, each with the sentence the audit and the site show.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from base import format as fmt
from compiler.metrics import METRICS
from report.planning.decidability import Inconclusive, inconclusive_reason
from report.stats.alpha_ledger import AlphaShare
from report.stats.verdict import VERDICTS, Verdict


class Why(StrEnum):
    """What a reason is about."""

    SELECTOR = "selector"  # the hypothesis' points could not be selected
    PREDICTION = "prediction"  # the prediction could not be evaluated
    NOT_CALIBRATED = "not calibrated"  # the run measured no ceilings: predicted against the spec sheet
    NO_POINTS = "no points"  # the run has no point for the selector
    NOT_MEASURED = "not measured"  # the points lack the metric
    MISSING_VALUES = "missing values"  # some points lack the metric: how many, and why
    POINT_STATUS = "point status"  # a point did not finish
    FAILED_CHECK = "failed check"  # a point failed a fail-level check
    SERVER_FAILED = "server failed"  # a server the metric is read from failed
    UNPAIRED = "unpaired repeats"  # launches (or repeats) without a partner in their block
    ONE_LAUNCH = "one launch"  # no launch-to-launch variation in the interval (one launch per arm, one value)
    NOT_EXCHANGEABLE = "not exchangeable"  # a point the plan marks as differing by construction: left out
    ZERO_DENOMINATOR = "zero denominator"  # repeats whose ratio has a zero denominator
    NOT_POSITIVE = "ratio not positive"  # a ratio <= 0: summarized on the linear scale
    STRADDLES = "straddles edge"  # the interval (at its look's level) contains a band edge: inconclusive
    EARLY_LOOK = "early look"  # uses fewer blocks than the run: its interval is read at the look of those blocks
    SPLIT_HOSTS = "split across hosts"  # a block whose points ran on two hosts: left out of the pairing
    SEARCH_OPEN = "search open"  # a capacity search found no bracket (held at hi, failed at lo) or was cut short
    SEARCH_RESOLUTION = "search resolution"  # a capacity's interval widened to the levels that failed
    PREMISE_REFUTED = "premise refuted"  # a hypothesis it requires is refuted: not measurable here (report.scoring.premise)
    PREMISE_UNSETTLED = "premise unsettled"  # a hypothesis it requires is not confirmed: at most inconclusive
    ON_A_CLIFF = "on a cliff"  # a tail percentile between two modes on some of its points: named, not a lock


SPLIT = "split across hosts: block"  # how a split block's observations say why they are left out (report.scoring.sides)


@dataclass(frozen=True)
class Reason:
    """One structured reason behind a score: which point failed which check, what was not measured,
    which edge the interval straddles."""

    why: Why
    point: str = ""  # point or server id
    checks: tuple[str, ...] = ()  # failed fail-level checks (FAILED_CHECK)
    edge: float | None = None  # the band edge (STRADDLES), in the metric's unit
    unit: str = ""  # display unit of `edge`
    count: int = 0  # how many repeats (UNPAIRED, ZERO_DENOMINATOR) or points (MISSING_VALUES)
    detail: str = ""  # free text from below (an exception, a status, an error)
    label: str = ""  # the level the interval was read at (Score.interval_label): STRADDLES
    decide: str = ""  # what would decide it (report.planning.deciding): STRADDLES, ONE_LAUNCH

    def __post_init__(self) -> None:
        # An observation of a split block reaches the score as one left out for not being exchangeable
        # (report.scoring.sides marks it so): it is named for what it is.
        if self.why is Why.NOT_EXCHANGEABLE and self.detail.startswith(SPLIT):
            object.__setattr__(self, "why", Why.SPLIT_HOSTS)

    @property
    def text(self) -> str:
        w = self.why
        if w is Why.FAILED_CHECK:
            return f"{self.point}: failed check {', '.join(self.checks) or '(marked invalid)'}"
        if w is Why.POINT_STATUS:
            return f"{self.point}: status {self.detail}"
        if w is Why.SERVER_FAILED:
            return f"{self.point}: server failed ({self.detail or 'no detail'})"
        if w is Why.SEARCH_OPEN:
            return f"{self.point}: capacity search without a capacity: {self.detail}"
        if w is Why.SEARCH_RESOLUTION:
            return (f"a capacity is the highest level that held; the interval is widened to the lowest that "
                    f"failed ({self.detail})")
        if w is Why.STRADDLES:
            edge = fmt.quantity(self.edge, self.unit, measured=False)
            return (f"the {self.label or '95% interval'} straddles the band edge {edge}: what would decide it: "
                    f"{self.decide or 'more launches per arm'}")
        if w is Why.NOT_CALIBRATED:
            return "run not calibrated: predicted against the spec sheet"
        if w is Why.NO_POINTS:
            return "no measured points for this selector in the run"
        if w is Why.NOT_MEASURED:
            return f"metric {self.detail} was not measured on these points"
        if w is Why.MISSING_VALUES:
            return f"{self.count} point(s) left out, without the metric: {self.detail}"
        if w is Why.UNPAIRED:
            return (f"{self.count} launch(es) or repeat(s) without a partner in their block were left out of "
                    "the paired interval")
        if w is Why.ONE_LAUNCH:
            alone = f" ({self.detail})" if self.detail else ""
            return (f"inconclusive (one launch): launch-to-launch variation is not in it{alone}; what would "
                    f"decide it: {self.decide or 'at least 2 launches per arm'}")
        if w is Why.PREMISE_REFUTED:
            return (f"not measurable here: its premise {self.point} is refuted ({self.detail}), so what was measured "
                    "is not what the claim is about; no verdict on the claim")
        if w is Why.PREMISE_UNSETTLED:
            return (f"its premise {self.point} is {self.detail}, not confirmed: at most inconclusive until the "
                    "premise is")
        if w is Why.ON_A_CLIFF:
            return (f"on a cliff: its {self.label} sits between two modes on {self.count} point(s) ({self.detail}): "
                    f"there a launch's {self.label} reads whether its share of slow ones is over or under the tail's "
                    f"share, so launches differ by a mode; the verdict reads the launches' mean {self.label} and its "
                    f"between-launch interval, which holds that spread")
        if w is Why.SPLIT_HOSTS:
            return f"{self.point}: left out of the pairing, {self.detail}"
        if w is Why.NOT_EXCHANGEABLE:
            return f"{self.point}: left out of the interval, not exchangeable ({self.detail})"
        if w is Why.ZERO_DENOMINATOR:
            return f"{self.count} repeat(s) with a zero denominator were left out"
        if w is Why.NOT_POSITIVE:
            return "a ratio is not positive: its interval is on the linear scale"
        if w is Why.EARLY_LOOK:
            return (f"its interval uses {self.count} of the run's blocks (a decided hypothesis is not measured "
                    f"again; a block without both sides of a pair is left out of it): read at that look, the "
                    f"{self.detail}")
        return f"{w.value}: {self.detail}"

    @property
    def invalidates(self) -> bool:
        return self.why in (Why.FAILED_CHECK, Why.POINT_STATUS, Why.SERVER_FAILED, Why.SEARCH_OPEN)


@dataclass(frozen=True)
class SetAside:
    """A hypothesis resting on a block set aside after the run (split across hosts by a resume): the verdict as
    the stopping rule saw it during the run, with the block, beside the published one without it."""

    blocks: tuple[int, ...]  # the blocks set aside after the run
    verdict: Verdict  # with them, as the stopping rule read it
    measured: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float
    look: tuple[int, int] | None
    n: int

    @property
    def label(self) -> str:
        """What that verdict was read at: "99.89% interval, look 11 of 12, with block 11"."""
        blocks = ", ".join(str(b) for b in self.blocks)
        return f"{interval_label(self.confidence, self.look)}, with block{'s' if len(self.blocks) > 1 else ''} {blocks}"


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
    interval: str = ""  # how the interval was computed (report.stats.intervals)
    confidence: float = 0.95  # the two-sided confidence the interval was read at (a sequential look's own)
    look: tuple[int, int] | None = None  # (the run's look, the budget's blocks) of a sequential run; None: fixed
    alpha_ledger: AlphaShare | None = None  # the run's share of the hypothesis' 5% (report.stats.alpha_ledger)
    set_aside: SetAside | None = None  # the verdict with a block set aside after the run kept (report.scoring.scoring.score)

    @property
    def interval_kind(self) -> str:
        """What the interval is: "95% interval"; a capacity's interval widened to its search's levels
        (`Why.SEARCH_RESOLUTION`) is a "resolution bound": it holds the interval at that level and more, so
        it is never labelled with the level."""
        return "resolution bound" if self.has(Why.SEARCH_RESOLUTION) else f"{fmt.percent_level(self.confidence)} interval"

    @property
    def look_text(self) -> str:
        """", look 10 of 12" under a sequential budget, else ""."""
        return f", look {self.look[0]} of {self.look[1]}" if self.look else ""

    @property
    def interval_label(self) -> str:
        """The level the interval was read at: "95% interval", "99.9% interval, look 10 of 12", "resolution
        bound"."""
        return self.interval_kind + self.look_text

    @property
    def verdict_label(self) -> str:
        """The verdict as shown: "inconclusive (one launch)" where no launch variation could decide it."""
        return label_of(self.verdict, self.has(Why.ONE_LAUNCH), self.has(Why.PREMISE_REFUTED))

    @property
    def inconclusive_reason(self) -> Inconclusive | None:
        """Why an inconclusive interval straddles an edge (report.planning.decidability): "underpowered" (wider than the
        band: at this many blocks it cannot lie inside) or "near an edge" (the estimate sits near or on one); None where
        it straddles none (decided, one launch, a premise)."""
        if self.verdict != "inconclusive" or not self.has(Why.STRADDLES) or self.ci_low is None or self.ci_high is None:
            return None
        return inconclusive_reason(self.kind, self.band_low, self.band_high, self.ci_low, self.ci_high)

    @property
    def shown_verdict(self) -> str:
        """The verdict as shown with why it is inconclusive: "inconclusive (underpowered)"."""
        reason = self.inconclusive_reason
        return f"{self.verdict_label} ({reason})" if reason else self.verdict_label

    @property
    def verdict_spec_label(self) -> str:
        """The spec-sheet verdict as shown (`verdict_label`)."""
        return label_of(self.verdict_spec, self.has(Why.ONE_LAUNCH), self.has(Why.PREMISE_REFUTED))

    @property
    def notes(self) -> tuple[str, ...]:
        """The reasons as sentences."""
        return tuple(r.text for r in self.reasons)

    def has(self, why: Why) -> bool:
        return any(r.why is why for r in self.reasons)

    @property
    def display_unit(self) -> str:
        """The unit its numbers are shown in: x, %, ms or the metric's own (base.format)."""
        metric = METRICS.get(self.metric)
        return fmt.display_unit(metric.unit if metric else self.unit, ratio=self.ratio)


def interval_label(confidence: float, look: tuple[int, int] | None) -> str:
    """"95% interval" (a fixed design), "99.9% interval, look 10 of 12" (after block 10 of a budget of 12)."""
    label = f"{fmt.percent_level(confidence)} interval"
    return f"{label}, look {look[0]} of {look[1]}" if look else label


NOT_MEASURABLE = "not measurable here"


def label_of(verdict: Verdict, one_launch: bool, premise_refuted: bool = False) -> str:
    """A verdict as shown: an inconclusive one resting on one launch says so; an invalid one whose premise was
    refuted is "not measurable here" (report.scoring.premise). A percentile on a cliff is named in a reason, not in the
    label: its verdict is the between-launch interval's (docs/verdicts.md, "Tail percentiles")."""
    if premise_refuted and verdict == "invalid":
        return NOT_MEASURABLE
    if verdict != "inconclusive":
        return verdict
    return "inconclusive (one launch)" if one_launch else verdict


def verdict_counts(scores: Sequence[Score]) -> dict[str, int]:
    """Verdict -> count, every verdict present (zeros included), in VERDICTS order."""
    return {v: sum(1 for s in scores if s.verdict == v) for v in VERDICTS}
