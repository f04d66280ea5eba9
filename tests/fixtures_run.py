"""Session fixture: one real quickstart run on the CPU vLLM server, shared by runner and report tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def quickstart_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Results of `studyc run studies/quickstart.toml` against a real vLLM CPU server."""
    from tests.conftest import vllm_missing

    why = vllm_missing()
    if why:
        pytest.skip(why)
    db = tmp_path_factory.mktemp("quickstart") / "quickstart.duckdb"
    out = subprocess.run(
        [sys.executable, "-m", "studyc", "run", "studies/quickstart.toml", "--db", str(db)],
        cwd=REPO, env=os.environ | {"PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return db
