"""The block planner's reads apart from its statistics: report.planning.stored_repeats reads the earlier runs'
repeats into typed values; report.planning.block_planner's statistics take those values, never a database."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from compiler.load import load_study
from compiler.plan_compile import compile_study
from report.planning.block_planner import Group, cells, paired_spread, power_plan, power_rows, read_spreads
from report.planning.stored_repeats import Measured, StoredRepeats, read_repeats
from tests.report.test_block_planner import LAUNCH, NOISY_B, WITHIN, _db, study  # noqa: F401  (fixture)


def test_the_reader_keeps_each_valid_exchangeable_repeat_with_its_run_launch_and_block(
    tmp_path: Path, study: Path,  # noqa: F811
) -> None:
    plan = compile_study(load_study(study))
    db = _db(tmp_path, study)
    got = read_repeats(db, "h200", ["tiny-qwen3"])
    assert got.vllm_version == "0.26.0"
    kept = [p for launch in plan.launches for p in launch.points if p.exchangeable]
    assert 0 < len(kept) < len(plan.points)  # arm b's first sends (cache = keep) run cold: left out
    want = sorted((f"toy/{p.arm}/L{p.launch}", p.launch, 100.0 * p.concurrency * LAUNCH[p.launch]
                   * WITHIN[p.repeat - 1]) for p in kept)
    assert sorted((m.launch, m.block, m.value) for m in got.measured) == [pytest.approx(w) for w in want]
    assert {(m.metric, m.run_id) for m in got.measured} == {("output_throughput", "r1")}
    assert read_repeats(db, "a100", ["tiny-qwen3"]) == StoredRepeats((), None)  # another GPU
    assert read_repeats(db, "h200", ["another-model"]) == StoredRepeats((), "0.26.0")
    assert read_repeats(db, "h200", ["tiny-qwen3"], "0.25.0") == StoredRepeats((), "0.25.0")


def test_the_statistics_read_no_database(tmp_path: Path, study: Path) -> None:  # noqa: F811
    """What was read is all the power plan needs: its rows are the same with the database gone."""
    plan = compile_study(load_study(study))
    db = _db(tmp_path, study, b_launch=NOISY_B)
    from_db = power_plan(plan, db)
    spreads = read_spreads(db, "h200", ["tiny-qwen3"])
    read = read_repeats(db, "h200", ["tiny-qwen3"])
    db.unlink()
    assert power_rows(plan, read) == from_db and from_db[0] and from_db[1] == "0.26.0"
    assert any(r.blocks is not None for r in from_db[0])
    launches, _ = cells(read)
    assert {k[0] for k in launches} == set(spreads[0]) == {"output_throughput"}


def _values(config: str, run_id: str, block: int, log: float) -> Measured:
    return Measured("m", (config,), run_id, f"{run_id}/{config}/L{block}", block, math.exp(log))


def test_a_paired_ratio_is_centred_on_each_runs_own_mean() -> None:
    """Per block the log-ratio of the two configurations; each run's own mean taken out (a host can shift the
    ratio), so the spread is the blocks' around their run's mean, on the runs' pooled df."""
    ratios = {"r1": (0.01, 0.03, 0.02), "r10": (0.10, 0.12)}
    measured = [v for run_id, ds in ratios.items() for block, d in enumerate(ds, start=1)
                for v in (_values("top", run_id, block, 1.0 + d), _values("bottom", run_id, block, 1.0))]
    measured.append(_values("top", "r2", 1, 5.0))  # a block without the other side: no ratio
    launches, blocks = cells(StoredRepeats(tuple(measured), "v"))
    assert set(blocks[("m", ("top",))]) == {Group(r, b) for r, ds in ratios.items() for b in range(1, len(ds) + 1)} | {
        Group("r2", 1)}
    assert set(launches[("m", ("bottom",))]) == {Group(r, f"{r}/bottom/L{b}") for r, ds in ratios.items()
                                                  for b in range(1, len(ds) + 1)}
    pair = paired_spread(blocks, "m", ("top",), ("bottom",))
    assert pair is not None and (pair.blocks, pair.df) == (5, 3)
    assert pair.sd == pytest.approx(math.sqrt((0.0002 + 0.0002) / 3))
    assert paired_spread(blocks, "m", ("top",), ("nowhere",)) is None
