"""report.planning.block_planner at its edges: every field of a power-plan row, derived here from the plan and the
stored values; the text `format_power` writes, line by line; a prediction's tolerance; where a side's spread
comes from; a Spread's per-block SD and parts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from compiler.load import load_study
from compiler.plan import budget_points
from compiler.plan_compile import compile_study
from report.planning.block_planner import (
    POWERS,
    Last,
    PowerRow,
    Spread,
    _side_spread,
    _tolerance,
    blocks_needed,
    power_plan,
)
from report.planning.power_text import format_power
from report.stats.intervals import welch_df
from tests.report.test_block_planner import LAUNCH, NOISY_B, _db, study  # noqa: F401  (fixture)


def test_spread_per_block_and_parts() -> None:
    s = Spread("m", 0.03, 4, 0.04, 6)
    assert s.per_block(2, False) == pytest.approx(math.sqrt(0.03 ** 2 + 0.04 ** 2 / 2))
    assert s.per_block(2, True) == pytest.approx(math.sqrt(2 * (0.03 ** 2 + 0.04 ** 2 / 2)))
    assert s.per_block(0, False) == pytest.approx(math.sqrt(0.03 ** 2 + 0.04 ** 2))  # at least one repeat
    assert s.parts(2) == [(pytest.approx(0.03 ** 2), 4), (pytest.approx(0.04 ** 2 / 2), 6)]
    assert s.parts(0) == [(pytest.approx(0.03 ** 2), 4), (pytest.approx(0.04 ** 2), 6)]
    assert Spread("m", None, 0, 0.04, 3).per_block(4, False) == pytest.approx(0.02)
    assert Spread("m", 0.03, 2, None, 0).per_block(4, False) == pytest.approx(0.03)
    assert Spread("m", None, 0, None, 0).per_block(1, True) is None
    assert Spread("m", None, 0, None, 0).parts(1) == [(0.0, 0), (0.0, 0)]


def _pred(kind: str, **kw: Any) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(kind=kind, **kw)


def test_tolerance_of_each_kind_of_prediction() -> None:
    assert _tolerance(_pred("value", band=0.05)) == 0.05
    assert _tolerance(_pred("range", range=[90, 110])) == pytest.approx(0.1)
    assert _tolerance(_pred("range", range=[110.0, 90.0])) == pytest.approx(0.1)  # either order
    assert _tolerance(_pred("range", range=[-110, -90])) == pytest.approx(0.1)  # the centre's size
    assert _tolerance(_pred("range", range=[-1, 1])) is None  # centred on 0: no relative band
    assert _tolerance(_pred("range", range=["0.78 * x", "0.81 * x"])) is None  # expressions
    assert _tolerance(_pred("range", range=[1, "x"])) is None
    assert _tolerance(_pred("relation", relation="<", value=1.0)) is None


def test_where_a_sides_spread_comes_from() -> None:
    """Its configuration's; with the metric's pooled launch spread where the configuration ran on one
    launch; the metric's pooled one where the configuration never ran; else none."""
    from types import SimpleNamespace

    launch = SimpleNamespace(engine=SimpleNamespace(configuration=("serve", "m")), env={})
    step = SimpleNamespace(input_len=1, output_len=2, prefix_len=0, cache="reset", concurrency=4, rate_rps=None,
                           shape_key=None)
    steps: Any = {"p": (launch, step)}
    from report.planning.block_planner import config_key

    key = ("output_throughput", config_key(launch, step))  # type: ignore[arg-type]
    own = Spread("output_throughput", 0.02, 3, 0.01, 4)
    pooled = Spread("output_throughput", 0.05, 9, 0.03, 12)
    assert _side_spread("output_throughput", "p", steps, {key: own}, {"output_throughput": pooled}) == (
        own, "the same configuration")
    once = Spread("output_throughput", None, 0, 0.01, 4)
    got, source = _side_spread("output_throughput", "p", steps, {key: once}, {"output_throughput": pooled})
    assert got == Spread("output_throughput", 0.05, 9, 0.01, 4)
    assert source == "the same configuration (within); every configuration of the metric (between launches)"
    assert _side_spread("output_throughput", "p", steps, {key: once}, {}) == (once, "the same configuration")
    assert _side_spread("output_throughput", None, steps, {key: own}, {"output_throughput": pooled}) == (
        pooled, "every configuration of the metric")
    assert _side_spread("output_throughput", "p", steps, {}, {"output_throughput": pooled}) == (
        pooled, "every configuration of the metric")


