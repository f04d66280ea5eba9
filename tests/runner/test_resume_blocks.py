"""`--resume` by whole blocks against a real DuckDB file and a compiled plan: a block with points still to
run whose measured points ran on another host (or on one not recorded) is set aside and run again whole;
one measured on this host continues; a block measured whole stays, wherever it ran. The host id itself."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from compiler.load import load_study, study_version
from compiler.plan import Plan
from compiler.plan_compile import compile_study
from runner.execute.resume import rerun_whole_blocks, split_blocks
from runner.measure.host import MACHINE_ID_ENV, host_identity, machine_id
from runner.store.records import (
    CheckResult,
    PointRecord,
    PointSummary,
    RequestRecord,
    RunRecord,
    ServerRecord,
)
from runner.store.store import Store
from tests.report.helpers import TINY_MODEL

STUDY = '''
[study]
id = "toy"
title = "Toy"
question = "Do blocks stay on one host?"
hardware = "cpu"

[model]
path = "@MODEL@"

[engine]
max_model_len = 2048

[arms.a]
description = "arm a"

[arms.b]
description = "arm b"

[workloads.w]
input_len = 64
output_len = 16

[load]
concurrency = [1, 2]
requests = 4
warmup = 1
launches = 2
repeats = 1

[[hypothesis]]
id = "same"
claim = "a and b give the same throughput"
metric = "output_throughput"
where = { concurrency = 1 }
predict = { ratio = ["b", "a"], value = 1.0, tolerance = 0.02 }
'''


def _plan(tmp: Path) -> Plan:
    study = tmp / "toy.toml"
    study.write_text(STUDY.replace("@MODEL@", str(TINY_MODEL)))
    return compile_study(load_study(study))


def _store(tmp: Path, plan: Plan, measured: dict[int, dict[str, str | None]]) -> Path:
    """A run whose launches of `measured` (block -> arm -> the machine id its server recorded) are done."""
    db = tmp / "runs.duckdb"
    with Store(db) as store:
        store.save_run(RunRecord("r1", plan.study_id, plan_json=plan.to_json(), started_at=datetime(2026, 1, 1)))
        for launch in plan.launches:
            host = measured.get(launch.block, {}).get(launch.arm, "skip")
            if host == "skip":
                continue
            store.record_server(ServerRecord("r1", launch.id, arm=launch.arm, launch_id=launch.id, machine_id=host))
            for p in launch.points:
                store.commit_point(
                    PointRecord("r1", p.id, server_id=launch.id, arm=p.arm, fingerprint=p.fingerprint, valid=True,
                                summary=PointSummary(output_throughput=100.0)),
                    [RequestRecord(0, False, 0.0, 0.0, 0.1, 1.0, (0.5,), 8, 8, 1, True, None, 200)],
                    [CheckResult(p.id, "errors", True, "fail", 0.0, 0.0, "")], [])
    return db


def test_a_block_measured_elsewhere_is_set_aside_and_run_again_whole(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    db = _store(tmp_path, plan, {1: {"a": "A", "b": "A"}, 2: {"a": "A"}})
    block2 = [p.id for launch in plan.launches if launch.block == 2 for p in launch.points]
    with Store(db) as store:
        done = store.done_points("r1")
        assert [r.block for r in split_blocks(store, "r1", plan, done, "A")] == []  # same host: continue
        found = split_blocks(store, "r1", plan, done, "B")
        assert [(r.block, r.hosts) for r in found] == [(2, ("A",))]
        kept, messages = rerun_whole_blocks(store, "r1", plan, dict(done), "B")
        assert "block 2 run again whole on B" in messages[0] and len(messages) == 1
        measured_a = [p for p in block2 if p in done]
        assert measured_a and not set(measured_a) & set(kept)  # run again
        assert set(kept) == set(done) - set(measured_a)  # block 1 (complete on A) stays
        rows = {p.point_id: p for p in store.points("r1")}
        for pid in measured_a:
            aside = rows[f"{pid}#aside1"]
            assert pid not in rows and aside.set_aside and "ran on A" in aside.set_aside
            assert store.request_records("r1", f"{pid}#aside1") and not store.request_records("r1", pid)
            assert {c.point_id for c in store.checks("r1")} >= {f"{pid}#aside1"}
        assert store.done_points("r1").keys() == kept.keys()


def test_set_aside_twice_keeps_both(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    db = _store(tmp_path, plan, {1: {"a": "A", "b": "A"}})
    pid = plan.launches[0].points[0].id
    with Store(db) as store:
        store.set_aside("r1", [pid], "first")
        store.commit_point(PointRecord("r1", pid, server_id="x", valid=True), [], [], [])
        store.set_aside("r1", [pid], "second")
        rows = {p.point_id: p.set_aside for p in store.points("r1")}
    assert rows[f"{pid}#aside1"] == "first" and rows[f"{pid}#aside2"] == "second" and pid not in rows


@pytest.mark.parametrize(("measured", "here", "blocks"), [
    ({1: {"a": "A", "b": "B"}}, "C", []),  # measured whole: stays, even split (the report leaves it out)
    ({1: {"a": "A", "b": "A"}, 2: {"a": None}}, "A", [2]),  # a host not recorded is not this one
    ({1: {"a": "A", "b": "A"}, 2: {"a": "A"}}, "A", []),
    ({1: {"a": "A", "b": "A"}, 2: {"b": "B"}}, "A", [2]),
    ({1: {"a": "A"}, 2: {"a": "B", "b": "B"}}, "B", [1]),
    ({}, "A", []),  # nothing measured
])
def test_which_blocks_run_again(tmp_path: Path, measured: dict[int, dict[str, str | None]], here: str,
                                blocks: list[int]) -> None:
    plan = _plan(tmp_path)
    db = _store(tmp_path, plan, measured)
    with Store(db) as store:
        assert [r.block for r in split_blocks(store, "r1", plan, store.done_points("r1"), here)] == blocks


def test_machine_id_env_file_and_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MACHINE_ID_ENV, " moved ")
    assert machine_id([tmp_path / "none"]) == "moved"
    monkeypatch.delenv(MACHINE_ID_ENV)
    empty, real = tmp_path / "empty", tmp_path / "id"
    empty.write_text("\n")
    real.write_text("abc123\n")
    assert machine_id([tmp_path / "none", empty, real]) == "abc123"
    assert machine_id([empty], gpu_uuid=lambda: None).startswith("host:")
    # a lent GPU machine has no machine-id file and is named "vm" like every other: its GPU names it
    assert machine_id([empty], gpu_uuid=lambda: "GPU-6d50832c") == "gpu:GPU-6d50832c"
    assert machine_id([real], gpu_uuid=lambda: "GPU-6d50832c") == "abc123"
    here = host_identity(("0",), gpu_host=False)
    assert here.gpu_uuid is None and here.gpu_serial is None and here.hostname


def test_study_version_ignores_comments_and_layout_not_values() -> None:
    a = 'x = 1\n[t]\ny = "z"\n'
    assert study_version(a) == study_version('# note\nx   = 1\n\n[t]\ny = "z" # c\n')
    assert study_version(a) != study_version(a.replace("1", "2"))
    assert study_version("x = ") is None


def test_a_block_whose_host_was_not_recorded_says_so(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    db = _store(tmp_path, plan, {1: {"a": "A", "b": "A"}, 2: {"a": None}})
    measured = [p.id for launch in plan.launches if (launch.block, launch.arm) == (2, "a") for p in launch.points]
    with Store(db) as store:
        (rerun,) = split_blocks(store, "r1", plan, store.done_points("r1"), "A")
        assert (rerun.block, rerun.hosts, rerun.point_ids) == (2, ("not recorded",), tuple(sorted(measured)))
        _, messages = rerun_whole_blocks(store, "r1", plan, dict(store.done_points("r1")), "A")
    assert messages == [f"block 2 run again whole on A by --resume: these ran on not recorded "
                        f"({len(measured)} points kept, set aside)"]


def test_replicas_points_find_their_host_through_the_launch(tmp_path: Path) -> None:
    """A launch of replicas stores a server per replica (its own id, the launch's id beside it); the points
    name the launch. Measured on A, resumed on A, the block continues; resumed on B, it runs again."""
    plan = _plan(tmp_path)
    db = tmp_path / "replicas.duckdb"
    first = [launch for launch in plan.launches if launch.block == 1][0]
    with Store(db) as store:
        store.save_run(RunRecord("r1", plan.study_id, plan_json=plan.to_json(), started_at=datetime(2026, 1, 1)))
        for replica in (1, 2):
            store.record_server(ServerRecord("r1", f"{first.id}/r{replica}", arm=first.arm, launch_id=first.id,
                                             machine_id="A"))
        p = first.points[0]
        store.commit_point(PointRecord("r1", p.id, server_id=first.id, arm=p.arm, fingerprint=p.fingerprint,
                                       valid=True, summary=PointSummary(output_throughput=1.0)), [], [], [])
        done = store.done_points("r1")
        assert split_blocks(store, "r1", plan, done, "A") == []
        assert [(r.block, r.hosts) for r in split_blocks(store, "r1", plan, done, "B")] == [(1, ("A",))]
