"""The alpha ledger at its edges (report.stats.alpha_ledger): what counts as the same prediction is the metric, the
prediction and each side's arm, workload and level, never the point ids; a prediction with one side (no
denominator) is compared as such; each share names its hypothesis and run. Plans compiled from a real study,
one field changed through the plan's own model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compiler.load import load_study
from compiler.plan import Plan
from compiler.plan_compile import compile_study
from report.stats.alpha_ledger import NEW_HYPOTHESIS, SHARED, ledger, stated
from runner.store.records import RunRecord
from tests.report.test_run_compare import _study


def _plan(tmp_path: Path) -> Plan:
    return compile_study(load_study(_study(tmp_path)))


def _changed(plan: Plan, **update: Any) -> str:
    """The plan's JSON with its one hypothesis changed (`numerator`/`denominator`: a dict of the side's fields,
    or None for no side)."""
    (h,) = plan.hypotheses
    for side in ("numerator", "denominator"):
        if isinstance(update.get(side), dict):
            update[side] = getattr(h, side).model_copy(update=update[side])
    return plan.model_copy(update={"hypotheses": (h.model_copy(update=update),)}).to_json()


def _share(first: str, second: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    s = ledger([RunRecord("a", "toy", plan_json=first, status="complete"),
                RunRecord("b", "toy", plan_json=second, status="complete")], "b")["same"]
    return s.case, s.runs, s.other_prediction


@pytest.mark.parametrize("side, field, value", [
    ("numerator", "concurrency", 8), ("numerator", "arm", "c"), ("denominator", "workload", "other"),
    ("denominator", "rate_rps", 2.5),
])
def test_a_side_stated_at_another_arm_workload_or_level_is_a_new_hypothesis(
        tmp_path: Path, side: str, field: str, value: object) -> None:
    plan = _plan(tmp_path)
    assert _share(plan.to_json(), plan.to_json()) == (SHARED, ("a", "b"), ())
    assert _share(plan.to_json(), _changed(plan, **{side: {field: value}})) == (NEW_HYPOTHESIS, ("b",), ("a",))


def test_other_point_ids_are_the_same_prediction(tmp_path: Path) -> None:
    """A design change (other points, launches, servers) is not a new prediction."""
    plan = _plan(tmp_path)
    moved = _changed(plan, points=("p-x",), numerator={"points": ("p-x",), "launches": ("l-x",), "servers": ()})
    assert _share(plan.to_json(), moved) == (SHARED, ("a", "b"), ())


def test_a_prediction_without_a_denominator_is_compared_by_its_one_side(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    one_side = _changed(plan, denominator=None)
    (h,) = Plan.from_stored(one_side).hypotheses  # type: ignore[union-attr]
    assert stated(h)[3] is None and stated(h)[2] == ("b", h.numerator.workload, h.numerator.concurrency, None)
    assert _share(one_side, one_side) == (SHARED, ("a", "b"), ())
    assert _share(plan.to_json(), one_side) == (NEW_HYPOTHESIS, ("b",), ("a",))


def test_each_share_names_its_hypothesis_and_run(tmp_path: Path) -> None:
    plan = _plan(tmp_path).to_json()
    runs = [RunRecord("a", "toy", plan_json=plan, status="complete"),
            RunRecord("b", "toy", plan_json=plan, status="complete")]
    for run_id in ("a", "b"):
        share = ledger(runs, run_id)["same"]
        assert (share.hypothesis, share.run_id) == ("same", run_id)
