"""The step-time model where it is used: `studyc model`, `studyc plan --db`, the prediction stored with
every point at run time, hypotheses' `model.calibrated.*`, and the site's ledger page."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from compiler.hardware import get_hardware
from compiler.load import load_study
from compiler.modelconfig import load_model
from compiler.plan_compile import compile_study
from compiler.predict_env import Calibrated, build_env
from compiler.stepcost import Card, Coefficients
from runner.execute.driver import Progress
from runner.store.records import PointRecord, RunRecord
from runner.store.store import Store
from studyc.cli import main
from studyc.predictions import predict_run
from tests.conftest import committed_copy

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "results" / "h200"
LEDGER_KEYS = {"study", "gpu", "vllm_version", "metric", "n", "median_abs_pct_error", "saturated", "worst_point"}
GPU_KEYS = {"gpu", "metric", "n", "studies", "median_abs_pct_error", "saturated", "median_abs_pct_error_saturated",
            "median_abs_pct_error_unsaturated", "worst_point"}
STUDY = REPO / "studies" / "cuda_graphs.toml"


@pytest.fixture(scope="module")
def small_db(tmp_path_factory):
    """The committed H200 results of two studies (their first runs: cuda-graphs, decode-roofline), migrated
    in a copy."""
    path = committed_copy("h200", tmp_path_factory.mktemp("small") / "small.duckdb")
    with Store(path) as store:
        store.con.execute("DELETE FROM runs WHERE run_id NOT IN ('20261129T234538-8c267f', '20261129T232436-d4a41c')")
    return path


def test_model_ledger_json_rows(small_db):
    result = CliRunner().invoke(main, ["model", "--ledger", "--db", str(small_db), "--format", "json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert set(found) == {"studies", "gpus", "not_validated"} and found["not_validated"]
    rows = found["studies"]
    assert rows and all(set(r) == LEDGER_KEYS for r in rows)
    assert {r["metric"] for r in rows} == {"output_throughput", "tpot_s", "ttft_s"}
    assert set(rows[0]["worst_point"]) == {"point_id", "predicted", "measured", "error_pct", "why", "saturated"}
    by_gpu = found["gpus"]  # each metric's error on the one GPU, over both studies
    assert by_gpu and all(set(r) == GPU_KEYS and r["gpu"] == "H200" for r in by_gpu)
    for r in by_gpu:
        assert r["n"] == sum(s["n"] for s in rows if s["metric"] == r["metric"])
        assert r["saturated"] == 0 and r["median_abs_pct_error_saturated"] is None  # c1 and c64 of 256 slots
        assert r["median_abs_pct_error_unsaturated"] == r["median_abs_pct_error"]
    assert "fitting the step-time model from 2 run(s)" in result.stderr
    table = CliRunner().invoke(main, ["model", "--ledger", "--db", str(small_db)])
    assert table.exit_code == 0 and "not validated" in table.stdout and "cuda-graphs" in table.stdout
    assert "by GPU and metric, every validated point:" in table.stdout and "near saturation: " in table.stdout


def test_model_prints_coefficients_and_needs_a_source(small_db):
    result = CliRunner().invoke(main, ["model", "--db", str(small_db), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["enforce_eager"] for r in rows} == {True, False}
    assert set(rows[0]["coefficients"]) == {"step_s", "seq_s", "mem", "flop", "request_s", "admit_s", "overlap"}
    assert CliRunner().invoke(main, ["model"]).exit_code == 2
    assert CliRunner().invoke(main, ["model", "--ledger", str(REPO / "models" / "qwen3-8b")]).exit_code == 2


def test_plan_json_predicts_every_point(small_db):
    result = CliRunner().invoke(main, ["plan", str(STUDY), "--db", str(small_db), "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    points = [p for s in plan.get("launches", plan.get("servers", [])) for p in s["points"]]
    assert points and all(set(p["predicted"]) == {"output_throughput", "tpot_s", "ttft_s"} for p in points)
    c1 = next(p for p in points if p["id"] == "cuda-graphs/graphs/L1/decode/c1/r1")["predicted"]
    assert c1["output_throughput"] == pytest.approx(190, rel=0.05) and c1["tpot_s"] > 0
    assert "fitting the step-time model from 2 run(s)" in result.stderr
    table = CliRunner().invoke(main, ["plan", str(STUDY), "--db", str(small_db)])
    assert table.exit_code == 0 and "step-time model predictions" in table.stdout
    plain = CliRunner().invoke(main, ["plan", str(STUDY), "--format", "json"])
    assert "predicted" not in plain.stdout


def test_run_time_prediction_per_point(small_db):
    plan = compile_study(load_study(STUDY))
    with Store(small_db, read_only=True) as store:
        run = next(r for r in store.runs() if r.study_id == "cuda-graphs")
        on_h200 = predict_run(store, plan, replace(run, run_id="new"), Progress())
        own_only = predict_run(store, plan, run, Progress())  # its own run is never fitted on
        elsewhere = predict_run(store, plan, replace(run, run_id="new", gpu_name="NVIDIA A100-SXM4-80GB"), Progress())
        unknown = predict_run(store, plan, replace(run, run_id="new", gpu_name="NVIDIA GeForce RTX 4090"), Progress())
        no_gpu = predict_run(store, plan, replace(run, run_id="new", gpu_name=None), Progress())
    c1, eager = "cuda-graphs/graphs/L1/decode/c1/r1", "cuda-graphs/eager/L1/decode/c1/r1"
    assert on_h200[c1].values["tpot_s"] and not on_h200[c1].note
    assert own_only[eager].values["tpot_s"] is None and "eager" in own_only[eager].note
    # An A100, never calibrated here: its spec sheet scaled by the H200's measured-to-spec ratios, said so
    assert "no calibration of a100-80gb" in elsewhere[c1].note
    assert elsewhere[c1].values["tpot_s"] > on_h200[c1].values["tpot_s"]  # 2.04 against 4.8 TB/s on the sheets
    assert unknown[c1].values["tpot_s"] is None and "not in the hardware table" in unknown[c1].note
    assert no_gpu[c1].values["tpot_s"] is None and "no GPU" in no_gpu[c1].note


def test_prediction_columns_round_trip(tmp_path):
    with Store(tmp_path / "r.duckdb") as store:
        store.save_run(RunRecord(run_id="r1", study_id="s"))
        point = PointRecord(run_id="r1", point_id="s/a/w/c1/r1", predicted_output_throughput=190.0,
                            predicted_tpot_s=0.0052, predicted_ttft_s=None, prediction_note="no TTFT")
        store.commit_point(point, [], [], [])
        back = store.points("r1")[0]
    assert (back.predicted_output_throughput, back.predicted_tpot_s, back.predicted_ttft_s,
            back.prediction_note) == (190.0, 0.0052, None, "no TTFT")


def test_hypothesis_calls_the_calibrated_model():
    shape, hw = load_model(REPO / "models" / "qwen3-8b"), get_hardware("h200")
    coef = Coefficients(2e-3, 0.0, 0.9, 1.1, 0.017, 0.003, overlap=2.0)
    env = build_env(shape, hw, calibrated=Calibrated(coef, Card(4.18e12, 6.58e14)))
    tps = env["model.calibrated.decode_tokens_per_s"](batch=1, context=384)
    assert 150 < tps < env["roofline.decode_tokens_per_s"](batch=1, context=384)  # type: ignore[operator]
    assert env["model.calibrated.decode_step_s"](1, 384) == pytest.approx(1 / tps)  # type: ignore[operator]
    for missing in (build_env(shape, hw), build_env(shape, hw, calibrated=Calibrated(None, None, "no run on A100"))):
        with pytest.raises(ValueError, match="model.calibrated"):
            missing["model.calibrated.decode_tokens_per_s"](batch=1, context=384)  # type: ignore[operator]


def test_site_ledger_page(small_db, tmp_path):
    from report.ledger.ledger_page import write_page
    from report.pages.site import environment

    path = write_page([small_db], tmp_path, environment())
    html = path.read_text(encoding="utf-8")
    assert "<table class=\"list ledger\">" in html and "H200 · vLLM 0.26.0" in html
    assert "cuda-graphs/graphs/decode" in html and "Not validated" in html
    index = (REPO / "site_templates" / "index.html").read_text(encoding="utf-8")
    assert 'href="ledger.html"' in index


def test_ledger_page_rebuilds_byte_identical_without_the_build_clock(small_db, tmp_path):
    from report.ledger.ledger_page import write_page
    from report.pages.site import environment

    first = write_page([small_db], tmp_path / "a", environment()).read_bytes()
    second = write_page([small_db], tmp_path / "b", environment()).read_bytes()
    assert first == second
    with Store(small_db, read_only=True) as store:
        newest = max(r.started_at for r in store.runs() if r.started_at is not None)
    assert f"runs up to {newest:%Y-%m-%d %H:%M} UTC".encode() in first  # the data's date, not the build clock
