"""`studyc new`: a starter study that validates, plans and (on the CPU vLLM) runs on this machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from compiler.load import check_file, load_study
from compiler.plan_compile import compile_study
from report.planning.decidability import Priors, plan_decidability
from studyc.cli import main
from studyc.new import template

ROOT = Path(__file__).resolve().parents[1]


def test_new_writes_a_study_that_validates_and_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["new", "my-first"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "studies/my_first.toml"
    assert f"wrote {Path('studies/my_first.toml')}" in result.stdout
    text = path.read_text()
    assert text.count("#") > 10  # commented
    loaded, problems = check_file(path)
    assert problems == [] and loaded is not None and loaded.warnings == ()
    plan = compile_study(loaded)
    assert plan.study_id == "my-first" and plan.points and plan.hypotheses
    assert plan.hypotheses[0].numerator.points
    # three launches per arm: its hypothesis can decide, and `studyc run` does not refuse it
    rows = plan_decidability(plan, Priors())
    assert [(d.blocks, d.one_launch, d.refused) for d in rows] == [(3, False, False)]
    assert CliRunner().invoke(main, ["validate", str(path)]).stderr == ""


def test_cpu_template_carries_the_cpu_engine_settings(tmp_path: Path) -> None:
    text = template("cpu-one", tmp_path / "x.toml", None)
    for needed in ('hardware = "cpu"', "kv_cache_memory_bytes", "enforce_eager = true", "block_size = 32",
                   "VLLM_ENABLE_V1_MULTIPROCESSING", "tiny-qwen3"):
        assert needed in text


def test_gpu_template_validates_for_the_hosts_card(tmp_path: Path) -> None:
    path = tmp_path / "deep/gpu.toml"
    path.parent.mkdir()
    path.write_text(template("gpu-one", path, "h100-sxm"))
    loaded, problems = check_file(path)
    assert problems == [] and loaded is not None and loaded.warnings == ()
    assert loaded.study.study.hardware == "h100-sxm" and "kv_cache_memory_bytes" not in loaded.study.engine


def test_new_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "s.toml"
    out.write_text("keep me")
    result = CliRunner().invoke(main, ["new", "x", "--out", str(out)])
    assert result.exit_code == 1 and "exists; not overwriting" in result.output
    assert out.read_text() == "keep me"


def test_new_refuses_a_name_that_is_not_a_slug(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["new", "My Study", "--out", str(tmp_path / "s.toml")])
    assert result.exit_code == 1 and "must be a slug" in result.output
    assert not (tmp_path / "s.toml").exists()


def test_new_from_a_study_renames_it_and_re_aims_its_folders(tmp_path: Path) -> None:
    out = tmp_path / "elsewhere/copy.toml"
    result = CliRunner().invoke(main, ["new", "copy", "--from", str(ROOT / "studies/decode_roofline.toml"),
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    loaded = load_study(out)
    assert loaded.study.study.id == "copy"
    assert loaded.study.arms["qwen3-0-6b"].model == os.path.relpath(ROOT / "models/qwen3-0.6b", out.parent)
    original = compile_study(load_study(ROOT / "studies/decode_roofline.toml"))
    copied = compile_study(loaded)
    assert [s.argv[1:] for s in copied.launches] == [s.argv[1:] for s in original.launches]


def test_new_from_a_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["new", "x", "--from", str(tmp_path / "nope.toml"), "--out",
                                       str(tmp_path / "x.toml")])
    assert result.exit_code == 1 and "cannot read" in result.output and not (tmp_path / "x.toml").exists()


@pytest.mark.vllm
def test_new_study_runs_on_the_cpu_vllm(tmp_path: Path) -> None:
    from tests.conftest import vllm_missing

    why = vllm_missing()
    if why:
        pytest.skip(why)
    path = tmp_path / "first.toml"
    assert CliRunner().invoke(main, ["new", "first", "--out", str(path)]).exit_code == 0
    # The smallest run of the same study: one launch, 5 requests per point.
    text = path.read_text().replace("requests = 16", "requests = 5").replace("launches = 3 ", "launches = 1 ")
    path.write_text(text)
    db = tmp_path / "first.duckdb"
    result = CliRunner().invoke(main, ["run", str(path), "--db", str(db), "--no-calibrate"])
    assert result.exit_code == 0, result.output
    assert "2 point(s) measured" in result.stdout
    audit = CliRunner().invoke(main, ["audit", str(path), "--db", str(db), "--format", "json"])
    assert audit.exit_code == 0, audit.output
    assert json.loads(audit.stdout)[0]["verdict"] != "not run"
