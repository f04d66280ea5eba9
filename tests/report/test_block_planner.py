"""Planning with power: spreads from earlier runs, blocks needed, GPU time, warnings; `studyc plan --db`."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from compiler.load import load_study
from compiler.plan import Launch, PointStep
from compiler.plan_compile import compile_study
from report.audit import audit_studies
from report.planning.block_planner import (
    CLIFF_WARNING,
    blocks_needed,
    blocks_to_clear,
    edge_distance,
    power_plan,
    read_spreads,
)
from report.scoring.score_model import Reason, Why
from report.stats.intervals import fixed_critical, t_quantile
from report.stats.power import power_inside, power_to_clear, sd_upper
from report.stats.sequential import look_critical
from runner.store.records import PointRecord, PointSummary, RunRecord
from runner.store.store import Store
from studyc.cli import main
from tests.report.helpers import with_searches, write_study

HYP = '''
[[hypothesis]]
id = "same"
claim = "a and b give the same c1 throughput"
metric = "output_throughput"
where = { concurrency = 1 }
predict = { ratio = ["b", "a"], value = 1.0, tolerance = 0.02 }

[[hypothesis]]
id = "tight"
claim = "a and b give the same c4 throughput within 0.1%"
metric = "output_throughput"
where = { concurrency = 4 }
predict = { ratio = ["b", "a"], value = 1.0, tolerance = 0.001 }
'''
LAUNCH = {1: 1.00, 2: 1.01, 3: 0.99}  # launch offsets: SD 1% between launches
WITHIN = (0.998, 1.002)  # repeats of one launch


def _db(tmp: Path, study: Path, gpu: str = "NVIDIA H200", b_launch: dict[int, float] | None = None,
        apart: bool = False) -> Path:
    """One run of the toy study; `apart`: arm b in a run of its own, so no block pairs the arms."""
    plan = compile_study(load_study(study))
    db = tmp / "runs.duckdb"
    with Store(db) as store:
        for run_id in ("r1", "r2") if apart else ("r1",):
            store.save_run(RunRecord(run_id=run_id, study_id="toy", plan_json=plan.to_json(), gpu_name=gpu,
                                     vllm_version="0.26.0", started_at=datetime(2026, 1, 1), status="complete"))
        for p in plan.points:
            launch = (b_launch or LAUNCH) if p.arm == "b" else LAUNCH
            value = 100.0 * p.concurrency * launch[p.launch] * WITHIN[p.repeat - 1]
            store.commit_point(PointRecord(
                run_id="r2" if apart and p.arm == "b" else "r1", point_id=p.id, server_id=f"{p.id.rsplit('/', 3)[0]}", arm=p.arm, workload=p.workload,
                concurrency=p.concurrency, repeat=p.repeat, valid=True,
                summary=PointSummary(output_throughput=value)), [], [], [])
    return db


@pytest.fixture
def study(tmp_path: Path) -> Path:
    text = write_study(tmp_path, HYP, hardware="h200").read_text().replace("repeats = 3", "repeats = 2\nlaunches = 3")
    path = tmp_path / "toy.toml"
    path.write_text(text)
    return path


def test_spreads_between_and_within_launches(tmp_path: Path, study: Path) -> None:
    db = _db(tmp_path, study)
    by_metric, _, version = read_spreads(db, "h200", ["tiny-qwen3"])
    s = by_metric["output_throughput"]
    within = abs(math.log(WITHIN[1] / WITHIN[0])) / math.sqrt(2)
    assert s.within_sd == pytest.approx(within, rel=0.01) and version == "0.26.0"
    logs = [math.log(v) for v in LAUNCH.values()]
    m = sum(logs) / 3
    between = sum((x - m) ** 2 for x in logs) / 2 - within ** 2 / 2
    assert s.launch_sd == pytest.approx(math.sqrt(between), rel=0.01)
    assert read_spreads(db, "a100", ["tiny-qwen3"])[0] == {}  # another GPU: nothing


def _end(n: int, first: int) -> float:
    """The critical value a run of n blocks reads at its end: a fixed 95% up to the required blocks, else
    the last look of a budget of n."""
    return fixed_critical(n - 1) if n <= first else look_critical(n, n, first)(n - 1)


def test_blocks_needed_is_the_fewest_with_the_power_asked() -> None:
    """80% power to confirm a truth at the prediction: the interval at the run's end inside the band on
    both sides, read at the stopping rule's last look past the required blocks."""
    sd, edge = 0.0086, math.log1p(0.02)
    n = blocks_needed(0.02, sd, first=3)
    assert n is not None and n > 3
    assert power_inside(edge, sd, n, _end(n, 3)) >= 0.8 > power_inside(edge, sd, n - 1, _end(n - 1, 3))
    n95 = blocks_needed(0.02, sd, power=0.95, first=3)
    assert n95 is not None and n95 > n and power_inside(edge, sd, n95, _end(n95, 3)) >= 0.95
    # exactly the power reached at n is enough (>=), a hair more is not
    reached = power_inside(edge, sd, n, _end(n, 3))
    assert blocks_needed(0.02, sd, power=reached, first=3) == n
    assert blocks_needed(0.02, sd, power=reached + 1e-9, first=3) == n + 1
    assert blocks_needed(0.02, 0.0) == 2 and blocks_needed(0.0, 0.01) is None
    assert blocks_needed(0.0001, 0.05, most=20) is None and blocks_needed(0.02, sd, first=3, most=n) == n
    assert blocks_needed(0.02, sd, first=3, most=n - 1) is None


