"""The study context: built once per study per build, it carries the run's plan, and scoring selects each
side of a hypothesis by that plan's point ids (server ids for a server metric), never by level."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from compiler.load import LoadedStudy, load_study
from compiler.plan import Plan
from compiler.plan_compile import compile_study
from report.pages import site
from report.results import RunData, latest_runs
from report.scoring import context as context_module
from report.scoring.context import build_context
from report.scoring.scoring import score
from tests.report.helpers import P, make_db, write_study

RATIO = '''launches = 1

[[hypothesis]]
id = "ratio"
claim = "a is twice b at c4"
metric = "output_throughput"
where = { concurrency = 4 }
predict = { ratio = ["a", "b"], value = 2.0, tolerance = 0.5 }

[[hypothesis]]
id = "kv"
claim = "a has KV room"
metric = "kv_capacity_tokens"
where = { arm = "a" }
predict = { relation = ">", value = 1 }
'''


def _points() -> list[P]:
    # a/c4 r3 is far off: it decides the ratio whenever it is read
    a4 = {1: 200.0, 2: 210.0, 3: 5000.0}
    return ([P("a", 4, r, {"output_throughput": a4[r]}) for r in (1, 2, 3)]
            + [P("b", 4, r, {"output_throughput": 100.0 + r}) for r in (1, 2, 3)]
            + [P(arm, 1, r, {"output_throughput": 50.0}) for arm in ("a", "b") for r in (1, 2, 3)])


def _setup(tmp: Path) -> tuple[LoadedStudy, RunData, Plan]:
    loaded = load_study(write_study(tmp, RATIO))
    db = make_db(tmp / "r.duckdb", _points(), servers={"a": {"kv_capacity_tokens": 1000}, "b": {"kv_capacity_tokens": 500}})
    return loaded, latest_runs([db])["toy"], compile_study(loaded)


def _with_plan(data: RunData, plan: dict[str, Any] | Plan) -> RunData:
    text = plan.to_json() if isinstance(plan, Plan) else json.dumps(plan)
    return dataclasses.replace(data, run=dataclasses.replace(data.run, plan_json=text))


def _trimmed(plan: Plan, keep: tuple[str, ...]) -> Plan:
    """The plan with the ratio's numerator narrowed to `keep` (a plan can name any subset of its points)."""
    hyps = []
    for h in plan.hypotheses:
        if h.id == "ratio":
            numerator = h.numerator.model_copy(update={"points": keep})
            assert h.denominator is not None
            h = h.model_copy(update={"numerator": numerator, "points": keep + h.denominator.points})
        hyps.append(h)
    return plan.model_copy(update={"hypotheses": tuple(hyps)})


def test_a_ratio_reads_exactly_its_plans_point_ids(tmp_path: Path) -> None:
    loaded, data, plan = _setup(tmp_path)
    keep = ("toy/a/w/c4/r1", "toy/a/w/c4/r2")  # r3 shares their level but is not in the list
    ctx = build_context(loaded, _with_plan(data, _trimmed(plan, keep)))
    assert ctx.plan_source == "stored" and ctx.recompiled == ()
    s = {x.hypothesis: x for x in score(ctx)}["ratio"]
    assert s.point_ids == (*keep, "toy/b/w/c4/r1", "toy/b/w/c4/r2", "toy/b/w/c4/r3")
    assert s.measured is not None and 1.5 < s.measured < 2.5  # (200, 210) over ~102; with r3 it would be ~18
    assert s.targets == ("a/w/4", "b/w/4")

    full = {x.hypothesis: x for x in score(build_context(loaded, _with_plan(data, plan)))}["ratio"]
    assert "toy/a/w/c4/r3" in full.point_ids and full.measured is not None and full.measured > 10


def test_a_server_metric_reads_exactly_its_plans_server_ids(tmp_path: Path) -> None:
    loaded, data, plan = _setup(tmp_path)
    s = {x.hypothesis: x for x in score(build_context(loaded, _with_plan(data, plan)))}["kv"]
    assert (s.point_ids, s.measured) == (("toy/a",), 1000.0)
    hyps = tuple(h.model_copy(update={"numerator": h.numerator.model_copy(update={"servers": ("toy/b",)})})
                 if h.id == "kv" else h for h in plan.hypotheses)
    s = {x.hypothesis: x for x in score(build_context(
        loaded, _with_plan(data, plan.model_copy(update={"hypotheses": hyps}))))}["kv"]
    assert (s.point_ids, s.measured) == (("toy/b",), 500.0)  # the plan's server is read, whatever its arm


