"""The GPU-time planner's inputs read from a real DuckDB file (report.planning.design_costs): the spread between launches
and repeats, paired blocks, what a start and a point cost; its proposal and `studyc plan --db`'s text."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from compiler.load import load_study
from compiler.plan import Plan
from compiler.plan_compile import compile_study
from report.planning.block_planner import SEARCH_SPREAD, power_plan
from report.planning.cheapest_design import Components, Costs, Goal, Proposal, cheapest
from report.planning.design_costs import NEEDS, SEARCH_NOT_PLANNED, format_gpu_plan, gpu_plan, read_stored
from runner.store.records import (
    PhaseRecord,
    PointRecord,
    PointSummary,
    RunRecord,
    SegmentRecord,
    ServerRecord,
)
from runner.store.store import Store
from studyc.cli import main
from tests.conftest import REPO, committed_copy
from tests.report.helpers import with_searches, write_study

HYP = '''
[[hypothesis]]
id = "same"
claim = "a and b give the same c1 throughput"
metric = "output_throughput"
where = { concurrency = 1 }
predict = { ratio = ["b", "a"], value = 1.0, tolerance = 0.02 }

[[hypothesis]]
id = "a-c4"
claim = "arm a reaches 400 tok/s at c4"
metric = "output_throughput"
where = { arm = "a", concurrency = 4 }
predict = { value = 400, tolerance = 0.05 }

[[hypothesis]]
id = "capacity"
claim = "b holds as many KV tokens as a"
metric = "kv_capacity_tokens"
predict = { ratio = ["b", "a"], value = 1.0, tolerance = 0.05 }
'''
KV = {("a", 1): 1000, ("a", 2): 1010, ("a", 3): 990, ("b", 1): 2000, ("b", 2): 1500, ("b", 3): 2020}
A = {1: 1.00, 2: 1.01, 3: 0.99}  # launch offsets of arm a
B = {1: 1.00, 2: 1.02, 3: 0.98}  # arm b's: its block ratios to a are 1.00, 1.0099, 0.9899
WITHIN = (0.998, 1.002)  # repeats of a launch, in turn
POINT_S = {1: {"warmup": 1.0, "measure": 4.0}, 4: {"warmup": 2.0, "measure": 8.0, "judge": 0.5}}
START_S = {"a": 50.0, "b": 70.0}


def toy_study(tmp_path: Path, hypotheses: str = HYP) -> Path:
    """The toy study on an H200, three launches per arm x 2 repeats, every repeat exchangeable, and arm b a
    configuration of its own (an engine option)."""
    text = write_study(tmp_path, hypotheses, hardware="h200").read_text()
    path = tmp_path / "toy.toml"
    path.write_text(text.replace("repeats = 3", "repeats = 2\nlaunches = 3").replace('cache = "keep"\n',
                                                                                     "max_num_seqs = 16\n"))
    return path


@pytest.fixture
def study(tmp_path: Path) -> Path:
    return toy_study(tmp_path)


def _db(tmp: Path, plan: Plan, *, phases: bool = False, gpu: str = "NVIDIA H200") -> Path:
    """One run of the toy study: each launch's servers with their start time, or (`phases`) its stored phases
    (a start of 40 s split in two, and a stop of 2 s)."""
    db = tmp / "runs.duckdb"
    with Store(db) as store:
        store.save_run(RunRecord(run_id="r1", study_id="toy", plan_json=plan.to_json(), gpu_name=gpu,
                                 vllm_version="0.26.0", started_at=datetime(2026, 1, 1), status="complete"))
        for launch in plan.launches:
            store.record_server(ServerRecord(  # b's second start compiled its graphs: left out of the capacity
                run_id="r1", server_id=launch.id, arm=launch.arm, startup_s=START_S[launch.arm] + launch.launch,
                kv_capacity_tokens=KV[(launch.arm, launch.launch)],
                compile_cache="cold" if (launch.arm, launch.launch) == ("b", 2) else "warm"))
            for p in launch.points:
                offset = (B if p.arm == "b" else A)[p.launch]
                store.commit_point(PointRecord(
                    run_id="r1", point_id=p.id, server_id=launch.id, arm=p.arm, workload=p.workload,
                    concurrency=p.concurrency, repeat=p.repeat, valid=True,
                    phases_json=json.dumps(POINT_S[p.concurrency or 0]),
                    summary=PointSummary(output_throughput=100.0 * (p.concurrency or 0) * offset * WITHIN[(p.repeat - 1) % 2])),
                    [], [], [])
        if phases:
            rows: list[SegmentRecord | PhaseRecord] = [SegmentRecord(1, datetime(2026, 1, 1), wall_s=900.0,
                                                                     ended="complete")]
            for i, launch in enumerate(plan.launches):
                rows += [PhaseRecord(1, 3 * i + 1, launch.id, "start: imports (API process)", 30.0),
                         PhaseRecord(1, 3 * i + 2, launch.id, "start (unsplit)", 10.0),
                         PhaseRecord(1, 3 * i + 3, launch.id, "stop", 2.0)]
            store.put_timing("r1", rows)
    return db


def _log_sd(values: list[float]) -> float:
    logs = [math.log(v) for v in values]
    m = sum(logs) / len(logs)
    return math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))


def test_costs_are_the_stored_medians_and_a_budget_blocks_points(tmp_path: Path, study: Path) -> None:
    plan = compile_study(load_study(study))
    got = gpu_plan(plan, _db(tmp_path, plan))
    rows = {r.hypothesis: r for r in got.rows}
    # starts: the median of each arm's three servers (51, 52, 53 and 71, 72, 73); a repeat: its points' wall
    assert rows["same"].costs == Costs(52.0 + 72.0, 5.0 + 5.0)
    assert rows["a-c4"].costs == Costs(52.0, 10.5)  # arm a's launch only, its c4 point only
    assert got.study_costs == Costs(124.0, 2 * (5.0 + 10.5))  # the whole first block
    assert got.runs == ("r1",) and got.version == "0.26.0"
    assert any("servers' stored start time" in a for a in got.assumed)


def test_a_capacity_search_is_a_blocks_cost_even_in_a_launch_with_no_point_needed(tmp_path: Path, study: Path) -> None:
    """A search runs once a launch, after its points, in every block: its estimate joins the block's
    starts, for each hypothesis (a launch that runs only a search still runs) and for the study."""
    plan = compile_study(load_study(study))
    db = _db(tmp_path, plan)
    with_search, only_search = with_searches(plan)
    got = gpu_plan(with_search, db)
    rows = {r.hypothesis: r for r in got.rows}
    c_start = 52.0  # arm a's configuration: the median of its stored starts
    assert rows["same"].costs == Costs(52.0 + 72.0 + 100.0 + c_start + 100.0, 5.0 + 5.0)
    assert rows["a-c4"].costs == Costs(52.0 + 100.0 + c_start + 100.0, 10.5)
    assert got.study_costs == Costs(124.0 + 100.0 + c_start + 100.0, 2 * (5.0 + 10.5))
    assert "a capacity search is the plan's estimate of its probes" in got.assumed
    assert "a capacity search is the plan's estimate of its probes" not in gpu_plan(plan, db).assumed


def test_starts_from_stored_phases_count_the_stop(tmp_path: Path, study: Path) -> None:
    plan = compile_study(load_study(study))
    got = gpu_plan(plan, _db(tmp_path, plan, phases=True))
    assert {r.hypothesis: r for r in got.rows}["same"].costs == Costs(2 * 42.0, 10.0)
    assert not any("servers' stored start time" in a for a in got.assumed)
    assert read_stored(tmp_path / "runs.duckdb", "toy", "h200").start_from_servers == set()
    # a newer run, servers' times only, of configurations this plan has none of: it says nothing of this plan
    other = tmp_path / "other.toml"
    other.write_text(study.read_text().replace("max_model_len = 2048", "max_model_len = 1024"))
    _other_run(tmp_path / "runs.duckdb", compile_study(load_study(other)), "o9", day=9, start_s=1.0)
    stored = read_stored(tmp_path / "runs.duckdb", "toy", "h200")
    assert len(stored.start_from_servers) == 2 and set(stored.start_run.values()) == {"r1", "o9"}
    got = gpu_plan(plan, tmp_path / "runs.duckdb")
    assert {r.hypothesis: r for r in got.rows}["same"].costs == Costs(2 * 42.0, 10.0)
    assert not any("servers' stored start time" in a or "another study's" in a for a in got.assumed)


def _other_run(db: Path, plan: Plan, run_id: str, *, day: int, start_s: float, study: str = "other",
               gpu: str = "NVIDIA H200", version: str = "0.26.0") -> None:
    """A run of `study` that started the toy plan's configurations, each server in `start_s` (no phases)."""
    with Store(db) as store:
        store.save_run(RunRecord(run_id=run_id, study_id=study, plan_json=plan.to_json(), gpu_name=gpu,
                                 vllm_version=version, started_at=datetime(2026, 1, day), status="complete"))
        for launch in plan.launches:
            store.record_server(ServerRecord(run_id=run_id, server_id=launch.id, arm=launch.arm, startup_s=start_s))


