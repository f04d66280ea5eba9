"""A results database the disk refuses (full, or a file size limit): the write that fails rolls back and says
so, with no traceback and what to do; every write committed before it is kept. The fault is a file size limit
(RLIMIT_FSIZE) on a real DuckDB file, in a process of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from runner.store.records import RunRecord
from runner.store.store import Store, write_refused
from tests.conftest import REPO

WRITER = """
import resource, sys
from runner.store.records import RunRecord
from runner.store.store import Store
from base.errors import StoreError
db, limit = sys.argv[1], int(sys.argv[2])
with Store(db) as store:
    store.save_run(RunRecord(run_id="kept", study_id="s", notes="x"))  # committed before the limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        for i in range(100000):
            store.save_run(RunRecord(run_id=f"r{i}", study_id="s", notes="y" * 4096))
    except StoreError as exc:
        print(f"refused after {i} runs: {exc.message}")
"""


def test_a_refused_write_says_so_and_keeps_what_was_committed(tmp_path: Path) -> None:
    db = tmp_path / "full.duckdb"
    size = 0
    with Store(db) as store:  # the empty database's size, so the limit sits just above it
        store.save_run(RunRecord(run_id="probe", study_id="s"))
    size = db.stat().st_size + sum(p.stat().st_size for p in tmp_path.glob("full.duckdb.wal"))
    db.unlink()
    for wal in tmp_path.glob("full.duckdb.wal"):
        wal.unlink()
    done = subprocess.run([sys.executable, "-c", WRITER, str(db), str(size + 256 * 1024)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "refused after" in done.stdout, done.stdout
    assert "the results database could not be written" in done.stdout
    assert "the points committed before are kept" in done.stdout and "continue with --resume" in done.stdout
    refused_after = int(done.stdout.split("refused after ", 1)[1].split()[0])
    with Store(db, read_only=True) as store:
        ids = {r.run_id for r in store.runs()}
    assert "kept" in ids and {f"r{i}" for i in range(refused_after)} <= ids and f"r{refused_after}" not in ids


@pytest.mark.parametrize("exc, refused", [
    (duckdb.IOException("IO Error: No space left on device"), True),
    (duckdb.TransactionException('Failed to commit: Could not write file "x.wal": File too large'), True),
    (duckdb.ConstraintException("Duplicate key"), False),
    (duckdb.CatalogException("Table with name nope does not exist"), False),
])
def test_only_a_refused_write_is_reported_as_one(exc: Exception, refused: bool) -> None:
    assert write_refused(exc) is refused
