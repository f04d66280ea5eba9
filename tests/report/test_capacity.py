"""The capacity side of a hypothesis from stored probe points: one capacity per launch, invalid probes and
open searches named, never dropped; the Wilson interval of a probe's attainment."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.load import load_study
from compiler.plan import SearchStep
from compiler.plan_compile import compile_study
from report.results import RunData
from report.scoring.capacity import ProbeRow, probe_rows, search_side, wilson
from report.scoring.score_model import Why
from report.scoring.scoring import _estimate
from report.stats.intervals import Layout, Obs, Place, fixed_critical, ratio_interval
from runner.store.records import CheckResult, PointRecord, PointSummary, RunRecord
from tests.compiler.test_slo import _variant


@pytest.fixture(scope="module")
def searches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SearchStep]:
    path = _variant(tmp_path_factory.mktemp("s"), ("launches = 1", "launches = 2"))
    plan = compile_study(load_study(path))
    return {q.id: q for launch in plan.launches for q in launch.searches}


def probe(search: SearchStep, level: int, attainment: float, valid: bool = True) -> PointRecord:
    return PointRecord(run_id="r", point_id=f"{search.id}/c{level}/r1", arm=search.arm, workload="w",
                       concurrency=level, valid=valid, summary=PointSummary(requests_ok=16, slo_attainment=attainment))


def data(points: list[PointRecord]) -> RunData:
    return RunData(db=Path("x.duckdb"), run=RunRecord(run_id="r", study_id="capacity"), servers=(),
                   points=tuple(points), checks=(), telemetry=())


def layout() -> Layout:
    return Layout(servers={f"capacity/{a}/L{k}": Place(f"capacity/{a}/L{k}", k) for a in ("large", "small")
                           for k in (1, 2)})


def run_search(search: SearchStep, capacity: int) -> list[PointRecord]:
    """The probes of a [1, 8] search with 4 probes when every level up to `capacity` holds (0.9 target)."""
    levels = {1: [8, 1, 4, 2], 2: [8, 1, 4, 2], 3: [8, 1, 4, 2], 5: [8, 1, 4, 6], 6: [8, 1, 4, 6]}[capacity]
    return [probe(search, x, 0.95 if x <= capacity else 0.5) for x in levels]


def test_one_capacity_per_launch_and_a_paired_ratio(searches: dict[str, SearchStep]) -> None:
    large = [searches[f"capacity/large/L{k}/w/search"] for k in (1, 2)]
    small = [searches[f"capacity/small/L{k}/w/search"] for k in (1, 2)]
    stored = run_search(large[0], 5) + run_search(large[1], 6) + run_search(small[0], 2) + run_search(small[1], 3)
    top = search_side(data(stored), [q.id for q in large], searches, {}, layout())
    bottom = search_side(data(stored), [q.id for q in small], searches, {}, layout())
    assert [(o.value, o.launch, o.block) for o in top.values] == [(4.0, "capacity/large/L1", 1),
                                                                 (6.0, "capacity/large/L2", 2)]
    assert [o.value for o in bottom.values] == [2.0, 2.0]  # 3 holds, but 4 probes end at the bracket [2, 4)
    assert [(o.value, o.block) for o in top.ceilings] == [(6.0, 1), (8.0, 2)]  # the lowest level that failed
    assert [o.value for o in bottom.ceilings] == [4.0, 4.0]
    assert top.invalid == [] and top.rows == 2 and top.point_ids == [q.id for q in large]
    interval = ratio_interval(top.values, bottom.values, fixed_critical)
    assert interval.mean == pytest.approx((4 * 6) ** 0.5 / 2) and interval.level == "blocks"


def test_the_attainment_target_itself_holds(searches: dict[str, SearchStep]) -> None:
    q = searches["capacity/large/L1/w/search"]
    stored = [probe(q, 8, 0.5), probe(q, 1, 0.9), probe(q, 4, 0.9), probe(q, 6, 0.8999)]
    side = search_side(data(stored), [q.id], searches, {}, layout())
    assert [o.value for o in side.values] == [4.0]


def test_an_invalid_probe_makes_the_side_invalid_naming_it(searches: dict[str, SearchStep]) -> None:
    q = searches["capacity/large/L1/w/search"]
    stored = [probe(q, 8, 0.5), probe(q, 1, 0.95), probe(q, 4, 0.95, valid=False)]
    failed = {f"{q.id}/c4/r1": [CheckResult(f"{q.id}/c4/r1", "steady_state", False, "fail", 1.0, 4.0, "few")]}
    side = search_side(data(stored), [q.id], searches, failed, layout())
    assert side.values == [] and len(side.invalid) == 1
    bad = side.invalid[0]
    assert (bad.why, bad.point, bad.checks) == (Why.FAILED_CHECK, f"{q.id}/c4/r1", ("steady_state",))


@pytest.mark.parametrize(("stored", "detail"), [
    ([(8, 0.95)], "holds at the top of the range (8): raise hi"),
    ([(8, 0.5), (1, 0.5)], "fails at the bottom of the range (1): lower lo"),
    ([(8, 0.5), (1, 0.95)], "cut short"),
])
def test_an_open_search_is_named_not_dropped(searches: dict[str, SearchStep], stored: list[tuple[int, float]],
                                             detail: str) -> None:
    q = searches["capacity/large/L1/w/search"]
    side = search_side(data([probe(q, x, a) for x, a in stored]), [q.id], searches, {}, layout())
    assert side.values == [] and [(r.why, r.point, r.detail) for r in side.invalid] == [(Why.SEARCH_OPEN, q.id, detail)]
    assert side.invalid[0].invalidates and detail in side.invalid[0].text


def test_a_search_without_probes_is_not_a_row(searches: dict[str, SearchStep]) -> None:
    side = search_side(data([]), list(searches), searches, {}, layout())
    assert side.rows == 0 and side.values == [] and side.invalid == []


def test_wilson_interval() -> None:
    low, high = wilson(9, 10) or (0, 0)
    assert low == pytest.approx(0.5958, abs=1e-4) and high == pytest.approx(0.9821, abs=1e-4)
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4)) and wilson(10, 10)[1] == 1.0  # type: ignore[index]
    assert wilson(0, 0) is None


def sides(searches: dict[str, SearchStep], large: tuple[int, int], small: tuple[int, int] | None):  # type: ignore[no-untyped-def]
    stored = [p for k, c in enumerate(large, 1) for p in run_search(searches[f"capacity/large/L{k}/w/search"], c)]
    ids = [[f"capacity/large/L{k}/w/search" for k in (1, 2)]]
    if small is not None:
        stored += [p for k, c in enumerate(small, 1) for p in run_search(searches[f"capacity/small/L{k}/w/search"], c)]
        ids.append([f"capacity/small/L{k}/w/search" for k in (1, 2)])
    return [search_side(data(stored), i, searches, {}, layout()) for i in ids]


def test_searches_that_bisected_alike_are_not_a_zero_width_interval(searches: dict[str, SearchStep]) -> None:
    # both launches of each arm bracket alike: large [4, 6), small [2, 4); the capacities' ratio is 2.0 on
    # every block, but the true ratio can lie anywhere from 4/4 to 6/2
    notes: list = []  # type: ignore[type-arg]
    _, stats, _ = _estimate(sides(searches, (5, 5), (2, 3)), notes, layout(), 2)
    assert stats is not None and stats.mean == pytest.approx(2.0)
    assert (stats.ci_low, stats.ci_high) == (pytest.approx(1.0), pytest.approx(3.0))
    assert [(r.why, r.detail) for r in notes] == [(Why.SEARCH_RESOLUTION, "1 to 3")]
    assert "widened to the lowest that failed (1 to 3)" in notes[0].text


def test_a_ratio_widened_by_the_interval_over_the_bracket_ends(searches: dict[str, SearchStep]) -> None:
    both = sides(searches, (5, 6), (2, 3))
    _, stats, _ = _estimate(both, [], layout(), 2)
    top, bottom = both
    low = ratio_interval(top.values, bottom.ceilings, fixed_critical).ci_low  # [4, 6] over [4, 4]
    high = ratio_interval(top.ceilings, bottom.values, fixed_critical).ci_high  # [6, 8] over [2, 2]
    plain = ratio_interval(top.values, bottom.values, fixed_critical)
    # never narrower than the capacities' own interval: here the low end moves, the high end is the plain one
    assert low < plain.ci_low and high < plain.ci_high and stats is not None
    assert (stats.ci_low, stats.ci_high) == (pytest.approx(low), pytest.approx(plain.ci_high))
    assert stats.mean == pytest.approx(plain.mean)


def test_one_capacity_widened_up_to_the_levels_that_failed(searches: dict[str, SearchStep]) -> None:
    notes: list = []  # type: ignore[type-arg]
    _, stats, _ = _estimate(sides(searches, (5, 6), None), notes, layout(), 2)
    assert stats is not None and stats.mean == pytest.approx(5.0)
    plain_low = 5.0 - 12.706 * 1.0  # t(1) on [4, 6]: the low end is the held levels' own
    high = 7.0 + 12.706 * 1.0  # and the high end the failed levels' [6, 8]
    assert (stats.ci_low, stats.ci_high) == (pytest.approx(plain_low, abs=1e-2), pytest.approx(high, abs=1e-2))
    assert notes[0].why is Why.SEARCH_RESOLUTION


def test_a_side_without_ceilings_is_not_widened(searches: dict[str, SearchStep]) -> None:
    top, bottom = sides(searches, (5, 5), (2, 3))
    bottom.ceilings = bottom.ceilings[:1]  # a side that is not all searches: the plain interval
    notes: list = []  # type: ignore[type-arg]
    _, stats, _ = _estimate([top, bottom], notes, layout(), 2)
    assert stats is not None and stats.ci_low == stats.ci_high == pytest.approx(2.0) and notes == []


def test_wilson_of_one_request() -> None:
    low, high = wilson(1, 1) or (0, 0)
    assert low == pytest.approx(0.2065, abs=1e-4) and high == pytest.approx(1.0)
    assert wilson(0, 1) == (0.0, pytest.approx(0.7935, abs=1e-4))


def test_probe_rows_say_each_probe_whole_and_skip_one_without_a_level(searches: dict[str, SearchStep]) -> None:
    q = searches["capacity/large/L1/w/search"]
    no_level = PointRecord(run_id="r", point_id=f"{q.id}/c0/r1", arm=q.arm, workload="w", concurrency=None,
                           summary=PointSummary(requests_ok=16, slo_attainment=0.95))
    failed = PointRecord(run_id="r", point_id=f"{q.id}/c4/r1", arm=q.arm, workload="w", concurrency=4,
                         status="failed", valid=True,
                         summary=PointSummary(requests_ok=10, requests_failed=6, slo_attainment=0.97))
    rows = probe_rows(data([no_level, probe(q, 8, 0.5, valid=False), failed, probe(q, 1, 0.95)]), q)
    assert rows == [ProbeRow(f"{q.id}/c1/r1", 1.0, 0.95, 16, True, True),
                    ProbeRow(f"{q.id}/c4/r1", 4.0, 0.97, 16, False, None),  # failed: not valid, held unknown
                    ProbeRow(f"{q.id}/c8/r1", 8.0, 0.5, 16, False, None)]


def test_a_side_reads_every_search_past_one_unknown_or_without_probes(searches: dict[str, SearchStep]) -> None:
    large = [searches[f"capacity/large/L{k}/w/search"] for k in (1, 2)]
    stored = run_search(large[1], 6)  # only the second launch's search has probes
    side = search_side(data(stored), ["not/a/search", large[0].id, large[1].id], searches, {}, layout())
    assert side.rows == 1 and side.point_ids == [large[1].id]
    assert side.values == [Obs(large[1].id, 6.0, "capacity/large/L2", 2, 1)]
    assert side.ceilings == [Obs(large[1].id, 8.0, "capacity/large/L2", 2, 1)]


@pytest.mark.parametrize(("servers", "place"), [
    ({"capacity/large/L1/s1": Place("capacity/large/L1", 7)}, ("capacity/large/L1", 7)),  # a replica's server id
    ({}, ("capacity/large/L1", None)),  # no design: the launch alone, block unknown
])
def test_a_capacity_placed_by_its_launch(searches: dict[str, SearchStep], servers: dict[str, Place],
                                         place: tuple[str, int | None]) -> None:
    q = searches["capacity/large/L1/w/search"]
    side = search_side(data(run_search(q, 5)), [q.id], searches, {}, Layout(servers=servers))
    assert side.values == [Obs(q.id, 4.0, *place, 1)] and side.ceilings == [Obs(q.id, 6.0, *place, 1)]


def test_an_invalid_probe_without_stored_checks_names_none(searches: dict[str, SearchStep]) -> None:
    q = searches["capacity/large/L1/w/search"]
    stored = [probe(q, 8, 0.5), probe(q, 1, 0.95, valid=False)]
    side = search_side(data(stored), [q.id], searches, {}, layout())
    assert [(r.why, r.point, r.checks) for r in side.invalid] == [(Why.FAILED_CHECK, f"{q.id}/c1/r1", ())]
