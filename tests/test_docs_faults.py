"""docs/faults.md: every fault the table lists names tests, and every test it names exists."""

from __future__ import annotations

import re

from tests.conftest import REPO

FAULTS = ("exits before it is ready", "dies at `go`", "fails twice", "out of memory at start", "dies mid-point",
          "port taken", "disk full", "SIGINT", "SIGTERM", "SIGKILL", "NVML missing", "a server that lies")


def test_every_fault_row_names_tests_that_exist() -> None:
    rows = [line for line in (REPO / "docs/faults.md").read_text().splitlines() if line.startswith("| ")][1:]
    for fault in FAULTS:
        assert any(fault in row.split("|")[1] for row in rows), f"no row for {fault}"
    for row in rows:
        cited = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?(?:\[\w+\])?`", row.split("|")[-2])
        assert cited, f"a fault row names no test: {row[:60]}"
        for path, name in cited:
            text = (REPO / path).read_text()
            assert not name or f"def {name}(" in text, f"{path}::{name} does not exist"
