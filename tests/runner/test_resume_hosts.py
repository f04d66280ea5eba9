"""`--resume` by whole blocks against a real CPU vLLM server: a two-arm study of two blocks is stopped
between the arms of block 2, then resumed "on another host" (another STUDYC_MACHINE_ID): block 2 runs again
whole there and its first arm's earlier points are kept, set aside. Resumed on the same host it continues
with the missing arm; a block split across hosts in such a run is left out of the pairing, with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from compiler.load import load_study
from compiler.plan_compile import compile_study
from report.results import read_run
from report.scoring.context import build_context
from report.scoring.score_model import Why
from report.scoring.scoring import score
from report.scoring.sides import split_blocks
from report.stats.intervals import layout
from runner.measure.host import MACHINE_ID_ENV
from runner.store.store import Store
from tests.conftest import REPO, vllm_missing
from tests.runner.test_run import studyc, wait_for_line

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]

STUDY = """
[study]
id = "hosts"
title = "Blocks stay on one host"
question = "Does --resume keep a block's arms on one host?"
hardware = "cpu"

[model]
path = "@MODEL@"

[engine]
max_model_len = 2048
max_num_seqs = 16
kv_cache_memory_bytes = "256M"
block_size = 32
enforce_eager = true
distributed_executor_backend = "uni"

[env]
VLLM_ENABLE_V1_MULTIPROCESSING = "0"

[arms.a]
description = "arm a"

[arms.b]
description = "arm b, the same server"

[workloads.short]
input_len = 64
output_len = 16

[load]
concurrency = [1]
requests = 4
warmup = 1
launches = 2
repeats = 1
cache = "reset"

[[hypothesis]]
id = "same"
claim = "the arms are the same server"
metric = "output_throughput"
predict = { ratio = ["b", "a"], value = 1.0, tolerance = 0.5 }
"""


def _resume(study: Path, db: Path, host: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(MACHINE_ID_ENV, host)
    proc = studyc("run", str(study), "--db", str(db), "--resume", "--no-calibrate", "--underpowered")
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out
    return out


def test_resume_on_another_host_runs_the_block_again_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study = tmp_path / "hosts.toml"
    study.write_text(STUDY.replace("@MODEL@", str(REPO / "models/tiny-qwen3")))
    plan = compile_study(load_study(study))
    order = sorted(plan.launches, key=lambda launch: (launch.block, launch.order))
    assert [launch.block for launch in order] == [1, 1, 2, 2]
    first, last = order[2], order[3]  # block 2's arms, in the order they run
    db = tmp_path / "a.duckdb"
    monkeypatch.setenv(MACHINE_ID_ENV, "host-A")
    proc = studyc("run", str(study), "--db", str(db), "--no-calibrate", "--underpowered", start_new_session=True)
    wait_for_line(proc, f"server {last.id}: starting", timeout_s=400)  # block 2's first arm is committed
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    with Store(db, read_only=True) as store:
        (run,) = store.runs()
        measured = {p.point_id for p in store.points(run.run_id)}
    assert measured == {p.id for launch in order[:3] for p in launch.points}
    same_db = tmp_path / "same.duckdb"
    shutil.copyfile(db, same_db)

    # Another host: block 2 again whole there; block 1 stays; the earlier block-2 points are set aside.
    out = _resume(study, db, "host-B", monkeypatch)
    assert "block 2 run again whole on host-B by --resume: these ran on host-A" in out
    with Store(db, read_only=True) as store:
        assert store.run(run.run_id).status == "complete"  # type: ignore[union-attr]
        points = store.points(run.run_id)
        servers = {s.server_id: s for s in store.servers(run.run_id)}
    current = {p.point_id: p for p in points if p.set_aside is None}
    aside = [p for p in points if p.set_aside is not None]
    assert current.keys() == {p.id for p in plan.points}
    assert sorted(p.point_id for p in aside) == sorted(f"{p.id}#aside1" for p in first.points)
    assert all("ran on host-A" in (p.set_aside or "") for p in aside)
    host_of = {pid: servers[p.server_id or ""].machine_id for pid, p in current.items()}
    assert {host_of[p.id] for launch in order[:2] for p in launch.points} == {"host-A"}
    assert {host_of[p.id] for launch in order[2:] for p in launch.points} == {"host-B"}
    assert current[first.points[0].id].server_id == f"{first.id}~2"  # a new start of the launch
    data = read_run(db, run.run_id)
    assert split_blocks(data, layout(data.plan)) == {}
    (s,) = score(build_context(load_study(study), data))
    assert s.n == 2 and not s.has(Why.SPLIT_HOSTS) and not any("#aside" in i for i in s.point_ids)

    # The same host: it continues with block 2's missing arm, nothing set aside.
    out = _resume(study, same_db, "host-A", monkeypatch)
    assert "run again whole" not in out
    with Store(same_db) as store:
        points = store.points(run.run_id)
        assert all(p.set_aside is None for p in points) and len(points) == len(plan.points)
        # the stopped start of block 2's last arm keeps its row: its points name a new one
        assert {p.server_id for p in points} == {launch.id for launch in order[:3]} | {f"{last.id}~2"}
        # As a run resumed before hosts were recorded could be: block 2's last arm on another host.
        store.con.execute("UPDATE servers SET machine_id = 'host-C' WHERE run_id = ? AND server_id = ?",
                          [run.run_id, f"{last.id}~2"])
    data = read_run(same_db, run.run_id)
    assert split_blocks(data, layout(data.plan)) == {2: "split across hosts: block 2 ran on 2 hosts: host-A; host-C"}
    (s,) = score(build_context(load_study(study), data))
    left = [r for r in s.reasons if r.why is Why.SPLIT_HOSTS]
    assert s.n == 1 and len(left) == 2 and all(re.search(r"block 2 ran on 2 hosts", r.text) for r in left)
