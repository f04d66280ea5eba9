"""Premises (`requires`): a claim whose premise is refuted reads "not measurable here", one whose premise is
not settled is at most inconclusive; a confirmed premise leaves it as it is. Validation names the key of a
premise that is unknown, the hypothesis itself, or has premises of its own."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from compiler.load import check_file
from compiler.study import Hypothesis, Prediction
from report.scoring.premise import premised, under
from report.scoring.score_model import NOT_MEASURABLE, Score, Why
from report.stats.verdict import VERDICTS, Verdict

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("verdict", VERDICTS)
def test_a_confirmed_premise_leaves_every_verdict_as_it_is(verdict: Verdict) -> None:
    assert under(verdict, "confirmed") == verdict


@pytest.mark.parametrize(("verdict", "expected"), [
    ("confirmed", "invalid"), ("refuted", "invalid"), ("inconclusive", "invalid"), ("invalid", "invalid"),
    ("not run", "not run"),
])
def test_a_refuted_premise_leaves_no_verdict_on_the_claim(verdict: Verdict, expected: Verdict) -> None:
    assert under(verdict, "refuted") == expected


@pytest.mark.parametrize("premise", ["inconclusive", "invalid", "not run"])
@pytest.mark.parametrize(("verdict", "expected"), [
    ("confirmed", "inconclusive"), ("refuted", "inconclusive"), ("inconclusive", "inconclusive"),
    ("invalid", "invalid"), ("not run", "not run"),
])
def test_an_unsettled_premise_holds_a_decided_verdict_at_inconclusive(premise: Verdict, verdict: Verdict,
                                                                       expected: Verdict) -> None:
    assert under(verdict, premise) == expected


def _hyp(hid: str, requires: tuple[str, ...] = ()) -> Hypothesis:
    return Hypothesis(id=hid, claim=f"claim {hid}", metric="tpot_mean_s",
                      predict=Prediction(relation=">=", value=0.007), requires=list(requires))


def _score(hid: str, verdict: Verdict, measured: float | None = 0.00465) -> Score:
    return Score(study_id="s", hypothesis=hid, claim=f"claim {hid}", metric="tpot_mean_s", unit="s",
                 kind="relation", relation=">=", tolerance=None, ratio=False, targets=(), predicted=0.007,
                 predicted_spec=0.0065, band_low=0.007, band_high=None, band_low_spec=0.0065, band_high_spec=None,
                 values=(), n=3, measured=measured, ci_low=0.00458, ci_high=0.00473, spread_low=None,
                 spread_high=None, error=None, error_spec=None, off_band=None, off_band_spec=None,
                 verdict=verdict, verdict_spec=verdict, run_id="r", calibrated=True)


def test_a_claim_on_a_refuted_premise_reads_not_measurable_here_and_says_what_was_measured() -> None:
    hyps = [_hyp("claim", ("premise",)), _hyp("premise")]
    claim, premise = premised(hyps, [_score("claim", "refuted"), _score("premise", "refuted")])
    assert (claim.verdict, claim.verdict_spec, claim.verdict_label) == ("invalid", "invalid", NOT_MEASURABLE)
    assert claim.has(Why.PREMISE_REFUTED) and not claim.has(Why.PREMISE_UNSETTLED)
    (text,) = claim.notes
    assert text.startswith("not measurable here: its premise premise is refuted (claim premise: 4.65")
    assert "(claim premise: 4.650 ms, interval 4.580–4.730 ms)" in text
    assert premise.verdict == "refuted" and premise.verdict_label == "refuted" and premise.notes == ()


def test_a_claim_on_an_unsettled_premise_is_held_at_inconclusive_and_names_it() -> None:
    hyps = [_hyp("premise"), _hyp("claim", ("premise",))]
    premise, claim = premised(hyps, [_score("premise", "inconclusive"), _score("claim", "confirmed")])
    assert (claim.verdict, claim.verdict_label) == ("inconclusive", "inconclusive")
    assert claim.notes == ("its premise premise is inconclusive, not confirmed: at most inconclusive until the "
                           "premise is",)
    assert premise.verdict == "inconclusive"


def test_a_claim_on_a_confirmed_premise_keeps_its_verdict_and_no_reason_is_added() -> None:
    hyps = [_hyp("claim", ("premise",)), _hyp("premise")]
    claim, _ = premised(hyps, [_score("claim", "refuted"), _score("premise", "confirmed")])
    assert (claim.verdict, claim.verdict_label, claim.notes) == ("refuted", "refuted", ())


def test_every_premise_counts_one_refuted_among_confirmed_ones_is_enough() -> None:
    hyps = [_hyp("claim", ("a", "b")), _hyp("a"), _hyp("b")]
    claim, _, _ = premised(hyps, [_score("claim", "confirmed"), _score("a", "confirmed"), _score("b", "refuted")])
    assert claim.verdict_label == NOT_MEASURABLE and len(claim.notes) == 1


def test_a_refuted_invalid_verdict_without_a_premise_is_still_invalid() -> None:
    """"not measurable here" is the label of a refuted premise only, not of any invalid verdict."""
    (alone,) = premised([_hyp("alone")], [_score("alone", "invalid")])
    assert alone.verdict_label == "invalid"


def _moe_variant(tmp_path: Path, old: str, new: str) -> Path:
    """studies/moe_union.toml with one edit, its model named by absolute path so the copy loads anywhere."""
    text = (REPO / "studies/moe_union.toml").read_text().replace('"../models/', f'"{REPO}/models/')
    assert old in text, old
    path = tmp_path / "moe.toml"
    path.write_text(text.replace(old, new, 1))
    return path


def _problems(path: Path) -> list[str]:
    _, problems = check_file(path)
    return [f"{p.path}: {p.message}" for p in problems]


PREMISED = ('source = "Effective weight traffic grows roughly sixfold from batch 1 to batch 64"\nrequires = '
            '["union-read"]')


@pytest.mark.parametrize(("requires", "said"), [
    ('["union-reed"]', "hypothesis[0].requires[0]: unknown hypothesis 'union-reed'; did you mean 'union-read'?"),
    ('["union-read", "step-grows-with-union"]',
     "hypothesis[0].requires[1]: hypothesis 'step-grows-with-union' cannot require itself"),
])
def test_a_premise_that_is_unknown_or_the_claim_itself_is_refused_by_key(tmp_path: Path, requires: str,
                                                                         said: str) -> None:
    path = _moe_variant(tmp_path, PREMISED, PREMISED.replace('["union-read"]', requires))
    assert said in _problems(path)


def test_a_premise_with_premises_of_its_own_is_refused(tmp_path: Path) -> None:
    path = _moe_variant(tmp_path, 'id = "union-read"\n', 'id = "union-read"\nrequires = ["step-grows-with-union"]\n')
    problems = _problems(path)
    assert any(p.startswith("hypothesis[0].requires[0]: 'union-read' has premises of its own") for p in problems)
    assert any(p.startswith("hypothesis[1].requires[0]: 'step-grows-with-union' has premises of its own")
               for p in problems)


def test_the_moe_study_with_its_premise_is_valid_and_scored_against_its_runs() -> None:
    """The committed study on both stored runs. The first (one launch, the engine's own router on dummy weights):
    its premise's row alone would read refuted (TPOT 4.65 ms at c64, under the ~7.4 ms the union takes) and holds
    the claim at inconclusive. The latest (three launches, vLLM's routing simulator): the premise is confirmed
    (~9.96 ms), so the claim keeps its own verdict, refuted (3.26x against 6.3x)."""
    from compiler.load import load_study
    from report.results import read_run
    from report.scoring.scoring import score_study
    from tests.conftest import committed_runs

    assert _problems(REPO / "studies/moe_union.toml") == []
    loaded = load_study(REPO / "studies/moe_union.toml")
    claim, premise = score_study(loaded, read_run(REPO / "results/h200", "20261201T022305-b2eded"))
    assert premise.hypothesis == "union-read" and premise.verdict == "inconclusive"
    assert premise.measured is not None and premise.band_low is not None and premise.measured < premise.band_low
    assert claim.verdict == "inconclusive" and claim.has(Why.PREMISE_UNSETTLED)

    claim, premise = score_study(loaded, committed_runs()["moe-union"])
    assert premise.verdict == "confirmed" and premise.measured is not None and premise.band_low is not None
    assert premise.measured > premise.band_low
    assert claim.verdict == "refuted" and not claim.has(Why.PREMISE_UNSETTLED)
    assert claim.measured is not None and 3.0 < claim.measured < 3.5


def test_an_unsettled_premise_holds_the_spec_sheet_verdict_too() -> None:
    hyps = [_hyp("claim", ("premise",)), _hyp("premise")]
    claim = replace(_score("claim", "confirmed"), verdict_spec="refuted")
    held, _ = premised(hyps, [claim, _score("premise", "inconclusive")])
    assert (held.verdict, held.verdict_spec) == ("inconclusive", "inconclusive")


def test_a_premise_without_a_score_counts_as_not_run() -> None:
    """A premise missing from the scores (none to read) is unsettled: "not run", never confirmed."""
    (claim,) = premised([_hyp("claim", ("premise",))], [_score("claim", "refuted")])
    assert claim.verdict == "inconclusive"
    assert claim.notes == ("its premise premise is not run, not confirmed: at most inconclusive until the premise is",)


def test_scores_and_hypotheses_must_pair_one_to_one() -> None:
    with pytest.raises(ValueError):
        premised([_hyp("a"), _hyp("b")], [_score("a", "confirmed")])


def test_the_premise_interval_is_as_precise_as_its_mean() -> None:
    """The refuted premise's interval is given at its mean's precision (46.5 ms: two decimals), not at that of
    its wider end (105 ms: one)."""
    premise = replace(_score("premise", "refuted", measured=0.0465), ci_low=0.040, ci_high=0.105)
    claim, _ = premised([_hyp("claim", ("premise",)), _hyp("premise")], [_score("claim", "confirmed"), premise])
    assert "(claim premise: 46.50 ms, interval 40.00–105.00 ms)" in claim.notes[0]
