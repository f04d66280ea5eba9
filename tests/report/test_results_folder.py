"""Results as a folder of files (report.exporting, runner.store.folder): `studyc export`, `import`, `merge` into a
folder, `--db FOLDER` and scripts/rewrite_results.py, on real DuckDB files holding runs copied out of the
published results; token times as microsecond gaps in the files, and folders written before (whole
nanoseconds) read bit for bit, alone or beside runs of gaps."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from runner.store.store import SCHEMA_VERSION, Store
from runner.store.tables import TABLES
from runner.store.timefmt import GAPS_US, TIMES_NS, ZSTD_LEVEL, whole_us
from studyc.cli import main
from tests.conftest import committed_db

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = next((p for p in (REPO / "results" / "h200", REPO / "results" / "h200.duckdb") if p.exists()), None)
MLA = ("20261201T042312-aaa653", "20261203T173415-385529", "20261205T121852-fcf0dd")  # mla-kv: 84 requests
ROOF = ("20261203T075449-6a1a6d",)  # decode-roofline: 72 requests
STUDIES = [str(REPO / "studies" / "mla_kv.toml"), str(REPO / "studies" / "decode_roofline.toml")]
pytestmark = pytest.mark.skipif(PUBLISHED is None, reason="no published results in results/")


def copy_runs(dest: Path, run_ids: tuple[str, ...]) -> Path:
    """A results database holding these runs of the published results, every column as stored."""
    assert PUBLISHED is not None
    # imported once a session, not into each test's own cache folder (5 s a test)
    source = str(committed_db("h200") if PUBLISHED.is_dir() else PUBLISHED).replace("'", "''")
    with Store(dest) as store:
        store.con.execute(f"ATTACH '{source}' AS src (READ_ONLY)")
        marks = ", ".join("?" for _ in run_ids)
        for table in TABLES:
            have = store._columns(table.name, catalog="src")
            names = ", ".join(c for c in table.column_names if c in have)
            store.con.execute(f"INSERT INTO {table.name} ({names}) SELECT {names} FROM src.{table.name} "
                              f"WHERE run_id IN ({marks})", list(run_ids))
        store.con.execute("DETACH src")
    return dest


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("STUDYC_CACHE_DIR", str(tmp_path / "cache"))
    yield tmp_path / "cache"


@pytest.fixture(scope="module")
def copied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MLA and ROOF copied out of the published results once for the module; each test writes a copy (`db`)."""
    return copy_runs(tmp_path_factory.mktemp("copied") / "small.duckdb", MLA + ROOF)


@pytest.fixture
def db(copied: Path, tmp_path: Path) -> Path:
    return Path(shutil.copyfile(copied, tmp_path / "small.duckdb"))


def studyc(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def audit(db: Path) -> str:
    result = studyc("audit", *STUDIES, "--db", str(db), "--format", "json")
    assert result.exit_code == 0, result.output
    return result.output


def everything(db: Path, rounded: tuple[str, ...] = ()) -> list[object]:
    """Every record of every table, read through the store; the token times of the runs named in `rounded`
    rounded to the microsecond, as the files hold them."""
    with Store(db, read_only=True) as store:
        out: list[object] = []
        for run in store.runs():
            requests = store.run_request_records(run.run_id)
            if run.run_id in rounded:
                requests = {p: [replace(r, token_times_s=tuple((whole_us(r.token_times_s) / 1e6).tolist()))
                                for r in records] for p, records in requests.items()}
            out += [run, store.servers(run.run_id), store.points(run.run_id), requests, store.checks(run.run_id),
                    store.telemetry(run.run_id), store.timing(run.run_id)]
        return out


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def one_line_error(result: Result, *fragments: str) -> None:
    """A refusal: exit 1, one line naming what is wrong, no traceback."""
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_round_trip_changes_nothing_but_token_times_to_the_microsecond(db: Path, tmp_path: Path, fmt: str) -> None:
    out, back = tmp_path / "out", tmp_path / "back.duckdb"
    assert studyc("export", "--db", str(db), str(out), "--format", fmt).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*MLA, *ROOF, "manifest.json"])
    assert sorted(p.name for p in (out / ROOF[0]).iterdir()) == sorted(
        ["manifest.json", *(f"{t.name}.{fmt}" for t in TABLES)])
    assert studyc("import", str(out), "--db", str(back)).exit_code == 0
    assert everything(back) == everything(out) == everything(db, rounded=MLA + ROOF)
    assert studyc("export", "--db", str(back), str(tmp_path / "again"), "--format", fmt).exit_code == 0
    assert files(tmp_path / "again") == files(out)  # the same rows give the same bytes; rounded once is rounded
    assert audit(db) == audit(back) == audit(out)


