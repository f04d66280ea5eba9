"""Every run of a study beside the one its verdicts are read from: which version of the study file each
measured, whether it completed, and per hypothesis its estimate with a Welch test of whether it differs
from the published run's. A verdict is read from the latest complete run (`report.results`); where another
complete run of the same file on the same GPU and vLLM reads differently, the audit and the page say so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from compiler.load import LoadedStudy, study_version
from compiler.plan import HypothesisSide, Plan
from report.pages.page_models import Fact
from report.results import PUBLISHED, RunData, read_run
from report.scoring import score_text
from report.scoring.context import build_context
from report.scoring.score_model import Score
from report.scoring.scoring import score
from report.stats.intervals import t_cdf
from runner.store.records import RunRecord

DIFFER_P = 0.05  # a two-sided Welch p below this flags "runs differ"


@dataclass(frozen=True)
class Welch:
    t: float
    df: float
    p: float  # two-sided


def welch(a: Sequence[float], b: Sequence[float]) -> Welch | None:
    """Welch's t test of two samples' means (each needs two values and some spread, else None)."""
    if len(a) < 2 or len(b) < 2:
        return None
    parts = []
    for xs in (a, b):
        mean = math.fsum(xs) / len(xs)
        parts.append((mean, math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1) / len(xs), len(xs) - 1))
    (ma, va, da), (mb, vb, db) = parts
    if va + vb <= 0:
        return None
    t = (ma - mb) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va * va / da if va else 0.0) + (vb * vb / db if vb else 0.0))
    return Welch(t, df, 2.0 * (1.0 - t_cdf(abs(t), df)))


def unit_values(s: Score) -> list[float]:
    """The values a score's interval rests on, on the scale it was read on (log for a positive ratio)."""
    if s.ratio and s.values and min(s.values) > 0:
        return [math.log(v) for v in s.values]
    return list(s.values)


@dataclass(frozen=True)
class RunVersion:
    """One run of the study: where it stands against the published run."""

    run: RunRecord
    version: str  # the study file version it measured: its TOML hash, else its bytes' ("raw ...")
    current: bool  # that version is the study file now
    published: bool  # its verdicts are the study's
    comparable: bool  # complete, same version, GPU and vLLM as the published run (not itself)
    scores: tuple[Score, ...]
    tests: tuple[tuple[str, Welch | None], ...]  # (hypothesis, test against the published run's estimate)

    @property
    def status(self) -> str:
        return self.run.status or "unknown"

    def describe(self) -> str:
        """"complete; study version file sha256 43c25927, not the current file; NVIDIA H200, vLLM 0.26.0"."""
        why = "" if self.status == PUBLISHED else ": not scored (only complete runs are)"
        now = "the current file" if self.current else "not the current file"
        return (f"{self.status}{why}; study version {self.version}, {now}; {self.run.gpu_name or 'no GPU'}, "
                f"vLLM {self.run.vllm_version or '-'}")


@dataclass(frozen=True)
class StudyRuns:
    study_id: str
    published: str | None  # the run id verdicts are read from
    runs: tuple[RunVersion, ...]  # oldest first
    changed: str = ""  # how the study file now differs from the plan the published run carried out ("" if not)
    path: str = ""  # the study file

    def differ(self, hypothesis: str) -> list[tuple[str, Welch]]:
        """(run id, test) of the comparable runs whose estimate differs from the published one."""
        return [(r.run.run_id, w) for r in self.runs if r.comparable for h, w in r.tests
                if h == hypothesis and w is not None and w.p < DIFFER_P]

    def rows(self) -> list[tuple[int, str, str]]:
        """(indent, label, text): one per run, then one per run per hypothesis, then the runs that differ.
        Empty where the study has one run."""
        if len(self.runs) < 2:
            return []
        out = []
        for r in self.runs:
            role = "published" if r.published else ("same file, GPU and vLLM" if r.comparable else "for reference")
            out.append((1, f"run {r.run.run_id} ({role})", r.describe()))
            tests = dict(r.tests)
            for s in r.scores:
                verdict = f", {s.verdict}" if r.status == PUBLISHED else ""
                test = test_text(tests.get(s.hypothesis), r.published)
                out.append((2, f"{r.run.run_id[:15]} {s.hypothesis}", f"{estimate(s)}{verdict}{test}"))
        for s in next((r.scores for r in self.runs if r.published), ()):
            for run_id, w in self.differ(s.hypothesis):
                out.append((1, f"{self.study_id}/{s.hypothesis}", f"runs differ ({p_text(w.p)}): run {run_id} "
                                                                  f"against the published {self.published}"))
        return out

    def summary(self) -> str:
        """One clause for the headline's runs note: the other runs and whether any differs ("" if none)."""
        changed = f"; the study file changed since: {self.changed}" if self.changed else ""
        others = [r for r in self.runs if not r.published]
        if not others:
            return changed
        said = [f"{r.run.run_id} {r.status}" + (", same file, GPU and vLLM" if r.comparable else
                                                  ", not scored" if r.status != PUBLISHED else
                                                  ", another version or setup") for r in others]
        differ = sorted({f"{h} ({p_text(w.p)})" for s in self.runs if s.published for h, _ in s.tests
                         for _, w in self.differ(h)})
        return (changed + f"; other runs: {', '.join(said)}"
                + (f"; runs differ on {', '.join(differ)}" if differ else ""))

    def lines(self) -> list[str]:
        """What the audit prints: a head line, then `rows`."""
        rows = self.rows()
        changed = [self.changed_line()] if self.changed else []
        if not rows:
            return changed
        head = f"{self.study_id}: {len(self.runs)} runs; verdicts from {self.published or 'none (no complete run)'}"
        return changed + [head] + [f"{'  ' * indent}{label}: {text}" for indent, label, text in rows]

    def changed_line(self) -> str:
        """The audit's line and the page's warning when the study file changed since the published run
        ("" when it has not)."""
        if not self.changed:
            return ""
        return f"{self.study_id}: {self.path} changed since run {self.published}: {self.changed}"

    def facts(self) -> tuple[Fact, ...]:
        """`rows` as the study page's provenance facts."""
        return tuple(Fact(label, text) for _, label, text in self.rows())