def test_a_start_is_the_newest_runs_of_its_configuration_whatever_its_study(tmp_path: Path, study: Path) -> None:
    """A start belongs to the configuration: the newest run on the same GPU and vLLM version that started it
    gives it, another study's too; an older run, another GPU's and another version's do not."""
    plan = compile_study(load_study(study))
    db = _db(tmp_path, plan)  # r1, 2026-01-01: starts 51-53 (a) and 71-73 (b)
    _other_run(db, plan, "old", day=1, start_s=5.0)  # no newer: started_at ties go to the run id, "old" < "r1"
    _other_run(db, plan, "a100", day=5, start_s=1.0, gpu="NVIDIA A100-SXM4-80GB")
    _other_run(db, plan, "v27", day=5, start_s=2.0, version="0.27.0")
    got = gpu_plan(plan, db)
    assert {r.hypothesis: r for r in got.rows}["same"].costs == Costs(52.0 + 72.0, 10.0)
    assert not any("another study's run" in a for a in got.assumed)
    _other_run(db, plan, "o2", day=2, start_s=20.0)
    stored = read_stored(db, "toy", "h200")
    assert set(stored.start_run.values()) == {"o2"} and stored.runs == ["r1"]
    got = gpu_plan(plan, db)
    assert {r.hypothesis: r for r in got.rows}["same"].costs == Costs(40.0, 10.0)
    assert got.study_costs == Costs(40.0, 2 * (5.0 + 10.5))  # the points' walls stay the study's own
    assert any("another study's run where that one is newer" in a for a in got.assumed)
    assert any("servers' stored start time" in a for a in got.assumed)  # o2 stored no phases
    _other_run(db, plan, "r2", day=3, start_s=30.0, study="toy")  # the study's own newer run wins again
    got = gpu_plan(plan, db)
    assert {r.hypothesis: r for r in got.rows}["same"].costs == Costs(60.0, 10.0)
    assert not any("another study's run" in a for a in got.assumed)


