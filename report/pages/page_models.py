"""Page models: plain frozen dataclasses of what each page shows, every number already text (formatted
by base.format). Built by report.pages.pages, rendered by report.pages.site through the Jinja templates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from report.pages.seed import SeedNote


@dataclass(frozen=True)
class Chart:
    """A chart, or, when `summary` is set, the one line of text that replaces a chart with nothing to
    show (every value zero)."""

    id: str
    title: str
    caption: str
    spec: dict[str, Any] | None
    summary: str = ""


@dataclass(frozen=True)
class Timing:
    """A study page's "where the wall time went": (phase, seconds, share) as text, a chart of the
    launches' phases, and a note on what the numbers are (`report.pages.cost`)."""

    rows: tuple[tuple[str, str, str], ...]
    chart: Chart | None
    note: str


@dataclass(frozen=True)
class Fact:
    label: str
    value: str


@dataclass(frozen=True)
class Link:
    href: str
    text: str


@dataclass(frozen=True)
class RequestsNote:
    """Where a run's requests table is: not in the site (one row per request with its per-token times, it is
    most of a run's bytes), but in the results the site was built from."""

    run_id: str
    in_folder: bool  # the results are a results folder (else a database file)
    stored: str  # the run's requests.parquet in that folder, or the database file
    export: str  # the `studyc export` command that writes the run's requests.csv
    exported: str  # where that command writes it


@dataclass(frozen=True)
class VerdictCount:
    verdict: str
    count: int


@dataclass(frozen=True)
class StudyRow:
    """One study on the index page."""

    id: str
    title: str
    href: str
    counts: tuple[VerdictCount, ...]
    hardware: str
    engine: str
    date: str
    host: str
    cost: str = "-"  # GPU-seconds per decided hypothesis (report.pages.cost)


@dataclass(frozen=True)
class SeedRow:
    """One scored hypothesis under its seed document and section (report.pages.seed_index)."""

    claim: str
    hypothesis: str
    study: str  # the study's title
    study_id: str
    href: str  # its row on the study page
    verdict: str
    verdict_label: str
    launches: str  # how many launches its measurements came from; "-" where none were read
    interval: str = ""  # what its interval was computed on ("paired: t on 9 block log-ratios, df 8")


@dataclass(frozen=True)
class SeedSection:
    section: str  # as the study's source gives it ("" where it names none)
    counts: tuple[VerdictCount, ...]
    rows: tuple[SeedRow, ...]


@dataclass(frozen=True)
class SeedGroup:
    """The hypotheses of one seed document (or of none), by section."""

    document: str  # the document's id; "no-seed"
    title: str
    counts: tuple[VerdictCount, ...]
    hypotheses: int
    sections: tuple[SeedSection, ...]


@dataclass(frozen=True)
class ClaimTestCell:
    """One hypothesis that tests a claim: its verdict and the GPU of its run."""

    label: str  # study/hypothesis
    href: str
    verdict: str
    gpu: str
    faithful: bool


@dataclass(frozen=True)
class ClaimLine:
    """One claim of a source document on the index (report.claims)."""

    claim: str
    section: str
    text: str
    status: str  # faithful | approximate | untested
    tests: tuple[ClaimTestCell, ...]
    differs: tuple[str, ...]  # of the first test; empty when faithful with nothing listed
    reason: str  # why untested


@dataclass(frozen=True)
class ClaimsTable:
    document: str
    title: str
    counts: str  # "40 claims: 12 faithful, 20 approximate, 8 untested"
    rows: tuple[ClaimLine, ...]


@dataclass(frozen=True)
class StudyClaim:
    """A claim one of the study's hypotheses tests, and the conditions in which the study differs from it."""

    claim: str
    document: str
    text: str
    hypothesis: str
    faithful: bool
    differs: tuple[str, ...]


@dataclass(frozen=True)
class IndexPage:
    root: str
    title: str
    built: str
    studies: tuple[StudyRow, ...]
    totals: tuple[VerdictCount, ...]
    cost: str = "-"  # every study's GPU-seconds, and per decided hypothesis
    seeds: tuple[SeedGroup, ...] = ()  # every scored hypothesis by seed document, then section
    claims: tuple[ClaimsTable, ...] = ()  # every claim of every source document (report.claims)


