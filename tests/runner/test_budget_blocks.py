"""Budget blocks (`required = false` launches) run only while the sequential rule says a hypothesis is
undecided, decided once per block (so a block's arms run together), within the budget's minutes."""

from __future__ import annotations

from pathlib import Path

from compiler.load import load_study
from compiler.plan_compile import compile_study
from runner.execute.driver import Driver, Progress, RunOptions, RunReport, run_phases
from runner.execute.launch import LaunchSpec
from runner.execute.run import _open_run
from runner.store.store import Store
from tests.conftest import REPO, committed_copy

BUDGET = "[design]\nbudget = { blocks = 4, minutes = 30 }\n\n[load]"


def _plan(tmp_path: Path, design: str = BUDGET, launches: int = 2, extra: str = ""):
    text = (REPO / "studies/quickstart.toml").read_text()
    text = text.replace('path = "../models/tiny-qwen3"', f'path = "{REPO / "models/tiny-qwen3"}"')
    text = text.replace("launches = 3 ", f"launches = {launches} ").replace("repeats = 1 ", "repeats = 3 ")
    text = text.replace("[load]", design, 1)
    path = tmp_path / "budget.toml"
    path.write_text(text + extra)
    return compile_study(load_study(path))


def _wanted(tmp_path: Path, answers: list[bool], *, origin: float | None = None, design: str = BUDGET):
    plan = _plan(tmp_path, design)
    asked: list[str] = []

    def decide(store: Store, run_id: str) -> bool:
        asked.append(run_id)
        return answers[len(asked) - 1]

    options = RunOptions(db=tmp_path / "r.duckdb", engine_command=[], python_argv=[], runs_dir=tmp_path,
                         decide_more=decide)
    with Store(tmp_path / "r.duckdb") as store:
        driver = Driver(store, "run-1", plan, RunReport("run-1"), Progress(), {}, options, origin=origin)
        ran = [(launch.block, launch.required) for launch in plan.launches
               if driver.wanted(LaunchSpec(launch=launch, points=launch.points, run_id="run-1", placement=None,  # type: ignore[arg-type]
                                           ctx=None, engine_command=(), log_dir=tmp_path,  # type: ignore[arg-type]
                                           key_dir=tmp_path, startup_timeout_s=1.0))]
    return plan, ran, asked, driver.report


def test_budget_blocks_run_while_undecided_up_to_the_budget(tmp_path: Path) -> None:
    plan, ran, asked, report = _wanted(tmp_path, [True, True])
    assert {launch.block for launch in plan.launches} == {1, 2, 3, 4}
    assert [b for b, _ in ran] == [launch.block for launch in plan.launches]  # every block, both arms each
    assert len(asked) == 2 and report.launches_not_needed == []  # asked once per budget block, not per launch


def test_a_decided_study_runs_no_budget_block_and_is_not_asked_again(tmp_path: Path) -> None:
    plan, ran, asked, report = _wanted(tmp_path, [False, True])
    assert all(required for _, required in ran) and {b for b, _ in ran} == {1, 2}
    assert len(asked) == 1  # block 4 is not asked once block 3 was declined
    assert len(report.launches_not_needed) == len([s for s in plan.launches if not s.required])


def test_spent_minutes_stop_budget_blocks_without_asking(tmp_path: Path) -> None:
    import time

    _, ran, asked, _ = _wanted(tmp_path, [True, True], origin=time.monotonic() - 31 * 60)
    assert {b for b, _ in ran} == {1, 2} and asked == []


WARM_FIRST = """
[[hypothesis]]
id = "warm-first-token"
claim = "A kept cache's first token within 100 ms at concurrency 1"
metric = "ttft_p50_s"
where = { arm = "warm", concurrency = 1 }
predict = { relation = "<", value = 0.1 }
"""


