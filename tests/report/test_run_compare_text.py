"""What the audit and the study page say of a study's other runs, word for word: each run's role, version,
GPU and vLLM, its estimates with their Welch test against the published run, the runs that differ; and the
small helpers under it (p values, the scale a ratio is tested on, study versions)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from compiler.load import load_study, study_version
from report import run_compare
from report.audit import audit_studies
from report.run_compare import StudyRuns, Welch, is_current, p_text, same_version, unit_values, version_of
from runner.store.records import RunRecord
from tests.report.test_run_compare import _run, _study


@pytest.fixture()
def three_runs(tmp_path: Path) -> tuple[StudyRuns, str]:
    """A complete run that differs, a partial one, and the published (latest complete) one."""
    study, db = _study(tmp_path), tmp_path / "r.duckdb"
    _run(db, study, "first", [0.98, 0.981, 0.979], day=1)
    _run(db, study, "cut", [1.0, 1.0, 1.0], day=2, status="partial")
    _run(db, study, "second", [1.0, 1.002, 0.998], day=3)
    version = f"TOML sha256 {study_version(study.read_text())[:8]}"
    return audit_studies([load_study(study)], [db]).compared["toy"], version


def test_the_other_runs_word_for_word(three_runs: tuple[StudyRuns, str]) -> None:
    compared, version = three_runs
    setup = f"study version {version}, the current file; NVIDIA H200, vLLM 0.26.0"
    assert compared.lines() == [
        "toy: 3 runs; verdicts from second",
        f"  run first (same file, GPU and vLLM): complete; {setup}",
        "    first same: 0.980x (97.5% interval 0.976–0.984x, n 3), confirmed; against the published run: "
        "Welch t = -15.58, df 3.0, p < 0.001",
        f"  run cut (for reference): partial: not scored (only complete runs are); {setup}",
        "    cut same: 1.000x (98.33% interval 1.000–1.000x, n 3); against the published run: Welch t = 0.00, df 2.0, "
        "p = 1",  # two complete runs and this one, were it to complete: 5%/3
        f"  run second (published): complete; {setup}",
        "    second same: 1.000x (97.5% interval 0.993–1.007x, n 3), confirmed",  # two complete runs share 5%
        "  toy/same: runs differ (p < 0.001): run first against the published second",
    ]
    assert compared.summary() == ("; other runs: first complete, same file, GPU and vLLM, cut partial, not scored; "
                                  "runs differ on same (p < 0.001)")
    assert [(f.label, f.value) for f in compared.facts()] == [(label, text) for _, label, text in compared.rows()]
    assert len(compared.facts()) == 7
    assert compared.changed == "" and compared.path.endswith(".toml")  # the file the published run measured


def test_a_run_of_another_setup_and_a_study_with_no_complete_run(three_runs: tuple[StudyRuns, str]) -> None:
    compared, version = three_runs
    first = compared.runs[0]
    other = replace(first, run=replace(first.run, gpu_name=None, vllm_version=None), comparable=False, current=False)
    assert other.describe() == f"complete; study version {version}, not the current file; no GPU, vLLM -"
    alone = replace(compared, runs=(other, compared.runs[1]), published=None)
    assert alone.lines()[0] == "toy: 2 runs; verdicts from none (no complete run)"
    assert alone.summary() == ("; other runs: first complete, another version or setup, "
                               "cut partial, not scored")
    assert [label for _, label, _ in alone.rows()][0] == "run first (for reference)"
    one = replace(compared, runs=compared.runs[2:])
    assert (one.rows(), one.lines(), one.facts(), one.summary()) == ([], [], (), "")


def test_p_is_said_to_two_digits_down_to_a_thousandth() -> None:
    assert (p_text(0.0734), p_text(0.001), p_text(math.nextafter(0.001, 0.0)), p_text(1.0)) == (
        "p = 0.073", "p = 0.001", "p < 0.001", "p = 1")
    assert run_compare.test_text(None, True) == run_compare.test_text(Welch(1.0, 2.0, 0.5), True) == ""
    assert run_compare.test_text(None, False) == ("; against the published run: no test (a side without two block, launch or "
                                      "repeat values)")
    assert run_compare.test_text(Welch(2.345, 10.04, 0.04), False) == "; against the published run: Welch t = 2.35, df 10.0, p = 0.04"


def test_welch_df_when_one_side_has_no_spread() -> None:
    """All of the variance on one side: df is that side's n - 1, whichever side it is."""
    w = run_compare.welch([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])
    assert w is not None and w.df == pytest.approx(2.0) and w.t == pytest.approx(-1 / math.sqrt(1 / 3))
    w = run_compare.welch([1.0, 2.0, 3.0, 4.0], [5.0, 5.0])
    assert w is not None and w.df == pytest.approx(3.0)


