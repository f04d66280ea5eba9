"""`studyc model --ledger` SIGKILLed in the middle of its fits (a timeout does that) leaves no process running:
its fit workers die with it (`runner.lifeline`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.report.test_ledger import pinned_copy
from tests.runner.test_run import alive, children

DB = REPO / "results/h200"


@pytest.mark.skipif(not DB.exists(), reason="the committed results database is not here")
def test_a_killed_ledger_leaves_no_fit_running(tmp_path: Path) -> None:
    env = os.environ | {"STUDYC_FIT_CACHE": "0", "STUDYC_CACHE_DIR": str(tmp_path / "cache")}
    # The eight studies test_ledger pins: read in a second, then fits that take many (every run's points
    # take ten seconds to read before the first fit starts)
    db = pinned_copy(tmp_path / "pinned.duckdb")
    proc = subprocess.Popen([sys.executable, "-m", "studyc", "model", "--db", str(db), "--ledger"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    workers: list[int] = []
    deadline = time.monotonic() + 240
    while len(workers) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
        workers = children(proc.pid)
    assert workers, "the ledger started no worker process to fit in"
    time.sleep(1.0)  # in the middle of their fits
    assert [p for p in workers if alive(p)] == workers, "a fit worker ended before its parent was killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    gone_by = time.monotonic() + 10
    while [p for p in workers if alive(p)] and time.monotonic() < gone_by:
        time.sleep(0.2)
    assert not [p for p in workers if alive(p)], "a fit worker outlived its SIGKILLed parent by 10 s"
