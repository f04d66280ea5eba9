"""An arm's `expect_log`: text each of its servers must have logged by ready (the engine did what the
study asked: a backend, a feature). The pure rule, the plan carrying it, and a real CPU server whose log
says it (measured) beside one whose log does not (its launch fails, naming the text; nothing measured)."""

from __future__ import annotations

from pathlib import Path

import pytest

from base.errors import EngineError
from compiler.load import check_file, load_study
from compiler.plan_compile import compile_study
from runner.execute.launch import expect_logged, missing_from_log
from runner.store.store import Store
from tests.conftest import vllm_missing
from tests.runner.test_launch import audit, study, studyc

ARMS = '''
[arms.a]
expect_log = ["Enforce eager set"]          # the CPU server says so when enforce_eager is on

[arms.b]
expect_log = ["Enforce eager set", "Using FLASH_ATTN attention backend"]   # no CPU server says the second

[load]
concurrency = [1]
requests = 4
warmup = 1
launches = 1
repeats = 1
'''


def test_missing_from_log_keeps_the_order_and_needs_every_text() -> None:
    log = "INFO a\nWARNING Enforce eager set, disabling torch.compile\nINFO Using TORCH_SDPA backend\n"
    assert missing_from_log(log, ["Enforce eager set", "Using TORCH_SDPA"]) == []
    assert missing_from_log(log, ["Using FLASH_ATTN", "Enforce eager set", "x"]) == ["Using FLASH_ATTN", "x"]
    assert missing_from_log("", []) == [] and missing_from_log("", ["a"]) == ["a"]


def test_expect_logged_reads_only_the_log_since_the_start(tmp_path: Path) -> None:
    """A held or restarted server appends to its log: what an earlier start said does not count."""
    log = tmp_path / "s.log"
    log.write_text("Enforce eager set (an earlier start)\n")
    start = log.stat().st_size
    with log.open("a") as f:
        f.write("INFO this start\n")
    expect_logged(log, "s/a", 0, ["Enforce eager set"])
    with pytest.raises(EngineError) as failed:
        expect_logged(log, "s/a", start, ["Enforce eager set", "INFO this start"])
    assert failed.value.message == (f"server s/a is ready but its log does not say 'Enforce eager set' (the arm's "
                                    f"expect_log): see {log}")
    expect_logged(log, "s/a", start, [])


def test_the_plan_carries_each_arms_texts_and_an_empty_one_is_refused(tmp_path: Path) -> None:
    path = study(tmp_path, "logs", ARMS)
    plan = compile_study(load_study(path))
    assert {s.arm: s.expect_log for s in plan.launches} == {
        "a": ("Enforce eager set",), "b": ("Enforce eager set", "Using FLASH_ATTN attention backend")}
    from compiler.plan_table import format_plan

    table = format_plan(plan)
    assert "  its log must say by ready: 'Enforce eager set'; 'Using FLASH_ATTN attention backend'\n" in table
    assert table.count("its log must say by ready:") == 2  # once per launch, one launch per arm
    bad = study(tmp_path, "empty", ARMS.replace('expect_log = ["Enforce eager set"]', 'expect_log = [""]'))
    line = bad.read_text().splitlines().index('expect_log = [""]          # the CPU server says so when enforce_eager '
                                              'is on') + 1
    _, problems = check_file(bad)
    assert [str(p) for p in problems] == [f"{bad}:{line}: arms.a.expect_log[0]: String should have at least 1 character"]


@pytest.mark.vllm
@pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))
def test_a_server_whose_log_lacks_an_expected_text_measures_nothing(tmp_path: Path) -> None:
    path = study(tmp_path, "logs", ARMS)
    db = tmp_path / "r.duckdb"
    out = studyc("run", str(path), "--db", str(db), "--no-calibrate", "--keep-going")
    assert "is ready but its log does not say 'Using FLASH_ATTN attention backend'" in out.stdout + out.stderr
    with Store(db) as store:
        run = store.runs()[0]
        servers = {s.arm: s for s in store.servers(run.run_id)}
        points = store.points(run.run_id)
    assert servers["a"].status == "ready" and servers["b"].status == "failed"
    assert "'Using FLASH_ATTN attention backend'" in (servers["b"].error or "")
    assert "Enforce eager set" not in (servers["b"].error or "")  # the text it did log is not named
    assert {p.arm for p in points if p.status == "ok"} == {"a"}
    assert run.status != "complete"  # a launch failed: the run is not published, so nothing is scored from it
    (row,) = audit(path, db)
    assert row["verdict"] == "not run"
