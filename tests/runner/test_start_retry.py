"""A start whose server exits before it is ready is tried once more, cold, and the run goes on; both starts
keep a servers row, a phase row and a log. One that fails twice ends the run with the reason and the command
that resumes it. The fault is a stand-in (tests/runner/standin/sitecustomize.py): vLLM's CLI exits the first
time it runs, at `go` in a held start, at once in a cold one; the engine and everything else are real."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runner.store.store import Store
from tests.conftest import REPO, vllm_missing
from tests.runner.test_run import FAULTS, studyc

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]
STANDIN = REPO / "tests/runner/standin"


def _study(tmp_path: Path, *, broken: bool) -> Path:
    """The faults study with one arm: `good` dying once (the stand-in), or `broken` alone (always fails)."""
    text = FAULTS.read_text().replace('path = "../../../models/tiny-qwen3"', f'path = "{REPO / "models/tiny-qwen3"}"')
    if broken:
        text = re.sub(r"(?ms)^\[arms\.good\]\n.*?\n\n", "", text, count=1)
    else:
        text = re.sub(r"(?ms)^\[arms\.broken\]\n.*?\n\n", "", text, count=1)
        flag = tmp_path / "died-once"
        text = text.replace('description = "Serves"',
                            f'description = "Serves"\nenv = {{ PYTHONPATH = "{STANDIN}", STUDYC_TEST_DIE_ONCE = "{flag}" }}')
    # one point is enough to show the retried launch measures: concurrency 1, two requests, one repeat
    text = re.sub(r"(?ms)^\[load\]\n.*\Z", "[load]\nconcurrency = [1]\nrequests = 2\nwarmup = 1\nrepeats = 1\n"
                  "launches = 1\n", text)
    path = tmp_path / "faults.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("start", ["held", "cold"])
def test_a_start_that_dies_before_ready_is_retried_cold_and_the_run_completes(tmp_path: Path, start: str) -> None:
    db = tmp_path / "retry.duckdb"
    flags = ["--cold-starts"] if start == "cold" else []
    proc = studyc("run", str(_study(tmp_path, broken=False)), "--db", str(db), "--no-calibrate", *flags)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "faults/good: its server exited before it was ready" in out and "cold, as faults/good~2" in out
    assert "starts retried once, cold (a server exited before it was ready): faults/good -> faults/good~2" in out
    with Store(db, read_only=True) as store:
        run = store.latest_run("faults")
        assert run is not None and run.status == "complete"
        servers = {s.server_id: s for s in store.servers(run.run_id)}
        assert set(servers) == {"faults/good", "faults/good~2"}
        first, again = servers["faults/good"], servers["faults/good~2"]
        assert first.status == "failed" and "exited with code 2" in (first.error or "")
        assert again.status == "ready" and again.startup_s and again.launch_id == "faults/good"
        points = store.points(run.run_id)
        assert len(points) == 1 and all(p.status == "ok" and p.server_id == "faults/good~2" for p in points)
        _, phases = store.timing(run.run_id)
        assert [p.phase for p in phases if p.launch_id == "faults/good"].count("start (failed)") == 1
    first_log = Path(first.log_path or "").read_text()
    assert "stand-in fault: the engine exits before it is ready" in first_log
    assert ("# studyc-held: go after" in first_log) == (start == "held")  # a held start dies at `go`
    assert "stand-in fault" not in Path(again.log_path or "").read_text() and again.log_path != first.log_path


def test_a_start_that_fails_twice_ends_the_run_with_the_command_that_resumes_it(tmp_path: Path) -> None:
    db = tmp_path / "twice.duckdb"
    study = _study(tmp_path, broken=True)
    proc = studyc("run", str(study), "--db", str(db), "--no-calibrate")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out
    assert "faults/broken: its start failed twice, the second time cold as faults/broken~2" in out
    assert f"continue with: studyc run {study} --db {db} --resume" in out and "Traceback" not in out
    with Store(db, read_only=True) as store:
        run = store.latest_run("faults")
        assert run is not None
        servers = {s.server_id: s.status for s in store.servers(run.run_id)}
        assert servers == {"faults/broken": "failed", "faults/broken~2": "failed"}
