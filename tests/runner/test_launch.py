"""Launches for real on the CPU: an arm with two replicas behind the client's balancer, and two arms
on two logical devices at once with rotating placement; both scored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner.store.store import Store
from tests.conftest import REPO, vllm_missing

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]

HEAD = f'''
[model]
path = "{REPO / "models/tiny-qwen3"}"
name = "tiny-qwen3"

[engine]
max_model_len = 512
max_num_seqs = 4
kv_cache_memory_bytes = "64M"
block_size = 32
enforce_eager = true
distributed_executor_backend = "uni"

[env]
VLLM_ENABLE_V1_MULTIPROCESSING = "0"

[workloads.short]
input_len = 64
output_len = 16

[[hypothesis]]
id = "it-streams"
claim = "The arm streams tokens"
metric = "output_throughput"
where = {{ arm = "a" }}
predict = {{ relation = ">", value = 0 }}
'''


def study(tmp: Path, name: str, body: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(f'[study]\nid = "{name}"\ntitle = "t"\nquestion = "q"\nhardware = "cpu"\n' + HEAD + body)
    return path


def studyc(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "studyc", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def audit(path: Path, db: Path) -> list[dict]:
    out = studyc("audit", str(path), "--db", str(db), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_two_replicas_behind_the_balancer_are_scored(tmp_path: Path) -> None:
    path = study(tmp_path, "pair", '''
[arms.a]
replicas = 2

[load]
concurrency = [2]
requests = 8
warmup = 2
launches = 1
repeats = 2
''')
    db = tmp_path / "r.duckdb"
    out = studyc("run", str(path), "--db", str(db), "--no-calibrate")
    assert out.returncode == 0, out.stdout + out.stderr
    with Store(db) as store:
        run = store.runs()[0]
        servers = store.servers(run.run_id)
        points = store.points(run.run_id)
        checks = store.checks(run.run_id)
    assert sorted(s.server_id for s in servers) == ["pair/a/s1", "pair/a/s2"]
    assert {s.launch_id for s in servers} == {"pair/a"} and all(s.status == "ready" for s in servers)
    assert len(points) == 2  # the second repeat re-sends the first one's prompts to both replicas
    for point in points:
        rows = json.loads(point.replicas_json or "[]")
        assert [r["server_id"] for r in rows] == ["pair/a/s1", "pair/a/s2"]
        assert all(r["client"]["sent"] > 0 for r in rows)  # both replicas received requests
        assert sum(r["server"]["requests"] for r in rows) == 8
        # tiny points may fail other checks (Little's law); the message names the item that did not pass
        assert "reconciliation" not in (point.verdict or ""), [(c.name, c.status, c.detail) for c in checks
                                                               if "reconciliation" in c.name and c.status != "pass"]
    for name in ("replica_reconciliation", "reconciliation", "cache_cold"):  # every replica's cache was reset
        assert [c.status for c in checks if c.name == name] == ["pass", "pass"], name
    (row,) = audit(path, db)
    assert row["verdict"] not in ("not run", "no data")


def test_two_arms_on_two_logical_devices_run_at_once_and_rotate(tmp_path: Path) -> None:
    """Block 3 is a budget block: the rule is asked once both required blocks were committed (it
    finds the hypothesis decided), not before the slots start."""
    path = study(tmp_path, "duo", '''
[arms.a]
[arms.b]
args = { max_num_seqs = 2 }

[design]
budget = { blocks = 3, minutes = 30 }

[load]
concurrency = [1]
requests = 4
warmup = 1
launches = 2
repeats = 1
''')
    db = tmp_path / "d.duckdb"
    out = studyc("run", str(path), "--db", str(db), "--no-calibrate", "--gpus", "0,1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "interference on duo/a" in out.stdout or "interference on duo/b" in out.stdout
    asked = out.stderr.index("block 3: ")  # the rule's answer, after every required launch stopped
    assert all(out.stderr.index(f"server duo/{arm}/L{n}: stopped") < asked for arm in "ab" for n in (1, 2))
    with Store(db) as store:
        run = store.runs()[0]
        servers = {s.server_id: s for s in store.servers(run.run_id)}
        points = store.points(run.run_id)
        segments, phases = store.timing(run.run_id)
    assert run.devices == "0,1" and run.wall_s and run.window_s and run.wall_s > run.window_s
    # two slots at once: the phases add up to the wall x 2, and every launch's start and stop is there
    assert [(s.ended, s.slots) for s in segments] == [("complete", 2)] and run.wall_s == segments[0].wall_s
    assert sum(p.seconds for p in phases) == pytest.approx(2 * run.wall_s, abs=0.01)
    assert all(p.seconds >= 0 for p in phases)  # the gap too: two slots never hold more than 2 x wall
    launched = {s.launch_id for s in servers.values()}
    assert {"duo/a/L1", "duo/a/L2", "duo/b/L1", "duo/b/L2"} <= launched
    assert {p.launch_id for p in phases if p.phase == "stop"} == launched
    assert {p.launch_id for p in phases if p.phase.startswith("start")} == launched
    found = json.loads(run.interference_json or "{}")
    assert found["rule"] and len(found["alone"]) == 2 and isinstance(found["parallel"], bool)
    budget = [s for sid, s in servers.items() if sid.endswith("/L3")]
    required_end = max(s.stopped_at for sid, s in servers.items() if not sid.endswith("/L3"))
    assert all(s.started_at > required_end for s in budget)
    block1 = [s for sid, s in servers.items() if sid.endswith("/L1")]
    assert len(block1) == 2
    first, second = sorted(block1, key=lambda s: s.started_at)
    assert first.stopped_at is not None and second.started_at < first.stopped_at  # lifetimes overlap
    device = {sid: s.device for sid, s in servers.items()}
    assert device["duo/a/L1"] != device["duo/a/L2"] and device["duo/b/L1"] != device["duo/b/L2"]
    assert device["duo/a/L1"] != device["duo/b/L1"]
    assert {p.device for p in points} == {"0", "1"} and all(p.status == "ok" for p in points)
    assert len(points) == 4 + len(budget)
    (row,) = audit(path, db)
    assert row["verdict"] not in ("not run", "no data")
