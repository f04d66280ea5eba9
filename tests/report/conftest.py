"""Report fixtures: one results database from a REAL CPU run of studies/quickstart.toml, per session.

The run goes through the `studyc run` CLI in a subprocess (about two minutes on two cores). Without
`.venv-vllm` (scripts/setup_vllm_cpu.sh) the tests that need it are skipped, saying so.
STUDYC_TEST_RESULTS_DB=path reuses a database from an earlier real run instead (copied, never written).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "studies" / "quickstart.toml"


@pytest.fixture(scope="session")
def quickstart_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("results")
    db = folder / "quickstart.duckdb"
    reuse = os.environ.get("STUDYC_TEST_RESULTS_DB")
    if reuse:
        shutil.copyfile(reuse, db)
        return db
    vllm = REPO / ".venv-vllm" / "bin" / "vllm"
    if not vllm.exists():
        pytest.skip(f"CPU vLLM not installed ({vllm} missing): run scripts/setup_vllm_cpu.sh")
    env = dict(os.environ, STUDYC_VLLM=str(vllm), STUDYC_RUNS_DIR=str(folder / "runs"), COLUMNS="120")
    proc = subprocess.run(
        [sys.executable, "-m", "studyc.cli", "run", str(QUICKSTART), "--db", str(db)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )
    # exit 1 with points committed = some point failed: still a real database for the report to show
    if proc.returncode not in (0, 1) or not db.exists() or not _has_points(db):
        pytest.fail(f"`studyc run` of the quickstart failed (exit {proc.returncode}):\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return db


def _has_points(db: Path) -> bool:
    from runner.store import Store

    with Store(db, read_only=True) as store:
        run = store.latest_run("quickstart")
        return run is not None and bool(store.point_rows(run["run_id"]))