@dataclass(frozen=True)
class SpecCell:
    """The same measurement scored against the spec sheet, shown only where it differs."""

    prediction: str
    off_band: str
    verdict: str
    verdict_label: str  # the verdict as shown: "inconclusive (one launch)"


@dataclass(frozen=True)
class HypothesisRow:
    anchor: str
    id: str
    claim: str
    source: str
    metric: str
    where: str  # the points, or "fp8 ÷ bf16" for a ratio
    prediction: str
    measured: str
    spread: str
    interval: str
    read_at: str  # the level the interval was read at: "99.9% interval, look 10 of 12"
    n: int
    off_band: str
    verdict: str
    verdict_label: str
    spec: SpecCell | None
    checks: str
    flags: tuple[str, ...]
    notes: tuple[str, ...]
    during_run: str = ""  # the verdict the stopping rule saw with a block set aside after the run ("" for none)
    during_run_label: str = ""  # "with block 11, look 11 of 12"
    set_aside: str = ""  # both verdicts side by side, in words (report.scoring.score_text.set_aside)
    alpha_ledger: str = ""  # where runs share the hypothesis' 5%, or a changed prediction made it new
    inconclusive_reason: str = ""  # why an interval straddling an edge is: "underpowered" or "near an edge"


@dataclass(frozen=True)
class ArgChange:
    sign: str  # "+" added by the arm, "~" changed from the base
    key: str
    value: str
    base: str


@dataclass(frozen=True)
class ArmRow:
    name: str
    description: str
    changes: tuple[ArgChange, ...]
    extras: tuple[str, ...]


@dataclass(frozen=True)
class ModelBlock:
    folder: str
    arms: str
    facts: tuple[Fact, ...]
    error: str


@dataclass(frozen=True)
class WorkloadRow:
    name: str
    input_len: str
    output_len: str
    prefix_len: str
    seed: str


@dataclass(frozen=True)
class CalibrationRow:
    quantity: str
    spec: str
    measured: str
    ratio: str


@dataclass(frozen=True)
class CheckRow:
    point: str
    name: str
    severity: str
    passed: bool
    value: str
    threshold: str
    detail: str


@dataclass(frozen=True)
class StudyPage:
    root: str
    title: str
    study_id: str
    question: str
    notes: str
    source: str
    study_path: str
    has_run: bool
    calibrated: bool
    counts: tuple[VerdictCount, ...]
    seed: SeedNote | None  # "Against the seed": None when no hypothesis quotes its seed
    models: tuple[ModelBlock, ...]
    base_engine: tuple[Fact, ...]
    arms: tuple[ArmRow, ...]
    workloads: tuple[WorkloadRow, ...]
    load: tuple[Fact, ...]
    provenance: tuple[Fact, ...]
    calibration: tuple[CalibrationRow, ...]
    hypotheses: tuple[HypothesisRow, ...]
    show_spec: bool  # some hypothesis scores differently against the spec sheet
    forest: Chart | None  # the forest plot of its hypotheses
    charts: tuple[Chart, ...]
    chart_notes: tuple[str, ...]
    problems: tuple[CheckRow, ...]
    checks_total: int
    checks_passed: int
    points_total: int
    downloads: tuple[Link, ...]  # the run's points and checks, under data/
    requests: RequestsNote | None  # where the run's requests are (None: no run)
    warnings: tuple[str, ...]
    timing: Timing | None = None  # where the run's wall went (None: no run)
    claims: tuple[StudyClaim, ...] = ()  # the claims its hypotheses test, and how it differs from each


@dataclass(frozen=True)
class AuditRow:
    study: str
    study_href: str
    hypothesis: str
    claim: str
    metric: str
    where: str
    prediction: str
    measured: str
    interval: str
    read_at: str
    n: int
    off_band: str
    verdict: str
    verdict_label: str
    spec: SpecCell | None
    checks: str


@dataclass(frozen=True)
class AuditPage:
    root: str
    title: str
    built: str
    rows: tuple[AuditRow, ...]
    show_spec: bool
    totals: tuple[VerdictCount, ...]
    chart: Chart | None  # the forest plot of every hypothesis
