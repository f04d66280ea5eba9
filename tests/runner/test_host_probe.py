"""The host probe: a fixed Python workload of a front end's kind, timed on this host for real, stable enough
to compare hosts by, and recorded with every calibration (`studyc run`'s and `studyc calibrate`'s) in the
run's calibration details, in a real DuckDB file."""

from __future__ import annotations

import sys
from pathlib import Path

from runner.execute.calibration_run import HOST_PROBE, calibration_json, stored_host_probe
from runner.execute.driver import Progress, RunOptions
from runner.execute.run import _calibration
from runner.measure.calibrate import Calibration
from runner.measure.host_probe import WORKLOAD, host_probe, one_request
from runner.store.records import RunRecord
from runner.store.store import Store


def test_the_workload_is_deterministic() -> None:
    assert one_request(3) == one_request(3) > 64 * 100  # 64 framed tokens of about 150 bytes each
    assert one_request(3) != one_request(1234)  # numbered requests: not one cached answer


def test_two_medians_agree_within_a_factor_of_two() -> None:
    first, second = host_probe(), host_probe()
    assert first.workload == second.workload == WORKLOAD and first.repeats == 15 and first.requests == 40
    assert first.fastest_s <= first.per_request_s <= first.slowest_s
    assert 1e-6 < first.per_request_s < 0.1  # a few ms per repeat of 40 requests, not nothing, not seconds
    assert 0.5 < first.per_request_s / second.per_request_s < 2.0


def test_a_run_records_it_even_where_the_gpu_is_not_calibrated(tmp_path: Path) -> None:
    """`studyc run`'s calibration, for real: the probe runs in this python (no torch here), so the GPU part
    fails and says why, and the host probe is recorded beside it; stored and read back."""
    options = RunOptions(db=tmp_path / "r.duckdb", engine_command=[], python_argv=[sys.executable], runs_dir=tmp_path)
    run = _calibration(RunRecord("run-1", "s"), options, Progress())
    assert run.calibrated is False and "torch" in (run.calibration_json or "")
    with Store(tmp_path / "r.duckdb") as store:
        store.save_run(run)
    with Store(tmp_path / "r.duckdb", read_only=True) as store:
        stored = store.run("run-1")
    assert stored is not None
    probe = stored_host_probe(stored)
    assert probe is not None and probe["workload"] == WORKLOAD and probe["per_request_s"] > 0


def test_the_gpu_probes_details_are_kept_beside_it() -> None:
    cal = Calibration(True, 4.2e12, 6.7e14, "NVIDIA H200", {"copy_ms": [1.0, 1.1]}, None)
    run = RunRecord("r", "s", calibration_json=calibration_json(cal, host_probe(repeats=3, requests=2)))
    assert set(stored_host_probe(run) or {}) >= {"workload", "per_request_s", "repeats", "python"}
    assert '"copy_ms": [1.0, 1.1]' in (run.calibration_json or "") and HOST_PROBE in (run.calibration_json or "")
    assert stored_host_probe(RunRecord("old", "s", calibration_json='{"device": "x", "details": {}}')) is None
    assert stored_host_probe(RunRecord("none", "s")) is None
