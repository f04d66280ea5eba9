"""Decidability on the command line: `studyc plan` gives each hypothesis its decidability with or without a
database, `studyc validate` warns about what `studyc run` refuses, and `studyc run` refuses it in one line per
hypothesis (file, line, id; no traceback) unless --underpowered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from base.errors import SpecError
from compiler.load import load_study
from compiler.plan_compile import compile_study
from studyc.cli import main
from studyc.decide import refuse_underpowered
from tests.variants import ONE_LAUNCH, study_variant

ROOT = Path(__file__).resolve().parents[1]
FP8 = ROOT / "studies/fp8_kv.toml"
H200 = ROOT / "results/h200"
QUICKSTART = ROOT / "studies/quickstart.toml"
NARROW = ("value = 0.75, tolerance = 0.2", "value = 0.75, tolerance = 0.05")  # ±5%: underpowered at 3 launches


def test_plan_json_without_a_database_gives_every_hypothesis_its_decidability() -> None:
    result = CliRunner().invoke(main, ["plan", str(FP8), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {h["id"]: h["decidability"] for h in json.loads(result.stdout)["hypotheses"]}
    assert len(rows) == 5 and all(r["hypothesis"] == h for h, r in rows.items())
    assert rows["capacity-doubles"]["decidable"] == "yes"
    decode = rows["faster-at-c128-decode"]
    assert decode["decidable"].startswith("only if the truth is at least ") and decode["decidable"].endswith(
        "% from an edge")
    assert decode["refused_by_run"] is True and decode["best_case_power"] < 0.5
    assert decode["prior"] == "default for throughput metrics" and decode["blocks"] == 12
    for key in ("min_detectable_distance", "narrowest_band", "band", "block_sd"):
        assert isinstance(decode[key], float), key


def test_plan_text_has_the_decidability_section() -> None:
    result = CliRunner().invoke(main, ["plan", str(FP8)])
    assert result.exit_code == 0, result.output
    assert "\ndecidability (80% power" in result.stdout
    assert "  capacity-doubles: decidable: yes; band ±3%; at 12 blocks" in result.stdout
    assert "studyc run refuses it (best-case power under 50%) without --underpowered" in result.stdout


def test_validate_warns_of_an_undecidable_hypothesis_with_its_line(tmp_path: Path) -> None:
    path = study_variant(tmp_path, NARROW)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0 and result.stdout == f"{path}: ok (4 hypotheses)\n"
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "tolerance = 0.05" in text)
    assert f"{path}:{line}: hypothesis[2].predict: warning: hypothesis kept-cache-hits is not decidable: " \
           "best-case power " in result.stderr
    assert result.stderr.count("warning: hypothesis") == 1


def test_validate_of_a_decidable_study_warns_of_none() -> None:
    """The quickstart as committed: three launches per arm decide each of its hypotheses (none refused)."""
    result = CliRunner().invoke(main, ["validate", str(QUICKSTART)])
    assert result.exit_code == 0 and result.stderr == ""


def test_validate_says_once_that_one_launch_decides_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(study_variant(tmp_path, *ONE_LAUNCH))])
    assert result.exit_code == 0
    assert result.stderr.count("load.launches: warning: one launch per arm") == 1
    assert "not decidable" not in result.stderr


def test_run_refuses_an_underpowered_hypothesis_in_one_line(tmp_path: Path) -> None:
    path, db = study_variant(tmp_path, NARROW), tmp_path / "r.duckdb"
    result = CliRunner().invoke(main, ["run", str(path), "--db", str(db), "--no-calibrate"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    refusal = [line for line in lines if "best-case power" in line]
    assert len(refusal) == 1 and refusal[0].startswith(f"{path}:")
    assert ": hypothesis[2].predict: hypothesis kept-cache-hits: best-case power " in refusal[0]
    assert refusal[0].endswith("widen the band, add blocks, or pass --underpowered")
    assert "Traceback" not in result.output and not db.exists()  # refused before anything started


def test_run_with_underpowered_goes_past_the_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUDYC_VLLM", str(tmp_path / "no-such-vllm"))  # stops at the engine check instead
    path, db = study_variant(tmp_path, NARROW), tmp_path / "r.duckdb"
    result = CliRunner().invoke(main, ["run", str(path), "--db", str(db), "--no-calibrate", "--underpowered"])
    assert result.exit_code != 0 and "best-case power" not in result.output
    clean = CliRunner().invoke(main, ["run", str(QUICKSTART), "--db", str(db), "--no-calibrate"])
    assert clean.exit_code != 0 and "best-case power" not in clean.output


@pytest.mark.skipif(not H200.exists(), reason="results/h200 is not here")
def test_run_judges_by_the_databases_priors_where_it_has_them() -> None:
    loaded = load_study(FP8)
    with pytest.raises(SpecError) as refused:
        refuse_underpowered([(loaded, compile_study(loaded))], H200)
    message = refused.value.message
    assert "hypothesis neutral-at-c1:" in message and "h200 (similar configurations)" in message
    assert "neutral-at-c8" not in message  # its stored pairs are tight: decidable at twelve blocks
