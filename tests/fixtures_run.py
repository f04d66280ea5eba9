"""Session fixture: one REAL run of studies/quickstart.toml on the CPU vLLM server, shared by the
runner and report tests (about a minute on two cores).

The run goes through the `studyc run` CLI in a subprocess. Without `.venv-vllm`
(scripts/setup_vllm_cpu.sh) the tests that need it are skipped, saying so.
STUDYC_TEST_RESULTS_DB=path reuses a database from an earlier real run instead (copied, never written).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "studies" / "quickstart.toml"


@pytest.fixture(scope="session")
def quickstart_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runner.store.store import Store
    from tests.conftest import vllm_missing

    folder = tmp_path_factory.mktemp("results")
    db = folder / "quickstart.duckdb"
    reuse = os.environ.get("STUDYC_TEST_RESULTS_DB")
    if reuse:
        shutil.copyfile(reuse, db)
        return db
    why = vllm_missing()
    if why:
        pytest.skip(why)
    env = dict(os.environ, STUDYC_RUNS_DIR=str(folder / "runs"), COLUMNS="120", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-m", "studyc", "run", str(QUICKSTART), "--db", str(db)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )
    # exit 1 with points committed = some point failed: still a real database; the runner's own
    # test asserts the run was complete.
    has_points = False
    if db.exists():
        with Store(db, read_only=True) as store:
            run = store.latest_run("quickstart")
            has_points = run is not None and bool(store.points(run.run_id))
    if proc.returncode not in (0, 1) or not has_points:
        pytest.fail(f"`studyc run` of the quickstart failed (exit {proc.returncode}):\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return db
