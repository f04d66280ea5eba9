"""The alpha ledger: one 5% per hypothesis across the runs of a study. A re-run that states the same prediction
under the same hypothesis id spends from the same budget (Bonferroni: each of the m complete runs that state
it is read at 5%/m); a run that states another prediction under that id is a new hypothesis, with its own
ledger. Pure: it reads the runs' stored plans (report.stats.sequential then reads each look at the run's share).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compiler.plan import HypothesisSide, HypothesisStep, Plan
from runner.store.records import RunRecord

PUBLISHED = "complete"  # only a complete run spends (report.results.PUBLISHED)

ONE_RUN = "one run"  # the only complete run that states this prediction: the whole 5%
SHARED = "shared"  # m complete runs state the same prediction under this id: 5%/m each
NEW_HYPOTHESIS = "new hypothesis"  # earlier runs stated another prediction under this id: its own 5%


@dataclass(frozen=True)
class AlphaShare:
    """One run's part of one hypothesis' 5%: the complete runs that share it (oldest first, this one among
    them), those under the same id with another prediction (their own ledgers), and those whose plan stored
    no prediction (not counted: what they stated is not known)."""

    hypothesis: str
    run_id: str
    case: str  # ONE_RUN | SHARED | NEW_HYPOTHESIS
    runs: tuple[str, ...]
    other_prediction: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()

    @property
    def m(self) -> int:
        return len(self.runs)

    @property
    def share(self) -> float:
        """The run's share of the hypothesis' alpha: 1/m."""
        return 1.0 / self.m

    @property
    def text(self) -> str:
        """The audit's phrase: which case applies and the level it gives."""
        level = f"{100 * (1 - 0.05 / self.m):.3g}%"
        others = (f"; {len(self.other_prediction)} run(s) under this id stated another prediction: a new hypothesis, "
                  f"its own 5%" if self.other_prediction else "")
        unknown = (f"; {len(self.unknown)} earlier run(s) stored no prediction, not counted" if self.unknown else "")
        if self.case == SHARED:
            return (f"alpha ledger: {self.m} complete runs state this prediction ({', '.join(self.runs)}) and share "
                    f"5%: this run spends 5%/{self.m}, read at {level} (a fixed design's level; a sequential "
                    f"run's looks split its share){others}{unknown}")
        if self.case == NEW_HYPOTHESIS:
            return (f"alpha ledger: a new hypothesis: {len(self.other_prediction)} earlier run(s) under this id "
                    f"stated another prediction; this prediction has its own 5%{unknown}")
        return f"alpha ledger: the one complete run stating this prediction spends the whole 5%{unknown}"


def _side(s: HypothesisSide | None) -> tuple[Any, ...] | None:
    return None if s is None else (s.arm, s.workload, s.concurrency, s.rate_rps)


def stated(h: HypothesisStep) -> tuple[Any, ...]:
    """What a run states of a hypothesis: its metric, prediction and the arm, workload and level of each side.
    Not the claim's wording, nor the point ids (a design change is not a new prediction)."""
    return (h.metric, h.prediction.model_dump_json(), _side(h.numerator), _side(h.denominator))


def ledger(runs: Sequence[RunRecord], run_id: str) -> dict[str, AlphaShare]:
    """Hypothesis id -> the share of run `run_id` (one of `runs`, every run of one study), for each hypothesis
    its stored plan states. Only complete runs spend; a run that is not complete itself is counted as one
    more (what it would spend if it completes). Empty when the run stored no hypotheses."""
    plans = {r.run_id: Plan.from_stored(r.plan_json) for r in runs}
    mine = plans.get(run_id)
    if mine is None:
        return {}
    unique = {r.run_id: r for r in reversed(runs)}  # a run merged into two databases is one run (its first)
    ordered = [r for r in sorted(unique.values(), key=lambda r: runs.index(r))
               if r.status == PUBLISHED or r.run_id == run_id]
    out: dict[str, AlphaShare] = {}
    for h in mine.hypotheses:
        key = stated(h)
        same: list[str] = []
        other: list[str] = []
        unknown: list[str] = []
        for r in ordered:
            plan = plans[r.run_id]
            theirs = {x.id: x for x in plan.hypotheses} if plan is not None else {}
            if not theirs:
                unknown.append(r.run_id)
            elif h.id in theirs:
                (same if stated(theirs[h.id]) == key else other).append(r.run_id)
        case = SHARED if len(same) > 1 else NEW_HYPOTHESIS if other else ONE_RUN
        out[h.id] = AlphaShare(h.id, run_id, case, tuple(same), tuple(other), tuple(unknown))
    return out