def test_a_spread_from_few_blocks_is_taken_at_its_upper_bound() -> None:
    """The SD's own uncertainty: from 2 df it plans more blocks than from 30, and from 30 more than a known
    SD; the bound is the chi-square one (report.stats.power.sd_upper)."""
    sd = 0.0086
    known, many, few = (blocks_needed(0.02, sd, df=df, first=3) for df in (None, 30, 2))
    assert known is not None and many is not None and few is not None and known < many < few
    assert many == blocks_needed(0.02, sd_upper(sd, 30), first=3)
    assert blocks_needed(0.02, sd, df=0, first=3) == known  # no df: nothing to bound, the SD as given


NOISY_B = {1: 1.00, 2: 1.02, 3: 0.98}  # arm b varies twice as much between launches as arm a


def test_power_plan_costs_and_warns_below_the_launch_spread(tmp_path: Path, study: Path) -> None:
    db = _db(tmp_path, study, b_launch=NOISY_B)
    plan = compile_study(load_study(study))
    rows = {r.hypothesis: r for r in power_plan(plan, db)[0]}
    assert rows["same"].blocks is not None and rows["same"].gpu_s is not None and rows["same"].gpu_s > 0
    assert not any("below the" in w for w in rows["same"].warnings)
    assert any("is below the block-to-block spread of the paired ratio" in w for w in rows["tight"].warnings)
    (tmp_path / "apart").mkdir()
    rows = {r.hypothesis: r for r in power_plan(plan, _db(tmp_path / "apart", study, apart=True))[0]}
    assert any("is below the launch-to-launch spread" in w for w in rows["tight"].warnings)


def test_a_paired_ratios_block_spread_is_that_of_its_block_ratios(tmp_path: Path, study: Path) -> None:
    """Where earlier runs measured both sides in the same blocks, what the two share in a block cancels:
    the block SD is that of the block log-ratios, not the two sides' launch spreads added."""
    plan = compile_study(load_study(study))
    shared = {r.hypothesis: r for r in power_plan(plan, _db(tmp_path, study))[0]}["same"]
    assert shared.block_sd == pytest.approx(0.0, abs=1e-12) and shared.blocks == 2  # both arms moved together
    assert shared.source == "paired blocks of the same two configurations (3 blocks, df 2)"
    (tmp_path / "b").mkdir()
    noisy = {r.hypothesis: r for r in power_plan(plan, _db(tmp_path / "b", study, b_launch=NOISY_B))[0]}["same"]
    d = [math.log(NOISY_B[k] / LAUNCH[k]) for k in (1, 2, 3)]
    m = sum(d) / 3
    assert noisy.block_sd == pytest.approx(math.sqrt(sum((x - m) ** 2 for x in d) / 2), rel=1e-9)


def test_plan_command_prints_the_power_plan_with_db(tmp_path: Path, study: Path) -> None:
    db = _db(tmp_path, study)
    out = CliRunner().invoke(main, ["plan", str(study), "--db", str(db)])
    assert out.exit_code == 0, out.output
    assert "power plan from" in out.output and "same: output_throughput band ±2%" in out.output
    plain = CliRunner().invoke(main, ["plan", str(study)])
    assert "power plan" not in plain.output
    as_json = CliRunner().invoke(main, ["plan", str(study), "--db", str(db), "--json"])
    json.loads(as_json.stdout)  # JSON stays JSON


def _score(measured: float, low: float | None, high: float | None, kind: str = "value",
           relation: str | None = None) -> Any:
    return SimpleNamespace(measured=measured, band_low=low, band_high=high, kind=kind, relation=relation)