def test_components_of_a_paired_ratio_and_of_one_side(tmp_path: Path, study: Path) -> None:
    """The ratio's launch part is its block ratios' variance less the repeats' share (2 repeats a launch); one
    side's is its launches' variance less theirs (method of moments)."""
    plan = compile_study(load_study(study))
    rows = {r.hypothesis: r for r in gpu_plan(plan, _db(tmp_path, plan)).rows}
    within = math.log(WITHIN[1] / WITHIN[0]) ** 2 / 2  # the variance of two repeats' logs
    ratio = rows["same"].components
    assert ratio is not None and rows["same"].source == "paired blocks (3, df 2) beyond their repeats"
    assert ratio.repeat_var == pytest.approx(2 * within) and ratio.repeat_df == pytest.approx(6)
    pair = _log_sd([B[k] / A[k] for k in (1, 2, 3)]) ** 2
    assert ratio.launch_var == pytest.approx(pair - 2 * within / 2) and ratio.launch_df == 2
    one = rows["a-c4"].components
    assert one is not None and rows["a-c4"].source == "each side's launches and repeats, added"
    assert one.launch_var == pytest.approx(_log_sd(list(A.values())) ** 2 - within / 2)
    assert (one.launch_df, one.repeat_df) == (2, 3) and one.repeat_var == pytest.approx(within)
    # the proposal is the optimiser's on these, the truth at the prediction (both edges of the band)
    assert rows["a-c4"].goal == "the truth at the prediction, band ±0.05"
    assert rows["a-c4"].proposal == cheapest([(one, Goal(math.log1p(0.05), inside=True))], rows["a-c4"].costs
                                             or Costs(0, 0))


