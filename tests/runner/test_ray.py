"""`studyc run --ray` on a local Ray cluster with two logical GPUs on the CPU, against real vLLM CPU
servers: the quickstart (at a lighter load) runs both launches as Ray actors, measures their interference
and is scored; a Ray worker
killed mid-point fails that point only, and --resume completes the run. Without Ray installed, --ray
says how to install it, and the base install never imports Ray."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.store.store import Store
from tests.conftest import REPO, vllm_missing
from tests.runner.test_run import alive, children, wait_for_line

RAY_MISSING = None
try:
    import ray  # noqa: F401
except ImportError:
    RAY_MISSING = "ray not installed (pip install -e '.[test]')"

def studyc(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "studyc", *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env=os.environ | {"PYTHONUNBUFFERED": "1", "COLUMNS": "200"} | (env or {}),
    )


def quickstart(tmp: Path) -> Path:
    """studies/quickstart.toml at a lighter load (one launch per arm, 8 requests, one repeat), its model path
    absolute."""
    text = (REPO / "studies/quickstart.toml").read_text()
    text = text.replace('path = "../models/tiny-qwen3"', f'path = "{REPO / "models/tiny-qwen3"}"')
    text = re.sub(r"(?m)^requests = \d+.*$", "requests = 8", text)
    text = re.sub(r"(?m)^warmup = 4.*$", "warmup = 2", text)
    text = re.sub(r"(?m)^launches = \d+.*$", "launches = 1", text)
    text = re.sub(r"(?m)^repeats = \d+.*$", "repeats = 1", text)
    path = tmp / "quickstart.toml"
    path.write_text(text)
    return path


def ray_workers(pid: int, name: str = "ray::LaunchWorker") -> list[int]:
    found = []
    for p in children(pid):
        try:
            if Path(f"/proc/{p}/cmdline").read_bytes().startswith(name.encode()):
                found.append(p)
        except OSError:
            continue
    return found


def engines(pid: int) -> list[int]:
    return [p for p in children(pid) if b"vllm" in _cmdline(p) and b"ray::" not in _cmdline(p)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _stat(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:40]
    except OSError:
        return ""


def _logs_to(pid: int, log: Path) -> bool:
    try:
        return Path(os.readlink(f"/proc/{pid}/fd/1")) == log
    except OSError:
        return False


def kill_mid_point(proc: subprocess.Popen[str], runs: Path, server: str) -> tuple[list[str], list[int]]:
    """Once `server` is ready and its launch's first point is in flight (a completion answered in its
    log), SIGKILL the Ray worker that runs it. Returns studyc's output so far and that worker's vLLM
    processes."""
    lines = wait_for_line(proc, f"server {server}: ready")
    (log,) = runs.glob(f"*/{server.replace('/', '__')}.log")
    deadline = time.monotonic() + 60
    while b"POST /v1/completions" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the point (2 warmup + 8 requests of 128 tokens at c1, seconds) is in flight
    workers = ray_workers(proc.pid)
    assert len(workers) == 2, workers  # both launches' workers at once
    (worker,) = [w for w in workers if any(_logs_to(p, log) for p in engines(w))]
    servers = engines(worker)
    assert servers, "no vLLM server under the Ray worker"
    os.kill(worker, signal.SIGKILL)
    return lines, servers


@pytest.mark.vllm
@pytest.mark.skipif(vllm_missing() is not None or RAY_MISSING is not None,
                    reason=str(vllm_missing() or RAY_MISSING))
def test_quickstart_on_a_local_ray_cluster_survives_a_killed_worker_and_is_scored(tmp_path: Path) -> None:
    """One Ray run: both launches at once, each on its own logical GPU, interference measured; the warm
    launch's worker killed mid-point fails that point only, its other point goes to a fresh worker;
    --resume completes the run, which is scored."""
    study = quickstart(tmp_path)
    db = tmp_path / "q.duckdb"
    env = {"STUDYC_RUNS_DIR": str(tmp_path / "runs")}
    args = ("run", str(study), "--db", str(db), "--no-calibrate", "--gpus", "0,1", "--ray", "--keep-going")
    proc = studyc(*args, env=env)
    lines, killed = kill_mid_point(proc, tmp_path / "runs", "quickstart/warm")
    out, _ = proc.communicate(timeout=400)
    out = "".join(lines) + out
    assert proc.returncode == 1, out  # a failed point: the run is partial
    assert "Ray: 2 GPU(s) in the cluster; 2 launch(es) to run" in out
    assert "Ray worker lost" in out and "remaining point(s) go to a fresh worker" in out
    deadline = time.monotonic() + 15
    while any(alive(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p, _stat(p), _cmdline(p)[:120]) for p in killed if alive(p)]
    assert not left, f"the killed worker's vLLM server was left running: {left}"
    with Store(db, read_only=True) as store:
        run = store.latest_run("quickstart")
        assert run is not None and run.status == "partial"
        rows = {r.point_id: r for r in store.points(run.run_id)}
        assert len(rows) == 4
        cold = [r for pid, r in rows.items() if pid.startswith("quickstart/cold/")]
        assert len(cold) == 2 and all(r.status == "ok" for r in cold)  # committed beside the kill: kept
        lost = rows["quickstart/warm/short/c1/r1"]
        assert lost.status == "failed" and "Ray worker lost" in (lost.error or "")
        assert rows["quickstart/warm/short/c4/r1"].status == "ok"  # the rest went to a fresh worker
        assert rows["quickstart/warm/short/c4/r1"].server_id == "quickstart/warm~2"
        servers = {s.server_id: s for s in store.servers(run.run_id)}
        assert set(servers) == {"quickstart/cold", "quickstart/warm", "quickstart/warm~2"}
        a, b, fresh = servers["quickstart/cold"], servers["quickstart/warm"], servers["quickstart/warm~2"]
        assert a.status == "ready" and b.status == "failed" and "Ray worker lost" in (b.error or "")
        assert fresh.status == "ready" and all(s.stopped_at is not None for s in servers.values())
        # both launches ran at once, each on its own logical GPU from Ray
        assert {a.device, b.device} == {"0", "1"}
        assert a.started_at < b.stopped_at and b.started_at < a.stopped_at
        # interference: the first launch's first point measured twice alone, then once beside the other
        found = json.loads(run.interference_json or "{}")
        assert len(found["alone"]) == 2 and all(x and x > 0 for x in found["alone"]), found
        assert found["beside"] and found["beside"] > 0, found
        assert found["beside_launch"] in {"quickstart/cold", "quickstart/warm"}
        assert found["beside_launch"] != found["point"].rsplit("/", 3)[0], found
        assert isinstance(found["parallel"], bool)
        run_id = run.run_id
    assert f"interference on {found['point']}: " in out
    proc = studyc(*args, "--resume", env=env)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "resuming run" in out
    with Store(db, read_only=True) as store:
        assert len(store.runs()) == 1
        run = store.latest_run("quickstart")
        assert run is not None and run.run_id == run_id and run.status == "complete"
        rows = store.points(run_id)
        assert len(rows) == 4 and all(r.status == "ok" for r in rows), [(r.point_id, r.status) for r in rows]
    audit = subprocess.run([sys.executable, "-m", "studyc", "audit", str(study), "--db", str(db), "--json"],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    verdicts = {h["hypothesis"]: h["verdict"] for h in json.loads(audit.stdout)}
    assert set(verdicts) == {"batching-helps", "cold-means-cold", "kept-cache-hits", "fast-first-token"}
    assert all(v not in ("not run", "no data") for v in verdicts.values()), verdicts


def test_ray_missing_says_how_to_install(tmp_path: Path) -> None:
    """Without Ray, --ray stops before anything starts, naming the extra; the base install never
    imports Ray."""
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    env = os.environ | {"PYTHONPATH": str(fake.parent)}
    out = subprocess.run([sys.executable, "-m", "studyc", "run", "studies/quickstart.toml", "--db",
                          str(tmp_path / "x.duckdb"), "--ray"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0
    assert "pip install 'studyc[ray]'" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert not (tmp_path / "x.duckdb").exists()
    probe = subprocess.run([sys.executable, "-c", "import sys, studyc.cli, runner.execute.run, runner.execute.parallel; "
                            "print('ray' in sys.modules)"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "False", probe.stdout + probe.stderr
