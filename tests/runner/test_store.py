"""The store against real DuckDB files: every record type round-trips, the DDL comes from the records,
a version-1 file (built here with the version-1 DDL) migrates, and merges across versions."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import duckdb
import pytest

from base.errors import StoreError
from runner.store import tables
from runner.store.records import (
    CheckResult,
    PhaseRecord,
    PointRecord,
    PointSummary,
    RequestRecord,
    RunRecord,
    SegmentRecord,
    ServerRecord,
    TelemetrySample,
    redact_argv,
)
from runner.store.store import SCHEMA_VERSION, Store
from runner.store.tables import sql_type

T0 = datetime(2025, 1, 2, 3, 4, 5)
RUN = RunRecord("run-1", "toy", study_path="toy.toml", study_sha256="0" * 64, plan_json="{}", studyc_version="0.1",
                git_sha="a" * 40, host="h", started_at=T0, status="complete", calibrated=True, bandwidth_Bps=4.8e12,
                nvml_available=False, notes="n")
SERVER = ServerRecord("run-1", "toy/a", arm="a", argv_json=json.dumps(["serve", "m", "--api-key", "***"]),
                      started_at=T0, startup_s=12.5, kv_capacity_tokens=1000, status="ready",
                      warnings=("WARNING x", "WARNING y"))
POINT = PointRecord("run-1", "toy/a/w/c4/r1", server_id="toy/a", arm="a", workload="w", concurrency=4,
                    repeat=1, fingerprint="f", status="ok", cache_policy="reset", reset_ok=True, started_at=T0,
                    summary=PointSummary(window_s=2.0, requests_ok=8, output_tokens=64, output_throughput=32.0,
                                         itl_p99_s=0.01, prefix_queries=10.0, prefix_hits=0.0),
                    valid=True, flagged=False, phases_json="{}", server_warnings=("WARNING z",), reset_attempts=2)
REQUESTS = [RequestRecord(0, True, 0.0, 0.0, 0.1, 1.0, (0.1, 0.5), 16, 8, 2, True, None, 200),
            RequestRecord(1, False, 1.0, 1.1, None, 2.0, (), 16, 0, 0, False, "boom", None, conversation=3, turn=1)]
CHECKS = [CheckResult(POINT.point_id, "errors", True, "fail", 0.0, 0.0, "ok"),
          CheckResult(POINT.point_id, "warmup_sufficient", False, "warn", None, 0.1, "n/a")]
TELEMETRY = [TelemetrySample(POINT.point_id, "nvml", 0.5, power_w=300.0, energy_j=10.0),
             TelemetrySample(POINT.point_id, "metrics", 0.25, kv_cache_usage=0.5, running=3.0)]
SEGMENT = SegmentRecord(1, T0, T0, 30.5, "complete", 1, "h")
PHASES = [PhaseRecord(1, 1, "toy/a", "start: model load", 12.5), PhaseRecord(1, 2, "", "gap", 18.0)]


def filled(path: Path) -> Path:
    with Store(path) as s:
        s.save_run(RUN)
        s.record_server(SERVER)
        s.commit_point(POINT, REQUESTS, CHECKS, TELEMETRY)
        s.put_timing("run-1", [replace(SEGMENT, ended="running"), PHASES[0]])
        s.put_timing("run-1", [SEGMENT, PHASES[1]])  # the segment's row replaced, phases added
    return path


def test_every_record_round_trips(tmp_path: Path) -> None:
    db = filled(tmp_path / "r.duckdb")
    with Store(db, read_only=True) as s:
        assert s.runs() == [RUN] and s.run("run-1") == RUN and s.latest_run("toy") == RUN
        assert s.run("nope") is None and s.latest_run("nope") is None
        assert s.servers("run-1") == [SERVER]
        assert s.points("run-1") == [POINT]
        assert s.request_records("run-1", POINT.point_id) == REQUESTS
        assert s.checks("run-1") == CHECKS
        assert s.telemetry("run-1") == sorted(TELEMETRY, key=lambda t: t.t_s)
        assert s.telemetry("run-1", POINT.point_id)[0].source == "metrics"
        assert s.done_points("run-1") == {POINT.point_id: "f"}
        assert s.timing("run-1") == ([SEGMENT], PHASES) and s.timing("nope") == ([], [])
        assert s.counts("run-1") == {"runs": 1, "servers": 1, "points": 1, "requests": 2, "checks": 2, "telemetry": 2,
                                     "segments": 1, "phases": 2}


def test_a_runs_request_records_read_at_once_are_each_points(tmp_path: Path) -> None:
    """`run_request_records` gives every point of one run the list `request_records` gives it (warmup first,
    in order); another run's points are not in it."""
    db = filled(tmp_path / "r.duckdb")
    other = replace(POINT, point_id="toy/a/L1/w/c2/r1")
    later = [replace(r, index=r.index + 5) for r in reversed(REQUESTS)]
    with Store(db) as s:
        s.commit_point(other, later, [], [])
        s.save_run(replace(RUN, run_id="run-2"))
        s.commit_point(replace(POINT, run_id="run-2"), REQUESTS[:1], [], [])
        whole = s.run_request_records("run-1")
        assert whole == {p: s.request_records("run-1", p) for p in (POINT.point_id, other.point_id)}
        assert [r.index for r in whole[other.point_id]] == [5, 6] and s.run_request_records("none") == {}