def test_the_last_runs_distance_is_the_goal_where_given(tmp_path: Path, study: Path) -> None:
    plan = compile_study(load_study(study))
    db = _db(tmp_path, plan)
    got = {r.hypothesis: r for r in gpu_plan(plan, db, {"same": 0.011}).rows}["same"]
    assert got.goal == "the truth where the last run measured it, 1.1% from its edge"
    assert got.components is not None and got.costs is not None
    assert got.proposal == cheapest([(got.components, Goal(0.011))], got.costs)
    assert gpu_plan(plan, db, {"same": 0.0}).rows[0].goal.startswith("the truth at the prediction")


def test_without_stored_runs_it_says_what_it_needs(tmp_path: Path, study: Path) -> None:
    plan = compile_study(load_study(study))
    db = _db(tmp_path, plan, gpu="NVIDIA A100-SXM4-80GB")  # another GPU's run: not this study's evidence
    got = gpu_plan(plan, db)
    assert got.runs == () and got.study_costs is None and got.study.design is None
    assert all(r.proposal.why_not == "no earlier run of this study on this GPU" for r in got.rows)
    assert format_gpu_plan(got, "toy", db) == (
        f"GPU time to a decision: no earlier run of toy on this GPU in {db}: {NEEDS}\n"
        "  runs on a GPU other than the study's h200, left out (their spreads and start costs are that GPU's): "
        "NVIDIA A100-SXM4-80GB: r1\n")


def test_runs_elsewhere_are_named_per_gpu_oldest_first(tmp_path: Path, study: Path) -> None:
    plan = compile_study(load_study(study))
    db = _db(tmp_path, plan)  # r1 on the study's H200: not elsewhere
    with Store(db) as store:
        for run_id, gpu, day in (("r3", "NVIDIA A100-SXM4-80GB", 3), ("r2", "NVIDIA A100-SXM4-80GB", 2),
                                 ("r4", None, 4), ("r5", "NVIDIA H100 80GB HBM3", 5)):
            store.save_run(RunRecord(run_id=run_id, study_id="toy", plan_json=plan.to_json(), gpu_name=gpu,
                                     vllm_version="0.26.0", started_at=datetime(2026, 1, day), status="complete"))
        store.save_run(RunRecord(run_id="o1", study_id="other", plan_json=plan.to_json(), gpu_name="NVIDIA A10",
                                 vllm_version="0.26.0", started_at=datetime(2026, 1, 1), status="complete"))
    assert read_stored(db, "toy", "h200").elsewhere == ("NVIDIA A100-SXM4-80GB: r2, r3", "an unrecorded GPU: r4",
                                                 "NVIDIA H100 80GB HBM3: r5")
    assert read_stored(db, "toy", "a100").elsewhere == ("NVIDIA H200: r1", "an unrecorded GPU: r4",
                                                 "NVIDIA H100 80GB HBM3: r5")
    got = gpu_plan(plan, db)  # the H200 run is planned from; the others stay out of the text
    assert got.runs == ("r1",) and got.elsewhere == () and got.hardware == "h200"
    assert "other than the study's" not in format_gpu_plan(got, "toy", db)


