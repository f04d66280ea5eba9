"""The error corpus: every bad study file yields its golden `file:line: key: message` lines, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from studyc.cli import main
from tests.golden import check_golden

ROOT = Path(__file__).resolve().parents[2]
BAD = sorted((ROOT / "tests/compiler/bad").glob("*.toml"))


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_study_golden(path: Path) -> None:
    rel = path.relative_to(ROOT)
    result = CliRunner().invoke(main, ["validate", str(rel)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    for line in result.output.strip().splitlines():
        assert line.startswith(f"{rel}:"), line
    check_golden(ROOT / "tests/compiler/golden" / f"{path.stem}.txt", result.output)


def test_every_problem_of_every_file_at_once() -> None:
    rels = [str(p.relative_to(ROOT)) for p in BAD]
    result = CliRunner().invoke(main, ["validate", *rels])
    assert result.exit_code == 2
    files = {line.split(":", 1)[0] for line in result.output.strip().splitlines()}
    assert files == set(rels)


def test_missing_file() -> None:
    result = CliRunner().invoke(main, ["validate", "studies/nope.toml"])
    assert result.exit_code == 2
    assert result.output == "studies/nope.toml:1: no such file\n"


def test_seed_studies_validate() -> None:
    studies = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "studies").glob("*.toml"))
    assert len(studies) >= 10
    result = CliRunner().invoke(main, ["validate", *studies])
    assert result.exit_code == 0, result.output
    assert result.output.count(": ok (") == len(studies)
