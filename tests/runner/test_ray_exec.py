"""`studyc run --ray` on a local Ray cluster without vLLM: an engine that answers --version and then fails to
serve drives the executor (dispatch, the interference gate, each launch's end, the stop) through real Ray
actors in seconds, where `tests/runner/test_ray.py` needs a CPU vLLM server."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.store.store import Store
from tests.runner.test_ray import RAY_MISSING, quickstart, studyc

pytestmark = [pytest.mark.ray, pytest.mark.skipif(RAY_MISSING is not None, reason=str(RAY_MISSING))]


def failing_engine(tmp: Path) -> Path:
    engine = tmp / "vllm"
    engine.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo 0.0.0+fake; exit 0; fi\n'
                      "echo 'RuntimeError: no engine here' >&2\nexit 3\n")
    engine.chmod(0o755)
    return engine


def run_on_ray(tmp: Path, *more: str) -> tuple[int, str, Path]:
    """quickstart (two launches: cold, then warm) on a local cluster of two logical GPUs."""
    db = tmp / "q.duckdb"
    env = {"STUDYC_RUNS_DIR": str(tmp / "runs"), "STUDYC_VLLM": str(failing_engine(tmp))}
    proc = studyc("run", str(quickstart(tmp)), "--db", str(db), "--no-calibrate", "--gpus", "0,1", "--ray", *more,
                  env=env)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out, db


def test_with_keep_going_each_launch_on_ray_records_its_failed_servers(tmp_path: Path) -> None:
    """The first launch's end (its servers failed, the second time cold) lets the gate dispatch the other;
    both launches' starts are recorded failed and the run is partial."""
    code, out, db = run_on_ray(tmp_path, "--keep-going")
    assert code == 1, out
    assert "Ray: 2 GPU(s) in the cluster; 2 launch(es) to run" in out
    for launch in ("quickstart/cold", "quickstart/warm"):
        assert f"server {launch} failed: {launch}: its start failed twice" in out, out
    with Store(db, read_only=True) as store:
        run = store.latest_run("quickstart")
        assert run is not None and run.status == "partial"
        servers = {s.server_id: s.status for s in store.servers(run.run_id)}
        assert store.points(run.run_id) == []
    assert servers == dict.fromkeys(
        ["quickstart/cold", "quickstart/cold~2", "quickstart/warm", "quickstart/warm~2"], "failed")


def test_without_keep_going_a_failed_server_on_ray_stops_the_run(tmp_path: Path) -> None:
    """The first launch measures interference alone, so it runs first; its failed server stops the run
    before the gate lets the other go, and the error is the engine's, once, without a traceback."""
    code, out, db = run_on_ray(tmp_path)
    assert code == 1, out
    assert "RuntimeError: no engine here" in out and "Traceback" not in out
    assert "server quickstart/warm" not in out
    with Store(db, read_only=True) as store:
        run = store.latest_run("quickstart")
        assert run is not None
        servers = {s.server_id: s.status for s in store.servers(run.run_id)}
    assert servers == {"quickstart/cold": "failed", "quickstart/cold~2": "failed"}
