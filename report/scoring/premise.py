"""Premises: a hypothesis may `require` others of its study, claims that must hold here for its own to be
about what was measured (e.g. that the engine reads the experts the model math's uniform routing says, where
dummy weights may route otherwise). Pure, applied after every hypothesis has its own verdict:

- every premise confirmed: the verdict stands;
- a premise refuted: "invalid", shown as "not measurable here" (report.scoring.score_model.label_of), a claim not
  scored on a measurement of something else; one that did not run stays "not run";
- a premise not settled (inconclusive, invalid, not run): a confirmed or refuted verdict is held at
  inconclusive, as a check that cannot verify does not pass.

Both the calibrated and the spec-sheet verdicts follow the premise's calibrated verdict: a premise is about
this machine as measured, not about the vendor's ceilings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from base import format as fmt
from compiler.study import Hypothesis
from report.scoring.score_model import Reason, Score, Why
from report.stats.verdict import Verdict

DECIDED: tuple[Verdict, ...] = ("confirmed", "refuted")


def under(verdict: Verdict, premise: Verdict) -> Verdict:
    """A verdict given its premise's: unchanged under a confirmed premise, invalid (not measurable) under a
    refuted one unless it did not run, at most inconclusive under an unsettled one."""
    if premise == "confirmed":
        return verdict
    if premise == "refuted":
        return verdict if verdict == "not run" else "invalid"
    return "inconclusive" if verdict in DECIDED else verdict


def premised(hypotheses: Sequence[Hypothesis], scores: Sequence[Score]) -> list[Score]:
    """Each score with its premises applied (`under`), each premise not confirmed named in its reasons. The
    scores are the hypotheses', in order; a premise has none of its own (compiler.validate)."""
    by_id = {s.hypothesis: s for s in scores}
    out: list[Score] = []
    for hyp, score in zip(hypotheses, scores, strict=True):
        verdict, spec, reasons = score.verdict, score.verdict_spec, list(score.reasons)
        for name in hyp.requires:
            premise = by_id.get(name)
            found: Verdict = premise.verdict if premise is not None else "not run"
            verdict, spec = under(verdict, found), under(spec, found)
            if found == "confirmed":
                continue
            label = premise.verdict_label if premise is not None else "not run"
            if found == "refuted" and premise is not None:
                unit = premise.display_unit
                measured = (f"{fmt.quantity(premise.measured, unit)}, interval "
                            f"{fmt.span(premise.ci_low, premise.ci_high, unit, ref=premise.measured)}")
                reasons.append(Reason(Why.PREMISE_REFUTED, point=name, detail=f"{premise.claim}: {measured}"))
            else:
                reasons.append(Reason(Why.PREMISE_UNSETTLED, point=name, detail=label))
        out.append(replace(score, verdict=verdict, verdict_spec=spec, reasons=tuple(reasons)))
    return out