def test_edge_distance_is_to_the_nearest_edge_the_interval_must_clear() -> None:
    assert edge_distance(_score(0.984, 0.98, 1.02)) == pytest.approx(math.log(0.984 / 0.98))
    assert edge_distance(_score(1.5, 0.98, 1.02)) == pytest.approx(math.log(1.5 / 1.02))
    # a relation: only its threshold counts
    assert edge_distance(_score(2.76, 1.0, None, "relation", ">")) == pytest.approx(math.log(2.76))
    assert edge_distance(_score(0.5, None, 1.0, "relation", "<")) == pytest.approx(math.log(2.0))
    assert edge_distance(_score(0.0, 0.98, 1.02)) is None


def test_blocks_to_clear_the_edge() -> None:
    """Past the required blocks, the interval it must clear is a budget's last look (4% two-sided), with
    80% power if the truth is where the last run put it."""
    sd, distance = 0.0085, 0.0045
    n = blocks_to_clear(distance, sd, first=3)
    assert n is not None and n > 3
    assert power_to_clear(distance, sd, n, _end(n, 3)) >= 0.8 > power_to_clear(distance, sd, n - 1, _end(n - 1, 3))
    # the old rule (the expected interval just clears the edge) planned fewer blocks, deciding about half the time
    old = next(k for k in range(4, 100) if t_quantile(0.98, k - 1) * sd / math.sqrt(k) < distance)
    assert old < n and 0.4 < power_to_clear(distance, sd, old, _end(old, 3)) < 0.65
    fixed = blocks_to_clear(distance, sd, first=100)  # read as a fixed design's 95%: fewer blocks
    assert fixed is not None and fixed < n and power_to_clear(distance, sd, fixed, fixed_critical(fixed - 1)) >= 0.8
    n95 = blocks_to_clear(distance, sd, power=0.95, first=3)
    assert n95 is not None and n95 > n
    reached = power_to_clear(distance, sd, n, _end(n, 3))
    assert blocks_to_clear(distance, sd, power=reached, first=3) == n
    assert blocks_to_clear(distance, sd, power=reached + 1e-9, first=3) == n + 1
    few = blocks_to_clear(distance, sd, df=3, first=3)
    assert few is not None and few > n
    assert blocks_to_clear(0.0, 0.01) is None  # a mean on the edge is never decided
    assert blocks_to_clear(1.0, 0.01) == 2


def test_an_unpaired_ratios_block_spread_adds_both_sides(tmp_path: Path, study: Path) -> None:
    plan = compile_study(load_study(study))
    same = {r.hypothesis: r for r in power_plan(plan, _db(tmp_path, study, apart=True))[0]}["same"]
    (tmp_path / "b").mkdir()
    mixed = {r.hypothesis: r for r in power_plan(plan, _db(tmp_path / "b", study, b_launch=NOISY_B, apart=True))[0]}
    mixed = mixed["same"]
    assert same.block_sd is not None and mixed.block_sd is not None
    # b's own spread counts, not a's doubled: sqrt(1 + 4) / sqrt(2) = 1.58 times a's-only figure
    assert mixed.block_sd == pytest.approx(same.block_sd * math.sqrt(5 / 2), rel=0.05)
    assert mixed.blocks is not None and same.blocks is not None and mixed.blocks > same.blocks
    # its df: Welch-Satterthwaite over both sides' launch and repeat parts (3 launches x 2 repeats a side)
    assert mixed.block_df is not None and 2 < mixed.block_df < 2 * 2 + 2 * 3
    assert mixed.blocks_95 is not None and mixed.blocks_95 > mixed.blocks
    assert mixed.gpu_95_s is not None and mixed.gpu_s is not None and mixed.gpu_95_s > mixed.gpu_s


def test_plan_says_what_deciding_from_the_last_run_would_take(tmp_path: Path, study: Path) -> None:
    db = _db(tmp_path, study)
    out = CliRunner().invoke(main, ["plan", str(study), "--db", str(db)])
    assert out.exit_code == 0, out.output
    # b / a is about 1 in the toy data: some 2% from either edge of "1x +- 2%", so a few blocks decide it
    line = next(x for x in out.output.splitlines() if "from the last run's" in x).strip()
    assert re.fullmatch(r"from the last run's 1\.00\d \(1\.\d% from the edge (0\.98|1\.02)\), to decide it: "
                        r"blocks for 80% / 95% power: \d+ / \d+ \(~\d+ / ~\d+ GPU min, from stored runs\)", line), line
    row = next(x for x in out.output.splitlines() if x.startswith("  same: output_throughput band"))
    assert re.search(r"block SD [\d.e-]+% \(df \d+\), launch-to-launch [^:]+: blocks for 80% / 95% power: \d+ / \d+ ", row), row


