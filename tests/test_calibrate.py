"""`studyc calibrate`: a GPU measured alone is stored as a run with no points, and `studyc plan --db` prices
that GPU's predictions on it; a host without the GPU, or a probe that fails, is one line and exit 2.

The stored calibration is built from a Calibration object (data), written to a real DuckDB file holding
the committed H200 points, and read back by the real `studyc plan`."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from report.ledger.ledger import gpu_id, read_calibrations, read_points
from runner.execute.calibration_run import (
    STUDY_ID,
    CalibrationError,
    calibration_run,
    measure_machine,
    stored_host_probe,
)
from runner.measure.calibrate import Calibration
from runner.measure.host_probe import host_probe
from runner.measure.nvml import gpu_info
from runner.store.store import Store
from studyc.calibrate_command import store_run
from studyc.cli import main
from tests.conftest import REPO, committed_copy

CUDA_GRAPHS_H200 = "20261201T202615-d1cd5a"  # cuda-graphs' qwen3-8b graphs and eager points on the H200
H100 = {"name": "NVIDIA H100 80GB HBM3", "driver_version": "570.00"}
MEASURED = Calibration(True, 3.0e12, 7.0e14, H100["name"], {"bandwidth_bytes": 4 << 30}, None)


@pytest.fixture(scope="module")
def h200_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed results with cuda-graphs' H200 run alone: no H100 run, no H100 calibration."""
    path = committed_copy("h200", tmp_path_factory.mktemp("cal") / "h200.duckdb")
    with Store(path) as store:
        store.con.execute("DELETE FROM runs WHERE run_id <> ?", [CUDA_GRAPHS_H200])
    return path


def test_a_calibration_only_run_prices_the_plan_for_its_gpu(h200_only: Path, tmp_path: Path) -> None:
    db = tmp_path / "h200.duckdb"
    db.write_bytes(h200_only.read_bytes())
    assert {gpu_id(c.gpu) for c in read_calibrations(db)} == {"h200"}
    run = calibration_run(MEASURED, host_probe(repeats=3), H100)
    store_run(db, run)
    with Store(db, read_only=True) as store:
        stored = store.run(run.run_id)
        assert stored is not None and store.points(run.run_id) == []
    assert stored.study_id == STUDY_ID and stored.plan_json is None and stored.gpu_name == H100["name"]
    assert (stored_host_probe(stored) or {}).get("per_request_s", 0) > 0
    assert {p.run_id for p in read_points(db)} == {CUDA_GRAPHS_H200}  # no points of its own to fit
    found = [c for c in read_calibrations(db) if c.run_id == run.run_id]
    assert [(gpu_id(c.gpu), c.bandwidth_Bps, c.flops_per_s) for c in found] == [("h100-sxm", 3.0e12, 7.0e14)]

    result = CliRunner().invoke(main, ["plan", str(REPO / "studies/roofline_h100.toml"), "--db", str(db)])
    assert result.exit_code == 0, result.output
    c1 = next(line for line in result.output.splitlines() if line.startswith("roofline-h100/graphs/L1/decode/c1/r1 "))
    assert ("not measured on h100-sxm: fitted on H200's points, priced on h100-sxm's calibration "
            "(median of 1 run(s): 3.00 TB/s, 700 TFLOP/s)") in c1


def test_a_results_folder_takes_the_calibration_as_a_run_folder(tmp_path: Path) -> None:
    from report.exporting import export_database

    first = calibration_run(MEASURED, None, H100)
    store_run(tmp_path / "one.duckdb", first)
    folder = tmp_path / "results"
    export_database(tmp_path / "one.duckdb", folder, "parquet")
    run = calibration_run(replace(MEASURED, bandwidth_Bps=3.2e12), None, H100)
    store_run(folder, run)
    assert (folder / run.run_id / "manifest.json").is_file()
    assert {c.run_id: c.bandwidth_Bps for c in read_calibrations(folder)} == {first.run_id: 3.0e12, run.run_id: 3.2e12}


@pytest.mark.skipif(gpu_info(0) is not None, reason="this host has a GPU: it would be calibrated")
def test_a_host_without_a_gpu_is_one_line_and_exit_2(tmp_path: Path) -> None:
    db = tmp_path / "none.duckdb"
    done = subprocess.run([sys.executable, "-m", "studyc", "calibrate", "--db", str(db)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("Error: no CUDA GPU 0 on this host") and len(done.stderr.splitlines()) == 1
    assert "Traceback" not in done.stderr and not db.exists()


def test_a_device_no_host_has_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["calibrate", "--db", str(tmp_path / "x.duckdb"), "--device", "63"])
    assert result.exit_code == 2 and "no CUDA GPU 63 on this host" in result.output
    assert len(result.output.splitlines()) == 1 and not (tmp_path / "x.duckdb").exists()


def test_a_probe_that_fails_is_one_line_and_exit_2() -> None:
    """A GPU the host reports (a fake NVML answer: the fault) and the real probe, run in this python, which
    has no torch."""
    with pytest.raises(CalibrationError) as caught:
        measure_machine(0, [sys.executable], find_gpu=lambda index: H100)
    assert caught.value.exit_code == 2
    assert caught.value.message.startswith(f"GPU 0 ({H100['name']}) not calibrated: torch not importable")
    assert "\n" not in caught.value.message


def test_a_probe_with_a_many_line_failure_still_says_it_in_one_line() -> None:
    def failing(python_cmd: list[str], *, gpu_index: int = 0) -> Calibration:
        return Calibration(False, None, None, None, {}, "calibration probe exited with code 1 and no result: a\nb\n")

    with pytest.raises(CalibrationError, match=r"exited with code 1 and no result: a b$"):
        measure_machine(0, ["python"], calibrator=failing, find_gpu=lambda index: H100)
