"""The runner against a real CPU vLLM server: a full run fills every table; faults lose no
committed data (crash at start, server killed mid-point, Ctrl-C), and --resume completes the rest.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from base.settings import load_settings
from compiler.load import load_study
from compiler.plan_compile import compile_study
from runner.server.engine import server_api_key
from runner.store.store import Store
from tests.conftest import REPO, vllm_missing

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]

FAULTS = REPO / "tests/runner/studies/faults.toml"
QUICKSTART = REPO / "studies/quickstart.toml"


def studyc(*args: str, **kw) -> subprocess.Popen[str]:
    env = os.environ | {"PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    return subprocess.Popen(
        [sys.executable, "-m", "studyc", *args],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kw,
    )


def children(pid: int) -> list[int]:
    """Every descendant process of pid (vLLM servers run in their own session, still our children)."""
    found, frontier = [], [pid]
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            stats[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in stats.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for_line(proc: subprocess.Popen[str], needle: str, timeout_s: float = 240) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"never saw {needle!r}; output:\n{''.join(lines)}")


def test_quickstart_fills_every_table(quickstart_db: Path) -> None:
    with Store(quickstart_db, read_only=True) as store:
        run = store.latest_run("quickstart")
        assert run is not None and run.status == "complete"
        assert run.git_sha is None or re.fullmatch(r"[0-9a-f]{40}", run.git_sha)
        counts = store.counts(run.run_id)
        assert counts["runs"] == 1 and counts["servers"] == 2 * 3 and counts["points"] == 12  # 3 launches per arm
        assert counts["requests"] == 2 * 6 * (16 + 4)  # both arms, 6 points each, measured + warmup
        assert counts["checks"] >= 12 * 6
        assert (counts["telemetry"] > 0) == bool(run.nvml_available)  # NVML alone samples inside the window
        rows = store.points(run.run_id)
        assert all(r.status == "ok" for r in rows)
        for row in rows:
            assert row.metric("littles_law_error") is not None and row.counters_after_json
            assert row.verdict is not None and row.verdict.split(":")[0] in ("valid", "invalid", "unverified")
            assert row.metric("output_throughput") > 0
            stall = row.metric("client_stall_max_s")  # the load generator's own loop stall, for reconciliation
            assert stall is not None and 0.001 <= stall < 5.0  # the 1 ms watch's bound is at least its period
        cold = [r for r in rows if r.arm == "cold"]
        warm = [r for r in rows if r.arm == "warm"]
        assert all(r.metric("prefix_hit_rate") < 0.01 and r.reset_ok for r in cold)
        assert all(r.flagged for r in warm)  # the kept cache is flagged on every point
        assert max(r.metric("prefix_hit_rate") for r in warm) > 0.5
        servers = store.servers(run.run_id)
        assert all(s.kv_capacity_tokens == 262_144 and s.startup_s and s.startup_s > 0 for s in servers)
        for server in servers:  # the API key is in the engine's environment, never in argv or its log
            argv = json.loads(server.argv_json or "[]")
            assert "--api-key" not in argv
            log = Path(server.log_path or "").read_text(errors="replace") if server.log_path else ""
            assert "non-default args" in log and "api_key" not in log
            assert all(" WARNING " in w or " ERROR " in w for w in server.warnings)
        assert any("SECURITY WARNING" in w for s in servers for w in s.warnings)  # dev mode, always logged
        key = server_api_key(load_settings().cache_path).encode()  # no file of the results holds the key
        assert not [f for f in quickstart_db.parent.rglob("*") if f.is_file() and key in f.read_bytes()]
        assert run.calibrated is False and run.vllm_version
        names = {c.name for c in store.checks(run.run_id)}
        assert {
            "steady_state",
            "littles_law",
            "reconciliation",
            "itl_trusted",
            "cache_cold",
            "output_exact",
            "errors",
            "warmup_sufficient",
        } <= names


def test_quickstart_later_servers_were_held(quickstart_db: Path) -> None:
    """Each launch after the first was spawned held while the one before ran, let go after it stopped, and
    stayed stopped through every point of it: each point of every launch but the last carries a passed
    `held_start_paused`. The first launch (cold/L1) was held too, with nothing to overlap: let go once
    imported, its imports a phase of their own, so every start counts from the same point."""
    order = [launch.id for launch in compile_study(load_study(QUICKSTART)).launches]
    assert order[0] == "quickstart/cold/L1" and len(order) == 6
    with Store(quickstart_db, read_only=True) as store:
        run = store.latest_run("quickstart")
        assert run is not None
        logs = {s.server_id: Path(s.log_path or "").read_text(errors="replace") for s in store.servers(run.run_id)}
        held = [c for c in store.checks(run.run_id) if c.name == "held_start_paused"]
        phases = {(p[0], p[1]): p[2] for p in store.con.execute(
            "SELECT launch_id, phase, sum(seconds) FROM phases WHERE run_id = ? GROUP BY ALL",
            [run.run_id]).fetchall()}
    assert sorted(logs) == sorted(order) and all("# studyc-held: go after" in log for log in logs.values())
    assert sorted(c.point_id for c in held) == sorted(f"{launch}/short/c{c}/r1" for launch in order[:-1]
                                                        for c in (1, 4))
    assert all(c.passed and c.value == 0.0 for c in held)
    # imported while the launch before ran, or (the first) before its start: under a second each (vLLM stamps
    # its lines to the second); the first launch's imports, waited for before its start, are a phase of it
    assert all(phases[(launch, "start: imports (API process)")] < 1.0 for launch in order)
    assert phases[(order[0], "start: imports (first launch, held)")] > 1.0
    assert not [launch for launch in order[1:] if (launch, "start: imports (first launch, held)") in phases]


def test_quickstart_decides_every_hypothesis(quickstart_db: Path) -> None:
    """Three launches per arm: every hypothesis of the newcomer's first run is confirmed or refuted, none
    inconclusive (its interval is taken between launches)."""
    from report.results import read_run
    from report.scoring.scoring import score_study

    with Store(quickstart_db, read_only=True) as store:
        run = store.latest_run("quickstart")
        assert run is not None
    scores = score_study(load_study(QUICKSTART), read_run(quickstart_db, run.run_id))
    assert len(scores) == 4 and all(s.n == 3 for s in scores)
    assert {s.hypothesis: s.verdict_label for s in scores if s.verdict not in ("confirmed", "refuted")} == {}


def test_crash_at_start_keep_going_then_kill_and_resume(tmp_path: Path) -> None:
    db = tmp_path / "faults.duckdb"
    proc = studyc("run", str(FAULTS), "--db", str(db), "--keep-going", "--no-calibrate")
    # The broken arm dies at start with its log tail; the good arm starts and runs.
    lines = wait_for_line(proc, "faults/good/w/c1/r1: ")  # committed (ok, or ok but judged invalid)
    text = "".join(lines)
    assert "server faults/broken failed" in text and "exited" in text
    time.sleep(1.0)  # the next point (128 tokens at c2) is in flight: kill the engine under it
    servers = [
        p for p in children(proc.pid) if "vllm" in Path(f"/proc/{p}/cmdline").read_text(errors="ignore")
    ]
    assert servers, "no vLLM process found under studyc"
    os.killpg(servers[0], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "failed" in out
    with Store(db, read_only=True) as store:
        run = store.latest_run("faults")
        assert run is not None and run.status == "partial"
        rows = {r.point_id: r for r in store.points(run.run_id)}
        assert rows["faults/good/w/c1/r1"].status == "ok"
        assert any(r.status == "failed" for r in rows.values())
        before = {pid for pid, r in rows.items() if r.status == "ok"}
        assert {rows[pid].server_id for pid in before} == {"faults/good"}
        failed = {s.server_id: s for s in store.servers(run.run_id)}["faults/broken"]
        assert failed.status == "failed" and "max" in (failed.error or "").lower()
        run_id = run.run_id
    # --resume completes what is missing and keeps what was committed.
    proc = studyc("run", str(FAULTS), "--db", str(db), "--resume", "--keep-going", "--no-calibrate")
    out, _ = proc.communicate(timeout=300)
    assert "resuming run" in out
    with Store(db, read_only=True) as store:
        rows = store.points(run_id)
        good = [r for r in rows if r.arm == "good"]
        assert len(good) == 4 and all(r.status == "ok" for r in good), out
        # each point names the server start that measured it
        assert {r.server_id for r in good if r.point_id not in before} == {"faults/good~2"}
        assert {r.server_id for r in good if r.point_id in before} == {"faults/good"}
        assert len(store.runs()) == 1
        assert f"resumed on {socket.gethostname()} at " in (store.run(run_id).notes or "")  # type: ignore[union-attr]
        assert "starts: held" in (store.run(run_id).notes or "")  # type: ignore[union-attr]  # studyc phases reads it
        # The servers that measured before the kill keep their rows; the resumed launches start new
        # ones under "~2" (the broken arm fails again, the good arm's second server serves the rest).
        servers = {s.server_id: s for s in store.servers(run_id)}
        assert {"faults/good", "faults/good~2", "faults/broken", "faults/broken~2"} <= servers.keys()
        first, second = servers["faults/good"], servers["faults/good~2"]
        assert first.started_at and second.started_at and first.started_at < second.started_at
        assert first.startup_s and second.status == "ready" and second.stopped_at and servers["faults/broken~2"].status == "failed"


def _good_arm_after_its_first_point(tmp_path: Path, db: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """studyc running the faults study's good arm alone (the broken one's failed start adds nothing here),
    returned as soon as its first point is committed (ok, or ok but judged invalid): the points after it
    take about a second, so nothing may stand between reading that line and a signal. With its vLLM pids."""
    study = tmp_path / "faults.toml"
    text = FAULTS.read_text().replace('path = "../../../models/tiny-qwen3"', f'path = "{REPO / "models/tiny-qwen3"}"')
    study.write_text(re.sub(r"(?ms)^\[arms\.broken\]\n.*?\n\n", "", text, count=1))
    proc = studyc("run", str(study), "--db", str(db), "--keep-going", "--no-calibrate", start_new_session=True)
    wait_for_line(proc, "server faults/good: ready")
    engines = [p for p in children(proc.pid) if "vllm" in Path(f"/proc/{p}/cmdline").read_text(errors="ignore")]
    assert engines
    wait_for_line(proc, "faults/good/w/c1/r1: ")
    return proc, engines


def _stopped_with_the_first_point_kept(engines: list[int], db: Path, status: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in engines) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in engines), "orphaned vLLM process"
    with Store(db, read_only=True) as store:
        run = store.latest_run("faults")
        assert run is not None and run.status == status
        assert store.points(run.run_id)[0].point_id == "faults/good/w/c1/r1"


@pytest.mark.parametrize("how", ["sigterm"])
def test_signal_stops_cleanly(tmp_path: Path, how: str) -> None:
    """SIGTERM to studyc alone (`timeout`, `kill`) stops the servers and marks the run interrupted, committed
    points kept, as Ctrl-C does (SIGINT to the process group: tests/runner/test_interrupt.py, mid-point and
    then resumed; the branch for it stays here)."""
    db = tmp_path / f"{how}.duckdb"
    proc, engines = _good_arm_after_its_first_point(tmp_path, db)
    if how == "sigint":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted" in out
    _stopped_with_the_first_point_kept(engines, db, "interrupted", within_s=10)


def test_a_killed_run_leaves_no_server_running(tmp_path: Path) -> None:
    """SIGKILL to studyc (the OOM killer, a CI job's timeout): nothing in studyc runs, but the reaper it
    left beside itself stops its server; the committed point is kept and the run stays resumable
    (`running`: nothing marked it, so --resume continues it)."""
    db = tmp_path / "killed.duckdb"
    proc, engines = _good_arm_after_its_first_point(tmp_path, db)
    proc.kill()
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    _stopped_with_the_first_point_kept(engines, db, "running", within_s=20)


SEQUENTIAL = """
[study]
id = "{id}"
title = "Sequential budget on the CPU"
question = "Do budget blocks run only while a hypothesis is undecided?"
hardware = "cpu"

[model]
path = "{model}"

[engine]
max_model_len = 2048
max_num_seqs = 16
kv_cache_memory_bytes = "256M"
block_size = 32
enforce_eager = true
distributed_executor_backend = "uni"

[env]
VLLM_ENABLE_V1_MULTIPROCESSING = "0"

{arms}

[workloads.short]
input_len = 128
output_len = 32

{extra}
[design]
budget = {{ blocks = 3, minutes = 20 }}

[load]
concurrency = [1]
requests = 16
warmup = 4
launches = 2
repeats = 1
cache = "reset"

[[hypothesis]]
id = "h"
claim = "{claim}"
metric = "{metric}"
predict = {predict}
"""


@pytest.mark.vllm
def test_budget_blocks_run_while_undecided(tmp_path: Path) -> None:
    """Two arms with the same server and workload: their throughput ratio's true value is the boundary 1.
    Arms run in a new order each block (block 2 reverses block 1), so an order effect (the first server of
    a block measured slower on a loaded host) flips sign between the blocks instead of deciding the ratio.
    The first look's interval (2 blocks, df 1, 1% of alpha) straddles 1 unless a 1%-level false decision
    happens: the budget's block 3 runs. (Two workloads on one launch were not enough: measured in the same
    order on every launch, they differed by a steady 4% under CI load and the first look decided.) A study
    decided at the first look runs no budget block: test_budget_blocks.py, with the real rule on a stored
    H200 run."""
    study = tmp_path / "seq.toml"
    predict = '{ ratio = ["base", "twin"], relation = ">", value = 1.0 }'
    study.write_text(SEQUENTIAL.format(id="seq", model=REPO / "models/tiny-qwen3", claim="the same throughput",
                                       metric="output_throughput", predict=predict,
                                       arms="[arms.base]\n[arms.twin]", extra=""))
    db = tmp_path / "seq.duckdb"
    proc = studyc("run", str(study), "--db", str(db), "--no-calibrate")
    out, _ = proc.communicate(timeout=1200)
    assert proc.returncode == 0, out
    with Store(db, read_only=True) as store:
        run = store.runs()[0]
        servers = store.servers(run.run_id)
        points = store.points(run.run_id)
    assert all(p.status == "ok" for p in points), out  # judged validity varies with the load on a 2-core host
    assert len({s.launch_id or s.server_id for s in servers}) == 3 * 2, out
    assert len(points) == 3 * 2
    assert "block 3: undecided (h): running it" in out and "budget launches not run" not in out, out


def test_recheck_keeps_the_held_start_check(quickstart_db: Path, tmp_path: Path) -> None:
    """`held_start_paused` was read while the point ran, not from its records: recheck keeps it as stored, a
    failed one included (here made to fail in the copy, as a run would have stored it)."""
    import shutil

    from runner.checks.recheck import recheck

    db = tmp_path / "q.duckdb"
    shutil.copyfile(quickstart_db, db)
    with Store(db) as store:
        run = store.latest_run("quickstart")
        assert run is not None
        store.con.execute("UPDATE checks SET passed = false, status = 'fail', value = 3 WHERE run_id = ? AND "
                          "point_id = 'quickstart/cold/L1/short/c1/r1' AND name = 'held_start_paused'", [run.run_id])
    recheck(db)
    with Store(db, read_only=True) as store:
        held = {c.point_id: c for c in store.checks(run.run_id) if c.name == "held_start_paused"}
        point = next(p for p in store.points(run.run_id) if p.point_id == "quickstart/cold/L1/short/c1/r1")
    assert len(held) == 10 and not held["quickstart/cold/L1/short/c1/r1"].passed  # every launch's but the last
    assert all(c.passed for pid, c in held.items() if pid != "quickstart/cold/L1/short/c1/r1")
    assert not point.valid and "held_start_paused" in (point.verdict or "")