def test_a_cliff_in_the_last_run_is_warned_not_costed(tmp_path: Path, study: Path) -> None:
    """A last run whose percentile sat on a cliff (report.scoring.score_model, Why.ON_A_CLIFF): no blocks to clear an
    edge from it, and a warning instead; the same score without the cliff is costed."""
    db = _db(tmp_path, study)
    loaded = load_study(study)
    plan = compile_study(loaded)
    last = {s.hypothesis: s for s in audit_studies([loaded], [db]).scores if s.run_id is not None}
    rows = {r.hypothesis: r for r in power_plan(plan, db, last)[0]}
    assert rows["same"].last is not None and CLIFF_WARNING not in rows["same"].warnings
    cliff = {h: dataclasses.replace(s, reasons=(*s.reasons, Reason(Why.ON_A_CLIFF, count=1))) for h, s in last.items()}
    rows = {r.hypothesis: r for r in power_plan(plan, db, cliff)[0]}
    assert rows["same"].last is None and CLIFF_WARNING in rows["same"].warnings


def test_budget_blocks_cost_only_the_points_their_hypothesis_rests_on(tmp_path: Path, study: Path) -> None:
    """The three required blocks are costed whole; each block past them, as the runner trims a budget
    block: arm a's launch with only the c1 points `same` rests on (its start included), arm b's up to
    its last c1 point (it keeps its prefix cache between points: the points before a point are part of it)."""
    plan = compile_study(load_study(study))
    row = {r.hypothesis: r for r in power_plan(plan, _db(tmp_path, study, b_launch=NOISY_B))[0]}["same"]
    assert row.blocks is not None and row.blocks > 3 and row.gpu_s is not None
    first = [launch for launch in plan.launches if launch.block == 1]
    whole = sum(launch.estimated_start_s + sum(p.estimated_s for p in launch.points) for launch in first)

    def kept(launch: Launch) -> list[PointStep]:  # b keeps its cache: every point up to its last c1 one
        if launch.arm == "a":
            return [p for p in launch.points if p.concurrency == 1]
        last = max(i for i, p in enumerate(launch.points) if p.concurrency == 1)
        return list(launch.points[:last + 1])

    trimmed = sum(launch.estimated_start_s + sum(p.estimated_s for p in kept(launch)) for launch in first)
    caches = {launch.arm: {p.cache for p in launch.points} for launch in first}
    assert caches == {"a": {"reset"}, "b": {"keep"}}
    assert all(len(kept(launch)) < len(launch.points) for launch in first)
    assert trimmed < whole
    assert row.gpu_s == pytest.approx(3 * whole + (row.blocks - 3) * trimmed)


def test_a_launchs_capacity_searches_are_costed_in_every_block(tmp_path: Path, study: Path) -> None:
    """A capacity search runs after its launch's points, in a required block and in a budget block alike
    (a budget block trims points, never searches; a launch with only a search still starts)."""
    plan = compile_study(load_study(study))
    db = _db(tmp_path, study, b_launch=NOISY_B)
    before = {r.hypothesis: r for r in power_plan(plan, db)[0]}["same"]
    with_search, only_search = with_searches(plan)
    after = {r.hypothesis: r for r in power_plan(with_search, db)[0]}["same"]
    assert before.blocks == after.blocks and before.blocks is not None and before.blocks > 3
    # every block: arm a's search, and the launch that runs only a search (its start and its search)
    per_block = 100.0 + (only_search.estimated_start_s + 100.0)
    assert after.gpu_s == pytest.approx(before.gpu_s + per_block * after.blocks)