def test_a_positive_ratio_is_tested_on_the_log_scale_else_as_it_is(three_runs: tuple[StudyRuns, str]) -> None:
    (score,) = three_runs[0].runs[2].scores

    def s(ratio: bool, values: tuple[float, ...]):  # type: ignore[no-untyped-def]
        return replace(score, ratio=ratio, values=values)

    assert unit_values(s(True, (1.0, math.e))) == [0.0, 1.0]
    assert unit_values(s(True, (0.0, 2.0))) == [0.0, 2.0]  # a zero cannot be logged: read as it is
    assert unit_values(s(True, (0.5, 2.0))) == [math.log(0.5), math.log(2.0)]
    assert unit_values(s(False, (1.0, math.e))) == [1.0, math.e]
    assert unit_values(s(True, ())) == []


def test_study_versions_by_toml_else_by_bytes() -> None:
    toml, raw = "a" * 64, "b" * 64
    run = RunRecord(run_id="r", study_id="toy", study_sha256=raw, study_toml_sha256=toml)
    assert version_of(run) == "TOML sha256 aaaaaaaa"
    assert version_of(replace(run, study_toml_sha256=None)) == "file sha256 bbbbbbbb"
    assert version_of(replace(run, study_toml_sha256=None, study_sha256=None)) == "file sha256 ?"
    other = replace(run, study_toml_sha256="c" * 64)
    assert same_version(run, run) and not same_version(run, other)
    assert same_version(replace(run, study_toml_sha256=None), other)  # one without a TOML hash: by bytes
    assert not same_version(replace(run, study_toml_sha256=None), replace(other, study_sha256="d" * 64))
    bare = replace(run, study_toml_sha256=None, study_sha256=None)
    assert not same_version(bare, bare)  # no version recorded: never the same


def test_is_current_by_toml_when_both_are_known(tmp_path: Path) -> None:
    loaded = load_study(_study(tmp_path))
    run = RunRecord(run_id="r", study_id="toy", study_sha256=loaded.sha256, study_toml_sha256="a" * 64)
    assert is_current(run, loaded, "a" * 64) and not is_current(run, loaded, "b" * 64)
    assert is_current(run, loaded, None)  # the file's TOML not readable: its bytes decide
    assert not is_current(replace(run, study_sha256="x"), loaded, None)


def test_a_study_edited_since_its_one_run_says_so_in_the_audit(tmp_path: Path) -> None:
    """A prediction widened after the run is scored from that run, and every form of the audit says the file
    changed; a note added after it changes nothing the run measured or claimed, and nothing is said."""
    from report.audit import json_rows, markdown_table

    study, db = _study(tmp_path), tmp_path / "r.duckdb"
    _run(db, study, "only", [1.0, 1.01, 0.99])
    text = study.read_text()
    study.write_text(text.replace('notes = "', 'notes = "Edited after the run. ', 1) if 'notes = "' in text
                     else text.replace("[study]\n", '[study]\nnotes = "Edited after the run."\n', 1))
    noted = audit_studies([load_study(study)], [db])
    assert noted.compared["toy"].changed == "" and noted.compared["toy"].lines() == []
    assert noted.compared["toy"].summary() == ""
    assert [r["study_file_changed"] for r in json_rows(noted)] == [None]
    study.write_text(text.replace("tolerance = 0.05", "tolerance = 0.08"))
    wider = audit_studies([load_study(study)], [db])
    compared = wider.compared["toy"]
    assert compared.changed == "its plan differs (hypotheses)"
    assert compared.lines() == [f"toy: {study} changed since run only: its plan differs (hypotheses)"]
    assert compared.summary() == "; the study file changed since: its plan differs (hypotheses)"
    assert "3 launches per arm x 1 repeat; the study file changed since: its plan differs (hypotheses))" in (
        markdown_table(wider))
    assert [r["study_file_changed"] for r in json_rows(wider)] == ["its plan differs (hypotheses)"]
    study.write_text(text.replace("launches = 3", "launches = 4"))  # the same claims on more launches
    assert audit_studies([load_study(study)], [db]).compared["toy"].changed == "its plan differs (design, launches)"
    study.write_text(text.replace("[arms.a]\n", '[arms.a]\nexpect_log = ["Enforce eager set"]\n', 1))
    assert audit_studies([load_study(study)], [db]).compared["toy"].changed == "its plan differs (launches)"
    study.write_text(text.replace("where = { concurrency = 1 }", "where = { concurrency = 4 }"))
    assert "hypotheses" in audit_studies([load_study(study)], [db]).compared["toy"].changed


def test_an_edited_study_with_other_runs_says_so_before_them(three_runs: tuple[StudyRuns, str]) -> None:
    compared, _ = three_runs
    edited = replace(compared, changed="its plan differs (launches)", path="s.toml")
    assert edited.lines()[:2] == ["toy: s.toml changed since run second: its plan differs (launches)",
                                  "toy: 3 runs; verdicts from second"]
    assert edited.lines()[2:] == compared.lines()[1:]
    assert edited.summary() == "; the study file changed since: its plan differs (launches)" + compared.summary()


def test_a_stored_plan_that_cannot_be_read_is_said_so(tmp_path: Path) -> None:
    assert run_compare.plan_differs(load_study(_study(tmp_path)), None) == "its stored plan is unreadable"