def test_a_retried_point_replaces_the_old_one(tmp_path: Path) -> None:
    db = filled(tmp_path / "r.duckdb")
    with Store(db) as s:
        s.commit_point(POINT, REQUESTS[:1], CHECKS[:1], [])
        assert s.counts("run-1")["requests"] == 1 and s.counts("run-1")["telemetry"] == 0
        with pytest.raises(StoreError, match="given with point"):
            s.commit_point(POINT, [], [CheckResult("other", "x", True, "fail", None, None, "")], [])


def test_non_finite_numbers_are_stored_as_null(tmp_path: Path) -> None:
    point = PointRecord("run-1", "p", summary=PointSummary(output_throughput=float("inf"), itl_p50_s=float("nan")))
    with Store(tmp_path / "r.duckdb") as s:
        s.commit_point(point, [], [], [])
        got = s.points("run-1")[0].summary
    assert got.output_throughput is None and got.itl_p50_s is None


def test_the_api_key_is_refused() -> None:
    assert redact_argv(["serve", "--api-key", "k", "--port", "1"]) == ["serve", "--api-key", "***", "--port", "1"]
    assert redact_argv(["--api-key=k", "x"]) == ["--api-key=***", "x"]
    assert redact_argv(["--api-key"]) == ["--api-key"]


def test_record_server_refuses_an_unredacted_key(tmp_path: Path) -> None:
    leaky = ServerRecord("run-1", "s", argv_json=json.dumps(["--api-key", "secret"]))
    with Store(tmp_path / "r.duckdb") as s, pytest.raises(StoreError, match="API key"):
        s.record_server(leaky)


def test_ddl_comes_from_the_records() -> None:
    assert sql_type(int) == "BIGINT" and sql_type(float | None) == "DOUBLE" and sql_type(bool) == "BOOLEAN"
    assert sql_type(tuple[float, ...]) == "DOUBLE[]" and sql_type(tuple[str, ...] | None) == "VARCHAR[]"
    assert sql_type(datetime) == "TIMESTAMP"
    with pytest.raises(TypeError):
        sql_type(dict)
    points = tables.POINTS.column_names
    assert "summary" not in points and {"output_throughput", "itl_p99_s", "server_warnings"} <= set(points)
    assert tables.REQUESTS.column_names[:3] == ("run_id", "point_id", "idx")


# The version-1 schema, as the first release created it (abridged to the columns this test writes,
# plus every column version 2 dropped nothing from).
V1 = """
CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, study_id VARCHAR, git_sha VARCHAR, started_at TIMESTAMP, status VARCHAR);
CREATE TABLE servers (run_id VARCHAR, server_id VARCHAR, argv_json VARCHAR, status VARCHAR,
  PRIMARY KEY (run_id, server_id));
CREATE TABLE points (run_id VARCHAR, point_id VARCHAR, arm VARCHAR, workload VARCHAR, level DOUBLE, repeat INTEGER,
  status VARCHAR, valid BOOLEAN, flagged BOOLEAN, requests_ok INTEGER, output_throughput DOUBLE,
  PRIMARY KEY (run_id, point_id));
CREATE TABLE requests (run_id VARCHAR, point_id VARCHAR, idx INTEGER, warmup BOOLEAN, scheduled_s DOUBLE,
  sent_s DOUBLE, first_token_s DOUBLE, end_s DOUBLE, prompt_tokens INTEGER, output_tokens INTEGER, chunks INTEGER,
  ok BOOLEAN, error VARCHAR, status INTEGER, token_times_s DOUBLE[]);
CREATE TABLE checks (run_id VARCHAR, point_id VARCHAR, name VARCHAR, passed BOOLEAN, severity VARCHAR,
  value DOUBLE, threshold DOUBLE, detail VARCHAR);
CREATE TABLE telemetry (run_id VARCHAR, point_id VARCHAR, source VARCHAR, t_s DOUBLE, power_w DOUBLE);
INSERT INTO meta VALUES ('schema_version', '1');
"""