def test_stored_block_costs_replace_the_estimates_where_a_hypothesis_has_them(tmp_path: Path, study: Path) -> None:
    """With the stored runs' block costs (report.planning.design_costs.block_costs), a required block costs their
    `required_s` and a budget block the hypothesis' own; a hypothesis with none keeps the plan's estimates,
    and each row says which."""
    from report.planning.block_planner import BlockCosts

    plan = compile_study(load_study(study))
    noisy = _db(tmp_path, study, b_launch=NOISY_B)
    estimated = {r.hypothesis: r for r in power_plan(plan, noisy)[0]}
    rows = {r.hypothesis: r for r in power_plan(plan, noisy, None, BlockCosts(100.0, {"same": 10.0}))[0]}
    same = rows["same"]
    assert same.stored_costs and same.blocks == estimated["same"].blocks and same.blocks is not None
    assert same.blocks > 3 and same.gpu_s == pytest.approx(3 * 100.0 + (same.blocks - 3) * 10.0)
    assert same.blocks_95 is not None and same.gpu_95_s == pytest.approx(300.0 + (same.blocks_95 - 3) * 10.0)
    others = [h for h in rows if h != "same"]
    assert others and all(not rows[h].stored_costs and rows[h].gpu_s == estimated[h].gpu_s for h in others)
    assert not any(r.stored_costs for r in estimated.values())
    (tmp_path / "paired").mkdir()
    paired = _db(tmp_path / "paired", study)  # both arms moved together: two blocks, inside the required three
    two = {r.hypothesis: r for r in power_plan(plan, paired, None, BlockCosts(100.0, {"same": 10.0}))[0]}["same"]
    assert two.blocks == 2 and two.gpu_s == pytest.approx(200.0)


def test_blocks_within_a_budget_are_read_at_its_looks() -> None:
    """Under a study's budget of K blocks, a look before the last gets an early look's share of alpha:
    the same distance takes more blocks than a budget of exactly that many, and one the last look
    cannot clear is not decided within the budget."""
    from report.planning.block_planner import blocks_within
    from report.stats.sequential import look_critical

    sd, distance = 0.0058, 0.0076
    alone = blocks_to_clear(distance, sd, first=3)
    within = blocks_within(distance, sd, first=3, budget=12)
    assert alone is not None and within is not None and alone < within <= 12

    def at(n: int) -> float:
        return power_to_clear(distance, sd, n, look_critical(n, 12, 3)(n - 1))

    assert at(within) >= 0.8 > at(within - 1)  # the fewest
    assert blocks_within(distance, sd, first=3, budget=12, power=at(within)) == within
    assert blocks_within(distance, sd, first=3, budget=12, power=0.95) in (None, *range(within, 13))
    assert blocks_within(0.001, sd, first=3, budget=12) is None
    assert blocks_within(1.0, sd, first=3, budget=12) == 3  # the first look, after the required blocks
    assert blocks_within(100.0, sd, first=1, budget=12) == 2  # never a look on one block


def test_arms_that_differ_only_in_their_environment_are_two_configurations() -> None:
    """engine-fork's arms have the same argv and differ in VLLM_WORKER_MULTIPROC_METHOD: two servers (they start
    and serve differently), so the planner must not pool them into one configuration (it read their paired
    spread as 0% when it did); launches of one arm share theirs, and the env is in it in name order."""
    from report.planning.block_planner import config_key, launch_configuration
    from report.planning.design_costs import server_key

    root = Path(__file__).resolve().parents[2]
    plan = compile_study(load_study(root / "studies/engine_fork.toml"))
    by_arm: dict[str, list[Launch]] = {}
    for launch in plan.launches:
        by_arm.setdefault(launch.arm, []).append(launch)
    spawn, fork = by_arm["spawn"][0], by_arm["fork"][0]
    assert spawn.engine.configuration == fork.engine.configuration
    assert launch_configuration(spawn) == (*spawn.engine.configuration, "env VLLM_WORKER_MULTIPROC_METHOD=spawn")
    assert launch_configuration(fork) == (*fork.engine.configuration, "env VLLM_WORKER_MULTIPROC_METHOD=fork")
    assert config_key(spawn, spawn.points[0]) != config_key(fork, fork.points[0])
    assert server_key(spawn) != server_key(fork)
    assert {launch_configuration(x) for x in by_arm["fork"]} == {launch_configuration(fork)}
    two = spawn.model_copy(update={"env": {"B": "2", "A": "1"}})
    assert launch_configuration(two)[-2:] == ("env A=1", "env B=2")


def test_a_server_metric_is_sent_to_the_plan_that_reads_it() -> None:
    """The power plan reads points; a server metric (startup_s, one value a start) is read by the GPU-time
    plan below it, so the power plan says so rather than "no earlier run" beside a plan that found runs."""
    from report.planning.block_planner import _side_spread

    assert _side_spread("startup_s", None, {}, {}, {}) == (
        None, "a server metric (one value a start): see 'GPU time to a decision' below")
    assert _side_spread("output_throughput", None, {}, {}, {}) == (
        None, "no earlier run of this metric on this GPU, model and vLLM version")
