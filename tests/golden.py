"""Golden files: compared byte for byte; rewritten only with STUDYC_UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
from pathlib import Path


def check_golden(path: Path, actual: str) -> None:
    if os.environ.get("STUDYC_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert path.exists(), f"missing golden file {path} (run with STUDYC_UPDATE_GOLDEN=1 to create it)"
    expected = path.read_text()
    assert actual == expected, f"output differs from {path}; if intended, rerun with STUDYC_UPDATE_GOLDEN=1"
