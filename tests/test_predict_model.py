"""`predict = { value = "model" }`: the step-time model's prediction frozen into the plan from a small real
database (one run of decode-roofline from results/h200), shown by `studyc plan`, refused without --db, and
scored by the audit like any value prediction."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from compiler.load import load_study
from compiler.model_freeze import freeze_model_values
from compiler.model_value import ModelPoint
from compiler.plan_compile import compile_study
from studyc.cli import main
from tests.conftest import REPO, RESULTS

RUN = "20261203T075449-6a1a6d"  # decode-roofline on the H200: 8B and 0.6B at batch 1, three launches each
MODELLED = """
[[hypothesis]]
id = "8b-as-modelled"
claim = "The step-time model predicts the 8B's batch-1 throughput"
metric = "output_throughput"
where = { arm = "qwen3-8b" }
predict = { value = "model", tolerance = 0.1 }

[[hypothesis]]
id = "ratio-as-modelled"
claim = "The step-time model predicts how much faster the 0.6B decodes"
metric = "output_throughput"
predict = { value = "model", tolerance = 0.3, ratio = ["qwen3-0-6b", "qwen3-8b"] }
"""


def study_file(folder: Path, extra: str = MODELLED) -> Path:
    """decode_roofline.toml with the model folders absolute and `extra` hypotheses appended."""
    text = (REPO / "studies" / "decode_roofline.toml").read_text()
    text = text.replace('"../models/', f'"{REPO / "models"}/')
    path = folder / "decode_roofline_model.toml"
    path.write_text(text + extra)
    return path


@pytest.fixture(scope="module")
def small_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database of one committed run, imported from a results folder holding only that run."""
    from report.exporting import import_folder

    folder = tmp_path_factory.mktemp("one-run") / "results"
    folder.mkdir()
    shutil.copyfile(RESULTS / "h200" / "manifest.json", folder / "manifest.json")
    shutil.copytree(RESULTS / "h200" / RUN, folder / RUN)
    db = folder.parent / "one-run.duckdb"
    import_folder(folder, db)
    return db


