"""`studyc recheck` on a real DuckDB file: points are re-judged from their stored records with
today's checks, and a verdict changes where a check became stricter."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path

from compiler.load import load_study
from compiler.plan_compile import compile_study
from runner.checks.cache import CacheState
from runner.checks.checks import verdict_reason
from runner.checks.judge import ServerSide, judge
from runner.checks.recheck import recheck
from runner.execute import replicas
from runner.measure import prometheus
from runner.store.records import CheckResult, PointRecord, RequestRecord, RunRecord
from runner.store.store import Store
from tests.conftest import committed_copy
from tests.report.helpers import write_study
from tests.runner.counters import edges


def _records(n: int, out: int) -> list[RequestRecord]:
    recs = []
    for i in range(n):  # a closed loop at c4: each wave sent when the one before ended
        t = (i // 4) * (0.1 + (out - 1) * 0.1)
        times = tuple(t + 0.1 + k * 0.1 for k in range(out))
        recs.append(RequestRecord(i, False, t, t, t + 0.1, t + 0.1 + (out - 1) * 0.1, times, 128, out, out, True,
                                  None, 200))
    return recs


def _db(tmp: Path, queries: float, counters: bool = True, replica_rows: list[dict] | None = None) -> tuple[Path, str]:
    plan = compile_study(load_study(write_study(tmp, "")))
    step = next(p for p in plan.points if p.cache == "reset" and p.concurrency == 4)
    records = _records(step.requests, step.output_len)
    before, after = edges(records, queries=queries)
    side = ServerSide(cache=CacheState(True, queries, 0.0), before=before, after=after)
    judged = judge(step, records, side, thresholds=plan.checks, client_ceiling_chunks_per_s=None)
    if replica_rows is not None:  # what the point runner adds when the launch has replicas
        judged = replicas.with_check(judged, replicas.replica_check(step.id, replica_rows))
    checks = list(judged.checks)
    valid = judged.valid
    if queries == 0 or not counters:  # what the old checks stored: no reconciliation, zero queries passed as cold
        checks = [dataclasses.replace(c, passed=True, status=None) if c.name == "cache_cold" else c
                  for c in checks if c.name != "reconciliation"]
        valid = all(c.passed for c in checks if c.severity == "fail")
    db = tmp / "r.duckdb"
    with Store(db) as s:
        s.save_run(RunRecord("run-1", plan.study_id, plan_json=plan.to_json(), started_at=datetime(2025, 1, 1)))
        point = PointRecord("run-1", step.id, arm=step.arm, workload=step.workload, concurrency=step.concurrency,
                            repeat=step.repeat, status="ok", cache_policy=step.cache, reset_ok=True,
                            summary=judged.summary, valid=valid, flagged=judged.flagged,
                            verdict=verdict_reason(checks),
                            counters_before_json=prometheus.edge_json(before) if counters else None,
                            counters_after_json=prometheus.edge_json(after) if counters else None,
                            replicas_json=None if replica_rows is None else replicas.replicas_json(replica_rows))
        s.commit_point(point, records, checks, [])
    return db, step.id


def test_recheck_keeps_what_the_records_say(tmp_path: Path) -> None:
    db, pid = _db(tmp_path, queries=100.0)
    with Store(db, read_only=True) as s:
        before = (s.points("run-1"), s.checks("run-1"))
    report = recheck(db)
    assert (report.points, report.changed, report.details) == (1, 0, [])
    with Store(db, read_only=True) as s:
        assert (s.points("run-1"), s.checks("run-1")) == before
        assert "checks recomputed" in (s.run("run-1").notes or "")  # type: ignore[union-attr]


def test_recheck_changes_the_verdict_of_a_stricter_check(tmp_path: Path) -> None:
    db, pid = _db(tmp_path, queries=0.0)
    with Store(db, read_only=True) as s:
        assert s.points("run-1")[0].valid
    report = recheck(db)
    assert report.changed == 1 and report.details[0].startswith(f"run-1 {pid}: ") and "cache_cold" in report.details[0]
    with Store(db, read_only=True) as s:
        point = s.points("run-1")[0]
        cold = next(c for c in s.checks("run-1") if c.name == "cache_cold")
    assert not point.valid and not cold.passed and "cannot verify" in cold.detail and cold.status == "unverified"
    assert point.verdict == "unverified: cache_cold"
    assert recheck(db).changed == 0  # idempotent


def test_recheck_marks_points_without_edge_counters_unverified(tmp_path: Path) -> None:
    db, pid = _db(tmp_path, queries=100.0, counters=False)
    with Store(db, read_only=True) as s:
        assert s.points("run-1")[0].valid
    report = recheck(db)
    assert report.changed == 1 and "reconciliation" in report.details[0]
    with Store(db, read_only=True) as s:
        point = s.points("run-1")[0]
        rec = next(c for c in s.checks("run-1") if c.name == "reconciliation")
    assert not point.valid and point.verdict == "unverified: reconciliation"
    assert rec.status == "unverified" and "no server counters" in rec.detail


def test_recheck_restores_tampered_checks(tmp_path: Path) -> None:
    db, pid = _db(tmp_path, queries=100.0)
    with Store(db) as s:
        point = s.points("run-1")[0]
        s.replace_judgement(dataclasses.replace(point, valid=False),
                            [CheckResult(pid, "littles_law", False, "fail", 1.0, 0.03, "tampered")])
    report = recheck(db)
    assert report.changed == 1
    with Store(db, read_only=True) as s:
        assert s.points("run-1")[0].valid
        assert {c.name for c in s.checks("run-1")} >= {"littles_law", "errors", "output_exact", "cache_cold"}


def _rows(records: int, tokens: int, server_requests: float) -> list[dict]:
    """Two replicas, each sent half the point's requests; the second's counters say `server_requests`."""
    half = records // 2
    row = {"client": {"requests": half, "sent": half, "prompt_tokens": 128 * half, "generation_tokens": tokens * half},
           "server": {"requests": float(half), "prompt_tokens": 128.0 * half, "generation_tokens": float(tokens * half)},
           "failed": 0}
    other = {**row, "server": {**row["server"], "requests": server_requests}}
    return [{"server_id": "s0", **row}, {"server_id": "s1", **other}]


def test_recheck_keeps_the_per_replica_reconciliation(tmp_path: Path) -> None:
    plan = compile_study(load_study(write_study(tmp_path, "")))
    step = next(p for p in plan.points if p.cache == "reset" and p.concurrency == 4)
    db, pid = _db(tmp_path, queries=100.0, replica_rows=_rows(step.requests, step.output_len, step.requests // 2))
    report = recheck(db)
    assert (report.changed, report.details) == (0, [])
    with Store(db, read_only=True) as s:
        kept = next(c for c in s.checks("run-1") if c.name == "replica_reconciliation")
        assert kept.status == "pass" and "s0:" in kept.detail and s.points("run-1")[0].valid


def test_recheck_recomputes_the_per_replica_reconciliation(tmp_path: Path) -> None:
    """Stored rows where one replica's server counted a request its client did not send: the stored
    check passed (tampered); recheck finds the difference from replicas_json."""
    plan = compile_study(load_study(write_study(tmp_path, "")))
    step = next(p for p in plan.points if p.cache == "reset" and p.concurrency == 4)
    rows = _rows(step.requests, step.output_len, step.requests // 2 + 1)
    db, pid = _db(tmp_path, queries=100.0, replica_rows=rows)
    with Store(db) as s:  # the stored verdict said valid
        point = s.points("run-1")[0]
        checks = [dataclasses.replace(c, passed=True, status="pass") if c.name == "replica_reconciliation" else c
                  for c in s.checks("run-1")]
        s.replace_judgement(dataclasses.replace(point, valid=True, verdict="valid"), checks)
    report = recheck(db)
    assert report.changed == 1 and "replica_reconciliation" in report.details[0]
    with Store(db, read_only=True) as s:
        got = next(c for c in s.checks("run-1") if c.name == "replica_reconciliation")
        point = s.points("run-1")[0]
    assert got.status == "fail" and "s1 requests" in got.detail and not point.valid
    assert point.verdict == "invalid: replica_reconciliation"


def test_a_trace_point_whose_trace_is_gone_keeps_its_stored_checks(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text((Path(__file__).parents[2] / "studies/traces/mini_mooncake.jsonl").read_text())
    study = write_study(tmp_path, "")
    study.write_text(study.read_text().replace("input_len = 128\noutput_len = 32", 'trace = "t.jsonl"'))
    plan = compile_study(load_study(study))
    step = next(p for p in plan.points if p.shape is not None)
    stored = [CheckResult(step.id, "output_exact", True, "fail", 0.0, 0.0, "as judged when measured")]
    db = tmp_path / "r.duckdb"
    with Store(db) as s:
        s.save_run(RunRecord("run-1", plan.study_id, plan_json=plan.to_json(), started_at=datetime(2025, 1, 1)))
        s.commit_point(PointRecord("run-1", step.id, arm=step.arm, status="ok", valid=True), _records(4, 8), stored, [])
    trace.unlink()  # its requests can no longer be known: the point is not judged again against the classic shape
    report = recheck(db)
    assert (report.points, report.changed) == (0, 0)
    assert len(report.kept) == 1 and report.kept[0].startswith(f"run-1 {step.id}: not rechecked") and "t.jsonl" in \
        report.kept[0]
    with Store(db, read_only=True) as s:
        assert s.checks("run-1") == stored and s.points("run-1")[0].valid


def test_recheck_verifies_a_caching_off_arm_by_its_engine(tmp_path: Path) -> None:
    """The H200 prefix-cache-shared run (three launches per arm), alone in a copy of the committed database: its
    uncached arm runs with --no-enable-prefix-caching, so recheck reads the arm's engine and finds its points
    cold (no lookups, no hits), and its cached arm's points still judged by their hit rate against the
    workload's shared prefixes."""

    import duckdb

    db = tmp_path / "prefix.duckdb"
    committed_copy("h200", db)
    run_id = "20261203T232143-445f2a"
    con = duckdb.connect(str(db))
    for (table,) in con.execute("SELECT table_name FROM information_schema.columns WHERE column_name = 'run_id'"
                                ).fetchall():
        con.execute(f"DELETE FROM {table} WHERE run_id <> ?", [run_id])
    con.close()
    report = recheck(db)
    assert report.points == 12 and report.changed == 0
    with Store(db, read_only=True) as store:
        run = store.latest_run("prefix-cache-shared")
        assert run is not None and run.run_id == run_id
        cold = {c.point_id: c for c in store.checks(run.run_id) if c.name == "cache_cold"}
    uncached = [c for pid, c in cold.items() if "/uncached/" in pid]
    assert len(uncached) == 6 and all(c.passed and "prefix caching off" in c.detail for c in uncached)
    cached = [c for pid, c in cold.items() if "/cached/" in pid]
    assert len(cached) == 6 and all(c.passed and "hit rate" in c.detail for c in cached)
