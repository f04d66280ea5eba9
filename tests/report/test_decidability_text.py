"""Decidability as text (report.planning.decidability_text): the plan's rows for each kind, validate's warnings and
run's refusals, each naming the file, the line of the prediction and the hypothesis."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from compiler.load import load_study
from report.planning.decidability import ONE_LAUNCH, Decidability
from report.planning.decidability_text import power, refusals, row_text, section, warnings

ROOT = Path(__file__).resolve().parents[2]
YES_ROW = Decidability("wide", "output_throughput", "value", 12, 0.01, 0.05, 0.011, 0.013, 0.99, "prior x")
NARROW = replace(YES_ROW, hypothesis="narrow", band=0.005, best_power=0.02)
RELATION = replace(YES_ROW, hypothesis="rel", kind="relation", band=None, best_power=1.0)
ONE = replace(YES_ROW, hypothesis="one", blocks=1, detectable=None, narrowest=None, best_power=0.0, one_launch=True)


def test_power_keeps_what_rounds_under_a_half() -> None:
    assert power(0.4996) == "49.9%" and power(0.5) == "50%" and power(0.81234) == "81.2%"
    assert power(1.0) == "100%" and power(0.0) == "0%" and power(0.00001) == "0%"


def test_rows_of_each_kind() -> None:
    assert row_text(YES_ROW) == (
        "  wide: decidable: yes; band ±5%; at 12 blocks, block SD 1% (prior x): detects 1.1% from an edge, confirms "
        "a band of ±1.3% or wider, best-case power 99%; an inconclusive verdict would be near an edge")
    narrow = row_text(NARROW).splitlines()
    assert narrow[0].startswith("  narrow: decidable: only if the truth is at least 1.1% from an edge; band ±0.5%")
    assert narrow[1] == ("    its band ±0.5% is narrower than the narrowest it could confirm, ±1.3%: only a truth "
                         "that far outside it is decided (refuted)")
    assert narrow[2] == "    studyc run refuses it (best-case power under 50%) without --underpowered"
    rel = row_text(RELATION).splitlines()
    assert "; a relation; " in rel[0] and rel[1] == "    a relation: decided once the truth is that far past its threshold"
    assert len(rel) == 2
    assert row_text(ONE) == f"  one: decidable: no ({ONE_LAUNCH})"


def test_section_heads_its_rows() -> None:
    assert section([YES_ROW, ONE]) == (
        "decidability (80% power at the interval the run reads at its end, at the most blocks the design allows; "
        "block SD at its 80% upper confidence bound; docs/decidability.md):\n"
        f"{row_text(YES_ROW)}\n{row_text(ONE)}\n")


def test_warnings_and_refusals_name_file_line_and_hypothesis() -> None:
    loaded = load_study(ROOT / "studies/fp8_kv.toml")
    row = replace(NARROW, hypothesis="faster-at-c128-decode")
    line = loaded.line("hypothesis[2].predict")
    where = f"{loaded.path}:{line}: hypothesis[2].predict"
    assert warnings(loaded, [YES_ROW, row]) == [
        f"{where}: warning: hypothesis faster-at-c128-decode is not decidable: best-case power 2% (its band ±0.5% is "
        "narrower than the narrowest it could confirm, ±1.3%: only a truth that far outside it is decided (refuted)); "
        "studyc run refuses it without --underpowered"]
    assert refusals(loaded, [YES_ROW, row]) == [
        f"{where}: hypothesis faster-at-c128-decode: best-case power 2% is under 50% (its band ±0.5% is narrower "
        "than the narrowest it could confirm, ±1.3%: only a truth that far outside it is decided (refuted), block SD "
        "1% from prior x); widen the band, add blocks, or pass --underpowered"]
    assert warnings(loaded, [YES_ROW]) == [] and refusals(loaded, [YES_ROW, ONE]) == []


def test_a_one_launch_design_is_warned_of_once() -> None:
    loaded = load_study(ROOT / "studies/quickstart.toml")
    rows = [replace(ONE, hypothesis=h.id) for h in loaded.study.hypothesis]
    (line,) = warnings(loaded, rows)
    assert line.startswith(f"{loaded.path}:{loaded.line('load.launches')}: load.launches: warning: one launch per arm")
    assert warnings(loaded, [*rows[:1], YES_ROW]) == []  # not every hypothesis on one launch: none said
    assert warnings(loaded, []) == []