def v1_file(path: Path, run_id: str = "old", git_sha: str = "HEAD") -> Path:
    con = duckdb.connect(str(path))
    con.execute(V1)
    con.execute("INSERT INTO runs VALUES (?, 'toy', ?, ?, 'complete')", [run_id, git_sha, T0])
    argv = json.dumps(["serve", "m", "--api-key", "0123abcd", "--port", "5"])
    con.execute("INSERT INTO servers VALUES (?, 'toy/a', ?, 'ready')", [run_id, argv])
    con.execute("INSERT INTO points VALUES (?, 'toy/a/w/c1/r1', 'a', 'w', 1.0, 1, 'ok', true, false, 4, 12.5)",
                [run_id])
    con.execute("INSERT INTO requests VALUES (?, 'toy/a/w/c1/r1', 0, false, 0.0, 0.0, 0.1, 1.0, 16, 8, 8, true, "
                "NULL, 200, [0.1, 0.2])", [run_id])
    con.execute("INSERT INTO checks VALUES (?, 'toy/a/w/c1/r1', 'errors', true, 'fail', 0.0, 0.0, 'ok')", [run_id])
    con.execute("INSERT INTO telemetry VALUES (?, 'toy/a/w/c1/r1', 'nvml', 0.5, 250.0)", [run_id])
    con.close()
    return path


def test_a_version_1_file_is_refused_read_only_with_the_way_out(tmp_path: Path) -> None:
    db = v1_file(tmp_path / "v1.duckdb")
    with pytest.raises(StoreError, match=r"schema version 1.*studyc recheck --db"):
        Store(db, read_only=True)


def test_a_version_1_file_migrates_in_place(tmp_path: Path) -> None:
    db = v1_file(tmp_path / "v1.duckdb")
    Store(db).close()
    with Store(db, read_only=True) as s:
        run = s.run("old")
        assert run is not None and run.git_sha is None and run.status == "complete"
        server = s.servers("old")[0]
        assert json.loads(server.argv_json or "") == ["serve", "m", "--api-key", "***", "--port", "5"]
        assert server.warnings == ()
        point = s.points("old")[0]
        assert point.summary.output_throughput == 12.5 and point.summary.requests_ok == 4 and point.valid
        assert point.server_warnings == () and point.reset_attempts is None
        assert s.request_records("old", point.point_id)[0].token_times_s == (0.1, 0.2)
        assert s.telemetry("old")[0].power_w == 250.0 and s.telemetry("old")[0].energy_j is None
    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute("SELECT count(*) FROM servers WHERE argv_json LIKE '%0123abcd%'").fetchone()
    finally:
        con.close()
    assert row == (0,)