def _claims(plan: Plan) -> list[tuple[Any, ...]]:
    """Each hypothesis as claimed and predicted, with the arm, workload and level of each side; not the point
    ids, which name launches and repeats (a design change is the design's and the launches', not a claim's)."""
    def side(s: HypothesisSide | None) -> tuple[Any, ...] | None:
        return None if s is None else (s.arm, s.workload, s.concurrency, s.rate_rps)

    return [(h.id, h.claim, h.metric, h.level, h.source, h.prediction, side(h.numerator), side(h.denominator))
            for h in plan.hypotheses]


def _plan_shape(plan: Plan) -> dict[str, Any]:
    """What a run carried out and claims: launches (with what their logs had to say) and points by
    fingerprint, hypotheses, title, design."""
    return {
        "title": plan.title, "hardware": plan.hardware, "hypotheses": _claims(plan), "design": plan.design,
        "launches": sorted((s.id, s.fingerprint, s.expect_log,
                            tuple(sorted((p.id, p.fingerprint) for p in s.points))) for s in plan.launches),
    }


def plan_differs(loaded: LoadedStudy, stored: Plan | None) -> str:
    """Why the study file no longer compiles to the plan its run stored ("" when it still does): edits
    to notes, comments or the question change the file's hash but not what was measured or claimed."""
    from compiler.plan_compile import compile_study

    if stored is None:
        return "its stored plan is unreadable"
    a, b = _plan_shape(stored), _plan_shape(compile_study(loaded))
    changed = [k for k in a if a[k] != b[k]]
    return f"its plan differs ({', '.join(changed)})" if changed else ""


def estimate(s: Score) -> str:
    if s.measured is None:
        return f"not measured ({s.verdict})"
    return f"{score_text.mean(s)} ({s.interval_label} {score_text.interval(s)}, n {s.n})"


def p_text(p: float) -> str:
    """"p = 0.073", or "p < 0.001" below that."""
    return f"p = {p:.2g}" if p >= 0.001 else "p < 0.001"


def test_text(w: Welch | None, published: bool) -> str:
    if published:
        return ""
    if w is None:
        return "; against the published run: no test (a side without two block, launch or repeat values)"
    return f"; against the published run: Welch t = {w.t:.2f}, df {w.df:.1f}, {p_text(w.p)}"


def version_of(run: RunRecord) -> str:
    if run.study_toml_sha256:
        return f"TOML sha256 {run.study_toml_sha256[:8]}"
    return f"file sha256 {(run.study_sha256 or '?')[:8]}"


def is_current(run: RunRecord, loaded: LoadedStudy, toml_now: str | None) -> bool:
    """Whether the run measured the study file as it is now: the same TOML, or (runs stored before the TOML
    hash) the same bytes."""
    if run.study_toml_sha256 and toml_now:
        return run.study_toml_sha256 == toml_now
    return run.study_sha256 == loaded.sha256


def same_version(a: RunRecord, b: RunRecord) -> bool:
    if a.study_toml_sha256 and b.study_toml_sha256:
        return a.study_toml_sha256 == b.study_toml_sha256
    return bool(a.study_sha256) and a.study_sha256 == b.study_sha256


def compare_runs(loaded: LoadedStudy, runs: Sequence[tuple[Path, RunRecord]], published: RunData | None,
                 published_scores: Sequence[Score] = ()) -> StudyRuns:
    """Every run of the study, scored (estimates only for a run that is not the published one), each tested
    against the published run's estimates."""
    try:
        toml_now = study_version(loaded.path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        toml_now = None
    base = {s.hypothesis: s for s in published_scores}
    siblings = tuple(r for _, r in runs)
    out = []
    for db, run in runs:
        mine = published is not None and run.run_id == published.run_id and Path(db) == published.db
        scores = tuple(published_scores) if mine else tuple(score(build_context(loaded, replace(
            read_run(db, run.run_id), study_runs=siblings))))  # read at its share of the ledger too
        comparable = (not mine and published is not None and run.status == PUBLISHED
                      and same_version(run, published.run) and run.gpu_name == published.run.gpu_name
                      and run.vllm_version == published.run.vllm_version)
        tests = tuple((s.hypothesis, None if mine or s.hypothesis not in base
                       else welch(unit_values(s), unit_values(base[s.hypothesis]))) for s in scores)
        out.append(RunVersion(run, version_of(run), is_current(run, loaded, toml_now), mine, comparable,
                              scores, tests))
    changed = ""
    if published is not None and published.run.study_sha256 and published.run.study_sha256 != loaded.sha256:
        changed = plan_differs(loaded, published.plan)
    return StudyRuns(loaded.study.study.id, published.run_id if published else None, tuple(out), changed,
                     str(loaded.path))