def test_every_field_of_a_power_plan_row(tmp_path: Path, study: Path) -> None:  # noqa: F811
    """The rows of the toy study (three required blocks, two arms), from the stored values alone: the
    paired block SD, its df, the blocks for 80% and 95% power from blocks_needed, and their GPU time from
    the plan's own estimates (a required block whole, no budget here)."""
    plan = compile_study(load_study(study))
    rows = {r.hypothesis: r for r in power_plan(plan, _db(tmp_path, study, b_launch=NOISY_B))[0]}
    d = [math.log(NOISY_B[k] / LAUNCH[k]) for k in (1, 2, 3)]
    m = sum(d) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / 2)
    required = sum(1 for b in plan.design.blocks if b.required)
    assert required == 3
    block_s = sum(launch.estimated_start_s + sum(p.estimated_s for p in launch.points)
                  for launch in plan.launches if launch.block == 1)
    for hyp_id, tol in (("same", 0.02), ("tight", 0.001)):
        r = rows[hyp_id]
        assert (r.metric, r.tolerance, r.block_df) == ("output_throughput", tol, 2)
        assert r.block_sd == pytest.approx(sd, rel=1e-9)
        assert r.source == "paired blocks of the same two configurations (3 blocks, df 2)"
        want = [blocks_needed(tol, sd, power=p, df=2, first=required) for p in POWERS]
        assert (r.blocks, r.blocks_95) == tuple(want)
        for blocks, gpu in ((r.blocks, r.gpu_s), (r.blocks_95, r.gpu_95_s)):
            if blocks:
                hyp = next(h for h in plan.hypotheses if h.id == hyp_id)
                budget_s = sum(launch.estimated_start_s + sum(p.estimated_s for p in pts)
                               for launch in plan.launches if launch.block == 1
                               and (pts := budget_points(launch, [hyp])))
                assert gpu == pytest.approx(min(blocks, required) * block_s + max(blocks - required, 0) * budget_s)
            else:
                assert gpu is None
        assert r.last is None  # no score given
    assert rows["same"].blocks is not None and rows["same"].blocks >= 3
    assert rows["tight"].blocks is None  # more than the planner's limit
    # one side's launch spread, as read for the arm the hypothesis's numerator names
    assert rows["same"].launch_sd is not None and rows["same"].launch_df == 2
    assert rows["same"].warnings == ()
    assert rows["tight"].warnings == (
        f"tolerance 0.1% is below the block-to-block spread of the paired ratio {100 * sd:.2g}%: it cannot be "
        "decided at any budget worth running",)


def test_an_unpaired_ratio_adds_both_sides_and_names_each_source(tmp_path: Path, study: Path) -> None:  # noqa: F811
    """Arm b in a run of its own: no block pairs the arms, so the block SD is both sides' per-block SDs added,
    its df by Welch over their parts, and the launch spread is one side's times sqrt(2)."""
    from report.planning.block_planner import read_spreads

    plan = compile_study(load_study(study))
    db = _db(tmp_path, study, apart=True)
    rows = {r.hypothesis: r for r in power_plan(plan, db)[0]}
    _, by_config, _ = read_spreads(db, "h200", ["tiny-qwen3"])
    r = rows["same"]
    sides = [s for (metric, key), s in by_config.items() if metric == "output_throughput" and key[5] == 1]
    assert len(sides) == 2
    repeats = plan.design.repeats
    want = math.sqrt(math.fsum(s.per_block(repeats, False) ** 2 for s in sides))  # type: ignore[operator]
    assert r.block_sd == pytest.approx(want, rel=1e-9)
    assert r.block_df == pytest.approx(welch_df([p for s in sides for p in s.parts(repeats)]), rel=1e-9)
    assert r.source == "the same configuration"
    assert any(w.startswith("tolerance 2% is below the launch-to-launch spread") for w in r.warnings) is (
        0.02 < (r.launch_sd or 0) * math.sqrt(2))