def v4_file(path: Path) -> Path:
    """A version 4 database: today's tables plus the `points.level` column version 5 dropped."""
    filled(path)
    con = duckdb.connect(str(path))
    con.execute("ALTER TABLE points ADD COLUMN level DOUBLE; UPDATE points SET level = concurrency; "
                "DROP TABLE segments; DROP TABLE phases; UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    con.close()
    return path


def columns_of_points(path: Path) -> set[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r[0] for r in con.execute("DESCRIBE points").fetchall()}
    finally:
        con.close()


def test_a_version_4_file_reads_as_it_is_and_loses_level_when_written(tmp_path: Path) -> None:
    db = v4_file(tmp_path / "v4.duckdb")
    with Store(db, read_only=True) as s:
        assert s.points("run-1") == [POINT]
    assert "level" in columns_of_points(db)  # a read-only open writes nothing
    Store(db).close()
    assert "level" not in columns_of_points(db) and "concurrency" in columns_of_points(db)
    with Store(db, read_only=True) as s:
        assert s.points("run-1") == [POINT] and s._version() == str(SCHEMA_VERSION)


def test_a_version_5_file_reads_as_it_is_and_gains_provenance_when_written(tmp_path: Path) -> None:
    db = filled(tmp_path / "v5.duckdb")
    con = duckdb.connect(str(db))
    for table, column in (("servers", "machine_id"), ("servers", "gpu_serial"), ("points", "set_aside"),
                          ("runs", "study_toml_sha256")):
        con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    con.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    con.close()
    with Store(db, read_only=True) as s:  # read as it is: the columns it lacks read None
        assert s.points("run-1") == [POINT] and s.servers("run-1")[0].machine_id is None
    assert "set_aside" not in columns_of_points(db)
    with Store(db) as s:
        assert s._version() == str(SCHEMA_VERSION) == "7" and s.points("run-1") == [POINT]
        s.record_server(replace(SERVER, machine_id="m1", gpu_serial="s1"))
        assert s.servers("run-1")[0].machine_id == "m1"
    assert "set_aside" in columns_of_points(db)


def test_a_version_6_file_reads_its_requests_as_single_and_gains_turns_when_written(tmp_path: Path) -> None:
    db = filled(tmp_path / "v6.duckdb")
    con = duckdb.connect(str(db))
    for column in ("conversation", "turn"):
        con.execute(f"ALTER TABLE requests DROP COLUMN {column}")
    con.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    con.close()
    single = [REQUESTS[0], replace(REQUESTS[1], conversation=-1, turn=0)]
    with Store(db, read_only=True) as s:  # read as it is: a request without a turn is a single request
        assert s.request_records("run-1", POINT.point_id) == single
    with Store(db) as s:
        assert s._version() == "7" and s.request_records("run-1", POINT.point_id) == single
        s.commit_point(POINT, REQUESTS, CHECKS, TELEMETRY)
        assert s.request_records("run-1", POINT.point_id) == REQUESTS


def test_an_unknown_newer_version_is_refused(tmp_path: Path) -> None:
    db = filled(tmp_path / "v8.duckdb")
    con = duckdb.connect(str(db))
    con.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
    con.close()
    for read_only in (True, False):
        with pytest.raises(StoreError, match="schema version 8"):
            Store(db, read_only=read_only)


def test_a_version_6_file_reads_without_slo_attainment_and_gains_it_when_written(tmp_path: Path) -> None:
    db = filled(tmp_path / "v6.duckdb")
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE points DROP COLUMN slo_attainment")
    con.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    con.close()
    with Store(db, read_only=True) as s:  # read as it is: the column it lacks reads None
        assert s.points("run-1") == [POINT] and s.points("run-1")[0].summary.slo_attainment is None
    assert "slo_attainment" not in columns_of_points(db)
    with Store(db) as s:
        assert s._version() == "7" and s.points("run-1") == [POINT]
        s.commit_point(replace(POINT, point_id="p2", summary=replace(POINT.summary, slo_attainment=0.75)), [], [], [])
        assert {p.point_id: p.summary.slo_attainment for p in s.points("run-1")}["p2"] == 0.75
    assert "slo_attainment" in columns_of_points(db)



def v5_file(path: Path) -> Path:
    """A version 5 database: today's tables without `segments` and `phases`."""
    filled(path)
    con = duckdb.connect(str(path))
    con.execute("DROP TABLE segments; DROP TABLE phases; UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    con.close()
    return path


def test_a_version_5_file_reads_without_timing_and_gains_the_tables_when_written(tmp_path: Path) -> None:
    db = v5_file(tmp_path / "v5.duckdb")
    with Store(db, read_only=True) as s:
        assert s.points("run-1") == [POINT] and s.timing("run-1") == ([], [])
        assert "phases" not in s.counts("run-1") and s.counts("run-1")["points"] == 1
    with Store(db) as s:
        assert s._version() == str(SCHEMA_VERSION) and s.timing("run-1") == ([], [])
        s.put_timing("run-1", [SEGMENT, *PHASES])
    with Store(db, read_only=True) as s:
        assert s.timing("run-1") == ([SEGMENT], PHASES)


@pytest.mark.parametrize("name", ["h200", "cpu-replicas"])
def test_the_committed_databases_read_as_they_are(tmp_path: Path, name: str) -> None:
    """The committed results (read from a copy): the runs stored before runs stored their timing have their wall
    only; from the mla-kv re-run of 2026-12-03 on (the first stored with it), each run's phases add up to the
    wall of its segments, and its wall is theirs: one complete segment, or a killed one and the complete one
    that resumed it (prefix-cache-shared and past-the-knee, each finished on a second machine), or two complete
    ones (warmup-trap's five-block run: its first segment's budget minutes ran out, a resume ran block 5)."""
    from tests.conftest import committed_copy

    db = committed_copy(name, tmp_path / f"{name}.duckdb")
    first_timed = "20261203T173415-385529"
    with Store(db, read_only=True) as s:
        runs = s.runs()
        assert runs and all(s.timing(r.run_id) == ([], []) for r in runs if r.run_id < first_timed)
        assert any(r.wall_s for r in runs)
        timed = {r.run_id: r for r in runs if r.run_id >= first_timed and r.study_id != "calibration"}
        if name == "h200":
            assert len(timed) >= 4
            # `studyc calibrate`'s runs (no points) store no segments and no phases
            calibrations = [r.run_id for r in runs if r.study_id == "calibration"]
            assert len(calibrations) == 4 and all(s.timing(r) == ([], []) for r in calibrations)
            for run_id, run in timed.items():
                segments, phases = s.timing(run_id)
                assert [g.ended for g in segments][-1] == "complete" and len(segments) <= 2, run_id
                assert all(g.ended == "killed" for g in segments[:-1]) or run_id == "20261205T180039-5efa12", run_id
                wall = sum(g.wall_s for g in segments)
                assert sum(p.seconds for p in phases) == pytest.approx(wall, abs=0.05)
                assert run.wall_s == pytest.approx(wall, abs=0.01)
            assert [g.ended for g in s.timing("20261205T180039-5efa12")[0]] == ["complete", "complete"]
            (segment,), _ = s.timing(first_timed)
            assert segment.wall_s == pytest.approx(593.5, abs=0.1)


def test_a_new_file_has_no_level_column(tmp_path: Path) -> None:
    assert "level" not in columns_of_points(filled(tmp_path / "new.duckdb"))


def test_a_real_sha_survives_the_migration(tmp_path: Path) -> None:
    db = v1_file(tmp_path / "v1.duckdb", git_sha="b" * 40)
    with Store(db) as s:
        run = s.run("old")
    assert run is not None and run.git_sha == "b" * 40


def test_merge_takes_version_1_and_version_2_files(tmp_path: Path) -> None:
    old = v1_file(tmp_path / "v1.duckdb")
    before = old.read_bytes()
    new = filled(tmp_path / "v2.duckdb")
    out = tmp_path / "merged.duckdb"
    with Store(out) as s:
        got = s.merge_from(old)
        assert got["runs_new"] == 1 and got["points"] == 1 and got["requests"] == 1
        assert s.merge_from(new)["runs_new"] == 1
        assert s.merge_from(new)["runs_new"] == 0  # already there
        assert {r.run_id for r in s.runs()} == {"old", "run-1"}
        assert json.loads(s.servers("old")[0].argv_json or "")[3] == "***"
        assert s.points("run-1") == [POINT]
    assert old.read_bytes() == before  # the source is never written


def records_of(point_id: str) -> tuple[list[CheckResult], list[TelemetrySample]]:
    """The module's checks and telemetry, for another point."""
    return ([replace(c, point_id=point_id) for c in CHECKS],
            [replace(t, point_id=point_id) for t in TELEMETRY])


def test_merge_takes_a_run_continued_elsewhere_and_keeps_one_that_diverged(tmp_path: Path) -> None:
    """A run resumed on another host (a copy of the database, then more points) replaces the copy
    here; a copy that lacks a point this one has is kept, and both are counted."""
    import shutil

    here = filled(tmp_path / "here.duckdb")
    there = tmp_path / "there.duckdb"
    shutil.copyfile(here, there)
    second = replace(POINT, point_id="toy/a/w/c4/r2", repeat=2)
    with Store(there) as s:
        s.commit_point(second, REQUESTS, *records_of(second.point_id))
    with Store(here) as s:
        got = s.merge_from(there)
        assert (got["runs_new"], got["runs_continued"], got["runs_kept"]) == (0, 1, 0)
        assert [p.point_id for p in s.points("run-1")] == [POINT.point_id, second.point_id]
        assert s.counts("run-1") == {"runs": 1, "servers": 1, "points": 2, "requests": 4, "checks": 4, "telemetry": 4,
                                     "segments": 1, "phases": 2}  # the continued copy's timing came too
        assert s.merge_from(there)["runs_kept"] == 1  # the same points: nothing to take
    diverged = tmp_path / "diverged.duckdb"
    with Store(diverged) as s:
        s.save_run(RUN)
        s.commit_point(replace(POINT, point_id="toy/a/w/c1/r1"), REQUESTS, *records_of("toy/a/w/c1/r1"))
    with Store(here) as s:
        assert s.merge_from(diverged)["runs_kept"] == 1
        assert len(s.points("run-1")) == 2


def test_merge_refuses_what_is_not_a_results_database(tmp_path: Path) -> None:
    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()
    with Store(tmp_path / "out.duckdb") as s, pytest.raises(StoreError, match="not a studyc results database"):
        s.merge_from(other)


def test_an_unknown_version_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "v9.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR); INSERT INTO meta VALUES ('schema_version', '9')")
    con.close()
    with pytest.raises(StoreError, match="schema version 9"):
        Store(db)


def test_export_is_sorted_and_csv_leaves_lists_out(tmp_path: Path) -> None:
    db = filled(tmp_path / "r.duckdb")
    with Store(db, read_only=True) as s:
        assert s.export_sorted("run-1", "requests", tmp_path / "req.csv", "csv") == 2
        assert s.export_sorted("run-1", "points", tmp_path / "p.parquet", "parquet") == 1
        with pytest.raises(StoreError):
            s.export_sorted("run-1", "nope", tmp_path / "x.csv", "csv")
    header = (tmp_path / "req.csv").read_text().splitlines()[0]
    assert "token_times_s" not in header and "idx" in header


def test_merge_compacts_what_a_replaced_run_left(tmp_path: Path) -> None:
    """A continued run replaces its copy: the old rows' space is given back, the data is the same."""
    import shutil

    from report.merge import merge_databases

    here = filled(tmp_path / "here.duckdb")
    with Store(here) as s:  # a run big enough that its dead copy weighs on the file
        for k in range(2, 60):
            p = replace(POINT, point_id=f"toy/a/w/c4/r{k}", repeat=k)
            s.commit_point(p, REQUESTS * 50, *records_of(p.point_id))
    there = tmp_path / "there.duckdb"
    shutil.copyfile(here, there)
    last = replace(POINT, point_id="toy/a/w/c4/r99", repeat=99)
    with Store(there) as s:
        s.commit_point(last, REQUESTS, *records_of(last.point_id))
    size = here.stat().st_size
    with Store(there, read_only=True) as s:
        want = s.counts("run-1")
    lines = merge_databases(here, [there])
    assert lines[-1].startswith(f"{here}: compacted ") and here.stat().st_size < 1.5 * size, lines
    assert not list(tmp_path.glob(".here.duckdb.compact*"))
    with Store(here, read_only=True) as s:
        assert s.counts("run-1") == want and want["points"] == 60
    assert merge_databases(here, [there])[-1].endswith("already there (kept) -> " + str(here))  # no rewrite


MACHINE_COLUMNS = ("machine_flops", "machine_bandwidth", "calibration_error")


def columns_of(path: Path, table: str) -> set[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}
    finally:
        con.close()


@pytest.mark.parametrize("version", ["6", "7"])
def test_a_file_without_the_machine_columns_reads_them_none_and_gains_them_when_written(
        tmp_path: Path, version: str) -> None:
    """A database from before each launch could calibrate its GPU (this version's, or a version 6 one) opens:
    read-only as it is (the columns read None), for writing with them added, the old rows NULL."""
    db = filled(tmp_path / "old.duckdb")
    con = duckdb.connect(str(db))
    for column in MACHINE_COLUMNS:
        con.execute(f"ALTER TABLE servers DROP COLUMN {column}")
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [version])
    con.close()
    with Store(db, read_only=True) as s:
        assert s.servers("run-1") == [SERVER]
        assert s.servers("run-1")[0].metric("ridge_point") is None
    assert not set(MACHINE_COLUMNS) & columns_of(db, "servers")  # a read-only open writes nothing
    measured = replace(SERVER, server_id="toy/a/L2", machine_flops=6.5e14, machine_bandwidth=4.2e12)
    failed = replace(SERVER, server_id="toy/a/L3", calibration_error="not calibrated: no GPU")
    with Store(db) as s:
        assert s._version() == str(SCHEMA_VERSION) and s.servers("run-1") == [SERVER]
        s.record_server(measured)
        s.record_server(failed)
    assert set(MACHINE_COLUMNS) <= columns_of(db, "servers")
    with Store(db, read_only=True) as s:
        got = {r.server_id: r for r in s.servers("run-1")}
        assert got == {SERVER.server_id: SERVER, measured.server_id: measured, failed.server_id: failed}
        assert got["toy/a/L2"].metric("ridge_point") == pytest.approx(6.5e14 / 4.2e12)
        assert got["toy/a/L3"].metric("machine_flops") is None
