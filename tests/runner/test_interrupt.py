"""Ctrl-C in the middle of a quickstart point: no traceback, the CLI says the run was interrupted and gives the
command that resumes it, no point is stored as failed (the point in flight is not stored: its requests were
cut, so --resume measures it again), no server is left running; then --resume completes every point valid."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from runner.store.store import Store
from tests.conftest import vllm_missing
from tests.runner.test_run import alive, children, studyc
from tests.variants import ONE_LAUNCH, study_variant

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]


def test_ctrl_c_mid_point_then_resume_completes_every_point_valid(tmp_path: Path) -> None:
    # two servers, two points each: the interrupt lands in the first server's second point, the resume measures
    # it and the other server's two
    study = study_variant(tmp_path, ONE_LAUNCH[0], name="quickstart.toml")
    db = tmp_path / "q.duckdb"
    proc = studyc("run", str(study), "--db", str(db), "--no-calibrate", start_new_session=True)
    assert proc.stdout is not None
    lines: list[str] = []
    engines: list[int] = []
    for line in proc.stdout:
        lines.append(line)
        if not engines and "ready in" in line:
            engines = [p for p in children(proc.pid) if "vllm" in Path(f"/proc/{p}/cmdline").read_text(errors="ignore")]
        if re.search(r"quickstart/\S+/c1/r1: ok", line):
            time.sleep(1.0)  # the next point (c4) is in flight: warmup or load
            os.killpg(proc.pid, signal.SIGINT)
            break
    out = "".join(lines) + proc.stdout.read()
    proc.wait(timeout=60)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "interrupted: servers stopped, committed points kept" in out
    assert f"continue with: studyc run {study} --db {db} --resume" in out
    deadline = time.monotonic() + 10
    while engines and any(alive(p) for p in engines) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert engines and not any(alive(p) for p in engines), "a vLLM process outlived the interrupt"
    with Store(db, read_only=True) as store:
        run = store.latest_run("quickstart")
        assert run is not None and run.status == "interrupted"
        kept = store.points(run.run_id)
        assert kept and all(p.status == "ok" for p in kept), [(p.point_id, p.status, p.error) for p in kept]
        # The interrupt landed inside the point after the first: only the first was committed
        assert [p.point_id.split("/")[-2:] for p in kept] == [["c1", "r1"]], [p.point_id for p in kept]
        run_id = run.run_id
    again = studyc("run", str(study), "--db", str(db), "--no-calibrate", "--resume")
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out
    with Store(db, read_only=True) as store:
        run = store.run(run_id)
        assert run is not None and run.status == "complete"
        points = store.points(run_id)
        assert len(points) == 4 and all(p.status == "ok" and p.valid for p in points), [
            (p.point_id, p.status, p.verdict) for p in points]