def _row(**kw: Any) -> PowerRow:
    base: dict[str, Any] = dict(hypothesis="h", metric="output_throughput", tolerance=0.02, block_sd=0.0123,
                                blocks=6, gpu_s=720.0, source="the same configuration")
    base.update(kw)
    return PowerRow(**base)


def test_format_power_line_by_line() -> None:
    rows = [
        _row(block_df=4.5, blocks_95=9, gpu_95_s=1080.0, launch_sd=0.011, launch_df=3,
             warnings=("a warning",)),
        _row(hypothesis="g", tolerance=None, block_sd=None, blocks=None, gpu_s=None, source="nowhere"),
        _row(hypothesis="k", blocks=None, blocks_95=12, gpu_95_s=None,
             last=Last(1.0234, 0.0123, 1.02, 40, 4800.0, 12, 7, 60, 7200.0)),
        _row(hypothesis="n", last=Last(0.9, 0.1, 0.95, None, None, 5, None, None, None)),
        _row(hypothesis="z", last=Last(0.9, 0.1, 0.95, 3, 360.0)),
        _row(hypothesis="s", blocks_95=9, gpu_95_s=1080.0, stored_costs=True, last=Last(0.9, 0.1, 0.95, 3, 360.0)),
    ]
    out = format_power(rows, "0.26.0", Path("/d/runs.duckdb")).splitlines()
    assert out == [
        "power plan from /d/runs.duckdb (vLLM 0.26.0; spreads relative, per block; power at the stopping rule's "
        "error rate, the block SD at its 80% upper confidence bound; GPU minutes from the plan's estimates, or, "
        "where marked, from the stored runs' starts and points, as below):",
        "  h: output_throughput band ±2%, block SD 1.2% (df 4.5), launch-to-launch 1.1% (df 3): blocks for "
        "80% / 95% power: 6 / 9 (~12 / ~18 GPU min) (the same configuration)",
        "    warning: a warning",
        "  g: output_throughput band -, block SD unknown: blocks: cannot say (nowhere)",
        "  k: output_throughput band ±2%, block SD 1.2%: blocks for 80% / 95% power: more than 100 / 12 (~12 / - "
        "GPU min) (the same configuration)",
        "    from the last run's 1.023 (1.2% from the edge 1.02), to decide it: blocks for 80% / 95% power: "
        "40 / 60 (~80 / ~120 GPU min); under this study's budget of 12 blocks, 80% power by block 7",
        "  n: output_throughput band ±2%, block SD 1.2%: blocks for 80% / 95% power: 6 / more than 100 "
        "(~12 / - GPU min) (the same configuration)",
        "    from the last run's 0.9 (10% from the edge 0.95), to decide it: blocks for 80% / 95% power: more "
        "than 100 / more than 100 (- / - GPU min); not with 80% power within this study's budget of 5 blocks",
        "  z: output_throughput band ±2%, block SD 1.2%: blocks for 80% / 95% power: 6 / more than 100 "
        "(~12 / - GPU min) (the same configuration)",
        "    from the last run's 0.9 (10% from the edge 0.95), to decide it: blocks for 80% / 95% power: 3 / "
        "more than 100 (~6 / - GPU min)",
        "  s: output_throughput band ±2%, block SD 1.2%: blocks for 80% / 95% power: 6 / 9 (~12 / ~18 GPU min, from "
        "stored runs) (the same configuration)",
        "    from the last run's 0.9 (10% from the edge 0.95), to decide it: blocks for 80% / 95% power: 3 / "
        "more than 100 (~6 / - GPU min, from stored runs)",
    ]
    assert format_power([], None, Path("x.duckdb")).startswith("power plan from x.duckdb (vLLM unknown;")
    assert format_power([], None, Path("x.duckdb")).endswith("as below):\n")


LEVEL = '''
[[hypothesis]]
id = "level"
claim = "arm a runs about 100 tok/s at c1"
metric = "output_throughput"
where = { arm = "a", concurrency = 1 }
predict = { value = 100.0, tolerance = 0.05 }
'''


