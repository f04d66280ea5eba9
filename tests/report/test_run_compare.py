"""Which runs a verdict reads: only complete runs are published; every run of a study is listed beside the
published one with its study version and a Welch test of its estimates; a block split across hosts is left
out of the pairing. Real DuckDB files, written through the store; the committed H200 results on a copy."""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from compiler.load import load_study, study_version
from compiler.plan_compile import compile_study
from report import run_compare
from report.audit import audit_studies, markdown_table
from report.results import all_runs, latest_runs, read_run
from report.run_compare import compare_runs, welch
from report.scoring.context import build_context
from report.scoring.score_model import Why
from report.scoring.scoring import score
from runner.store.records import PointRecord, PointSummary, RunRecord, ServerRecord
from runner.store.store import Store
from tests.conftest import committed_copy
from tests.report.helpers import REPO, write_study

HYP = '''
[[hypothesis]]
id = "same"
claim = "a and b give the same c1 throughput"
metric = "output_throughput"
where = { concurrency = 1 }
predict = { ratio = ["b", "a"], value = 1.0, tolerance = 0.05 }
'''
RESULTS = REPO / "results"


def test_welch_against_a_table_value() -> None:
    """Equal sizes and spreads: df = 2(n - 1) = 10; t = 2 there is two-sided p = 0.0734 (t tables)."""
    a = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    shift = 2.0 * math.sqrt(2 * 3.5 / 6)
    w = welch(a, [x + shift for x in a])
    assert w is not None and w.t == pytest.approx(-2.0) and w.df == pytest.approx(10.0)
    assert w.p == pytest.approx(0.0734, abs=5e-4)
    assert welch([1.0], [1.0, 2.0]) is None and welch([1.0, 1.0], [2.0, 2.0]) is None
    assert welch([1.0, 1.0], [1.0, 3.0]) is not None  # one side without spread still tests


def _study(tmp: Path) -> Path:
    path = write_study(tmp, HYP, hardware="h200")
    text = path.read_text().replace("repeats = 3", "repeats = 1\nlaunches = 3").replace('cache = "keep"\n', "")
    path.write_text(text)
    return path


def _run(db: Path, study: Path, run_id: str, ratio: list[float], *, status: str = "complete", day: int = 1,
         gpu: str = "NVIDIA H200", hosts: dict[int, str] | None = None) -> None:
    """One run of the toy study: b/a = ratio[block - 1] at c1; `hosts`: block -> arm b's machine id."""
    plan = compile_study(load_study(study))
    raw = study.read_bytes()
    with Store(db) as store:
        store.save_run(RunRecord(run_id, "toy", study_path=str(study), study_sha256=hashlib.sha256(raw).hexdigest(),
                                 study_toml_sha256=study_version(raw.decode()), plan_json=plan.to_json(),
                                 status=status, gpu_name=gpu, vllm_version="0.26.0", calibrated=True,
                                 started_at=datetime(2026, 1, day)))
        for launch in plan.launches:
            host = (hosts or {}).get(launch.block, "m1") if launch.arm == "b" else "m1"
            store.record_server(ServerRecord(run_id, launch.id, arm=launch.arm, launch_id=launch.id,
                                             machine_id=host, status="ready"))
            for p in launch.points:
                scale = ratio[launch.block - 1] if p.arm == "b" else 1.0
                store.commit_point(PointRecord(
                    run_id, p.id, server_id=launch.id, arm=p.arm, workload=p.workload, concurrency=p.concurrency,
                    repeat=p.repeat, valid=True, summary=PointSummary(output_throughput=100.0 * scale
                                                                      * (1 + 0.001 * launch.block))), [], [], [])


def test_only_complete_runs_are_published(tmp_path: Path) -> None:
    study, db = _study(tmp_path), tmp_path / "r.duckdb"
    _run(db, study, "old", [1.0, 1.01, 0.99], day=1)
    _run(db, study, "new", [1.0, 1.01, 0.99], day=2, status="partial")
    assert latest_runs([db])["toy"].run_id == "old"
    assert [r.run_id for _, r in all_runs([db])["toy"]] == ["old", "new"]
    _run(db, study, "newer", [1.0, 1.01, 0.99], day=3)
    assert latest_runs([db])["toy"].run_id == "newer"
    result = audit_studies([load_study(study)], [db])
    lines = "\n".join(result.compared["toy"].lines())
    assert "run new (for reference): partial: not scored" in lines
    assert "new partial, not scored" in markdown_table(result)