def _kept_points(tmp_path: Path, undecided: tuple[str, ...]) -> tuple[object, dict[str, list[list[str]]]]:
    plan = _plan(tmp_path, BUDGET, extra=WARM_FIRST)
    options = RunOptions(db=tmp_path / "r.duckdb", engine_command=[], python_argv=[], runs_dir=tmp_path,
                         decide_more=lambda store, run_id: undecided)
    with Store(tmp_path / "r.duckdb") as store:
        driver = Driver(store, "run-1", plan, RunReport("run-1"), Progress(), {}, options)
        kept = {}
        for launch in plan.launches:
            spec = LaunchSpec(launch=launch, points=launch.points, run_id="run-1", placement=None,  # type: ignore[arg-type]
                              ctx=None, engine_command=(), log_dir=tmp_path,  # type: ignore[arg-type]
                              key_dir=tmp_path, startup_timeout_s=1.0)
            assert driver.wanted(spec)
            kept[launch.id] = [p.id.rsplit("/", 3)[-2:] for p in driver.trimmed(spec).points]
    return plan, kept


def test_a_budget_block_measures_only_what_its_undecided_hypotheses_rest_on(tmp_path: Path) -> None:
    """The rule names `fast-first-token` (cold arm, c1): the cold arm's budget launch keeps its c1
    points alone and the warm arm's is not needed; required launches and a rule that answers only True
    are never trimmed."""
    plan, kept = _kept_points(tmp_path, ("fast-first-token",))
    first = next(h for h in plan.hypotheses if h.id == "fast-first-token")
    for launch in plan.launches:
        if launch.required:
            assert len(kept[launch.id]) == len(launch.points), launch.id
        elif launch.arm == "warm":
            assert kept[launch.id] == [], launch.id
        else:
            assert kept[launch.id] == [["c1", p.rsplit("/", 1)[-1]] for p in first.points if launch.id in p]
            assert kept[launch.id] and len(kept[launch.id]) < len(launch.points)
    _, ran, _, _ = _wanted(tmp_path, [True, True])  # a bare True: every point, as before
    assert len(ran) == len(plan.launches)


def test_a_kept_cache_launch_is_trimmed_to_the_points_up_to_its_last_needed_one(tmp_path: Path) -> None:
    """The warm arm keeps its cache between points, so a point's measurement includes every point
    before it: for `warm-first-token` (c1) the budget launch runs up to its last c1 point and stops
    there; for `kept-cache-hits` (c4, its last points) it runs whole."""
    plan, kept = _kept_points(tmp_path, ("warm-first-token",))
    budget_warm = [launch for launch in plan.launches if not launch.required and launch.arm == "warm"]
    assert budget_warm
    for launch in budget_warm:  # run order: the ladder c1, c4 once per repeat
        assert kept[launch.id] == [["c1", "r1"], ["c4", "r1"], ["c1", "r2"], ["c4", "r2"], ["c1", "r3"]], kept[launch.id]
        assert [p.id.rsplit("/", 3)[-2:] for p in launch.points][:5] == kept[launch.id]  # a prefix, in run order
        assert len(launch.points) == 6
    _, kept = _kept_points(tmp_path, ("kept-cache-hits",))
    for launch in budget_warm:
        assert len(kept[launch.id]) == len(launch.points)


def test_the_cli_rule_reads_the_stored_run_and_stops_a_fixed_design(tmp_path: Path) -> None:
    """The CLI's callback reads the run back through the open store and asks report.scoring.scoring; the
    committed fixed-design runs have no budget, so nothing more runs."""

    from studyc.run_command import decide_more

    db = tmp_path / "h200.duckdb"
    committed_copy("h200", db)
    loaded = load_study(REPO / "studies/decode_roofline.toml")
    with Store(db) as store:
        run = store.latest_run("decode-roofline")
        assert run is not None
        assert decide_more(loaded)(store, run.run_id) == ()


def test_a_run_resumed_from_a_changed_study_file_records_the_new_hash(tmp_path: Path) -> None:
    """Adding a budget to a stored run's study, then --resume: the run carries the new plan and hash,
    and its notes say the file changed (so the site compares against what ran last)."""
    from dataclasses import replace

    first = _plan(tmp_path, "[load]")
    options = RunOptions(db=tmp_path / "r.duckdb", engine_command=[], python_argv=[], runs_dir=tmp_path)
    with Store(tmp_path / "r.duckdb") as store:
        run_id, _ = _open_run(store, first, options, Progress())
        second = _plan(tmp_path, BUDGET)
        assert second.study_sha256 != first.study_sha256
        again, _ = _open_run(store, second, replace(options, resume=True), Progress())
        run = store.run(run_id)
    assert again == run_id and run is not None and run.study_sha256 == second.study_sha256
    assert f"from a changed study file (sha256 {first.study_sha256[:12]} -> {second.study_sha256[:12]})" in (run.notes or "")