def _request_times(db: Path, run_id: str) -> list[tuple[float, ...]]:
    """A run's token times per request, in the order its requests file holds them."""
    with Store(db, read_only=True) as store:
        return [r.token_times_s for records in store.run_request_records(run_id).values() for r in records]


def test_token_times_are_microsecond_gaps_split_by_bytes_in_the_file(db: Path, tmp_path: Path) -> None:
    studyc("export", "--db", str(db), str(tmp_path / "out"))
    path = tmp_path / "out" / ROOF[0] / "requests.parquet"
    data = pq.read_table(path)
    assert "token_times_s" not in data.column_names and TIMES_NS not in data.column_names
    assert str(data.schema.field(GAPS_US).type) == "list<element: int64>"
    times = _request_times(db, ROOF[0])
    gaps = data.column(GAPS_US).to_pylist()
    assert len(gaps) == len(times) == data.num_rows
    assert [np.cumsum(g, dtype=np.int64).tolist() for g in gaps] == [whole_us(t).tolist() for t in times]
    assert sum(map(len, gaps)) > 1000
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "BYTE_STREAM_SPLIT" in encodings[f"{GAPS_US}.list.element"]


def as_written_before(folder: Path, run_id: str, db: Path) -> None:
    """Make one run of a folder as folders were written before the gaps: its requests file holding
    `token_times_ns` (the database's times in whole nanoseconds), its manifest's sha256 to match."""
    path = folder / run_id / "requests.parquet"
    data = pq.read_table(path)
    ns = [[round(t * 1e9) for t in times] for times in _request_times(db, run_id)]
    at = data.column_names.index(GAPS_US)
    data = data.remove_column(at).add_column(at, TIMES_NS, pa.array(ns, pa.list_(pa.int64())))
    pq.write_table(data, path, compression="zstd", compression_level=ZSTD_LEVEL,
                   use_dictionary=[n for n in data.column_names if n != TIMES_NS])
    _edit(folder / run_id / "manifest.json",
          lambda m: m["tables"]["requests"].update(sha256=hashlib.sha256(path.read_bytes()).hexdigest()))


def _times_column(folder: Path, run_id: str) -> str:
    names = pq.read_schema(folder / run_id / "requests.parquet").names
    return next(n for n in names if n in (GAPS_US, TIMES_NS, "token_times_s"))


def test_merge_into_a_folder_of_nanoseconds_adds_gaps_and_both_read(tmp_path: Path, db: Path) -> None:
    first = copy_runs(tmp_path / "mla.duckdb", MLA)
    out = tmp_path / "published"  # a folder written before: every run in whole nanoseconds
    assert studyc("export", "--db", str(first), str(out)).exit_code == 0
    for run_id in MLA:
        as_written_before(out, run_id, first)
    assert json.loads((out / "manifest.json").read_text())["format_version"] == 1
    assert everything(out) == everything(first)  # nanoseconds read back bit for bit
    second = copy_runs(tmp_path / "roof.duckdb", ROOF)
    assert studyc("merge", str(out), str(second)).exit_code == 0
    assert {r: _times_column(out, r) for r in MLA + ROOF} == {**dict.fromkeys(MLA, TIMES_NS), ROOF[0]: GAPS_US}
    assert json.loads((out / "manifest.json").read_text())["format_version"] == 1
    assert everything(out) == everything(db, rounded=ROOF)
    assert studyc("import", str(out), "--db", str(tmp_path / "back.duckdb")).exit_code == 0
    assert everything(tmp_path / "back.duckdb") == everything(db, rounded=ROOF)
    assert audit(out) == audit(db)


SCRIPT = REPO / "scripts" / "rewrite_results.py"


def rewrite(folder: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(folder), str(out)], capture_output=True, text=True,
                          cwd=REPO, check=False)