@pytest.mark.parametrize("stored", ["no hypotheses", "no plan"])
def test_an_old_plan_is_scored_by_the_recompiled_hypotheses(tmp_path: Path, stored: str) -> None:
    loaded, data, plan = _setup(tmp_path)
    old: dict[str, Any] = json.loads(plan.to_json())
    old.pop("hypotheses")
    old_data = _with_plan(data, old) if stored == "no hypotheses" else _with_plan(data, {})
    ctx = build_context(loaded, old_data)
    assert ctx.plan_source == "recompiled from the study file"
    assert ctx.recompiled == ("ratio", "kv")
    assert (ctx.plan is not None) == (stored == "no hypotheses")
    want = {h.id: h for h in plan.hypotheses}
    for hid in ("ratio", "kv"):  # point ids are stable: the recompiled resolution is the compiler's
        got, compiled = ctx.hypotheses[hid], want[hid]
        assert got.numerator.points == compiled.numerator.points
        assert (got.denominator.points if got.denominator else ()) == (
            compiled.denominator.points if compiled.denominator else ())
        assert got.numerator.servers == compiled.numerator.servers
    new = {x.hypothesis: x for x in score(build_context(loaded, _with_plan(data, plan)))}
    for s in score(ctx):
        assert (s.point_ids, s.measured, s.verdict) == (new[s.hypothesis].point_ids, new[s.hypothesis].measured,
                                                        new[s.hypothesis].verdict)


def test_a_selector_that_does_not_resolve_is_said(tmp_path: Path) -> None:
    loaded, data, _ = _setup(tmp_path)
    bad = loaded.study.hypothesis[0].model_copy(update={"where": loaded.study.hypothesis[0].where.model_copy(
        update={"concurrency": 3})})
    broken = dataclasses.replace(loaded, study=loaded.study.model_copy(update={"hypothesis": [bad]}))
    ctx = build_context(broken, _with_plan(data, {}))
    assert "ratio" not in ctx.hypotheses and ctx.unresolved == {"ratio": "selector matches no point of the plan"}
    (s,) = score(ctx)
    assert s.verdict == "not run" and s.targets == ()
    assert [r.detail for r in s.reasons if r.why.value == "selector"] == ["selector matches no point of the plan"]


def test_the_context_is_built_once_per_study_and_reads_each_model_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded, _, _ = _setup(tmp_path)
    other = load_study(write_study(tmp_path, RATIO, study_id="two"))
    dbs = [tmp_path / "r.duckdb", make_db(tmp_path / "t.duckdb", _points(), study_id="two")]
    calls: dict[str, list[str]] = {"build": [], "model": [], "hardware": []}

    def counting(name: str, real: Any) -> Any:
        def wrapper(*args: Any, **kw: Any) -> Any:
            calls[name].append(str(args[0].study.study.id if name == "build" else args[0]))
            return real(*args, **kw)
        return wrapper

    monkeypatch.setattr(site, "build_context", counting("build", site.build_context))
    monkeypatch.setattr(context_module, "load_model", counting("model", context_module.load_model))
    monkeypatch.setattr(context_module, "get_hardware", counting("hardware", context_module.get_hardware))
    gathered = site.gather([loaded, other], dbs)
    assert sorted(calls["build"]) == ["toy", "two"]
    assert len(calls["model"]) == 2  # one folder per study (both arms and the study share it), read once
    assert calls["hardware"] == ["cpu", "cpu"]
    assert [page.study_id for page, _ in gathered.studies] == ["toy", "two"]
    # only the context reads model configs and hardware entries
    for name in ("report.scoring.scoring", "report.pages.pages", "report.pages.seed", "report.pages.study_charts", "report.pages.site",
                 "report.audit"):
        module = importlib.import_module(name)
        assert not hasattr(module, "load_model") and not hasattr(module, "get_hardware"), name
