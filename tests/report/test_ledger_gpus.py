"""Predictions that travel: a plan's GPU matched to the stored runs' through the hardware table, and a GPU
with no points priced on its calibration, or on its spec sheet scaled, from the other GPUs' fits."""

from __future__ import annotations

import pytest

from compiler.plan import Plan
from compiler.target_card import Calibration
from report.ledger.ledger import gpu_id, predict_points, read_calibrations, read_points
from runner.store.store import Store
from tests.conftest import committed_copy
from tests.report.test_ledger import REPO

ROOFLINE_H100 = "20261206T095824-45d4b3"  # roofline-h100 on "NVIDIA H100 80GB HBM3", its plan's hardware h100-sxm
PREFIX_NULL_H100 = "20261205T102715-83d28e"  # prefix-cache-null's qwen3-8b graphs points on the same H100 host
CUDA_GRAPHS_H200 = "20261201T202615-d1cd5a"  # cuda-graphs' qwen3-8b graphs and eager points on the H200
C1 = "roofline-h100/graphs/L1/decode/c1/r1"


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    """Copies of the committed results: the two H100 runs alone, and cuda-graphs' H200 run alone with the
    H100 runs' calibrations (their points deleted)."""
    folder = tmp_path_factory.mktemp("gpus")
    h100, h200 = folder / "h100.duckdb", folder / "h200.duckdb"
    for path, keep in ((h100, (ROOFLINE_H100, PREFIX_NULL_H100)), (h200, (CUDA_GRAPHS_H200, ROOFLINE_H100))):
        committed_copy("h200", path)
        with Store(path) as store:
            store.con.execute(f"DELETE FROM runs WHERE run_id NOT IN {keep}")
            store.con.execute("DELETE FROM points WHERE run_id = ?", [ROOFLINE_H100 if path == h200 else ""])
    return h100, h200


def _plan(db, run_id):
    with Store(db, read_only=True) as store:
        plan = Plan.from_stored(next(r for r in store.runs() if r.run_id == run_id).plan_json)
    assert plan is not None
    return plan


def test_h100_runs_are_found_through_the_hardware_table(dbs):
    h100, _ = dbs
    points = [p for p in read_points(h100) if p.run_id != ROOFLINE_H100]
    assert {p.key.gpu for p in points} == {"H100 80GB HBM3"} and gpu_id("H100 80GB HBM3") == "h100-sxm"
    plan = _plan(h100, ROOFLINE_H100)
    assert plan.hardware == "h100-sxm"
    predicted = predict_points(plan, points)
    c1 = predicted[C1]
    # Found (the note would say "not measured on h100-sxm"), though fitted from prefix-cache-null's points at
    # 32 users alone: 5.12 ms against the 6.54-6.55 ms measured at batch 1 (4.96 ms before the opening burst
    # reached the engine together, 4.72 ms before a request waited for the step scheduled after it arrived:
    # docs/predictions.md, TTFT).
    assert c1.note == "" and c1.values["tpot_s"] == pytest.approx(0.00512, rel=0.02)
    eager = predicted["roofline-h100/eager/L1/decode/c1/r1"]  # no run here measured eager
    assert eager.values["tpot_s"] is None and "no stored run measured h100-sxm / vLLM 0.26.0 / qwen3 / eager" in eager.note


def test_a_gpu_with_a_calibration_and_no_points_is_priced_on_it(dbs):
    _, h200 = dbs
    points, calibrations = read_points(h200), read_calibrations(h200)
    assert {p.key.gpu for p in points} == {"H200"}
    assert {gpu_id(c.gpu) for c in calibrations} == {"h200", "h100-sxm"}
    plan = _plan(dbs[0], ROOFLINE_H100)
    on_h100 = predict_points(plan, points, calibrations=calibrations)[C1]
    assert "not measured on h100-sxm: fitted on H200's points, priced on h100-sxm's calibration" in on_h100.note
    assert on_h100.values["tpot_s"] == pytest.approx(0.00655, rel=0.05)  # measured 6.54-6.55 ms on the H100
    on_h200 = predict_points(plan, points, hardware="NVIDIA H200")[C1]
    assert on_h200.note == ""  # the H200's own fit and cards
    # batch 1 streams the weights: the H100's lower measured bandwidth (3.04 against 4.26 TB/s) is slower
    assert 1.2 < on_h100.values["tpot_s"] / on_h200.values["tpot_s"] < 1.45


def test_a_gpu_without_a_calibration_gets_its_spec_sheet_scaled(dbs):
    _, h200 = dbs
    points = read_points(h200)
    plan = _plan(dbs[0], ROOFLINE_H100)
    spec = predict_points(plan, points)[C1]  # no calibration of the H100 handed in: the H200's runs only
    assert "no calibration of h100-sxm: its spec sheet scaled by the measured-to-spec ratios of h200" in spec.note
    assert spec.values["tpot_s"] == pytest.approx(0.00655, rel=0.06)
    a100 = predict_points(plan, points, hardware="a100-80gb")[C1]
    assert "no calibration of a100-80gb" in a100.note and a100.values["tpot_s"] > spec.values["tpot_s"]


def test_a_card_the_table_does_not_hold_and_nobody_calibrated_gets_no_prediction(dbs):
    _, h200 = dbs
    points = read_points(h200)
    odd = Calibration("GeForce RTX 4090", 9e11, 1.5e14, "elsewhere")
    plan = _plan(dbs[0], ROOFLINE_H100)
    none = predict_points(plan, points, hardware="NVIDIA GeForce RTX 5090", calibrations=[odd])[C1]
    assert all(v is None for v in none.values.values())
    assert "not in the hardware table and no run calibrated it" in none.note
    own = predict_points(plan, points, hardware="NVIDIA GeForce RTX 4090", calibrations=[odd])[C1]
    assert "priced on GeForce RTX 4090's calibration" in own.note and own.values["tpot_s"] is not None


def test_studyc_plan_prices_a_gpu_on_calibrations_of_runs_without_points(dbs):
    """`studyc plan --db`: the H100's calibrations come from its runs, though none of its points are left."""
    from compiler.load import load_study
    from studyc.plan_command import plan_study

    _, h200 = dbs
    summary = plan_study(load_study(REPO / "studies" / "roofline_h100.toml"), db=h200, advise=False)
    assert summary.predicted is not None and summary.plan.hardware == "h100-sxm"
    notes = {pp.note for pid, pp in summary.predicted.items() if "/graphs/" in pid}
    assert notes == {"not measured on h100-sxm: fitted on H200's points, priced on h100-sxm's calibration "
                     "(median of 1 run(s): 3.04 TB/s, 711 TFLOP/s)"}