def test_rewrite_results_writes_every_run_in_gaps_and_nothing_else_anew(tmp_path: Path, db: Path) -> None:
    mixed = tmp_path / "mixed"  # runs of both encodings
    assert studyc("export", "--db", str(db), str(mixed)).exit_code == 0
    for run_id in MLA:
        as_written_before(mixed, run_id, db)
    before = files(mixed)
    out = tmp_path / "rewritten"
    done = rewrite(mixed, out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{mixed} (") and "4 runs, " in done.stdout and " requests, " in done.stdout
    assert files(mixed) == before  # only read
    assert {r: _times_column(out, r) for r in MLA + ROOF} == dict.fromkeys(MLA + ROOF, GAPS_US)
    after = files(out)
    assert sorted(after) == sorted(before)
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {f"{r}/{f}" for r in MLA for f in ("requests.parquet", "manifest.json")}
    for run_id in MLA + ROOF:  # each manifest names its files' new sha256 (the store checks them as it reads)
        entries = json.loads(after[f"{run_id}/manifest.json"])["tables"]
        assert all(e["sha256"] == hashlib.sha256(after[f"{run_id}/{e['file']}"]).hexdigest() for e in entries.values())
    assert everything(out) == everything(db, rounded=MLA + ROOF)
    assert audit(out) == audit(db)
    again = rewrite(out, tmp_path / "again")
    assert again.returncode == 0 and files(tmp_path / "again") == after  # in the current encoding already: the same
    refused = rewrite(mixed, out)
    assert refused.returncode == 1 and refused.stderr == f"Error: {out}: exists and is not an empty folder\n"


@pytest.fixture(scope="module")
def exported(copied: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`copied` exported once for the module; each test breaks a copy (`folder`)."""
    out = tmp_path_factory.mktemp("exported") / "out"
    assert studyc("export", "--db", str(copied), str(out)).exit_code == 0
    return out


@pytest.fixture
def folder(exported: Path, tmp_path: Path) -> Path:
    """A copy of `exported`: the export of the rows `db` holds (an export of the same rows is byte for byte the same)."""
    return Path(shutil.copytree(exported, tmp_path / "out"))


def test_a_changed_file_is_named(folder: Path) -> None:
    path = folder / ROOF[0] / "requests.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    one_line_error(studyc("audit", *STUDIES, "--db", str(folder)), str(path), "sha256")


def test_a_file_that_is_not_parquet_is_named(folder: Path) -> None:
    path = folder / ROOF[0] / "points.parquet"
    path.write_bytes(b"not parquet at all")
    manifest = folder / ROOF[0] / "manifest.json"
    found = json.loads(manifest.read_text())
    found["tables"]["points"]["sha256"] = hashlib.sha256(b"not parquet at all").hexdigest()
    manifest.write_text(json.dumps(found))
    one_line_error(studyc("import", str(folder), "--db", str(folder.parent / "x.duckdb")), str(path),
                   "cannot read it as parquet")
    assert not (folder.parent / "x.duckdb").exists()


def test_a_missing_file_is_named(folder: Path) -> None:
    path = folder / MLA[0] / "checks.parquet"
    path.unlink()
    one_line_error(studyc("audit", *STUDIES, "--db", str(folder)), str(path), "missing")


def test_a_newer_schema_is_refused(folder: Path) -> None:
    top = folder / "manifest.json"
    found = json.loads(top.read_text())
    found["schema_version"] = SCHEMA_VERSION + 1
    top.write_text(json.dumps(found))
    one_line_error(studyc("audit", *STUDIES, "--db", str(folder)), str(top), "newer than this studyc reads")
    found["schema_version"] = SCHEMA_VERSION
    top.write_text(json.dumps(found))
    assert studyc("audit", *STUDIES, "--db", str(folder)).exit_code == 0


def test_a_folder_is_read_only(folder: Path) -> None:
    one_line_error(studyc("recheck", "--db", str(folder)), str(folder), "read-only", "studyc import")


def test_export_and_import_refuse_to_overwrite(db: Path, folder: Path) -> None:
    one_line_error(studyc("export", "--db", str(db), str(folder)), str(folder), "not an empty folder")
    one_line_error(studyc("import", str(folder), "--db", str(db)), str(db), "exists")


def test_the_cache_is_built_once_and_again_when_the_folder_changes(folder: Path, cache: Path, tmp_path: Path) -> None:
    # this folder's cache files only (the published results, read by copy_runs, may be cached beside them)
    where = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:12]
    audit(folder)
    built = list((cache / "results").glob(f"{where}-*.duckdb"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    audit(folder)
    assert built[0].stat().st_mtime_ns == stamp  # read, not built again
    more = copy_runs(tmp_path / "more.duckdb", ("20261129T232436-d4a41c",))
    assert studyc("merge", str(folder), str(more)).exit_code == 0
    audit(folder)
    again = list((cache / "results").glob(f"{where}-*.duckdb"))
    assert len(again) == 1 and again != built  # a new digest; the old file removed


def test_merge_into_a_folder_writes_only_the_new_run(tmp_path: Path, db: Path) -> None:
    first = copy_runs(tmp_path / "mla.duckdb", MLA)
    out = tmp_path / "merged"
    assert studyc("export", "--db", str(first), str(out)).exit_code == 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    second = copy_runs(tmp_path / "roof.duckdb", ROOF)
    result = studyc("merge", str(out), str(second), str(first))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"{second}: 1 new run(s) -> {out}",
                                          f"{first}: 0 new run(s), 3 already there (kept) -> {out}"]
    after = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert {p: t for p, t in after.items() if p in before} == before
    assert sorted({p.parent.name for p in set(after) - set(before)}) == [ROOF[0]]
    assert audit(out) == audit(db)


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    found = json.loads(path.read_text())
    change(found)
    path.write_text(json.dumps(found))


def _rename_a_column(folder: Path) -> None:
    path = folder / ROOF[0] / "phases.parquet"
    data = pq.read_table(path)
    pq.write_table(data.rename_columns(["bad name", *data.column_names[1:]]), path)
    _edit(folder / ROOF[0] / "manifest.json",
          lambda m: m["tables"]["phases"].update(sha256=hashlib.sha256(path.read_bytes()).hexdigest()))


BROKEN: dict[str, tuple[Callable[[Path], object], str, str]] = {  # how a folder is broken, the file named, the words
    "rows": (lambda f: _edit(f / ROOF[0] / "manifest.json", lambda m: m["tables"]["points"].update(rows=1)),
             f"{ROOF[0]}/points.parquet", "rows"),
    "unknown table": (lambda f: _edit(f / ROOF[0] / "manifest.json", lambda m: m["tables"].update(x={})),
                      f"{ROOF[0]}/manifest.json", "unknown table 'x'"),
    "no tables": (lambda f: _edit(f / ROOF[0] / "manifest.json", lambda m: m.pop("tables")),
                  f"{ROOF[0]}/manifest.json", "no `tables`"),
    "not json": (lambda f: (f / "manifest.json").write_text("{"), "manifest.json", "not a readable manifest"),
    "not ours": (lambda f: _edit(f / "manifest.json", lambda m: m.update(format="other")), "manifest.json",
                 "not a studyc results folder"),
    "old schema": (lambda f: _edit(f / "manifest.json", lambda m: m.update(schema_version=2)), "manifest.json",
                   "migrate"),
    "column name": (_rename_a_column, f"{ROOF[0]}/phases.parquet", "'bad name' is not a column name"),
    "a run's copy": (lambda f: shutil.copytree(f / ROOF[0], f / "copy"), "copy/checks.parquet",
                     f"rows of run {ROOF[0]} in the folder of run copy"),
    "a path for a file": (lambda f: _edit(f / MLA[1] / "manifest.json",
                                          lambda m: m["tables"]["runs"].update(file="../manifest.json")),
                          f"{MLA[1]}/manifest.json", "table runs: no file name"),
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_broken_folder_is_refused_naming_the_file(folder: Path, broken: str) -> None:
    breaking, named, words = BROKEN[broken]
    breaking(folder)
    one_line_error(studyc("audit", *STUDIES, "--db", str(folder)), str(folder / named), words)


def test_import_needs_a_results_folder(tmp_path: Path) -> None:
    one_line_error(studyc("import", str(tmp_path), "--db", str(tmp_path / "x.duckdb")), str(tmp_path),
                   "not a results folder")


def test_merge_replaces_a_run_continued_elsewhere_and_nothing_else(tmp_path: Path, db: Path) -> None:
    partial = copy_runs(tmp_path / "partial.duckdb", MLA + ROOF)
    with Store(partial) as store:
        last = store.points(ROOF[0])[-1].point_id
        for table in ("points", "requests", "checks", "telemetry"):
            store.con.execute(f"DELETE FROM {table} WHERE run_id = ? AND point_id = ?", [ROOF[0], last])
    out = tmp_path / "out"
    assert studyc("export", "--db", str(partial), str(out)).exit_code == 0
    assert audit(out) != audit(db)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    result = studyc("merge", str(out), str(db))
    assert result.output.splitlines() == [f"{db}: 0 new run(s), 1 continued (more points than the copy in {out}), "
                                          f"3 already there (kept) -> {out}"]
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {p.parent.name for p in after if after[p] != before.get(p)} == {ROOF[0]}
    assert audit(out) == audit(db)
    one_line_error(studyc("merge", str(out), str(out)), "cannot merge a folder into itself")
