"""The stopping rule and the verdict rule keep their error rates where production uses them: simulated runs
(tests.report.simulate) compiled from a study file, extended block by block while report.scoring.undecided
asks for more, scored by report.scoring.score_study. With the truth on a band's edge, a range's edge or a
relation's threshold, false "confirmed" and false "refuted" are each at most 2.5% + 3 Monte Carlo SE; a
rule that spends 6% instead of 5% fails that; runs written to a real DuckDB file score exactly as the
in-memory runs the bulk of the simulation uses."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from report import sequential
from tests.report.simulate import (
    ABOVE,
    BAND,
    BROKEN_RATE,
    NOMINAL,
    SENTINEL,
    Case,
    Rates,
    cases,
    in_duckdb,
    in_memory,
    models_read_once,
    planner_checks,
    prepare,
    seeds,
    sims_to_detect,
    simulate,
)

SUITE = [pytest.param(c, id=f"{c.edge}|{c.design}") for c in cases()]


@pytest.mark.parametrize("case", SUITE)
def test_false_verdicts_at_the_edge_stay_within_the_nominal_rate(case: Case) -> None:
    rates = simulate(case, workers=2)
    assert rates.holds, (f"{case.edge}, {case.design}: false confirmed {rates.false_confirmed:.4f}, "
                         f"false refuted {rates.false_refuted:.4f}, allowed {rates.tolerance:.4f} "
                         f"({rates.sims} runs)")


def test_a_rule_spending_six_percent_fails_the_criterion(monkeypatch: pytest.MonkeyPatch) -> None:
    """Alpha 6% instead of 5% (report.sequential.ALPHA): the sentinel design's false rates rise past the
    criterion, which its number of runs was chosen to see (sims_to_detect)."""
    monkeypatch.setattr(sequential, "ALPHA", 0.06)
    rates = simulate(SENTINEL, workers=2)
    assert not rates.holds, (rates.false_confirmed, rates.false_refuted, rates.tolerance)
    assert max(rates.false_confirmed, rates.false_refuted) > rates.tolerance


def test_the_sentinel_runs_enough_simulations_to_see_a_six_percent_rule() -> None:
    n = sims_to_detect(BROKEN_RATE, 0.9)
    assert SENTINEL.sims == n and 40_000 < n < 60_000
    tolerance = Rates(SENTINEL, n, 0, 0).tolerance
    se = math.sqrt(BROKEN_RATE * (1 - BROKEN_RATE) / n)
    assert BROKEN_RATE - 1.2815 * se == pytest.approx(tolerance, abs=2e-5)  # 90% of runs of n see it
    assert sims_to_detect(BROKEN_RATE, 0.99) > n > sims_to_detect(0.03, 0.9)


def test_the_criterion_is_nominal_plus_three_standard_errors() -> None:
    case = Case(BAND, "edge", 1.02)
    tol = NOMINAL + 3 * math.sqrt(NOMINAL * (1 - NOMINAL) / 10_000)
    at = math.floor(tol * 10_000)  # the most false verdicts of 10,000 that still hold
    assert Rates(case, 10_000, at, at).holds
    assert not Rates(case, 10_000, at + 1, 0).holds
    assert not Rates(case, 10_000, 0, at + 1).holds
    assert Rates(case, 10_000, 0, 0).decided == 0 and Rates(case, 10, 3, 4).decided == 0.7


def test_the_simulation_decides_where_the_truth_is_clear() -> None:
    """Not a simulation that never decides: a truth at the band's centre is confirmed, one far outside is
    refuted, and a truth on an edge splits."""
    centre = simulate(Case(BAND, "centre", 1.0, launches=6, seed=21), 200)
    outside = simulate(Case(BAND, "outside", 1.10, launches=3, seed=22), 200)
    above = simulate(Case(ABOVE, "above", 1.08, launches=3, seed=23), 200)
    assert centre.confirmed > 190 and centre.refuted == 0
    assert outside.refuted == 200 and above.confirmed == 200


def test_a_sequential_run_adds_blocks_only_while_undecided(tmp_path: Path) -> None:
    """The simulated runner: blocks past the required ones only while undecided, never past the budget."""
    case = Case(BAND, "past the edge", 1.035, launches=2, budget=6, seed=24)
    with models_read_once():
        prep = prepare(case, tmp_path)
        blocks = [in_memory(prep, k).n for k in seeds(case, 100)]
        far = prepare(replace(case, truth=1.5), tmp_path)
        # refuted by block 3 (the look after block 2 reads at 99.75% on 1 df, a multiplier of ~250): no more
        assert {(s.n, s.verdict) for s in (in_memory(far, k) for k in seeds(case, 20))} == {(2, "refuted"),
                                                                                          (3, "refuted")}
    assert set(blocks) <= set(range(2, 7)) and 6 in blocks and len(set(blocks)) > 2


CHECKED = [Case(BAND, "band", 1.02, budget=6, seed=31), Case(ABOVE, "relation", 1.0, server="per-point",
                                                               repeats=2, budget=4, tails="t3", seed=32),
           Case('{ ratio = ["a", "b"], range = [1.04, 1.06] }', "range", 1.04, launches=1, repeats=3, seed=33),
           Case(BAND, "band", 0.98, launches=3, repeats=2, seed=34)]


@pytest.mark.parametrize("case", CHECKED, ids=lambda c: c.design)
def test_duckdb_and_memory_give_identical_scores(case: Case, tmp_path: Path) -> None:
    """The same seeds through a real DuckDB file (each point committed by runner.store, the run read back by
    report.results.read_run) and through in-memory records: equal scores, field for field; and the bulk's
    verdict-only scoring (explain=False) gives the same verdict and interval, without the planner's texts."""
    with models_read_once():
        prep = prepare(case, tmp_path)
        for k in seeds(case, 8):
            stored = in_duckdb(prep, k, tmp_path / "sim.duckdb")
            assert stored == in_memory(prep, k)
            assert stored.n >= 1 and stored.verdict in ("confirmed", "refuted", "inconclusive")
            bare = in_memory(prep, k, explain=False)
            assert (bare.verdict, bare.verdict_spec, bare.ci_low, bare.ci_high, bare.n) == (
                stored.verdict, stored.verdict_spec, stored.ci_low, stored.ci_high, stored.n)


def _se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def test_runs_at_the_planned_blocks_decide_with_the_power_planned() -> None:
    """report.block_planner, validated by the simulation: runs of the blocks it recommends for 80% (95%)
    power decide at least that often (3 Monte Carlo SE), whether the truth is at the prediction or past
    an edge, and with the SD from a pilot on 4 df taken at its upper bound. Planned as if that pilot SD
    were the truth, as the planner did before, they fall short."""
    found = {(p.what, power): p for p, power in planner_checks(runs=1000)}
    for (what, power), p in found.items():
        if "as if known" in what:
            continue
        assert p.decided >= power - 3 * _se(power, 1000), (what, power, p.decided, p.blocks[:5])
    naive = found[("blocks_needed, pilot SD as if known", 0.8)]
    assert naive.decided < 0.8 - 3 * _se(0.8, 1000), naive.decided
    bounded = found[("blocks_needed, pilot SD on 4 df", 0.8)]
    assert sum(bounded.blocks) > sum(naive.blocks)  # the same pilots: the bound asks for more blocks
