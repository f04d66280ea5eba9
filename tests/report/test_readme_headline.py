"""The headline table of docs/results.md is the audit of the committed results, not numbers typed by hand."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO, committed_runs


def test_results_headline_is_the_audit_of_the_committed_results() -> None:
    readme = (REPO / "docs/results.md").read_text()
    block = re.search(r"<!-- headline:start -->\n(.*?)\n<!-- headline:end -->", readme, re.S)
    assert block, "docs/results.md lost its headline markers"
    ids = [i for i in dict.fromkeys(re.findall(r"^\| ([a-z0-9-]+) \|", block.group(1), re.M)) if i != "study"]
    files = [str(REPO / "studies" / (i.replace("-", "_") + ".toml")) for i in ids]
    out = subprocess.run(
        [sys.executable, "-m", "studyc", "audit", *files, "--db", str(REPO / "results/h200"),
         "--format", "markdown"], cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert len(ids) >= 8
    assert block.group(1).strip() == out.stdout.strip(), (
        "docs/results.md's headline differs from `studyc audit ... --format markdown`: regenerate it"
    )


def test_each_run_says_the_launches_and_repeats_it_rests_on() -> None:
    """The footer under the table names each run's design: launches per arm and repeats per launch,
    read from the points it stored (so a ±2% interval is read against how many servers made it)."""
    from report.audit import design_note

    runs = committed_runs()
    assert design_note(runs["cuda-graphs"]) == "3 launches per arm x 1 repeat"
    assert design_note(runs["prefix-cache-ladder"]) == ("4 launches per arm x 2 repeats; blocks 4 of 4: a repeated "
                                                        "interval, this look's at 96%")
    assert design_note(runs["mla-kv"]) == "3 launches per arm x 1 repeat"


def test_a_run_read_before_its_budget_is_spent_says_the_level_of_its_look() -> None:
    """The fp8-kv run under a budget of twelve blocks: read at its last look, its intervals are at 96%; the
    same run read as it stood after five blocks is an early look's, far wider than a 95% interval, and the
    footer says so."""
    from dataclasses import replace

    from compiler.plan import Plan
    from report.audit import sequential_note
    from report.stats.intervals import layout

    runs = committed_runs()
    run = runs["fp8-kv"]
    assert sequential_note(run) == "; blocks 12 of 12: a repeated interval, this look's at 96%"
    design = layout(Plan.from_stored(run.run.plan_json))
    early = replace(run, points=tuple(p for p in run.points
                                      if (design.point(p.point_id, p.server_id, p.repeat).block or 0) <= 5))
    assert 0 < len(early.points) < len(run.points)
    assert sequential_note(early) == "; blocks 5 of 12: a repeated interval, this look's at 99.9%"
    assert sequential_note(runs["mla-kv"]) == ""  # a fixed design


def test_the_audit_points_from_its_launch_counts_to_the_planner() -> None:
    """A row whose interval straddles an edge says how many launches would decide it at this run's own spread
    and mean; the audit then says, once, where the 80%-power design and its GPU time are. A run with no such
    row does not say it."""
    from click.testing import CliRunner

    from report.audit import PLANNER_POINTER
    from studyc.cli import main

    db = str(REPO / "results/h200")
    straddling = CliRunner().invoke(main, ["audit", str(REPO / "studies/prefix_cache_null.toml"), "--db", db])
    assert "what would decide it: about" in straddling.stdout
    assert straddling.stdout.count(PLANNER_POINTER.strip()) == 1
    decided = CliRunner().invoke(main, ["audit", str(REPO / "studies/mla_kv.toml"), "--db", db])
    assert decided.exit_code == 0 and "studyc plan STUDY" not in decided.stdout
