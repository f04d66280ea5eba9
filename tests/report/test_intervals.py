"""Intervals at the level that varies: launch means between, repeats within; ratios paired only by design."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from compiler.load import load_study
from compiler.plan import Plan
from compiler.plan_compile import compile_study
from report.stats.intervals import (
    SINGLE_LAUNCH,
    Obs,
    layout,
    mean_interval,
    ratio_interval,
    t_cdf,
    t_quantile,
    welch_df,
)
from tests.report.helpers import write_study


def obs(values: dict[int, list[float]], arm: str = "a", cold_first: bool = False) -> list[Obs]:
    """Block -> repeats of one launch in that block."""
    return [Obs(f"{arm}/L{b}/r{r}", v, f"{arm}/L{b}", b, r, not (cold_first and r == 1), "cold" if cold_first and r == 1
                else "") for b, vs in values.items() for r, v in enumerate(vs, start=1)]


def _t_interval(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return m, t_quantile(0.975, len(xs) - 1) * sd / math.sqrt(len(xs))


def test_t_quantiles() -> None:
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile(0.975, 30) == pytest.approx(2.0423, abs=1e-4)
    assert t_quantile(0.995, 4) == pytest.approx(4.6041, abs=1e-4)
    assert t_quantile(0.025, 5) == pytest.approx(-2.5706, abs=1e-4)
    assert t_cdf(0.0, 3.3) == pytest.approx(0.5)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.95996, abs=1e-5)


def test_mean_is_the_mean_of_launch_means_with_df_launches_minus_one() -> None:
    data = obs({1: [100.0, 102.0], 2: [104.0, 104.0], 3: [98.0, 99.0, 100.0]})
    got = mean_interval(data)
    means = [101.0, 104.0, 99.0]
    m, half = _t_interval(means)
    assert (got.level, got.n, got.df, got.single_launch) == ("launches", 3, 2.0, False)
    assert got.mean == pytest.approx(m) and got.ci_high - got.mean == pytest.approx(half)
    # repeats treated as independent would be narrower: the launch level is what varies
    naive_m, naive_half = _t_interval([v.value for v in data])
    assert naive_half < half


def test_one_launch_falls_back_to_repeats_and_says_so() -> None:
    got = mean_interval(obs({1: [100.0, 101.0, 102.0]}))
    assert got.level == "repeats" and got.single_launch and SINGLE_LAUNCH in got.notes
    assert got.ci_high - got.mean == pytest.approx(t_quantile(0.975, 2) * 1.0 / math.sqrt(3))
    one = mean_interval(obs({1: [7.0]}))
    assert (one.level, one.ci_low, one.ci_high) == ("value", 7.0, 7.0)


def test_non_exchangeable_points_are_left_out_and_reported() -> None:
    data = obs({1: [50.0, 100.0, 101.0], 2: [55.0, 102.0, 103.0]}, cold_first=True)
    got = mean_interval(data)
    assert got.mean == pytest.approx((100.5 + 102.5) / 2)
    assert [i for i, _ in got.excluded] == ["a/L1/r1", "a/L2/r1"]
    assert any("not exchangeable (cold)" in n for n in got.notes)
    with pytest.raises(ValueError):
        mean_interval([o for o in data if not o.exchangeable])


def test_ratio_paired_within_blocks_removes_the_shared_block_effect() -> None:
    shift = {1: 1.00, 2: 1.10, 3: 0.92, 4: 1.05}  # launches drift together within a block
    top = obs({b: [2.0 * s * x for x in (1.0, 1.01)] for b, s in shift.items()}, "t")
    bottom = obs({b: [1.0 * s * x for x in (0.995, 1.0)] for b, s in shift.items()}, "b")
    got = ratio_interval(top, bottom)
    d = [math.log((2.0 * s * 1.005) / (s * 0.9975)) for s in shift.values()]
    m, half = _t_interval(d)
    assert got.level == "blocks" and got.method.startswith("paired") and got.log_scale
    assert got.mean == pytest.approx(math.exp(m)) and got.ci_low == pytest.approx(math.exp(m - half))
    assert got.unpaired == 0


def test_launches_of_different_blocks_are_never_paired() -> None:
    top = obs({1: [2.0, 2.1], 3: [2.2, 2.0], 5: [1.9, 2.0]}, "t")
    bottom = obs({2: [1.0, 1.1], 4: [1.05, 1.0], 6: [0.95, 1.0]}, "b")
    got = ratio_interval(top, bottom)
    assert got.method.startswith("unpaired") and got.level == "launches"
    mt, mb = (2.05 + 2.1 + 1.95) / 3, (1.05 + 1.025 + 0.975) / 3
    assert got.mean == pytest.approx(mt / mb)


def test_one_launch_each_side_is_a_ratio_of_means_not_repeat_i_over_repeat_i() -> None:
    top = obs({1: [10.0, 20.0, 30.0]}, "t")
    bottom = obs({1: [30.0, 20.0, 10.0]}, "b")
    got = ratio_interval(top, bottom)
    assert got.mean == pytest.approx(1.0)  # repeat-by-repeat would give the geometric mean of 1/3, 1, 3 = 1 too
    assert got.method.startswith("unpaired") and got.single_launch
    # Welch df from the two sides' variances on the log scale
    v = (100.0 / 3) / 20.0 ** 2
    assert got.df == pytest.approx(welch_df([(v, 2.0), (v, 2.0)])) == pytest.approx(4.0)
    assert 0 < got.ci_low < 1.0 < got.ci_high


def test_one_shared_launch_pairs_repeat_with_repeat() -> None:
    top = [Obs(f"c4/r{r}", v, "a", 1, r) for r, v in enumerate([400.0, 420.0, 380.0], start=1)]
    bottom = [Obs(f"c1/r{r}", v, "a", 1, r) for r, v in enumerate([100.0, 105.0, 95.0], start=1)]
    got = ratio_interval(top, bottom)
    assert got.level == "repeats" and got.single_launch and got.ci_low == pytest.approx(4.0)


def test_unpaired_launches_are_counted_not_dropped_silently() -> None:
    top = obs({1: [2.0], 2: [2.1], 3: [2.05], 4: [1.9]}, "t")
    bottom = obs({1: [1.0], 2: [1.02], 3: [1.01]}, "b")
    got = ratio_interval(top, bottom)
    assert got.level == "blocks" and got.n == 3 and got.unpaired == 1


def test_ratio_intervals_are_positive_however_noisy() -> None:
    got = ratio_interval(obs({1: [0.1, 5.0]}, "t"), obs({1: [1.0, 1.1]}, "b"))
    assert got.ci_low > 0


def test_v1_plans_get_the_compilers_exchangeability(tmp_path: Path) -> None:
    """A stored v1 plan has no `exchangeable` (nor engine settings): its upgrade derives them; they must agree
    with the compiler's."""
    compiled = compile_study(load_study(write_study(tmp_path, "")))
    plan = json.loads(compiled.to_json())
    want = {p["id"]: p["exchangeable"] for s in plan["launches"] for p in s["points"]}
    assert not all(want.values())  # arm b keeps its cache: some points are cold
    top = {k: v for k, v in plan.items() if k not in ("launches", "design", "hypotheses")}
    v1 = top | {"schema_version": 1, "servers": [
        {k: v for k, v in s.items() if k not in ("launch", "block", "order", "server_ids", "engine")} | {
            "points": [{k: v for k, v in p.items() if k not in ("exchangeable", "not_exchangeable_because")}
                       for p in s["points"]]} for s in plan["launches"]]}
    upgraded = Plan.from_stored(json.dumps(v1))
    assert upgraded is not None
    got = layout(upgraded)
    assert {i: p.exchangeable for i, p in got.points.items()} == want
    assert [p.not_exchangeable_because for p in upgraded.points] == [p.not_exchangeable_because for p in compiled.points]
    assert [s.engine for s in upgraded.launches] == [s.engine for s in compiled.launches]
    assert layout(compiled).points.keys() == got.points.keys()
    assert layout(Plan.from_stored("not json")).points == {}