def test_a_single_sides_row_reads_its_own_configuration(tmp_path: Path, study: Path) -> None:  # noqa: F811
    """Not a ratio: the block SD is the side's own per-block SD (no sqrt(2)), its df by Welch over its
    parts; a point that failed, or was judged invalid, is not read (here they hold wild values)."""
    from datetime import datetime

    from report.planning.block_planner import read_spreads
    from runner.store.records import PointRecord, PointSummary
    from runner.store.store import Store
    from tests.report.test_block_planner import HYP

    text = study.read_text().replace(HYP.strip(), (HYP + LEVEL).strip())
    assert "id = \"level\"" in text
    study.write_text(text)
    plan = compile_study(load_study(study))
    db = _db(tmp_path, study)
    _, by_config, _ = read_spreads(db, "h200", ["tiny-qwen3"])
    before = dict(by_config)
    with Store(db) as store:
        for i, (status, valid) in enumerate((("failed", True), ("ok", False))):
            store.commit_point(PointRecord(
                run_id="r1", point_id=f"toy/a/w/c1/r{9 + i}", server_id="toy/a/L1", arm="a", workload="w",
                concurrency=1, repeat=1, valid=valid, status=status, started_at=datetime(2026, 1, 1),
                summary=PointSummary(output_throughput=1e6)), [], [], [])
    assert read_spreads(db, "h200", ["tiny-qwen3"])[1] == before
    rows = {r.hypothesis: r for r in power_plan(plan, db)[0]}
    r = rows["level"]
    from report.planning.block_planner import config_key

    launch, step = next((la, p) for la in plan.launches if la.arm == "a" for p in la.points if p.concurrency == 1)
    a_side = by_config[("output_throughput", config_key(launch, step))]
    repeats = plan.design.repeats
    assert r.tolerance == 0.05 and r.source == "the same configuration"
    assert r.block_sd == pytest.approx(a_side.per_block(repeats, False), rel=1e-9)
    assert r.block_df == pytest.approx(welch_df(a_side.parts(repeats)), rel=1e-9)
    assert r.launch_sd == pytest.approx(a_side.launch_sd) and r.launch_df == a_side.launch_df
    want = [blocks_needed(0.05, r.block_sd, power=p, df=r.block_df, first=3) for p in POWERS]
    assert (r.blocks, r.blocks_95) == tuple(want)


def test_the_last_runs_estimate_with_what_deciding_it_takes() -> None:
    """`_last`: the nearest edge on the log scale, the blocks for 80% and 95% power with their GPU time, and
    under a budget the look that decides it; nothing without a score, a measurement or a spread."""
    from types import SimpleNamespace

    from report.planning.block_planner import _last, blocks_to_clear, blocks_within, edge_distance

    score: Any = SimpleNamespace(measured=1.015, band_low=0.98, band_high=1.02, kind="value", relation=None)
    sd, df = 0.01, 12.0
    cost = {}

    def gpu_time(blocks: int) -> float:
        cost[blocks] = 60.0 * blocks
        return cost[blocks]

    got = _last(score, sd, df, gpu_time, 3, budget=40)
    assert got is not None
    distance = edge_distance(score)
    n80, n95 = blocks_to_clear(distance, sd, power=0.8, df=df, first=3), blocks_to_clear(distance, sd, power=0.95,
                                                                                        df=df, first=3)
    assert n80 is not None and n95 is not None and n95 > n80 > 3
    assert (got.measured, got.distance, got.edge) == (1.015, distance, 1.02)  # 1.02 is nearer than 0.98
    assert (got.blocks, got.gpu_s, got.blocks_95, got.gpu_95_s) == (n80, 60.0 * n80, n95, 60.0 * n95)
    assert (got.budget, got.within) == (40, blocks_within(distance, sd, first=3, budget=40, df=df))
    low: Any = SimpleNamespace(measured=0.985, band_low=0.98, band_high=1.02, kind="value", relation=None)
    assert _last(low, sd, df, gpu_time, 3).edge == 0.98  # type: ignore[union-attr]
    assert _last(low, sd, df, gpu_time, 3).within is None  # type: ignore[union-attr]  # no budget, no look
    assert _last(None, sd, df, gpu_time, 3) is None
    assert _last(score, None, df, gpu_time, 3) is None
    assert _last(SimpleNamespace(**{**vars(score), "measured": None}), sd, df, gpu_time, 3) is None
