"""Edges of the GPU-time planner's reading (report.planning.design_costs), from its mutation survivors: which stored
starts count, the rows of a plan with no run, a hypothesis with no goal, the limits passed through, and the
caveats word for word."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from compiler.load import load_study
from compiler.plan import Plan
from compiler.plan_compile import compile_study
from report.planning.cheapest_design import Costs, Design, Limits, Proposal
from report.planning.design_costs import (
    GpuPlan,
    HypothesisDesign,
    format_gpu_plan,
    gpu_plan,
    read_stored,
)
from runner.store.records import PhaseRecord, RunRecord, SegmentRecord, ServerRecord
from runner.store.store import Store
from tests.report.test_design_costs import HYP, _db, toy_study

RELATION = '''
[[hypothesis]]
id = "b-faster"
claim = "b is faster than a at c1"
metric = "output_throughput"
where = { concurrency = 1 }
predict = { ratio = ["b", "a"], relation = ">", value = 1.0 }
'''
NO_DESIGN = "no hypothesis has a design"
ANOTHER = "a start from another study's run where that one is newer and started the same configuration"
SERVERS = "some starts from the servers' stored start time (no phases stored): their stop is left out"
SERVER_METRIC = ("a server metric's every start loads its compiled graphs (one that compiles them is left out of it, "
                 "so count the first start on a cold cache as extra)")


def _study(tmp_path: Path, hypotheses: str) -> Plan:
    return compile_study(load_study(toy_study(tmp_path, hypotheses)))


def _run(db: Path, plan: Plan, run_id: str, day: int, *, study: str = "other", plan_json: str | None = None,
         gpu: str | None = "NVIDIA H200", started: bool = True) -> None:
    with Store(db) as store:
        store.save_run(RunRecord(run_id=run_id, study_id=study, plan_json=plan.to_json() if plan_json is None
                                 else plan_json, gpu_name=gpu, vllm_version="0.26.0",
                                 started_at=datetime(2026, 1, day) if started else None, status="complete"))


def test_a_plan_with_no_run_has_a_row_per_hypothesis_and_the_limits_it_was_given(tmp_path: Path) -> None:
    plan = _study(tmp_path, HYP)
    db = tmp_path / "empty.duckdb"
    Store(db).close()
    limits = Limits(launches=4, repeats=2)
    got = gpu_plan(plan, db, limits=limits)
    assert [r.hypothesis for r in got.rows] == ["same", "a-c4", "capacity"]
    assert got.study.design is None and got.study.why_not == NO_DESIGN
    assert got.limits is limits and got.assumed == () and got.hardware == "h200" and got.version is None


def test_a_hypothesis_with_no_goal_keeps_what_it_was_planned_from(tmp_path: Path) -> None:
    """A relation with no earlier distance: no design, but its spread and costs are still given, and a study
    of such hypotheses only has no design either."""
    plan = _study(tmp_path, RELATION)
    db = _db(tmp_path, plan)
    got = gpu_plan(plan, db)
    (row,) = got.rows
    meaning = "no earlier estimate and no band around the prediction"
    assert row.hypothesis == "b-faster" and row.proposal.design is None and row.proposal.why_not == meaning
    assert row.goal == meaning and row.components is not None and row.costs == Costs(52.0 + 72.0, 10.0)
    assert row.source.startswith("paired blocks")
    assert got.study.design is None and got.study.why_not == NO_DESIGN
    assert got.study_costs == Costs(124.0, 2 * (5.0 + 10.5))
    # given the last run's distance, it has a design, within the limits passed
    tight = gpu_plan(plan, db, {"b-faster": 0.05}, limits=Limits(launches=2, repeats=1))
    assert tight.limits == Limits(launches=2, repeats=1)
    free = gpu_plan(plan, db, {"b-faster": 0.05})
    one, whole = free.rows[0].proposal.design, free.study.design
    assert one is not None and whole is not None and (whole.launches, whole.repeats) == (one.launches, one.repeats)
    assert one.launches > 2 and tight.rows[0].proposal.design is None and tight.study.design is None
    assert "up to 2 launches per arm and 1 repeats" in tight.rows[0].proposal.why_not


def test_the_caveats_word_for_word(tmp_path: Path) -> None:
    plan = _study(tmp_path, HYP)
    db = _db(tmp_path, plan)
    assert SERVERS in gpu_plan(plan, db).assumed and SERVER_METRIC in gpu_plan(plan, db).assumed
    _run(db, plan, "o2", 2)
    with Store(db) as store:
        for launch in plan.launches:
            store.record_server(ServerRecord(run_id="o2", server_id=launch.id, arm=launch.arm, startup_s=9.0))
    assert ANOTHER in gpu_plan(plan, db).assumed


def test_which_stored_starts_count(tmp_path: Path) -> None:
    """A newer run whose plan cannot be read is passed over, not the end of the search; only start and stop
    phases of the plan's own launches count; a server the plan does not place, or with no start time, does
    not."""
    plan = _study(tmp_path, HYP)
    db = _db(tmp_path, plan)  # r1, day 1: a 51-53 s, b 71-73 s (servers)
    _run(db, plan, "o2", 2)
    with Store(db) as store:
        rows: list[SegmentRecord | PhaseRecord] = [SegmentRecord(1, datetime(2026, 1, 2), wall_s=900.0,
                                                                 ended="complete")]
        for i, launch in enumerate(plan.launches):
            rows += [PhaseRecord(1, 4 * i + 1, launch.id, "start: model load", 20.0),
                     PhaseRecord(1, 4 * i + 2, launch.id, "stop", 1.0),
                     PhaseRecord(1, 4 * i + 3, launch.id, "window", 500.0)]
        rows += [PhaseRecord(1, 999, "", "prime (unmeasured start)", 300.0),
                 PhaseRecord(1, 1000, "elsewhere/L1", "start: model load", 700.0)]
        store.put_timing("o2", rows)
    _run(db, plan, "broken", 3, plan_json="{}")  # newest, unreadable
    got = gpu_plan(plan, db)
    assert {r.hypothesis: r for r in got.rows}["same"].costs == Costs(2 * 21.0, 10.0)
    assert SERVERS not in got.assumed
    # servers' start times: only the placed ones with a time
    _run(db, plan, "o4", 4)
    with Store(db) as store:
        for launch in plan.launches:
            store.record_server(ServerRecord(run_id="o4", server_id=launch.id, arm=launch.arm,
                                             startup_s=10.0 if launch.arm == "a" else None))
        store.record_server(ServerRecord(run_id="o4", server_id="toy/zz/L9", arm="zz", startup_s=1.0))
    stored = read_stored(db, "toy", "h200")
    assert sorted(stored.start_run.values()) == ["o2", "o4"]  # a from o4 (10 s each); b had no time in o4: o2's
    got = gpu_plan(plan, db)
    assert {r.hypothesis: r for r in got.rows}["same"].costs == Costs(10.0 + 21.0, 10.0)
    assert SERVERS in got.assumed and ANOTHER in got.assumed


def test_runs_elsewhere_with_an_unknown_gpu_and_no_start_time(tmp_path: Path) -> None:
    plan = _study(tmp_path, HYP)
    db = tmp_path / "runs.duckdb"
    _run(db, plan, "z1", 5, study="toy", gpu="Some Accelerator 9000")  # no such hardware: not the study's GPU
    _run(db, plan, "z0", 1, study="toy", gpu="Some Accelerator 9000", started=False)  # no start time: first
    _run(db, plan, "h1", 2, study="toy")  # the study's own GPU
    assert read_stored(db, "toy", "h200").elsewhere == ("Some Accelerator 9000: z0, z1",)
    assert read_stored(db, "toy", "h200").runs == ["h1"]


@pytest.mark.parametrize("gpu", [None, ""])
def test_a_run_with_no_gpu_name_is_no_gpus(tmp_path: Path, gpu: str | None) -> None:
    plan = _study(tmp_path, HYP)
    db = tmp_path / "runs.duckdb"
    _run(db, plan, "n1", 1, study="toy", gpu=gpu)
    assert read_stored(db, "toy", "h200").runs == []
    assert read_stored(db, "toy", "h200").elsewhere == ("an unrecorded GPU: n1",)


def test_what_was_never_stored_is_the_plans_estimate(tmp_path: Path) -> None:
    """Arm b's starts and the c4 points' walls missing from the stored run: the plan's estimates stand in, each
    said once; the first repeat's points only."""
    plan = _study(tmp_path, HYP)
    db = _db(tmp_path, plan)
    with Store(db) as store:
        store.con.execute("DELETE FROM servers WHERE arm = 'b'")
        store.con.execute("UPDATE points SET phases_json = NULL WHERE concurrency = 4")
    first = {launch.arm: launch for launch in plan.launches if launch.block == 1}
    c4 = {arm: next(p.estimated_s for p in launch.points if p.concurrency == 4 and p.repeat == 1)
          for arm, launch in first.items()}
    got = gpu_plan(plan, db)
    assert {r.hypothesis: r for r in got.rows}["same"].costs == Costs(52.0 + first["b"].estimated_start_s, 10.0)
    assert got.study_costs == Costs(52.0 + first["b"].estimated_start_s, 2 * 5.0 + c4["a"] + c4["b"])
    assert c4["a"] > 0 and first["b"].estimated_start_s > 0
    assert {"a start never stored is the plan's estimate", "a point never stored is the plan's estimate"} <= set(
        got.assumed)


def test_a_design_reads_its_repeats_and_its_block(tmp_path: Path) -> None:
    rows = (HypothesisDesign("one", Proposal(Design(3, 1, 1234.4, 0.81, 0.01)), costs=Costs(100.4, 12.25)),
            HypothesisDesign("two", Proposal(Design(2, 2, 99.0, 0.9, 0.01))))
    text = format_gpu_plan(GpuPlan(rows, Proposal(None, "why"), None, ("r1",), "0.26.0", ()), "toy", tmp_path)
    lines = text.splitlines()
    assert lines[1] == "  whole study: cannot plan: why"
    assert lines[2] == ("  one: 3 launches per arm x 1 repeat, 1 block per launch: 1,234 GPU-s (a block: 100 s of starts "
                        "and stops + 12.2 s a repeat), 81% power")
    assert lines[3] == "  two: 2 launches per arm x 2 repeats, 1 block per launch: 99 GPU-s, 90% power"