def test_runs_that_differ_are_flagged_and_the_latest_decides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study, db = _study(tmp_path), tmp_path / "r.duckdb"
    _run(db, study, "first", [0.98, 0.981, 0.979], day=1)
    _run(db, study, "second", [1.0, 1.002, 0.998], day=2)
    loaded = load_study(study)
    result = audit_studies([loaded], [db])
    compared = result.compared["toy"]
    assert compared.published == "second" and [s.run_id for s in result.scores] == ["second"]
    first = compared.runs[0]
    assert first.comparable and not first.published and first.current
    (run_id, w), = compared.differ("same")
    assert run_id == "first" and w.p < 0.05
    assert f"toy/same: runs differ ({run_compare.p_text(w.p)})" in "\n".join(compared.lines())
    assert "runs differ on same" in markdown_table(result)
    # The flag's edge: p exactly at the threshold does not flag, just above it does.
    monkeypatch.setattr(run_compare, "DIFFER_P", w.p)
    assert compared.differ("same") == []
    monkeypatch.setattr(run_compare, "DIFFER_P", math.nextafter(w.p, 1.0))
    assert len(compared.differ("same")) == 1
    # Another GPU, or another version of the study file: listed, never flagged.
    monkeypatch.setattr(run_compare, "DIFFER_P", 0.05)
    other = tmp_path / "o.duckdb"
    _run(other, study, "first", [0.98, 0.981, 0.979], day=1, gpu="NVIDIA H100")
    _run(other, study, "second", [1.0, 1.002, 0.998], day=2)
    assert audit_studies([loaded], [other]).compared["toy"].differ("same") == []
    # The file edited after both ran: they still measured one version (so still compared), not the current one.
    study.write_text(study.read_text().replace("tolerance = 0.05", "tolerance = 0.04"))
    edited = audit_studies([load_study(study)], [db]).compared["toy"]
    assert len(edited.differ("same")) == 1 and not any(r.current for r in edited.runs)
    assert "not the current file" in edited.runs[1].describe()
    # A run of the edited file beside one of the old: listed, not compared.
    _run(db, study, "third", [1.0, 1.002, 0.998], day=3)
    versions = audit_studies([load_study(study)], [db]).compared["toy"]
    assert versions.differ("same") == [] and [r.current for r in versions.runs] == [False, False, True]


def test_a_comment_edit_keeps_the_version_current(tmp_path: Path) -> None:
    study, db = _study(tmp_path), tmp_path / "r.duckdb"
    _run(db, study, "only", [1.0, 1.0, 1.0])
    study.write_text("# a comment\n" + study.read_text())
    (run,) = compare_runs(load_study(study), all_runs([db])["toy"], latest_runs([db])["toy"]).runs
    assert run.current and run.published and run.version.startswith("TOML sha256 ")
    assert run_compare.is_current(replace(run.run, study_toml_sha256=None), load_study(study), "x") is False


def test_a_block_split_across_hosts_is_left_out_of_the_pairing(tmp_path: Path) -> None:
    study, db = _study(tmp_path), tmp_path / "r.duckdb"
    _run(db, study, "split", [1.0, 1.5, 1.0], hosts={2: "m2"})
    _run(db, study, "whole", [1.0, 1.5, 1.0], day=2)
    loaded = load_study(study)
    split = score(build_context(loaded, read_run(db, "split")))[0]
    whole = score(build_context(loaded, read_run(db, "whole")))[0]
    assert whole.n == 3 and not whole.has(Why.SPLIT_HOSTS)
    assert split.n == 2 and split.measured == pytest.approx(1.0, rel=1e-2)
    left = [r for r in split.reasons if r.why is Why.SPLIT_HOSTS]
    assert len(left) == 2 and all("block 2 ran on 2 hosts: m1; m2" in r.text for r in left)
    assert not split.has(Why.NOT_EXCHANGEABLE)


def test_hosts_not_recorded_are_told_apart_by_resumed_sessions(tmp_path: Path) -> None:
    study, db = _study(tmp_path), tmp_path / "r.duckdb"
    _run(db, study, "r", [1.0, 1.0, 1.0])
    data = read_run(db, "r")
    t0 = datetime(2026, 1, 1, 12)
    servers = tuple(replace(s, machine_id=None, started_at=t0 + timedelta(hours=2 * i))
                    for i, s in enumerate(sorted(data.servers, key=lambda s: s.server_id)))
    notes = "x; resumed on vm at 2026-01-01T15:00:00Z"
    resumed = replace(data, run=replace(data.run, notes=notes), servers=servers)
    hosts = resumed.hosts
    assert hosts[servers[0].server_id] == "session 1 of 2 (host not recorded)"
    assert hosts[servers[1].server_id] == "session 1 of 2 (host not recorded)"  # 14:00, before the resume
    assert hosts[servers[2].server_id] == "session 2 of 2 (host not recorded)"  # 16:00
    plain = replace(data, servers=servers)
    assert set(plain.hosts.values()) == {"host not recorded"}


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("committed")
    for name in ("h200", "cpu-replicas"):
        committed_copy(name, folder / f"{name}.duckdb")
    return folder


def test_the_committed_fp8_kv_runs_are_shown_side_by_side(committed: Path) -> None:
    """fp8-kv's interrupted run of 2026-12-01 (c8 0.982) is listed beside the published one, not scored;
    the published run's block 11 ran across a resume and is left out."""
    result = audit_studies([load_study(REPO / "studies/fp8_kv.toml")], [committed / "h200.duckdb"])
    compared = result.compared["fp8-kv"]
    assert compared.published == "20261202T152456-8d4fc8"
    earlier = next(r for r in compared.runs if r.run.run_id == "20261201T111139-6ca602")
    assert earlier.status == "running" and not earlier.comparable and not earlier.published
    c8 = next(s for s in earlier.scores if s.hypothesis == "neutral-at-c8")
    assert c8.measured == pytest.approx(0.982, abs=5e-4) and c8.n == 6
    lines = "\n".join(compared.lines())
    assert "run 20261201T111139-6ca602 (for reference): running: not scored" in lines
    assert "20261201T111139 neutral-at-c8: 0.982x" in lines
    published = {s.hypothesis: s for s in result.scores}
    assert any("block 11 ran on 2 hosts" in r.text for r in published["neutral-at-c8"].reasons
               if r.why is Why.SPLIT_HOSTS)


def test_the_committed_replicas_rehearsal_still_audits(committed: Path) -> None:
    result = audit_studies([load_study(REPO / "studies/replicas_4v8_cpu.toml")], [committed / "cpu-replicas.duckdb"])
    assert result.scores and result.compared["replicas-4v8-cpu"].lines() == []  # one run: nothing beside it
