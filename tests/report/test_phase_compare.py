"""Where the wall went, run beside run: two runs of one study (before and after a lever) read phase by
phase from their stored segments, and what a run's notes say of how its servers started."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from report.phase_compare import compare_text, run_cost
from report.results import RunData
from runner.execute.driver import RunOptions
from runner.execute.run import setup_notes
from runner.store.records import PhaseRecord, RunRecord, SegmentRecord
from runner.store.store import Store
from studyc.cli import main

AT = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)


def run(run_id: str, notes: str | None, starts: dict[str, float], window: float, wall: float,
        segments: int = 1) -> RunData:
    """A run with one launch per entry of `starts` (its start phase), each measuring `window` seconds."""
    phases = [PhaseRecord(1, 1, "", "calibration", 5.0)]
    for i, (launch, s) in enumerate(starts.items()):
        phases += [PhaseRecord(1, 10 * i + 2, launch, "start: engine process (config, spawn, imports)", s),
                   PhaseRecord(1, 10 * i + 3, launch, "window", window)]
    segs = [SegmentRecord(k, AT, wall_s=wall / segments, ended="complete") for k in range(1, segments + 1)]
    return RunData(db=Path("x.duckdb"), run=RunRecord(run_id=run_id, study_id="s", notes=notes), servers=(),
                   points=(), checks=(), telemetry=(), segments=tuple(segs), phases=tuple(phases))


BEFORE = run("r-cold", "Linux; starts: cold (--cold-starts)", {"s/a/L1": 40.0, "s/b/L1": 42.0}, 10.0, 120.0)
AFTER = run("r-held", "Linux; starts: held; servers inherit VLLM_X=1", {"s/a/L1": 20.0, "s/b/L1": 22.0}, 10.0,
            70.0)


def test_a_run_cost_from_its_phases() -> None:
    cost = run_cost(BEFORE)
    assert cost is not None and (cost.launches, cost.starts) == (2, "cold (--cold-starts)")
    assert cost.table.wall_s == 120.0 and cost.table.window_s == 20.0 and cost.over_windows == 6.0
    held = run_cost(AFTER)
    assert held is not None and held.starts == "held" and held.over_windows == 3.5


def test_a_run_without_phases_has_no_cost_and_one_without_windows_no_ratio() -> None:
    bare = RunData(db=Path("x.duckdb"), run=RunRecord(run_id="old", study_id="s"), servers=(), points=(),
                   checks=(), telemetry=())
    assert run_cost(bare) is None
    none = run_cost(run("w0", None, {"s/a/L1": 30.0}, 0.0, 40.0))
    assert none is not None and none.over_windows is None and none.starts == "not recorded"
    assert "wall over windows" in compare_text([none]) and "  -" in compare_text([none])


def test_a_resumed_run_says_each_way_its_servers_started() -> None:
    mixed = run_cost(run("m", "starts: held; resumed on h; starts: cold (--cold-starts); starts: held",
                         {"s/a/L1": 1.0}, 1.0, 4.0, segments=2))
    assert mixed is not None and mixed.starts == "held then cold (--cold-starts)" and mixed.table.segments == 2


def test_two_runs_side_by_side_with_the_second_minus_the_first() -> None:
    costs = [c for c in (run_cost(BEFORE), run_cost(AFTER)) if c is not None]
    text = compare_text(costs)
    lines = {ln.split("  ")[1].strip(): ln for ln in text.splitlines()}
    assert "second - first" in lines["run"] and "r-cold" in lines["run"] and lines["run"].index("r-cold") < \
        lines["run"].index("r-held")
    engine = lines["start: engine process (config, spawn, imports)"]
    assert "82.0 s" in engine and "42.0 s" in engine and engine.rstrip().endswith("-40.0 s")
    assert lines["wall"].rstrip().endswith("-50.0 s") and "120.0 s" in lines["wall"]
    assert "6.00x" in lines["wall over windows"] and "3.50x" in lines["wall over windows"]
    assert lines["launches started"].split()[-2:] == ["2", "2"]
    assert lines["windows"].split()[-4:] == ["20.0", "s", "20.0", "s"]
    three = compare_text([*costs, costs[0]])
    assert "second - first" not in three and not three.splitlines()[3].rstrip().endswith("s -")
    assert compare_text([]) == "no run with stored phases"


def test_the_notes_say_how_servers_started_and_what_they_inherit_never_a_secret() -> None:
    options = RunOptions(db=Path("x"), engine_command=["vllm"], python_argv=["python"], runs_dir=Path("r"))
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "fork", "VLLM_API_KEY": "s3cret", "HF_TOKEN": "t",
           "VLLM_HF_TOKEN": "t", "PATH": "/bin", "VLLM_A": "1", "VLLM_DB_PASSWORD": "p",
           "VLLM_AUTHORIZATION": "a", "VLLM_S3_CREDENTIALS": "c", "VLLM_SECRET_X": "s"}
    assert setup_notes(options, env) == ("starts: held", "servers inherit VLLM_A=1, VLLM_WORKER_MULTIPROC_METHOD=fork")
    cold = RunOptions(db=Path("x"), engine_command=["vllm"], python_argv=["python"], runs_dir=Path("r"),
                      held_start=False)
    assert setup_notes(cold, {"PATH": "/bin"}) == ("starts: cold (--cold-starts)",)


def test_the_command_reads_runs_and_studies_from_a_real_database(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    with Store(db) as store:
        for data in (BEFORE, AFTER):
            store.save_run(data.run)
            store.put_timing(data.run.run_id, [*data.segments, *data.phases])
        store.save_run(RunRecord(run_id="r-old", study_id="s"))  # stored before phases were
    cli = CliRunner()
    both = cli.invoke(main, ["phases", "r-cold", "r-held", "--db", str(db)])
    assert both.exit_code == 0, both.output
    assert "second - first" in both.output and "-50.0 s" in both.output
    study = cli.invoke(main, ["phases", "s", "--db", str(db)])
    assert study.exit_code == 0 and "r-cold" in study.output and "r-held" in study.output
    assert "(1 run(s) stored before phases were: left out)" in study.output and "r-old" not in study.output
    missing = cli.invoke(main, ["phases", "nope", "--db", str(db)])
    assert missing.exit_code == 1 and f"{db}: no run or study 'nope' (studies: s)" in missing.output
    assert "Traceback" not in missing.output


@pytest.mark.parametrize("notes", [None, "", "starts:held"])
def test_notes_without_a_starts_entry_read_not_recorded_or_the_entry(notes: str | None) -> None:
    cost = run_cost(run("n", notes, {"s/a/L1": 1.0}, 1.0, 3.0))
    assert cost is not None and cost.starts == ("held" if notes else "not recorded")


def test_the_table_exactly_phases_in_run_order_unknown_ones_last_and_a_phase_one_run_lacks() -> None:
    a = run("a", "starts: held", {"s/x/L1": 2.0}, 1.0, 10.0)
    b = run("b", None, {"s/x/L1": 1.0}, 2.0, 8.0)
    extra = (PhaseRecord(1, 90, "s/x/L2", "window", 1.0), PhaseRecord(1, 91, "", "zz later", 0.5),
             PhaseRecord(1, 92, "", "aa later", 0.5))
    b = RunData(db=b.db, run=b.run, servers=(), points=(), checks=(), telemetry=(), segments=b.segments,
                phases=b.phases + extra)  # a launch that only measured (its start in an earlier segment)
    costs = [c for c in (run_cost(a), run_cost(b)) if c is not None]
    assert costs[1].launches == 1  # a launch without a start phase is not a launch started here
    got = compare_text(costs).splitlines()
    w = len("start: engine process (config, spawn, imports)")
    head = lambda label: f"  {label:<{w}}"  # noqa: E731
    assert got[0] == head("run") + f"  {'a':>17}  {'b':>17}  {'second - first':>12}"
    assert got[1] == head("study") + f"  {'s':>17}  {'s':>17}  {'':>12}"
    assert got[2] == head("starts") + f"  {'held':>17}  {'not recorded':>17}  {'':>12}"
    assert [ln[2:2 + w].strip() for ln in got[3:9]] == [
        "calibration", "start: engine process (config, spawn, imports)", "window", "gap", "aa later", "zz later"]
    assert got[5] == head("window") + f"  {'1.0 s  10.0%':>17}  {'3.0 s  37.5%':>17}  {'+2.0 s':>12}"
    assert got[7] == head("aa later") + f"  {'-':>17}  {'0.5 s   6.2%':>17}  {'+0.5 s':>12}"
    alone = compare_text(costs[:1]).splitlines()
    assert alone[0] == head("run") + f"  {'a':>17}" and alone[-1] == head("launches started") + f"  {'1':>17}"