def test_plan_freezes_the_models_number_with_its_provenance(tmp_path: Path, small_db: Path) -> None:
    path = study_file(tmp_path)
    result = CliRunner().invoke(main, ["plan", str(path), "--db", str(small_db), "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output[result.output.index("{"):])
    hyps = {h["id"]: h for h in plan["hypotheses"]}
    frozen = hyps["8b-as-modelled"]["model"]
    predicted = {p["id"]: p["predicted"] for launch in plan["launches"] for p in launch["points"]}
    eight = [v["output_throughput"] for k, v in predicted.items() if "/qwen3-8b/" in k]
    small = [v["output_throughput"] for k, v in predicted.items() if "/qwen3-0-6b/" in k]
    assert frozen["value"] == pytest.approx(sum(eight) / len(eight))
    assert 150 < frozen["value"] < 250  # the 8B at batch 1 on the H200: 190.5-191.3 tok/s measured
    assert "qwen3" in frozen["fit_key"] and "H200" in frozen["fit_key"]
    assert frozen["card"].startswith("h200: priced on h200's calibration")
    ratio = hyps["ratio-as-modelled"]["model"]["value"]
    assert ratio == pytest.approx((sum(small) / len(small)) / (sum(eight) / len(eight)))
    assert "model" not in hyps["8b-at-80pct"]  # an expression's hypothesis carries no frozen number

    table = CliRunner().invoke(main, ["plan", str(path), "--db", str(small_db)])
    assert table.exit_code == 0, table.output
    assert re.search(r"8b-as-modelled: output_throughput = 1\d\d\.?\d* tok/s ±10%\n    fit: .*qwen3", table.output)


def test_without_db_the_compile_names_file_line_and_key(tmp_path: Path) -> None:
    path = study_file(tmp_path)
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 1
    line = path.read_text().splitlines().index('predict = { value = "model", tolerance = 0.1 }') + 1
    assert f'{path}:{line}: hypothesis[3].predict.value: value = "model" is the step-time model' in result.output
    assert "--db DB" in result.output and "Traceback" not in result.output


def test_a_point_the_model_cannot_predict_fails_the_compile(tmp_path: Path) -> None:
    loaded = load_study(study_file(tmp_path))
    plan = compile_study(loaded)
    none = {p.id: ModelPoint(dict.fromkeys(("output_throughput", "tpot_s", "ttft_s")), note="no stored run measured it")
            for p in plan.points}
    from base.errors import StudycError

    with pytest.raises(StudycError, match=r"hypothesis\[3\]\.predict\.value: the step-time model does not predict "
                                          r"decode-roofline/qwen3-8b/.*: no stored run measured it"):
        freeze_model_values(plan, loaded, none)
    some = {pid: ModelPoint({"output_throughput": 100.0}, "fit", "card") for pid in none}
    frozen = freeze_model_values(plan, loaded, some)
    assert [h.model.value if h.model else None for h in frozen.hypotheses][-2:] == [100.0, 1.0]
    assert freeze_model_values(plan, load_study(study_file(tmp_path, extra="")), None) is plan  # none to freeze


def test_the_audit_scores_the_frozen_number_like_any_value(tmp_path: Path, small_db: Path) -> None:
    from report.results import read_run
    from report.scoring.scoring import score_study
    from studyc.plan_command import compile_with_model

    loaded = load_study(study_file(tmp_path))
    plan = compile_with_model(loaded, small_db)
    data = read_run(small_db, RUN)
    data = replace(data, run=replace(data.run, plan_json=plan.to_json()))  # as `studyc run` stores it
    scores = {s.hypothesis: s for s in score_study(loaded, data)}
    s = scores["8b-as-modelled"]
    step = next(h for h in plan.hypotheses if h.id == "8b-as-modelled")
    assert step.model is not None
    assert s.kind == "value" and s.predicted == pytest.approx(step.model.value)
    assert s.band_low == pytest.approx(0.9 * step.model.value) and s.band_high == pytest.approx(1.1 * step.model.value)
    assert s.verdict in ("confirmed", "refuted", "inconclusive")
    assert s.measured is not None and abs(s.measured / step.model.value - 1) < 0.1

    # The run's plan from before the hypothesis existed holds no number: scoring says why, no verdict read.
    old = {s.hypothesis: s for s in score_study(loaded, read_run(small_db, RUN))}["8b-as-modelled"]
    assert old.predicted is None
    assert any("holds no frozen step-time model prediction" in str(r.detail) for r in old.reasons)


@pytest.mark.parametrize(("predict", "metric", "said"), [
    ('{ value = "model" }', "output_throughput",
     "hypothesis[3].predict.tolerance: value = \"model\" needs a stated `tolerance`"),
    ('{ value = "model", relation = "<" }', "output_throughput",
     "hypothesis[3].predict.relation: value = \"model\" takes a `tolerance`, not a `relation`"),
    ('{ value = "model", tolerance = 0.1 }', "itl_p99_s",
     "hypothesis[3].metric: value = \"model\" predicts output_throughput, tpot_mean_s, ttft_mean_s"),
])
def test_validate_refuses_a_model_value_it_cannot_score(tmp_path: Path, predict: str, metric: str, said: str) -> None:
    extra = MODELLED.replace('{ value = "model", tolerance = 0.1 }', predict, 1).replace(
        'metric = "output_throughput"', f'metric = "{metric}"', 1)
    path = study_file(tmp_path, extra)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    line = path.read_text().splitlines().index(f"predict = {predict}") + 1 if "metric" not in said else (
        path.read_text().splitlines().index(f'metric = "{metric}"') + 1)
    assert f"{path}:{line}: {said}" in result.output and "Traceback" not in result.output


def test_validate_passes_a_model_value_with_its_tolerance(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(study_file(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "ok (5 hypotheses)" in result.output  # a decidability warning (the priors) may stand beside it
    assert "tolerance" not in result.output and "relation" not in result.output and "model\"" not in result.output


def test_a_resumed_run_keeps_the_number_its_plan_froze(tmp_path: Path, small_db: Path) -> None:
    from runner.store.store import Store
    from studyc.plan_command import compile_with_model

    db = tmp_path / "resumed.duckdb"
    shutil.copyfile(small_db, db)
    loaded = load_study(study_file(tmp_path))
    fresh = compile_with_model(loaded, db)
    step = next(h for h in fresh.hypotheses if h.id == "8b-as-modelled")
    assert step.model is not None and step.model.value != 123.0
    earlier = fresh.model_copy(update={"hypotheses": tuple(
        h.model_copy(update={"model": h.model.model_copy(update={"value": 123.0})}) if h.model else h
        for h in fresh.hypotheses)})
    with Store(db) as store:  # the run stored with a number the model, refitted now, would not give
        run = store.run(RUN)
        assert run is not None
        store.save_run(replace(run, plan_json=earlier.to_json()))
    resumed = compile_with_model(loaded, db, resume=True)
    assert [h.model.value for h in resumed.hypotheses if h.model] == [123.0, 123.0]
    assert [h.model.value for h in compile_with_model(loaded, db).hypotheses if h.model][0] == step.model.value
