"""The machine metrics scored from stored server rows: each launch's own calibration, one value per launch
(a start that compiled its graphs keeps its value: the calibration ran before it started), ridge_point as
flops / bandwidth, and a calibration that failed (NULLs and its reason) never passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from report.scoring.score_model import Why
from runner.store.records import ServerRecord
from tests.report.test_scoring_branches import RUN, hyp, launch, run, scores, study

PLAN = {"launches": [launch(f"La{b}", b, server_ids=[f"toy/a/{b}"]) for b in (1, 2, 3)]}
FLOPS = (6.51e14, 6.49e14, 6.55e14)
BANDWIDTH = (4.19e12, 4.21e12, 4.20e12)
NO_GPU = "not calibrated: calibration probe reported failure: no CUDA device"


def server(b: int, flops: float | None, bandwidth: float | None, *, cache: str = "warm",
           error: str | None = None) -> ServerRecord:
    return ServerRecord(run_id=RUN, server_id=f"toy/a/{b}", arm="a", status="ready", compile_cache=cache,
                        machine_flops=flops, machine_bandwidth=bandwidth, calibration_error=error)


def measured(**cache: str) -> list[ServerRecord]:
    return [server(b, FLOPS[b - 1], BANDWIDTH[b - 1], cache=cache.get(f"s{b}", "warm")) for b in (1, 2, 3)]


def test_machine_flops_is_read_from_each_launch_and_a_cold_start_keeps_its_value(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("flops", "machine_flops", '{ arm = "a" }', "{ relation = \"<\", value = 8.24e14 }"))
    s = scores(loaded, run(servers=measured(s1="cold"), plan=PLAN))["flops"]
    assert s.values == pytest.approx(FLOPS) and s.n == 3 and s.unit == "FLOP/s"
    assert s.point_ids == ("toy/a/1", "toy/a/2", "toy/a/3")
    assert s.verdict == "confirmed" and s.ci_high is not None and s.ci_high < 8.24e14
    assert not any("not exchangeable" in n for n in s.notes)  # compiled or not: measured before the start


def test_ridge_point_is_flops_over_bandwidth_per_launch(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("ridge", "ridge_point", '{ arm = "a" }', "{ value = 155, tolerance = 0.15 }"))
    s = scores(loaded, run(servers=measured(), plan=PLAN))["ridge"]
    ridges = tuple(f / b for f, b in zip(FLOPS, BANDWIDTH, strict=True))  # 155.4, 154.2, 156.0
    assert s.values == pytest.approx(ridges) and s.unit == "FLOP/byte" and s.n == 3
    assert s.verdict == "confirmed" and s.measured == pytest.approx(sum(ridges) / 3)


@pytest.mark.parametrize("metric", ["machine_flops", "machine_bandwidth", "ridge_point"])
def test_a_failed_calibration_never_passes(tmp_path: Path, metric: str) -> None:
    loaded = study(tmp_path, hyp("m", metric, '{ arm = "a" }', "{ relation = \">\", value = 0 }"))
    failed = [server(b, None, None, error=NO_GPU) for b in (1, 2, 3)]
    s = scores(loaded, run(servers=failed, plan=PLAN))["m"]
    assert s.verdict == "not run" and s.measured is None and s.n == 0
    assert any(r.why == Why.NOT_MEASURED for r in s.reasons)
    assert any(r.why == Why.MISSING_VALUES and NO_GPU in r.detail and r.count == 3 for r in s.reasons), s.reasons


def test_one_launch_without_its_calibration_is_named_and_the_rest_scored(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("flops", "machine_flops", '{ arm = "a" }', "{ relation = \"<\", value = 8.24e14 }"))
    servers = [*measured()[:2], server(3, None, 4.2e12, error=NO_GPU)]
    s = scores(loaded, run(servers=servers, plan=PLAN))["flops"]
    assert s.values == pytest.approx(FLOPS[:2]) and s.n == 2
    assert any(r.why == Why.MISSING_VALUES and "toy/a/3" in r.detail and NO_GPU in r.detail for r in s.reasons)


def test_ridge_point_without_a_bandwidth_is_missing_not_zero(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("ridge", "ridge_point", '{ arm = "a" }', "{ relation = \">\", value = 0 }"))
    servers = [server(b, FLOPS[b - 1], None if b == 1 else 0.0) for b in (1, 2, 3)]
    s = scores(loaded, run(servers=servers, plan=PLAN))["ridge"]
    assert s.verdict == "not run" and s.n == 0
    missing = [r for r in s.reasons if r.why == Why.MISSING_VALUES]
    assert missing and "stored no calibration" in missing[0].detail  # no reason stored: said so, not invented


def test_rows_from_before_machine_metrics_read_as_not_calibrated(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("bw", "machine_bandwidth", '{ arm = "a" }', "{ relation = \"<\", value = 4.8e12 }"))
    old = [ServerRecord(run_id=RUN, server_id=f"toy/a/{b}", arm="a", status="ready", kv_capacity_tokens=1000)
           for b in (1, 2, 3)]
    s = scores(loaded, run(servers=old, plan=PLAN))["bw"]
    assert s.verdict == "not run" and s.n == 0