def test_with_no_run_anywhere_it_names_none(tmp_path: Path, study: Path) -> None:
    plan = compile_study(load_study(study))
    db = tmp_path / "empty.duckdb"
    Store(db).close()
    got = gpu_plan(plan, db)
    assert got.runs == () and got.elsewhere == ()
    assert format_gpu_plan(got, "toy", db) == f"GPU time to a decision: no earlier run of toy on this GPU in {db}: {NEEDS}\n"


def test_one_launch_per_arm_is_not_planned_from_its_repeats(tmp_path: Path) -> None:
    study = tmp_path / "one.toml"  # 3 repeats on one launch per arm
    study.write_text(write_study(tmp_path, HYP, hardware="h200").read_text().replace("repeats = 3",
                                                                                     "repeats = 3\nlaunches = 1"))
    plan = compile_study(load_study(study))
    got = {r.hypothesis: r for r in gpu_plan(plan, _db(tmp_path, plan)).rows}["a-c4"]
    assert got.components == Components(0.0, 0, got.components.repeat_var if got.components else 0.0, 2)
    assert got.proposal.design is None and "2 launches per arm" in got.proposal.why_not


def test_plan_command_prints_the_gpu_time_proposal(tmp_path: Path, study: Path) -> None:
    plan = compile_study(load_study(study))
    out = CliRunner().invoke(main, ["plan", str(study), "--db", str(_db(tmp_path, plan))])
    assert out.exit_code == 0, out.output
    text = out.output[out.output.index("GPU time to a decision"):]
    assert "from 1 earlier run(s) of toy" in text and "  whole study: " in text
    line = next(x for x in text.splitlines() if x.startswith("  same: "))
    assert " launches per arm x " in line and "1 block per launch" in line and "a block: 124 s of starts" in line
    assert "  assumed: one block per launch" in text and "at most 30 launches per arm and 10 repeats" in text


def test_the_committed_h200_runs_plan_cuda_graphs(tmp_path: Path) -> None:
    """cuda-graphs' three H200 runs: spreads from paired blocks; the eager arm's starts from its own newest
    run's servers (no phases stored), the graphs arm's from a newer run of another study that started the
    same 8B configuration (with phases); every hypothesis is far from its edge, so three or four launches per
    arm do."""
    db = tmp_path / "h200.duckdb"
    committed_copy("h200", db)
    plan = compile_study(load_study(REPO / "studies" / "cuda_graphs.toml"))
    got = gpu_plan(plan, db, {"eager-halves-c1": 0.96})
    assert len(got.runs) == 3 and got.version == "0.26.0"
    first = got.rows[0]
    assert first.hypothesis == "eager-halves-c1" and first.proposal.design is not None
    assert 2 <= first.proposal.design.launches <= 4 and first.source.startswith("paired blocks")
    assert got.study_costs is not None and 60 < got.study_costs.start_s < 300
    assert any("another study's run" in a for a in got.assumed)
    assert any("servers' stored start time" in a for a in got.assumed)


def test_a_capacity_hypothesis_is_planned_from_the_stored_searches(tmp_path: Path) -> None:
    """kv-capacity-slo rests on capacity searches (no plan point; a `studyc plan --db` of it once broke on a
    KeyError on the search's id): its stored run's three searches per arm plan it, the power plan points to
    that plan, and a block costs its starts and searches, no repeat."""
    db = tmp_path / "h200.duckdb"
    committed_copy("h200", db)
    plan = compile_study(load_study(REPO / "studies" / "kv_capacity_slo.toml"))
    assert {h.level for h in plan.hypotheses} == {"search"}
    got = gpu_plan(plan, db, {"fp8-holds-more": math.log(1.818 / 1.3)})
    (row,) = got.rows
    assert row.proposal.design is not None and row.proposal.design.repeats == 1, row.proposal
    assert row.source.startswith("paired blocks (3, df 2)") and "the searches' resolution" in row.source
    assert row.costs is not None and row.costs.point_s == 0.0 and got.study_costs is not None
    assert got.study_costs.start_s > sum(q.estimated_s for launch in plan.launches if launch.block == 1
                                         for q in launch.searches)
    (power,) = power_plan(plan, db)[0]
    assert power.hypothesis == "fp8-holds-more" and power.blocks is None and power.source == SEARCH_SPREAD


