"""The machine metrics (machine_flops, machine_bandwidth, ridge_point): server-level metrics of the GPU, named
in the catalogue, validated like kv_capacity_tokens (arms and ratios of arms, never a point's selection), and a
plan that calibrates each launch only when a hypothesis names one (its JSON unchanged otherwise)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from compiler.load import check_file, load_study
from compiler.metrics import MACHINE_METRICS, METRICS, ridge_point
from compiler.plan_compile import compile_study
from studyc.cli import main
from tests.variants import study_variant

ROOT = Path(__file__).resolve().parents[2]
MACHINE = ROOT / "studies/the_machine.toml"


def test_the_catalogue_names_them_as_server_metrics_with_units() -> None:
    assert MACHINE_METRICS == ("machine_flops", "machine_bandwidth", "ridge_point")
    units = {name: (METRICS[name].level, METRICS[name].unit, METRICS[name].higher_is_better) for name in MACHINE_METRICS}
    assert units == {"machine_flops": ("server", "FLOP/s", True), "machine_bandwidth": ("server", "B/s", True),
                     "ridge_point": ("server", "FLOP/byte", True)}
    assert all(METRICS[name].description for name in MACHINE_METRICS)


@pytest.mark.parametrize(("flops", "bandwidth", "ridge"), [
    (6.5e14, 4.2e12, 6.5e14 / 4.2e12), (989e12, 3.35e12, 989e12 / 3.35e12),
    (None, 4.2e12, None), (6.5e14, None, None), (None, None, None), (6.5e14, 0.0, None), (6.5e14, -1.0, None),
])
def test_ridge_point_is_flops_over_bandwidth(flops: float | None, bandwidth: float | None,
                                             ridge: float | None) -> None:
    assert ridge_point(flops, bandwidth) == (pytest.approx(ridge) if ridge is not None else None)


def test_the_machine_study_validates_and_calibrates_every_launch() -> None:
    assert check_file(MACHINE)[1] == []
    plan = compile_study(load_study(MACHINE))
    assert plan.calibrate_launches and len(plan.launches) == 3
    assert json.loads(plan.to_json())["calibrate_launches"] is True
    ridge = next(h for h in plan.hypotheses if h.metric == "ridge_point")
    assert ridge.level == "server" and ridge.unit == "FLOP/byte" and ridge.numerator.points == ()
    assert len(ridge.numerator.servers) == 3 and len(ridge.numerator.launches) == 3
    assert "each launch first calibrates its GPU (6 s)" in plan.estimate_basis


@pytest.mark.parametrize("name", ["quickstart", "fp8_kv", "mla_kv", "decode_roofline"])
def test_a_study_without_them_leaves_the_flag_out_of_its_plan(name: str) -> None:
    plan = compile_study(load_study(ROOT / f"studies/{name}.toml"))
    assert not plan.calibrate_launches and "calibrate_launches" not in plan.to_json()
    assert "calibrates its GPU" not in plan.estimate_basis


def test_a_ratio_of_arms_validates_and_plans(tmp_path: Path) -> None:
    path = study_variant(tmp_path, ('metric = "ttft_p50_s"\nwhere = { arm = "cold", concurrency = 1 }\n'
                                    'predict = { relation = "<", value = 0.1 }',
                                    'metric = "ridge_point"\npredict = { ratio = ["warm", "cold"], value = 1.0 }'))
    assert check_file(path)[1] == []
    plan = compile_study(load_study(path))
    step = next(h for h in plan.hypotheses if h.metric == "ridge_point")
    assert plan.calibrate_launches and step.denominator is not None
    assert step.numerator.arm == "warm" and step.denominator.arm == "cold"


@pytest.mark.parametrize(("where", "key", "named"), [
    ('where = { arm = "cold", concurrency = 1 }', "hypothesis[3].where.concurrency", "concurrency"),
    ('where = { arm = "cold", workload = "short" }', "hypothesis[3].where.workload", "workload"),
])
def test_a_point_selection_of_a_server_metric_is_refused_at_its_line(tmp_path: Path, where: str, key: str,
                                                                    named: str) -> None:
    path = study_variant(tmp_path, ('metric = "ttft_p50_s"\nwhere = { arm = "cold", concurrency = 1 }',
                                    f'metric = "ridge_point"\n{where}'))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    line = path.read_text().splitlines().index(where) + 1
    assert result.output.startswith(
        f"{path}:{line}: {key}: ridge_point is a server metric, one value per server launch: select it by arm "
        f"only, not by {named}")


def test_a_point_selection_in_a_ratio_side_is_refused_too(tmp_path: Path) -> None:
    path = study_variant(tmp_path, ('metric = "ttft_p50_s"\nwhere = { arm = "cold", concurrency = 1 }\n'
                                    'predict = { relation = "<", value = 0.1 }',
                                    'metric = "machine_flops"\n'
                                    'predict = { ratio = [{ arm = "warm", concurrency = 4 }, "cold"], value = 1.0 }'))
    messages = [f"{p.path}: {p.message}" for p in check_file(path)[1]]
    assert messages == ["hypothesis[3].predict.ratio.concurrency: machine_flops is a server metric, one value per "
                        "server launch: select it by arm only, not by concurrency"]