def test_scoring_uses_launch_blocks_from_the_stored_plan(tmp_path: Path) -> None:
    """Three launches per arm in blocks: the ratio is paired over blocks, with no single-launch mark; the
    kept-cache arm's cold points are left out and named."""
    from report.results import read_run
    from report.scoring.score_model import Why
    from report.scoring.scoring import score_study
    from tests.report.test_block_planner import HYP, _db

    path = write_study(tmp_path, HYP, hardware="h200")
    path.write_text(path.read_text().replace("repeats = 3", "repeats = 2\nlaunches = 3"))
    db = _db(tmp_path, path)
    scores = {s.hypothesis: s for s in score_study(load_study(path), read_run(db, "r1"))}
    same = scores["same"]
    assert same.interval.startswith("paired: t on 3 block log-ratios") and same.n == 3
    assert not same.has(Why.ONE_LAUNCH)
    assert same.has(Why.NOT_EXCHANGEABLE)  # arm b keeps its cache: its first c1 point of each launch is cold
    assert same.measured == pytest.approx(1.002)  # b keeps only its warm repeat 2 (x1.002) over a's mean


def test_one_value_each_side_says_it_has_no_interval() -> None:
    got = ratio_interval(obs({1: [3.0]}, "t"), obs({1: [2.0]}, "b"))
    assert (got.mean, got.ci_low, got.ci_high, got.method) == (1.5, 1.5, 1.5, "one value on each side: no interval")