CAPACITY = {("bf16", 1): 30, ("bf16", 2): 30, ("bf16", 3): 24, ("fp8", 1): 50, ("fp8", 2): 55, ("fp8", 3): 55}


def _capacity_db(tmp: Path, plan: Plan, searched: tuple[str, ...] = ("bf16", "fp8")) -> Path:
    """One run of kv-capacity-slo whose searches probed as if each launch held up to CAPACITY conversations
    (levels 64, 16, 40, then 28 or 52, then 6 either side): bf16 finds 28, 28, 22 (failing at 34, 34, 28),
    fp8 46, 52, 52 (failing at 52, 58, 58). An arm not `searched` stored only its first probe."""
    levels = {30: (64, 16, 40, 28, 34), 24: (64, 16, 40, 28, 22), 50: (64, 16, 40, 52, 46), 55: (64, 16, 40, 52, 58)}
    db = tmp / "kv.duckdb"
    with Store(db) as store:
        store.save_run(RunRecord(run_id="r1", study_id=plan.study_id, plan_json=plan.to_json(), gpu_name="NVIDIA H200",
                                 vllm_version="0.26.0", started_at=datetime(2026, 1, 1), status="complete"))
        for launch in plan.launches:
            cap = CAPACITY[(launch.arm, launch.launch)]
            for search in launch.searches:
                for level in levels[cap][:None if launch.arm in searched else 1]:
                    store.commit_point(PointRecord(
                        run_id="r1", point_id=f"{search.id}/c{level}/r1", server_id=launch.id, arm=launch.arm,
                        workload=search.workload, concurrency=level, repeat=1, valid=True,
                        summary=PointSummary(slo_attainment=1.0 if level <= cap else 0.5)), [], [], [])
    return db


def test_a_capacitys_spread_is_its_block_ratios_and_its_goal_is_less_the_searches_resolution(tmp_path: Path) -> None:
    plan = compile_study(load_study(REPO / "studies" / "kv_capacity_slo.toml"))
    db = _capacity_db(tmp_path, plan)
    ratios = [46 / 28, 52 / 28, 52 / 22]  # fp8 over bf16, block by block
    resolution = max(math.log(34 / 28), math.log(58 / 52))  # each arm's median log(failed / capacity), the wider
    (row,) = gpu_plan(plan, db, {"fp8-holds-more": 0.5}).rows
    assert row.components is not None and row.components.launch_var == pytest.approx(_log_sd(ratios) ** 2)
    assert row.components.launch_df == 2 and (row.components.repeat_var, row.components.repeat_df) == (0.0, 0)
    assert row.source.startswith("paired blocks (3, df 2)") and row.source.endswith(f"{100 * math.expm1(resolution):.3g}%")
    assert row.costs is not None and row.proposal == cheapest([(row.components, Goal(0.5 - resolution))], row.costs)
    assert row.proposal.design is not None and row.goal.endswith("less the searches' resolution")
    (close,) = gpu_plan(plan, db, {"fp8-holds-more": resolution}).rows  # at the resolution: no launches decide it
    assert close.proposal.design is None and close.proposal.why_not.endswith(
        f"within the searches' resolution ({100 * math.expm1(resolution):.3g}%): more probes, not more launches")
    (unknown,) = gpu_plan(plan, db).rows  # no earlier estimate, and a relation has no band
    assert unknown.proposal.design is None and unknown.goal == "no earlier estimate and no band around the prediction"
    assert unknown.source.endswith(f"{100 * math.expm1(resolution):.3g}%")


