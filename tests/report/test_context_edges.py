"""The edges of report.scoring.context: an arm's model and why it has none, the calibrated card, and hypotheses
resolved onto a run whose plan stored none (point, server and search metrics, rates)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from compiler.hardware import get_hardware
from compiler.load import load_study
from compiler.modelconfig import ModelError
from compiler.plan import HypothesisSide
from compiler.plan_compile import compile_study
from compiler.study import Study
from report.results import RunData, latest_runs
from report.scoring.context import (
    ArmModel,
    StudyContext,
    arm_models,
    build_context,
    hardware_pair,
    resolve_hypothesis,
    side_label,
)
from runner.store.records import PointRecord, PointSummary, RunRecord, ServerRecord
from tests.compiler.test_slo import _variant
from tests.report.helpers import TINY_MODEL, P, make_db, write_study

KV = '''launches = 1

[[hypothesis]]
id = "kv"
claim = "b has KV room"
metric = "kv_capacity_tokens"
where = { arm = "b" }
predict = { relation = ">", value = 1 }

[[hypothesis]]
id = "ratio"
claim = "a is twice b at c4"
metric = "output_throughput"
where = { concurrency = 4 }
predict = { ratio = ["a", "b"], value = 2.0, tolerance = 0.5 }
'''


def _data(tmp: Path) -> tuple[Study, RunData]:
    loaded = load_study(write_study(tmp, KV))
    points = [P(arm, c, 1, {"output_throughput": 100.0}) for arm in ("a", "b") for c in (1, 4)]
    db = make_db(tmp / "r.duckdb", points)
    return loaded.study, latest_runs([db])["toy"]


def test_a_missing_shape_raises_its_own_reason_else_says_there_is_none() -> None:
    with pytest.raises(ModelError, match="^no model shape$"):
        ArmModel(None, None, "", "", None).require()
    own = ModelError("config.json: no hidden_size")
    with pytest.raises(ModelError) as raised:
        ArmModel("m", None, "", "", own).require()
    assert raised.value is own


def test_an_arm_without_a_model_of_its_own_reads_the_studys(tmp_path: Path) -> None:
    ctx = build_context(load_study(write_study(tmp_path, KV)), None)
    assert set(ctx.models) == {"", "a", "b"}
    mine = ArmModel("own", None, "x", "y", None)
    ctx = dataclasses.replace(ctx, models={**ctx.models, "a": mine})
    assert ctx.model("a") is mine
    assert ctx.model("no such arm") is ctx.models[""]


def _ceilings(study: Study, run: RunRecord) -> tuple[float, float, bool]:
    card, _, calibrated = hardware_pair(study, run)
    assert card is not None
    return card.bandwidth_Bps, card.flops_bf16, calibrated


def test_a_calibrated_run_puts_both_measured_ceilings_on_the_card(tmp_path: Path) -> None:
    study, _ = _data(tmp_path)
    spec = get_hardware("cpu")
    run = RunRecord(run_id="r", study_id="toy", calibrated=True, bandwidth_Bps=1e11, flops_bf16=2e12)
    assert hardware_pair(study, run)[1] == spec
    assert _ceilings(study, run) == (1e11, 2e12, True)
    assert _ceilings(study, dataclasses.replace(run, flops_bf16=None)) == (1e11, spec.flops_bf16, True)
    assert _ceilings(study, dataclasses.replace(run, bandwidth_Bps=None)) == (spec.bandwidth_Bps, 2e12, True)
    for uncalibrated in (dataclasses.replace(run, calibrated=False),
                         dataclasses.replace(run, bandwidth_Bps=None, flops_bf16=None), None):
        assert hardware_pair(study, uncalibrated) == (spec, spec, False)


def test_each_arm_says_its_folder_shape_and_dtypes_or_why_it_has_none(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((TINY_MODEL / "config.json").read_text())
    text = write_study(tmp_path, KV).read_text().replace(
        'description = "arm b"', f'description = "arm b"\nmodel = "{broken}"')
    (tmp_path / "toy.toml").write_text(text)
    loaded = load_study(tmp_path / "toy.toml")
    (broken / "config.json").write_text("{}")  # changed after validation: the report reads it again
    models = arm_models(loaded)
    a, b = models["a"], models["b"]
    assert (a.folder, a.shape is not None, a.dtype, a.kv_dtype, a.error) == (str(TINY_MODEL), True, "bf16", "auto",
                                                                            None)
    assert (b.folder, b.shape, b.dtype, b.kv_dtype) == (str(broken), None, "", "")
    assert isinstance(b.error, (ModelError, ValueError))


def test_an_arm_that_names_no_folder_has_no_shape_and_says_which_arm(tmp_path: Path) -> None:
    text = write_study(tmp_path, KV).read_text().replace(f'path = "{TINY_MODEL}"\n', "")
    (tmp_path / "toy.toml").write_text(text)
    models = arm_models(load_study(tmp_path / "toy.toml"))
    b = models["b"]
    assert (b.folder, b.shape, b.dtype, b.kv_dtype) == (None, None, "", "")
    assert str(b.error) == "arm 'b' names no local model folder: expressions need a config.json"


def test_an_unknown_metric_is_named(tmp_path: Path) -> None:
    study, data = _data(tmp_path)
    hyp = study.hypothesis[1].model_copy(update={"metric": "no_such_metric"})
    with pytest.raises(ValueError, match="^unknown metric 'no_such_metric'$"):
        resolve_hypothesis(study, hyp, data, None)


def test_without_a_plan_the_stored_points_and_servers_resolve_it(tmp_path: Path) -> None:
    study, data = _data(tmp_path)
    kv = resolve_hypothesis(study, study.hypothesis[0], data, None)
    assert (kv.numerator.points, kv.numerator.servers) == ((), ("toy/b",))  # a server metric reads no point
    ratio = resolve_hypothesis(study, study.hypothesis[1], data, None)
    assert ratio.numerator.points == ("toy/a/w/c4/r1",)
    assert ratio.denominator is not None and ratio.denominator.points == ("toy/b/w/c4/r1",)
    assert (ratio.numerator.servers, ratio.denominator.servers) == (("toy/a",), ("toy/b",))


def test_a_recompiled_hypothesis_is_written_into_the_stored_plan(tmp_path: Path) -> None:
    study, data = _data(tmp_path)
    plan = compile_study(load_study(tmp_path / "toy.toml"))
    old = json.loads(plan.to_json())
    old.pop("hypotheses")
    run = dataclasses.replace(data.run, plan_json=json.dumps(old))
    ctx = build_context(load_study(tmp_path / "toy.toml"), dataclasses.replace(data, run=run))
    assert ctx.plan is not None and ctx.recompiled == ("kv", "ratio")
    assert [h.id for h in ctx.plan.hypotheses] == ["kv", "ratio"]
    # the plan's points (three repeats), not the one the run stored
    assert ctx.plan.hypotheses[1].numerator.points == plan.hypotheses[1].numerator.points == tuple(
        f"toy/a/w/c4/r{r}" for r in (1, 2, 3))


def test_a_capacity_hypothesis_reads_the_searches_of_its_arm_only(tmp_path: Path) -> None:
    loaded = load_study(_variant(tmp_path, ("launches = 1", "launches = 2")))
    plan = compile_study(loaded)
    old = json.loads(plan.to_json())
    old.pop("hypotheses")
    run = RunRecord(run_id="r", study_id="capacity", plan_json=json.dumps(old))
    servers = tuple(ServerRecord(run_id="r", server_id=f"capacity/{a}/L{k}", arm=a) for a in ("large", "small")
                    for k in (1, 2))
    probe = PointRecord(run_id="r", point_id="capacity/large/L1/w/search/c1/r1", arm="large", workload="w",
                        concurrency=1, summary=PointSummary(requests_ok=16, slo_attainment=1.0))
    data = RunData(db=tmp_path / "x.duckdb", run=run, servers=servers, points=(probe,), checks=(), telemetry=())
    ctx: StudyContext = build_context(loaded, data)
    (step,) = ctx.plan.hypotheses if ctx.plan else ()
    assert step.numerator.points == ("capacity/large/L1/w/search", "capacity/large/L2/w/search")
    assert step.denominator is not None
    assert step.denominator.points == ("capacity/small/L1/w/search", "capacity/small/L2/w/search")
    assert step.numerator.points == plan.hypotheses[0].numerator.points


def test_a_side_is_labelled_by_its_rung_rate_included() -> None:
    side = HypothesisSide(arm="a", workload="w", concurrency=None, rate_rps=2.5, points=(), servers=())
    assert side_label(side) == "a/w/2.5"
    assert side_label(side.model_copy(update={"rate_rps": None})) == "a/w"