def test_a_run_that_measured_refuses_to_resume_under_another_stopping_rule(tmp_path: Path) -> None:
    """Once a point is committed, --resume refuses a raised budget (the horizon the error rate is spent
    over) and a changed number of required launches (the first look), naming both rules; the same rule,
    or only other minutes, resumes."""
    import pytest

    from base.errors import StudycError
    from runner.measure.host import machine_id
    from runner.store.records import PointRecord, ServerRecord

    first = _plan(tmp_path)
    # the load generator's self-test (seconds of load, advisory) runs in the test above; this one is about the rule
    options = RunOptions(db=tmp_path / "r.duckdb", engine_command=[], python_argv=[], runs_dir=tmp_path, resume=True,
                         client_selftest=False)
    with Store(tmp_path / "r.duckdb") as store:
        run_id, _ = _open_run(store, first, options, Progress())
        point = first.launches[0].points[0]
        server = first.launches[0].id  # measured on this host: resumed here, its block continues
        store.record_server(ServerRecord(run_id, server, launch_id=server, machine_id=machine_id()))
        store.commit_point(PointRecord(run_id=run_id, point_id=point.id, server_id=server,
                                       fingerprint=point.fingerprint), [], [], [])
        for design in ("[design]\nbudget = { blocks = 6, minutes = 30 }\n\n[load]", "[load]"):
            with pytest.raises(StudycError) as err:
                _open_run(store, _plan(tmp_path, design), options, Progress())
            assert f"run {run_id}" in err.value.message and "budget blocks 4" in err.value.message
            assert err.value.message.startswith(f"{tmp_path / 'budget.toml'}:")  # file:line: key
            assert ": design.budget: " in err.value.message
            assert "without --resume" in err.value.message
        with pytest.raises(StudycError, match="launches {'cold': 2, 'warm': 2}") as err:
            _open_run(store, _plan(tmp_path, launches=3), options, Progress())
        text = (tmp_path / "budget.toml").read_text().splitlines()
        line = int(err.value.message.split(":")[1])
        assert text[line - 1].startswith("launches = 3") and ": load.launches: " in err.value.message
        again, done = _open_run(store, _plan(tmp_path, BUDGET.replace("minutes = 30", "minutes = 90")), options, Progress())
    assert again == run_id and set(done) == {point.id}


def test_budget_blocks_wait_for_the_launches_before_them_on_every_executor(tmp_path: Path) -> None:
    """`run_phases` hands the required launches to the executor (several device slots, Ray) at once and
    asks the rule about block 3 only after they returned, block 4 only after block 3; the phases that
    ran are what the rule saw."""

    plan = _plan(tmp_path)
    phases: list[list[tuple[int, bool]]] = []
    seen: list[int] = []

    def decide(store: Store, run_id: str) -> bool:
        seen.append(len(phases))
        return len(seen) == 1  # block 3 runs, block 4 does not

    options = RunOptions(db=tmp_path / "r.duckdb", engine_command=[], python_argv=[], runs_dir=tmp_path,
                         decide_more=decide)
    specs = [LaunchSpec(launch=launch, points=launch.points, run_id="run-1", placement=None,  # type: ignore[arg-type]
                        ctx=None, engine_command=(), log_dir=tmp_path,  # type: ignore[arg-type]
                        key_dir=tmp_path, startup_timeout_s=1.0) for launch in plan.launches]
    with Store(tmp_path / "r.duckdb") as store:
        driver = Driver(store, "run-1", plan, RunReport("run-1"), Progress(), {}, options)
        run_phases(specs, driver, lambda some: phases.append([(s.launch.block, s.launch.required) for s in some]))
    assert [sorted({b for b, _ in p}) for p in phases] == [[1, 2], [3]]
    assert all(required for _, required in phases[0]) and len(phases[0]) == 4  # two arms x two launches
    assert seen == [1, 2]  # block 3 asked after the required phase ran; block 4 after block 3
    assert sorted(driver.report.launches_not_needed) == sorted(s.id for s in plan.launches if s.block == 4)