def test_a_capacity_with_a_side_never_resolved_is_not_planned(tmp_path: Path) -> None:
    plan = compile_study(load_study(REPO / "studies" / "kv_capacity_slo.toml"))
    (row,) = gpu_plan(plan, _capacity_db(tmp_path, plan, searched=("bf16",)), {"fp8-holds-more": 0.5}).rows
    assert row.proposal.design is None and row.proposal.why_not == SEARCH_NOT_PLANNED


def test_a_server_metric_is_planned_from_its_warm_starts(tmp_path: Path, study: Path) -> None:
    """One value per start, so no repeats; b's start that compiled its graphs (1,500 tokens) is left out,
    as the scoring leaves it out: its blocks 1 and 3 pair with a's."""
    plan = compile_study(load_study(study))
    got = gpu_plan(plan, _db(tmp_path, plan))
    row = {r.hypothesis: r for r in got.rows}["capacity"]
    assert row.components is not None and row.source == "paired blocks (2, df 1) beyond their repeats"
    ratios = [KV[("b", k)] / KV[("a", k)] for k in (1, 3)]
    assert row.components.launch_var == pytest.approx(_log_sd(ratios) ** 2)
    assert (row.components.repeat_var, row.components.repeat_df) == (0.0, 0)
    assert row.proposal.design is not None and row.proposal.design.repeats == 1
    assert any("every start loads its compiled graphs" in a for a in got.assumed)


def test_the_power_plan_costs_its_blocks_from_the_stored_runs(tmp_path: Path, study: Path) -> None:
    """`studyc plan --db` gives the power plan the GPU-time plan's stored block costs: a required block whole,
    a budget block with the hypothesis' own points, each repeat counted; a hypothesis with none stored keeps
    the plan's estimates, and says which."""
    from report.planning.block_planner import BlockCosts, power_plan
    from report.planning.design_costs import block_costs

    plan = compile_study(load_study(study))
    db = _db(tmp_path, plan)
    gpu = gpu_plan(plan, db)
    costs = block_costs(gpu, 2)
    assert costs is not None and gpu.study_costs is not None
    assert costs.required_s == pytest.approx(gpu.study_costs.start_s + 2 * gpu.study_costs.point_s)
    by_id = {r.hypothesis: r.costs for r in gpu.rows if r.costs is not None}
    assert costs.budget_s == {h: pytest.approx(c.start_s + 2 * c.point_s) for h, c in by_id.items()}
    assert block_costs(gpu, 3).required_s == pytest.approx(costs.required_s + gpu.study_costs.point_s)  # type: ignore[union-attr]
    stored = {r.hypothesis: r for r in power_plan(plan, db, None, costs)[0]}
    same = stored["same"]
    assert same.stored_costs and same.blocks is not None and same.blocks > 3
    assert same.gpu_s == pytest.approx(3 * costs.required_s + (same.blocks - 3) * costs.budget_s["same"])
    estimated = {r.hypothesis: r for r in power_plan(plan, db)[0]}["same"]
    assert not estimated.stored_costs and estimated.blocks == same.blocks and estimated.gpu_s != same.gpu_s
    partial = {r.hypothesis: r for r in power_plan(plan, db, None, BlockCosts(1.0, {"a-c4": 1.0}))[0]}
    assert not partial["same"].stored_costs and partial["same"].gpu_s == estimated.gpu_s  # none stored: the estimate
    assert partial["a-c4"].stored_costs


def test_no_stored_run_no_block_costs(tmp_path: Path, study: Path) -> None:
    from report.planning.design_costs import GpuPlan, HypothesisDesign, block_costs

    plan = compile_study(load_study(study))
    with Store(tmp_path / "empty.duckdb"):
        pass
    assert block_costs(gpu_plan(plan, tmp_path / "empty.duckdb"), 2) is None
    one = GpuPlan((HypothesisDesign("x", Proposal(None, "-"), None, Costs(10.0, 1.0)),
                   HypothesisDesign("y", Proposal(None, "-"))), Proposal(None, "-"), Costs(100.0, 5.0), ("r",), None, ())
    got = block_costs(one, 3)
    assert got is not None and got.required_s == 115.0 and got.budget_s == {"x": 13.0}
