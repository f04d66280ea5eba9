"""The statistics across looks and runs: a hypothesis re-run under the same prediction spends one 5% across its
complete runs (report.stats.alpha_ledger: each at 5%/m, the intervals recomputed at that level); a changed prediction
is a new hypothesis; a block set aside after the run is shown beside the published verdict as the stopping rule
saw it during the run (report.scoring.scoring, `Score.set_aside`). Real DuckDB files through the store; the committed
results read-only."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from compiler.load import load_study
from compiler.plan_compile import compile_study
from report.audit import audit_studies, json_rows, markdown_table
from report.pages.pages import study_page
from report.pages.site import environment
from report.results import latest_runs
from report.scoring.context import build_context
from report.scoring.scoring import score
from report.stats.alpha_ledger import NEW_HYPOTHESIS, ONE_RUN, SHARED, ledger
from report.stats.intervals import t_quantile
from runner.store.records import RunRecord
from tests.conftest import REPO, committed_runs
from tests.report.test_run_compare import _run, _study

DB = REPO / "results/h200"


def _record(run_id: str, plan_json: str | None, status: str = "complete") -> RunRecord:
    return RunRecord(run_id, "toy", plan_json=plan_json, status=status)


def test_runs_stating_the_same_prediction_share_five_percent(tmp_path: Path) -> None:
    plan = compile_study(load_study(_study(tmp_path))).to_json()
    runs = [_record("a", plan), _record("b", plan), _record("cut", plan, "partial"), _record("c", plan)]
    share = ledger(runs, "c")["same"]
    assert (share.case, share.runs, share.m, share.share) == (SHARED, ("a", "b", "c"), 3, pytest.approx(1 / 3))
    assert "5%/3, read at 98.3%" in share.text
    alone = ledger([_record("c", plan)], "c")["same"]
    assert (alone.case, alone.m, alone.share) == (ONE_RUN, 1, 1.0) and "the whole 5%" in alone.text
    # a run merged into two databases is one run; a run still partial is counted as what it would spend
    assert ledger([_record("a", plan), _record("a", plan), _record("c", plan)], "c")["same"].m == 2
    assert ledger(runs, "cut")["same"].runs == ("a", "b", "cut", "c")


def test_a_changed_prediction_is_a_new_hypothesis(tmp_path: Path) -> None:
    path = _study(tmp_path)
    before = compile_study(load_study(path)).to_json()
    path.write_text(path.read_text().replace("tolerance = 0.05", "tolerance = 0.03"))
    after = compile_study(load_study(path)).to_json()
    share = ledger([_record("a", before), _record("b", after)], "b")["same"]
    assert (share.case, share.runs, share.other_prediction) == (NEW_HYPOTHESIS, ("b",), ("a",))
    assert share.share == 1.0 and "a new hypothesis" in share.text
    # a run whose plan stored no hypotheses (plan schema 1) is not counted, and said so
    bare = ledger([_record("old", None), _record("b", after)], "b")["same"]
    assert (bare.case, bare.unknown) == (ONE_RUN, ("old",)) and "stored no prediction" in bare.text
    assert ledger([_record("b", None)], "b") == {}


def test_the_shared_level_recomputes_the_interval(tmp_path: Path) -> None:
    """Two complete runs of the same prediction: the published run's interval is t(1 - 0.025/2) wide, not
    t(0.975); its JSON and markdown say which case applies."""
    study, db = _study(tmp_path), tmp_path / "r.duckdb"
    _run(db, study, "first", [0.98, 0.981, 0.979], day=1)
    one = audit_studies([load_study(study)], [db]).scores[0]
    _run(db, study, "second", [1.0, 1.002, 0.998], day=2)
    result = audit_studies([load_study(study)], [db])
    s = result.scores[0]
    assert one.confidence == pytest.approx(0.95) and s.confidence == pytest.approx(0.975)
    assert s.alpha_ledger is not None and s.alpha_ledger.case == SHARED
    alone = score(build_context(load_study(study), replace(latest_runs([db])["toy"], study_runs=())))[0]
    assert alone.confidence == pytest.approx(0.95) and alone.measured == s.measured
    widen = t_quantile(1 - 0.0125, 2) / t_quantile(0.975, 2)
    assert s.ci_high is not None and alone.ci_high is not None and s.measured is not None and alone.measured
    assert (s.ci_high / s.measured) == pytest.approx((alone.ci_high / alone.measured) ** widen, rel=1e-9)
    row = json_rows(result)[0]
    assert row["alpha_ledger"]["case"] == SHARED and row["alpha_ledger"]["m"] == 2
    assert row["alpha_ledger"]["runs"] == ["first", "second"] and row["set_aside"] is None
    assert "(5%/2: 2 runs share it)" in markdown_table(result)
    json.dumps(row)  # serialisable


def test_a_block_set_aside_after_the_run_is_shown_beside_the_published_verdict(tmp_path: Path) -> None:
    """Block 2's arm b ran on another host: the published verdict leaves it out (confirmed on blocks 1 and 3);
    the stopping rule saw it during the run (inconclusive with it)."""
    study, db = _study(tmp_path), tmp_path / "r.duckdb"
    _run(db, study, "split", [1.0, 1.3, 1.002], hosts={2: "m2"})
    result = audit_studies([load_study(study)], [db])
    s = result.scores[0]
    assert s.verdict == "confirmed" and s.n == 2
    assert s.set_aside is not None and s.set_aside.blocks == (2,) and s.set_aside.n == 3
    assert s.set_aside.verdict == "inconclusive"
    row = json_rows(result)[0]["set_aside"]
    assert (row["published"], row["verdict"], row["blocks"]) == ("confirmed", "inconclusive", [2])
    assert row["text"].startswith("block 2 set aside after the run: published, without it: confirmed")
    assert "(during the run, with block 2: inconclusive)" in markdown_table(result)
    ctx = build_context(load_study(study), latest_runs([db])["toy"])
    html = environment().get_template("study.html").render(page=study_page(ctx, score(ctx), ""))
    assert 'during the run:</span> <span class="verdict v-inconclusive">inconclusive</span>' in html
    assert '<p class="set-aside">block 2 set aside after the run: published, without it: confirmed' in html
    _run(db, study, "whole", [1.0, 1.3, 1.002], day=2)  # nothing split: nothing beside it
    again = audit_studies([load_study(study)], [db]).scores[0]
    assert again.set_aside is None and again.alpha_ledger is not None and again.alpha_ledger.m == 2
    ctx = build_context(load_study(study), latest_runs([db])["toy"])
    html = environment().get_template("study.html").render(page=study_page(ctx, score(ctx), ""))
    assert "during the run:" not in html and '<p class="alpha-ledger">alpha ledger: 2 complete runs' in html


@pytest.mark.skipif(not DB.exists(), reason="the committed results database is not here")
def test_the_committed_runs_fp8_kv_block_11_and_warmup_trap_ledger() -> None:
    """fp8-kv's block 11 was split across hosts by a resume: faster-at-c128-decode is refuted with it at look 11
    (as the stopping rule saw it) and inconclusive without it, the published verdict. warmup-trap's two complete
    runs state ready-is-compiled alike: they share 5%, the re-run's last look at 0.8 x 2.5% (98%)."""
    runs = committed_runs()
    fp8 = {s.hypothesis: s for s in score(build_context(load_study(REPO / "studies/fp8_kv.toml"), runs["fp8-kv"]))}
    c128 = fp8["faster-at-c128-decode"]
    assert c128.verdict == "inconclusive" and c128.set_aside is not None
    assert (c128.set_aside.verdict, c128.set_aside.look, c128.set_aside.blocks) == ("refuted", (11, 12), (11,))
    assert fp8["neutral-at-c1"].set_aside is None  # decided at look 10: block 11 did not measure it
    trap = {s.hypothesis: s for s in score(build_context(load_study(REPO / "studies/warmup_trap.toml"),
                                                        runs["warmup-trap"]))}
    ready = trap["ready-is-compiled"]
    assert ready.alpha_ledger is not None and (ready.alpha_ledger.case, ready.alpha_ledger.m) == (SHARED, 2)
    assert ready.confidence == pytest.approx(0.98) and ready.look == (5, 5)
